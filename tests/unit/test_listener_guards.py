"""What a listener refuses before the app is asked (``services.listeners``,
``services.bootstrap.listener_gates``): a request head past its byte bound, a peer endpoint on the client
listener, a caller of the peer listener that is not a node of the cluster (no body read, no
slot taken), and a certificate's region standing in for another. And how the node's own server
stops (idle connections at once, busy ones after their answer) and runs the app's lifespan."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from services.api.peer_trust import CERT_REGION_SCOPE_KEY, PEER_REGION_SCOPE_KEY
from services.asgi_lifespan import Lifespan, LifespanFailed
from services.bootstrap.listener_gates import ClientListenerGate, PeerListenerGate
from services.bootstrap.serve import peer_listener_host
from services.listeners import ListenerConfig
from tests.unit.wire_client import MemoryTransport, WireConnection, raw_request

HEAD_BYTES_MAX = 8 * 1024
SECRET = "s" * 40
REGIONS = ("east", "west")
CHUNK = b"a" * 1024


def small_app() -> FastAPI:
    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    return app


def wire(app: FastAPI) -> WireConnection:
    limits = ListenerConfig("client", 100, 5.0, header_bytes_max=HEAD_BYTES_MAX)
    return WireConnection(app, lane=False, limits=limits)


async def test_a_head_past_its_byte_bound_is_answered_431_before_the_parser_takes_more() -> None:
    connection = wire(small_app())
    fed = 0
    connection.protocol.data_received(b"GET /healthz HTTP/1.1\r\nhost: n\r\nx-big: ")
    while not connection.transport.closed and fed < 64 * HEAD_BYTES_MAX:
        connection.protocol.data_received(CHUNK)  # a header that never ends, 1 KiB at a time
        fed += len(CHUNK)
    await asyncio.sleep(0)
    assert connection.transport.closed
    assert fed <= HEAD_BYTES_MAX  # refused once the head passed its bound, not later
    written = bytes(connection.transport.written)
    assert written.startswith(b"HTTP/1.1 431 ")
    assert b'"request_header_fields_too_large"' in written
    # the parser never held more than the bound: what it had gathered of the header is small
    assert len(connection.protocol.headers) == 1  # host only: x-big never completed


async def test_one_write_holding_a_whole_oversized_head_is_refused_too() -> None:
    connection = wire(small_app())
    head = b"GET /healthz HTTP/1.1\r\nhost: n\r\nx-big: " + b"a" * (4 * HEAD_BYTES_MAX)
    connection.protocol.data_received(head + b"\r\n\r\n")
    await asyncio.sleep(0)
    assert connection.transport.closed
    assert bytes(connection.transport.written).startswith(b"HTTP/1.1 431 ")


async def test_heads_within_the_bound_are_served_one_after_another() -> None:
    connection = wire(small_app())
    header = {"x-fill": "f" * (HEAD_BYTES_MAX // 2)}
    request = raw_request("/healthz", None, header, method="GET")
    answers = await connection.exchange(request, request, request)  # pipelined, one write
    assert [a.status for a in answers] == [200, 200, 200]
    # and a body larger than the head bound is no head: it is never counted as one
    big_body = raw_request("/healthz", b"x" * (4 * HEAD_BYTES_MAX), {}, method="GET")
    assert [a.status for a in await connection.exchange(big_body)] == [200]


# --- the gates ------------------------------------------------------------------------------


class Recorder:
    """An app that records what reached it, and whether it read a body."""

    def __init__(self) -> None:
        self.scopes: list[Scope] = []
        self.bodies_read = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope)
        if scope["method"] == "POST":
            await receive()
            self.bodies_read += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def call(app: Any, path: str, headers: dict[str, str], **scope_extra: Any) -> int:
    """``app``'s status for a POST whose body never comes (reading it would hang)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # a body that never arrives
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        **scope_extra,
    }  # fmt: skip
    async with asyncio.timeout(5):  # a gate that read the body would wait forever
        await app(scope, receive, send)
    return int(sent[0]["status"])


def peer_gate(app: Any, *, tls: bool) -> PeerListenerGate:
    return PeerListenerGate(app, peer_secret=SECRET, regions=REGIONS, tls=tls)


PEER = {"X-Convplane-Peer-Auth": SECRET, "X-Convplane-Source-Region": "east"}


async def test_the_client_listener_serves_no_peer_endpoint_secret_or_not() -> None:
    app = Recorder()
    gate = ClientListenerGate(app)
    for path in ("/peer/health", "/peer/forwarded-appends", "/peer/drills/canary"):
        assert await call(gate, path, PEER) == 404
    assert app.scopes == []  # nothing reached the app: no slot, no body


async def test_the_peer_listener_refuses_strangers_before_reading_their_body() -> None:
    app = Recorder()
    gate = peer_gate(app, tls=False)
    refused = [
        {},
        {"X-Convplane-Peer-Auth": SECRET},  # no region claimed
        {"X-Convplane-Peer-Auth": "x" * 40, "X-Convplane-Source-Region": "east"},
        {**PEER, "X-Convplane-Source-Region": "mars"},  # no region of the cluster
    ]
    for headers in refused:
        assert await call(gate, "/peer/forwarded-appends", headers) == 401
    assert app.scopes == []


