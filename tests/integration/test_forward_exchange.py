"""The forward batch's own HTTP/1.1 (``services.api.forward_exchange.StreamBatchExchange``) on
loopback sockets: against a node's real peer listener (the node's own listener and
app), where it must answer exactly what the httpx exchange answers; and against a hand-written
peer that answers well and badly: NDJSON in odd chunks, kept-alive connections, a connection the
peer closed while idle or let sit too long, a refusal, an answer cut short, one that never
comes, one too long, bytes after the answer, nobody listening, a TLS handshake never answered,
a drill's black-hole, and mutual TLS with the cluster's certificates (and with a stranger's)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import Response

from eventlog.clock import LoopClock
from eventlog.errors import DeadlineExceeded
from eventlog.http_headers import PEER_AUTH_HEADER
from services.api import forward_exchange
from services.api.errors import ForwardFailed
from services.api.forward_batch import BATCH_PATH, AppendBatcher, BatchConfig
from services.api.forward_exchange import (
    BatchExchange,
    BatchLost,
    BatchNotSent,
    HttpxBatchExchange,
    StreamBatchExchange,
)
from services.asgi_lifespan import Lifespan
from services.bootstrap.listener_gates import PeerListenerGate
from services.cluster_tls import client_ssl_context, issue_cluster_tls
from services.listeners import Listener, ListenerConfig
from tests.unit.admission_nodes import SECRET, SlowLog, build_node, cluster, node_clock
from tests.unit.api_fakes import KEY_A, conversation_led_by

#: what a node of region east sends to a peer listener (``services.bootstrap.listener_gates``)
HEADERS = {
    "content-type": "application/json",
    PEER_AUTH_HEADER: SECRET,
    "X-Convplane-Source-Region": "east",
}
TIMEOUT_S = 2.0
LINES = [{"index": i, "status": 201, "headers": {}, "body": "{}"} for i in range(3)]

Answer = Callable[[bytes, bytes], Awaitable[bytes | None]]


def ndjson(lines: list[dict[str, Any]], cuts: tuple[int, ...] = ()) -> bytes:
    """A chunked NDJSON answer, its body cut into chunks at ``cuts`` (mid-line, too)."""
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    edges = [0, *cuts, len(body)]
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (end - start, body[start:end])
        for start, end in itertools.pairwise(edges)
        if end > start
    )
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n"
        b"transfer-encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    )


class Peer:
    """A listener that answers each request (head, body) with what ``answer`` returns (None:
    close without answering), and records what it was sent."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.close_after_answer = False

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                )
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                data = await self.answer(head, body)
                if data is None:
                    break
                writer.write(data)
                await writer.drain()
                if self.close_after_answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def listening(peer: Peer, server_ssl: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    server = await asyncio.start_server(peer.serve, "127.0.0.1", 0, ssl=server_ssl)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if server_ssl else 'http'}://127.0.0.1:{port}{BATCH_PATH}"
    finally:
        server.close()


async def send(
    exchange: BatchExchange, url: str, body: bytes = b'{"items":[]}', timeout_s: float = TIMEOUT_S
) -> tuple[Any, list[Any]]:
    lines: list[Any] = []
    refused = await exchange.send("b", url, lambda: body, HEADERS, timeout_s, lines.append)
    return refused, [json.loads(line) for line in lines]


def answering(data: bytes) -> Answer:
    async def answer(head: bytes, body: bytes) -> bytes:
        return data

    return answer


async def test_lines_in_odd_chunks_arrive_whole_over_one_kept_connection() -> None:
    peer = Peer(answering(ndjson(LINES, cuts=(5, 40, 41, 90))))
    async with listening(peer) as url:
        exchange = StreamBatchExchange(ssl_context=None)
        for _ in range(3):
            assert await send(exchange, url, b'{"items":[1]}') == (None, LINES)
        await exchange.close()
    assert peer.connections == 1
    head, body = peer.requests[0]
    assert head.startswith(f"POST {BATCH_PATH} HTTP/1.1\r\n".encode())
    assert f"{PEER_AUTH_HEADER.lower()}: {SECRET}".encode() in head
    assert body == b'{"items":[1]}'


