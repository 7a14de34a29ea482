"""The peer protocol's window (``services.peer_protocol``) at the peer listener's gate
(``services.bootstrap.listener_gates``): a node of the pinned earlier release (no protocol headers) is
served, a peer outside the window is refused 409 before its body is read, with a JSON error
naming both sides' versions and windows, not retryable, and the refusing side logs it (once
per peer and version, not per call); every answer says what this node speaks."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from services.bootstrap.listener_gates import PeerListenerGate
from services.peer_protocol import (
    OLDEST_HEADER,
    PEER_PROTOCOL,
    PEER_PROTOCOL_HEADERS,
    PEER_PROTOCOL_OLDEST,
    PROTOCOL_HEADER,
    PROTOCOL_REFUSED,
    Speaks,
    peer_speaks,
    refusal,
)

SECRET = "s" * 40
PEER = {"X-Convplane-Peer-Auth": SECRET, "X-Convplane-Source-Region": "east"}


class Recorder:
    """An app that records the requests that reached it (and reads their bodies)."""

    def __init__(self) -> None:
        self.reached = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.reached += 1
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def post(gate: PeerListenerGate, headers: dict[str, str]) -> httpx.Response:
    transport = httpx.ASGITransport(app=gate)
    async with httpx.AsyncClient(transport=transport, base_url="http://n") as client:
        return await client.post("/peer/forwarded-appends", json={}, headers=headers)


def gate(app: Recorder, speaks: Speaks | None = None) -> PeerListenerGate:
    extra = {} if speaks is None else {"speaks": speaks}
    return PeerListenerGate(app, peer_secret=SECRET, regions=("east", "west"), tls=False, **extra)


def error_of(reply: httpx.Response) -> dict[str, Any]:
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "retryable"}
    error: dict[str, Any] = body["error"]
    return error


def test_a_call_without_protocol_headers_is_protocol_1_and_inside_this_window() -> None:
    assert peer_speaks([]) == Speaks(1, 1)
    assert PEER_PROTOCOL_OLDEST <= 1 <= PEER_PROTOCOL  # the pinned earlier release upgrades
    assert refusal(Speaks(1, 1), "east") is None
    raw = [(k.lower().encode(), v.encode()) for k, v in PEER_PROTOCOL_HEADERS.items()]
    assert peer_speaks(raw) == Speaks(PEER_PROTOCOL, PEER_PROTOCOL_OLDEST)


@pytest.mark.parametrize(
    "headers",
    [
        [(b"x-convplane-peer-protocol", b"two")],
        [(b"x-convplane-peer-protocol", b"0")],
        [(b"x-convplane-peer-protocol", b"2"), (b"x-convplane-peer-protocol", b"3")],
        [(b"x-convplane-peer-protocol", b"2"), (b"x-convplane-peer-protocol-oldest", b"3")],
    ],
)
def test_headers_no_node_sends_are_not_a_protocol(headers: list[tuple[bytes, bytes]]) -> None:
    assert peer_speaks(headers) is None


async def test_a_node_of_the_earlier_release_is_served_and_told_what_this_node_speaks() -> None:
    app = Recorder()
    reply = await post(gate(app), PEER)  # what a node of commit 83d929a sends
    assert reply.status_code == 200 and app.reached == 1
    assert reply.headers[PROTOCOL_HEADER] == str(PEER_PROTOCOL)
    assert reply.headers[OLDEST_HEADER] == str(PEER_PROTOCOL_OLDEST)


async def test_a_peer_older_than_the_window_is_refused_naming_both_versions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Recorder()
    newer = gate(app, Speaks(protocol=3, oldest=2))  # a future node that dropped protocol 1
    with caplog.at_level(logging.ERROR, logger="convplane.peer_protocol"):
        replies = [await post(newer, PEER) for _ in range(3)]
    assert app.reached == 0  # refused before the body and the app
    for reply in replies:
        assert reply.status_code == 409
        error = error_of(reply)
        assert error["code"] == PROTOCOL_REFUSED and error["retryable"] is False
        message = error["message"]
        assert "region east speaks peer protocol 1" in message
        assert "it speaks 3 and serves protocols 2 to 3" in message
        assert reply.headers[PROTOCOL_HEADER] == "3"
    refusals = [r for r in caplog.records if "peer call refused" in r.getMessage()]
    assert len(refusals) == 1  # logged once, not once per call
    assert "region east speaks peer protocol 1" in refusals[0].getMessage()


async def test_a_peer_that_no_longer_serves_this_node_is_refused_naming_both_windows() -> None:
    app = Recorder()
    future = {**PEER, PROTOCOL_HEADER: "9", OLDEST_HEADER: "8"}
    reply = await post(gate(app), future)
    assert reply.status_code == 409 and app.reached == 0
    message = error_of(reply)["message"]
    assert "region east speaks peer protocol 9 and serves protocols 8 to 9 only" in message
    assert f"this node speaks {PEER_PROTOCOL} (serves {PEER_PROTOCOL_OLDEST} to " in message
    assert "upgrade this node first" in message


async def test_a_newer_peer_whose_window_holds_this_node_is_served() -> None:
    app = Recorder()
    newer = {**PEER, PROTOCOL_HEADER: str(PEER_PROTOCOL + 1), OLDEST_HEADER: str(PEER_PROTOCOL)}
    assert (await post(gate(app), newer)).status_code == 200


async def test_malformed_protocol_headers_are_refused() -> None:
    app = Recorder()
    reply = await post(gate(app), {**PEER, PROTOCOL_HEADER: "two"})
    assert reply.status_code == 409 and app.reached == 0
    assert "peer protocol headers no convplane node sends" in error_of(reply)["message"]
