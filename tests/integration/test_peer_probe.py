"""The peer prober's own HTTP/1.1 (``services.control.peer_probe``) against a real listener on loopback
that answers the way a node's peer listener may, well and badly: kept-alive connections, a
connection the peer closed while idle, ``Connection: close``, other statuses, bodies that are
not a health object, answers too long or chunked, a peer that never answers, and mutual TLS with
the cluster's certificates (and with a stranger's)."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from services.cluster_tls import client_ssl_context, issue_cluster_tls
from services.control.peer_probe import BODY_BYTES_MAX, HttpPeerProber
from services.peer_protocol import PROTOCOL_REFUSED

HEALTH = {"region": "b", "suspects": [], "led_shards": [1, 2]}
SECRET = "peer-secret-for-the-probe-test"
TIMEOUT_S = 2.0

Answer = Callable[[bytes], Awaitable[bytes | None]]


def answer_of(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


HEALTHY = answer_of(json.dumps(HEALTH).encode())


class Peer:
    """A listener that answers each request with what ``answer`` returns (None: close the
    connection without answering) and records what it was sent."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.close_after_answer = False

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                data = await self.answer(head)
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
        yield f"{'https' if server_ssl else 'http'}://127.0.0.1:{port}"
    finally:
        server.close()


def prober(url: str, client_ssl: ssl.SSLContext | None = None) -> HttpPeerProber:
    return HttpPeerProber(
        {"b": url},
        timeout_s=TIMEOUT_S,
        peer_secret=SECRET,
        ssl_context=client_ssl,
        source_region="a",
    )


async def healthy(_: bytes) -> bytes:
    return HEALTHY


async def test_probes_share_one_kept_alive_connection_and_carry_the_secret() -> None:
    peer = Peer(healthy)
    async with listening(peer) as url:
        probe = prober(url)
        for _ in range(3):
            assert await probe.health("b") == HEALTH
        await probe.close()
    assert peer.connections == 1
    assert all(f"x-convplane-peer-auth: {SECRET}".encode() in r for r in peer.requests)
    # and name their own region, which the peer listener checks against the certificate
    assert all(b"x-convplane-source-region: a\r\n" in r for r in peer.requests)
    assert all(r.startswith(b"GET /peer/health HTTP/1.1\r\n") for r in peer.requests)


async def test_a_connection_closed_while_idle_or_by_the_answer_is_replaced() -> None:
    peer = Peer(healthy)
    async with listening(peer) as url:
        probe = prober(url)
        peer.close_after_answer = True  # as a peer whose keep-alive timeout passed
        for _ in range(3):
            assert await probe.health("b") == HEALTH
        peer.close_after_answer = False

        async def closing(_: bytes) -> bytes:
            return answer_of(json.dumps(HEALTH).encode(), extra="connection: close\r\n")

        peer.answer = closing
        assert await probe.health("b") == HEALTH
        assert await probe.health("b") == HEALTH
        await probe.close()
    assert peer.connections == 5


@pytest.mark.parametrize(
    "bad",
    [
        answer_of(b'{"error": {}}', status="401 Unauthorized"),
        answer_of(b"[1, 2]"),
        answer_of(b"not json"),
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: " + str(BODY_BYTES_MAX + 1).encode() + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx-filler: " + b"a" * 20_000 + b"\r\ncontent-length: 2\r\n\r\n{}",
        b"SSH-2.0-OpenSSH\r\n\r\n",
    ],
)
async def test_an_answer_that_is_not_a_health_object_is_no_answer(bad: bytes) -> None:
    async def answer(_: bytes) -> bytes:
        return bad

    peer = Peer(answer)
    async with listening(peer) as url:
        probe = prober(url)
        assert await probe.health("b") is None
        peer.answer = healthy
        assert await probe.health("b") == HEALTH  # and the next probe starts clean
        await probe.close()


async def test_a_peer_that_never_answers_costs_one_timeout() -> None:
    async def silent(_: bytes) -> bytes:
        await asyncio.sleep(3600)
        return HEALTHY

    peer = Peer(silent)
    async with listening(peer) as url:
        probe = HttpPeerProber(
            {"b": url}, timeout_s=0.2, peer_secret=None, ssl_context=None, source_region="a"
        )
        assert await probe.health("b") is None
        await probe.close()


async def test_nobody_listening_is_no_answer() -> None:
    probe = prober("http://127.0.0.1:9")  # discard: nothing listens there
    assert await probe.health("b") is None
    assert await probe.health("nowhere") is None


async def test_mutual_tls_with_the_clusters_certificates_only(tmp_path: Path) -> None:
    ours = issue_cluster_tls(tmp_path / "ours", ["a", "b"], ["127.0.0.1"])
    theirs = issue_cluster_tls(tmp_path / "theirs", ["a", "b"], ["127.0.0.1"])
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ours["b"].ca_file))
    server.load_cert_chain(str(ours["b"].cert_file), str(ours["b"].key_file))
    server.verify_mode = ssl.CERT_REQUIRED
    peer = Peer(healthy)
    async with listening(peer, server) as url:
        probe = prober(url, client_ssl_context(ours["a"]))
        assert await probe.health("b") == HEALTH
        await probe.close()
        stranger = prober(url, client_ssl_context(theirs["a"]))
        assert await stranger.health("b") is None
        await stranger.close()


async def test_a_peer_refusing_this_nodes_protocol_is_not_answering_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A peer outside this node's protocol window (``services.peer_protocol``) answers every
    probe 409: the probe counts it as no answer, sends nothing more for it, and logs the
    peer's reason once (not once per probe)."""
    reason = "region a speaks peer protocol 2, older than this node serves (...)"
    refused = answer_of(
        json.dumps({"error": {"code": PROTOCOL_REFUSED, "message": reason,
                              "retryable": False}}).encode(),
        status="409 Conflict",
    )  # fmt: skip

    async def refusing(_: bytes) -> bytes:
        return refused

    peer = Peer(refusing)
    with caplog.at_level(logging.ERROR, logger="convplane.peer_protocol"):
        async with listening(peer) as url:
            probe = prober(url)
            for _ in range(3):
                assert await probe.health("b") is None
            await probe.close()
    assert len(peer.requests) == 3  # one request per probe: no retry
    assert all(b"x-convplane-peer-protocol: " in r for r in peer.requests)
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"region b refuses this node's peer calls: {reason}"]