async def test_a_refusal_is_returned_whole() -> None:
    error = b'{"error":{"code":"unauthorized"}}'
    refusal = (
        b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n"
        b"Retry-After: 1\r\ncontent-length: %d\r\n\r\n%s" % (len(error), error)
    )
    peer = Peer(answering(refusal))
    async with listening(peer) as url:
        exchange = StreamBatchExchange(ssl_context=None)
        refused, lines = await send(exchange, url)
        assert lines == []
        assert (refused.status, refused.body) == (401, error)
        assert refused.headers["retry-after"] == "1"
        assert await send(exchange, url) == (refused, [])  # the connection was kept
        await exchange.close()
    assert peer.connections == 1


async def test_connections_closed_while_idle_or_idle_too_long_are_replaced() -> None:
    peer = Peer(answering(ndjson(LINES)))
    async with listening(peer) as url:
        exchange = StreamBatchExchange(ssl_context=None)
        peer.close_after_answer = True  # as a peer whose keep-alive timeout passed
        for _ in range(3):
            assert await send(exchange, url) == (None, LINES)
            await asyncio.sleep(0.05)  # the peer's close arrives while idle
        await exchange.close()
        peer.close_after_answer = False
        impatient = StreamBatchExchange(ssl_context=None, idle_reuse_s=0.0)
        for _ in range(2):
            assert await send(impatient, url) == (None, LINES)
        await impatient.close()
    assert peer.connections == 5


def test_kept_connections_are_reused_well_inside_the_peers_idle_close() -> None:
    assert forward_exchange.idle_reuse_s(5.0) == forward_exchange.IDLE_REUSE_S
    assert forward_exchange.idle_reuse_s(1.5) == 0.75  # the listener closes after 1.5 s


async def test_a_lost_batch_drops_the_regions_other_kept_connections() -> None:
    """After a lost batch the next one goes on a new connection: the other kept ones may be
    broken the same way (the peer restarted)."""
    cut = ndjson(LINES)
    cut_short = cut[: cut.index(b"}\n") + 2]
    answers = [ndjson(LINES)] * 2 + [cut_short] + [ndjson(LINES)]

    async def in_turn(head: bytes, body: bytes) -> bytes | None:
        return answers[len(peer.requests) - 1]

    peer = Peer(in_turn)
    async with listening(peer) as url:
        exchange = StreamBatchExchange(ssl_context=None)
        both = await asyncio.gather(send(exchange, url), send(exchange, url))
        assert list(both) == [(None, LINES)] * 2 and peer.connections == 2  # both kept
        peer.close_after_answer = True
        with pytest.raises(BatchLost):
            await send(exchange, url)  # on one of the two
        peer.close_after_answer = False
        assert await send(exchange, url) == (None, LINES)
        await exchange.close()
    assert peer.connections == 3  # not the other kept one