async def test_with_tls_the_secret_alone_is_nothing_and_a_certificate_speaks_for_its_region() -> (
    None
):
    app = Recorder()
    gate = peer_gate(app, tls=True)
    path = "/v1/conversations/c/events"
    assert await call(gate, path, PEER) == 401  # no certificate
    assert await call(gate, path, PEER, **{CERT_REGION_SCOPE_KEY: None}) == 401
    # a certificate of west claiming to be east
    assert await call(gate, path, PEER, **{CERT_REGION_SCOPE_KEY: "west"}) == 401
    assert app.scopes == []


async def test_an_authenticated_peer_reaches_the_app_as_its_region() -> None:
    app = Recorder()
    gate = peer_gate(app, tls=True)
    scope_extra = {CERT_REGION_SCOPE_KEY: "east"}
    await asyncio.wait_for(_served(gate, scope_extra), 5)
    assert [s[PEER_REGION_SCOPE_KEY] for s in app.scopes] == ["east"]


async def _served(gate: PeerListenerGate, scope_extra: dict[str, Any]) -> None:
    transport = httpx.ASGITransport(app=_with_scope(gate, scope_extra))
    async with httpx.AsyncClient(transport=transport, base_url="http://n") as client:
        r = await client.get("/peer/health", headers=PEER)
        assert r.status_code == 200


def _with_scope(app: Any, extra: dict[str, Any]) -> Any:
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        await app({**scope, **extra}, receive, send)

    return wrapped


def test_a_peer_listener_without_tls_listens_on_loopback_only() -> None:
    assert peer_listener_host("0.0.0.0", tls=False) == "127.0.0.1"
    assert peer_listener_host("10.1.2.3", tls=False) == "127.0.0.1"
    assert peer_listener_host("node-us-east", tls=False) == "127.0.0.1"
    for loopback in ("127.0.0.1", "::1", "localhost"):
        assert peer_listener_host(loopback, tls=False) == loopback
    assert peer_listener_host("0.0.0.0", tls=True) == "0.0.0.0"  # certificates: any address


# --- stopping: idle connections close now, busy ones after their answer ---------------------


class HeldApp:
    """An app whose answers wait for ``release``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.entered += 1
        await self.release.wait()
        body = b"{}"
        headers = [(b"content-length", b"2"), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def test_a_stopping_listener_closes_idle_connections_and_finishes_busy_ones() -> None:
    app = HeldApp()
    limits = ListenerConfig("client", 100, 5.0)
    idle = WireConnection(app, lane=False, limits=limits)
    listener = idle.listener
    busy = listener.connection()
    busy_transport = MemoryTransport()
    busy.connection_made(busy_transport)
    busy.data_received(raw_request("/x", None, {}, method="GET"))
    await until(lambda: app.entered == 1)
    listener.stop_accepting()
    assert idle.transport.closed  # nothing under way: closed at once
    assert not busy_transport.closed  # its request is answered first
    drained = asyncio.ensure_future(listener.drained())
    app.release.set()
    await until(lambda: busy_transport.closed)
    written = bytes(busy_transport.written)
    assert written.startswith(b"HTTP/1.1 200 ") and b"connection: close\r\n" in written
    for connection in (idle.protocol, busy):
        connection.connection_lost(None)  # as the event loop reports the closed sockets
    await asyncio.wait_for(drained, 5)
    assert listener.connections == set() and listener.tasks == set()


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("never")


# --- the app's lifespan, as the node's server runs it ---------------------------------------


class LifespanApp:
    def __init__(self, *, fail_startup: bool = False) -> None:
        self.fail_startup = fail_startup
        self.events: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "lifespan"
        while True:
            message = await receive()
            self.events.append(message["type"])
            if message["type"] == "lifespan.startup":
                if self.fail_startup:
                    await send({"type": "lifespan.startup.failed", "message": "no database"})
                    return
                scope["state"]["opened"] = True
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


async def test_the_lifespan_starts_and_stops_the_app_and_shares_its_state() -> None:
    app = LifespanApp()
    lifespan = Lifespan(app)
    await lifespan.startup()
    assert lifespan.state == {"opened": True}  # copied into every request's scope
    await lifespan.shutdown()
    assert app.events == ["lifespan.startup", "lifespan.shutdown"]


async def test_an_app_that_cannot_start_stops_the_node() -> None:
    with pytest.raises(LifespanFailed, match="no database"):
        await Lifespan(LifespanApp(fail_startup=True)).startup()


async def test_a_bugs_500_that_the_client_does_not_take_closes_the_connection() -> None:
    """The app gave up on a slow reader without starting its answer; the server's 500 waits at
    most ``send_timeout_s`` for the reader too, then the connection closes (no unbounded wait)."""

    async def gives_up(scope: Scope, receive: Receive, send: Send) -> None:
        return None  # as the edge does once a reader stopped taking its answer

    limits = ListenerConfig("client", 100, 60.0, send_timeout_s=2.0)
    connection = WireConnection(gives_up, lane=False, limits=limits)
    connection.protocol.pause_writing()  # the reader takes nothing: the send buffer is full
    connection.protocol.data_received(raw_request("/x", None, {}, method="GET"))
    await asyncio.sleep(1.0)
    assert not connection.transport.closed
    await asyncio.sleep(limits.send_timeout_s)
    assert connection.transport.closed
    assert connection.listener.tasks == set()