async def test_a_connection_nothing_was_sent_on_goes_back_with_its_idle_time_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every item of a batch was answered while its connection was made or taken (the body
    builds None): nothing is written, and the connection goes back for the next batch, idle
    since the peer last heard from it, not since it was put back (the peer's keep-alive time
    runs on)."""
    now_s = [100.0]
    monkeypatch.setattr(forward_exchange, "time", SimpleNamespace(monotonic=lambda: now_s[0]))
    peer = Peer(answering(ndjson(LINES)))
    async with listening(peer) as url:
        exchange = StreamBatchExchange(ssl_context=None)
        nothing = await exchange.send("b", url, lambda: None, HEADERS, TIMEOUT_S, print)
        assert (nothing, peer.connections) == (None, 1)  # connected, nothing sent
        now_s[0] += 1.0
        assert await send(exchange, url, b'{"items":[1]}') == (None, LINES)  # reused
        assert peer.connections == 1
        now_s[0] += 1.5  # the peer answered 1.5 s ago: still reusable
        assert await exchange.send("b", url, lambda: None, HEADERS, TIMEOUT_S, print) is None
        now_s[0] += 1.0  # 2.5 s since the answer, though 1 s since it was put back
        assert await send(exchange, url, b'{"items":[2]}') == (None, LINES)
        await exchange.close()
    assert peer.connections == 2  # the last batch did not take the stale connection
    assert [body for _, body in peer.requests] == [b'{"items":[1]}', b'{"items":[2]}']


async def test_an_answer_cut_short_is_lost_after_the_lines_that_came() -> None:
    cut = ndjson(LINES)
    peer = Peer(answering(cut[: cut.index(b"}\n") + 2]))  # the first line, then nothing
    peer.close_after_answer = True
    async with listening(peer) as url:
        exchange = StreamBatchExchange(ssl_context=None)
        lines: list[bytes] = []
        with pytest.raises(BatchLost):
            await exchange.send("b", url, lambda: b"{}", HEADERS, TIMEOUT_S, lines.append)
        assert [json.loads(line) for line in lines] == LINES[:1]
        peer.answer, peer.close_after_answer = answering(ndjson(LINES)), False
        assert await send(exchange, url) == (None, LINES)  # the next batch starts clean
        await exchange.close()


@pytest.mark.parametrize(
    "bad",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        ndjson([{"index": 0, "body": "x" * 300}]),  # a line over the (lowered) bound
        b"HTTP/1.1 500 Oops\r\ncontent-length: 400\r\n\r\n" + b"e" * 400,  # refusal too long
        b"HTTP/1.1 200 OK\r\nx-filler: " + b"a" * 20_000 + b"\r\ncontent-length: 2\r\n\r\n{}",
    ],
)
async def test_a_malformed_or_unbounded_answer_is_lost(
    bad: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forward_exchange, "LINE_BYTES_MAX", 200)
    monkeypatch.setattr(forward_exchange, "REFUSAL_BYTES_MAX", 200)
    peer = Peer(answering(bad))
    async with listening(peer) as url:
        exchange = StreamBatchExchange(ssl_context=None)
        with pytest.raises(BatchLost):
            await send(exchange, url)
        peer.answer = answering(ndjson(LINES))
        assert await send(exchange, url) == (None, LINES)
        await exchange.close()
    assert peer.connections == 2  # never reused after a failure


async def test_bytes_after_the_answer_retire_the_connection() -> None:
    peer = Peer(answering(ndjson(LINES) + b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"))
    async with listening(peer) as url:
        exchange = StreamBatchExchange(ssl_context=None)
        assert await send(exchange, url) == (None, LINES)
        peer.answer = answering(ndjson(LINES))
        assert await send(exchange, url) == (None, LINES)
        await exchange.close()
    assert peer.connections == 2


async def test_a_peer_that_never_answers_is_lost_at_the_deadline() -> None:
    async def silent(head: bytes, body: bytes) -> bytes:
        await asyncio.sleep(3600)
        return b""

    peer = Peer(silent)
    async with listening(peer) as url:
        exchange = StreamBatchExchange(ssl_context=None)
        with pytest.raises(BatchLost):
            await send(exchange, url, timeout_s=0.2)
        await exchange.close()


async def test_nothing_sent_to_nobody_or_through_a_black_hole() -> None:
    exchange = StreamBatchExchange(ssl_context=None)
    with pytest.raises(BatchNotSent):
        await send(exchange, "http://127.0.0.1:9" + BATCH_PATH)  # discard: nobody listens
    peer = Peer(answering(ndjson(LINES)))
    async with listening(peer) as url:
        holed = StreamBatchExchange(ssl_context=None, blocked=lambda region: region == "b")
        with pytest.raises(BatchNotSent):
            await send(holed, url)
    assert peer.connections == 0


@asynccontextmanager
async def handshake_never_answered() -> AsyncIterator[tuple[str, bytearray]]:
    """A peer that takes the TCP connection and never answers the TLS handshake: yields its
    URL and what it received."""
    received = bytearray()
    accepted: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        try:
            while chunk := await reader.read(4096):
                received.extend(chunk)  # the client's hello, and nothing more ever comes
        finally:
            writer.close()

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"https://127.0.0.1:{port}", received
    finally:
        server.close()
        for writer in accepted:  # the server's side of the connection ends with the test
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await server.wait_closed()


async def test_a_handshake_that_never_ends_sent_nothing(tmp_path: Path) -> None:
    """The time ran out before any byte of the batch left, so the batch was not sent (safe to
    send again), and its body was never built."""
    tls = issue_cluster_tls(tmp_path / "tls", ["a", "b"], ["127.0.0.1"])
    exchange = StreamBatchExchange(ssl_context=client_ssl_context(tls["a"]))
    built: list[bytes] = []

    def body() -> bytes:
        built.append(b"{}")
        return b"{}"

    async with handshake_never_answered() as (base_url, received):
        try:
            with pytest.raises(BatchNotSent):
                await exchange.send("b", base_url + BATCH_PATH, body, HEADERS, 0.3, print)
        finally:
            await exchange.close()
    assert received  # the connection was made: only its handshake never finished
    assert b"POST" not in received and BATCH_PATH.encode() not in received
    assert built == []


async def test_an_append_whose_deadline_passes_during_the_handshake_was_not_applied(
    tmp_path: Path,
) -> None:
    """Two appends share a batch whose connection's TLS handshake never ends. The first one's
    deadline passes during the handshake: nothing of the batch had left, so its answer is 504
    ``deadline_exceeded`` (not applied), not ``outcome_unknown``; it used to be told unknown,
    because its batch counted as under way from the moment it began to connect."""
    tls = issue_cluster_tls(tmp_path / "tls", ["a", "b"], ["127.0.0.1"])
    clock = LoopClock()
    limits = BatchConfig(batch_max=8, batches_in_flight_max=1, straggler_s=5.0,
                         batches_open_max=2, queue_max=8, retries_max=0, backoff_s=0.1)  # fmt: skip

    async def while_reachable(region: str, url: str, call: Coroutine[Any, Any, None]) -> None:
        await call

    batcher = AppendBatcher(
        exchange=StreamBatchExchange(ssl_context=client_ssl_context(tls["a"])), clock=clock,
        rng=random.Random(1), limits=limits, peer_secret=SECRET, source_region="a",
        while_reachable=while_reachable, count=lambda region, outcome: None,
    )  # fmt: skip

    async def append(base_url: str, deadline_s: float) -> Response:
        return await batcher.forward(
            target_region="b", base_url=base_url, conversation_id="c1",
            body=b'{"type":"note"}', authorization=f"Bearer {KEY_A}", idempotency_key=None,
            repeatable=False, deadline_s=clock.monotonic() + deadline_s,
        )  # fmt: skip

    async with handshake_never_answered() as (base_url, received):
        try:
            short, long = await asyncio.gather(
                append(base_url, 0.3), append(base_url, 1.0), return_exceptions=True
            )
        finally:
            await batcher.close()
    assert isinstance(short, DeadlineExceeded), repr(short)
    assert "not applied" in str(short)
    # the other one's time ran out with the handshake: never sent either
    assert isinstance(long, DeadlineExceeded | ForwardFailed), repr(long)
    assert received and b"POST" not in received


async def test_a_node_whose_handshake_never_ends_is_passed_over_for_its_sibling(
    tmp_path: Path,
) -> None:
    """A node whose host drops packets never refuses: its connection is not made within the
    connect timeout, far inside the append's deadline. That attempt sent nothing, so the node
    is marked silent (``refused``) and the next attempt goes where ``peer_url`` names now (its
    sibling), which applies it: the append does not wait out its deadline on the dead node."""
    tls = issue_cluster_tls(tmp_path / "tls", ["a", "b"], ["127.0.0.1"])
    clock = LoopClock()
    limits = BatchConfig(batch_max=8, batches_in_flight_max=1, straggler_s=5.0,
                         batches_open_max=2, queue_max=8, retries_max=1, backoff_s=0.01)  # fmt: skip
    silent: list[tuple[str, str]] = []
    sibling = Peer(answering(ndjson(LINES[:1])))

    async def while_reachable(region: str, url: str, call: Coroutine[Any, Any, None]) -> None:
        await call

    async with handshake_never_answered() as (holder_url, received), listening(sibling) as url:
        sibling_url = url.removesuffix(BATCH_PATH)

        def peer_url(region: str, shard: int | None) -> str:
            assert (region, shard) == ("b", 7)
            return sibling_url if silent else holder_url

        exchange = StreamBatchExchange(
            ssl_context=client_ssl_context(tls["a"]), connect_timeout_s=0.2
        )
        batcher = AppendBatcher(
            exchange=exchange, clock=clock, rng=random.Random(1), limits=limits, peer_secret=SECRET,
            source_region="a", while_reachable=while_reachable,
            count=lambda region, outcome: None,
            refused=lambda region, url: silent.append((region, url)), peer_url=peer_url,
        )  # fmt: skip
        try:
            answer = await batcher.forward(
                target_region="b", base_url=holder_url, conversation_id="c1",
                body=b'{"type":"note"}', authorization=f"Bearer {KEY_A}", idempotency_key=None,
                repeatable=False, deadline_s=clock.monotonic() + 60, shard=7,
            )  # fmt: skip
        finally:
            await batcher.close()
            await exchange.close()
    assert answer.status_code == 201
    assert silent == [("b", holder_url)]
    assert received and b"POST" not in received  # the holder got a hello, never the batch
    assert len(sibling.requests) == 1 and b'"conversation_id":"c1"' in sibling.requests[0][1]


async def test_a_batch_still_connecting_when_its_node_is_lost_was_not_applied(
    tmp_path: Path,
) -> None:
    """Its node stopped answering probes (``Forwarder._while_reachable`` gives the batch up)
    while its connection's handshake had not ended: nothing of it left, so its append is
    answered 503 ``forward_failed``, not applied, and not as out of time: its deadline is
    far off."""
    tls = issue_cluster_tls(tmp_path / "tls", ["a", "b"], ["127.0.0.1"])
    clock = LoopClock()
    limits = BatchConfig(batch_max=8, batches_in_flight_max=1, straggler_s=5.0,
                         batches_open_max=2, queue_max=8, retries_max=0, backoff_s=0.1)  # fmt: skip

    async def until_lost(region: str, url: str, call: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(call)
        if not (await asyncio.wait({task}, timeout=0.2))[0]:
            task.cancel()
            raise ConnectionAbortedError(f"{url} stopped answering probes")

    exchange = StreamBatchExchange(ssl_context=client_ssl_context(tls["a"]), connect_timeout_s=60)
    batcher = AppendBatcher(
        exchange=exchange, clock=clock, rng=random.Random(1), limits=limits, peer_secret=SECRET,
        source_region="a", while_reachable=until_lost, count=lambda region, outcome: None,
    )  # fmt: skip
    async with handshake_never_answered() as (base_url, received):
        try:
            with pytest.raises(ForwardFailed, match="not applied"):
                await batcher.forward(
                    target_region="b", base_url=base_url, conversation_id="c1",
                    body=b'{"type":"note"}', authorization=f"Bearer {KEY_A}",
                    idempotency_key=None, repeatable=False, deadline_s=clock.monotonic() + 60,
                )  # fmt: skip
        finally:
            await batcher.close()
            await exchange.close()
    assert b"POST" not in received


async def test_mutual_tls_with_the_clusters_certificates_only(tmp_path: Path) -> None:
    ours = issue_cluster_tls(tmp_path / "ours", ["a", "b"], ["127.0.0.1"])
    theirs = issue_cluster_tls(tmp_path / "theirs", ["a", "b"], ["127.0.0.1"])
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ours["b"].ca_file))
    server.load_cert_chain(str(ours["b"].cert_file), str(ours["b"].key_file))
    server.verify_mode = ssl.CERT_REQUIRED
    peer = Peer(answering(ndjson(LINES)))
    async with listening(peer, server) as url:
        exchange = StreamBatchExchange(ssl_context=client_ssl_context(ours["a"]))
        assert await send(exchange, url) == (None, LINES)
        await exchange.close()
        stranger = StreamBatchExchange(ssl_context=client_ssl_context(theirs["a"]))
        with pytest.raises(BatchNotSent):  # the handshake fails: nothing was sent
            await send(stranger, url)
        await stranger.close()


# --- against a node's real peer listener --------------------------------------------------------


@asynccontextmanager
async def peer_listener() -> AsyncIterator[str]:
    """A node (fake log) served by the node's own peer listener and its gate (without TLS), on
    loopback."""
    clock = node_clock()
    async with AsyncExitStack() as stack:
        peers = await stack.enter_async_context(httpx.AsyncClient())
        config_of_cluster = cluster(SECRET)
        app = build_node("west", SlowLog("west", clock), peers, clock, config_of_cluster)
        gate = PeerListenerGate(
            app, peer_secret=SECRET, regions=[r.name for r in config_of_cluster.regions], tls=False
        )
        limits = ListenerConfig("peer", connections_max=100, header_timeout_s=5.0)
        lifespan = Lifespan(app)
        await lifespan.startup()
        listener = Listener(gate, limits, state=lifespan.state)
        port = await listener.start("127.0.0.1", 0, None)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            listener.stop_accepting()
            await listener.drained()
            await lifespan.shutdown()


def _item(conversation_id: str, key: str | None, body: Any) -> dict[str, Any]:
    return {
        "conversation_id": conversation_id,
        "authorization": f"Bearer {KEY_A}",
        "idempotency_key": key,
        "deadline_ms": 5_000,
        "body": body if isinstance(body, str) else json.dumps(body),
    }


async def test_both_exchanges_get_the_same_answers_from_a_real_listener() -> None:
    west = conversation_led_by("west")
    user = {"type": "message.user", "payload": {"content": "hello"}}
    batches = [
        [_item(west, "k1", user), _item(west, "k2", user)],
        [_item(west, "k1", user), _item(west, "k2", {**user, "expected_seq": 1})],
        [_item(west, None, "not json"), _item(conversation_led_by("east"), None, user)],
        [_item(west, "k1", {**user, "payload": {"content": "other"}})],
    ]
    answers: dict[str, list[Any]] = {}
    for name in ("stream", "httpx"):
        async with peer_listener() as base, httpx.AsyncClient() as client:
            created = await client.post(
                base + "/v1/conversations",
                json={"conversation_id": west},
                headers={**HEADERS, "authorization": f"Bearer {KEY_A}"},
            )
            assert created.status_code == 201, created.text
            exchange: BatchExchange = (
                StreamBatchExchange(ssl_context=None)
                if name == "stream"
                else HttpxBatchExchange(client)
            )
            got = []
            for batch in [*batches, "not a batch"]:
                body = json.dumps({"items": batch}).encode()
                refused, lines = await send(exchange, base + BATCH_PATH, body)
                lines.sort(key=lambda line: line["index"])
                got.append((refused.status, json.loads(refused.body)) if refused else lines)
            await exchange.close()
        answers[name] = got
    assert answers["stream"] == answers["httpx"]
    statuses = [[line["status"] for line in batch] for batch in answers["stream"][:4]]
    assert statuses == [[201, 201], [200, 200], [400, 503], [409]]
    assert answers["stream"][4][0] == 400  # the batch's own refusal
