"""How a node asks a peer for its health: a one-method port, and its HTTP adapter.

The controller only needs "what does region R's node say about itself right now" (its suspects,
the shards it leads, its placement version, its unhealthy loops). ``HttpPeerProber`` asks
``GET /peer/health`` on the peer's listener with the peer secret, over one kept-alive
connection per peer (mutual TLS where the cluster has certificates); the whole-plane simulator
(``services.plane_sim``) answers from the peer controller through its simulated network instead,
so the same controller code runs on virtual time.

The request is one fixed GET and the answer one small JSON object, so the adapter speaks that
much HTTP/1.1 itself over asyncio streams: through httpx a probe cost a node about 3,000 Python
calls (its request and response models, its connection pool, anyio's TLS stream), and a node
probes every peer five times a second, under load and idle alike (``bench/rest.py``: 6-8 % of a
node's calls per append). Everything is bounded: the answer's head and body in bytes, each
probe in time (a connection in an unknown state, after any failure, is closed, never reused).
A connection the peer closed while idle is retried once on a fresh one, as HTTP clients do for
idempotent requests. A drill's black-hole (``services.control.drills.faults``) is asked before each
probe, as its transport is for the node's other peer calls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from eventlog.http_headers import PEER_AUTH_HEADER, SOURCE_REGION_HEADER
from services.peer_protocol import PEER_PROTOCOL_HEADERS, PROTOCOL_REFUSED, PROTOCOL_REFUSED_STATUS

log = logging.getLogger("convplane.peer_protocol")

#: the most bytes of an answer's head and of its body a probe reads
HEAD_BYTES_MAX = 16 * 1024
BODY_BYTES_MAX = 256 * 1024
PROBE_PATH = "/peer/health"
#: a peer's refusal of this node's protocol is logged at most this often per peer
PROTOCOL_REFUSAL_LOG_EVERY_S = 60.0


class PeerProber(Protocol):
    async def health(self, region: str) -> Mapping[str, Any] | None:
        """The peer's health reply, or None when it did not answer (in time, or at all)."""


class OwnedPeerProber(PeerProber, Protocol):
    """A prober the node's runtime built and closes (the controller only asks ``health``)."""

    async def close(self) -> None:
        """Release what it holds (connections)."""


class _Dropped(Exception):
    """The peer closed a kept-alive connection before answering (retry once on a new one)."""


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        self.writer.close()


class HttpPeerProber:
    def __init__(
        self,
        urls: Mapping[str, str],
        *,
        timeout_s: float,
        peer_secret: str | None,
        ssl_context: ssl.SSLContext | None,
        source_region: str,
        blocked: Callable[[str], bool] = lambda region: False,
    ) -> None:
        """``urls``: each region's peer listener; ``source_region``: this node's region (the
        peer listener checks it against our certificate); ``blocked(region)``: whether a
        drill's black-hole drops probes to it now."""
        self._addresses = {region: _address(url) for region, url in urls.items()}
        self._tls = {region: urlsplit(url).scheme == "https" for region, url in urls.items()}
        self._timeout_s = timeout_s
        self._ssl = ssl_context
        self._blocked = blocked
        self._idle: dict[str, _Connection] = {}  # kept alive between probes, one per peer
        self._refusal_logged_s: dict[str, float] = {}
        self._requests = {
            region: _request_bytes(host, port, peer_secret, source_region)
            for region, (host, port) in self._addresses.items()
        }

    async def health(self, region: str) -> Mapping[str, Any] | None:
        if self._blocked(region) or region not in self._addresses:
            return None
        try:
            async with asyncio.timeout(self._timeout_s):
                connection = self._idle.pop(region, None)
                if connection is not None:
                    try:
                        return await self._ask(region, connection)
                    except (_Dropped, OSError):
                        pass  # closed on the peer's side while idle: once more, on a new one
                return await self._ask(region, await self._connect(region))
        except (
            OSError,
            TimeoutError,
            ValueError,
            _Dropped,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            return None

    async def close(self) -> None:
        for connection in self._idle.values():
            connection.close()
        self._idle.clear()

    async def _connect(self, region: str) -> _Connection:
        host, port = self._addresses[region]
        context = None
        if self._tls[region]:  # the cluster's mutual TLS, else the system's trust store
            context = self._ssl or ssl.create_default_context()
        reader, writer = await asyncio.open_connection(
            host,
            port,
            ssl=context,
            server_hostname=host if context else None,
            limit=HEAD_BYTES_MAX,
        )
        return _Connection(reader, writer)

    async def _ask(self, region: str, connection: _Connection) -> Mapping[str, Any] | None:
        """One exchange; the connection goes back for the next probe only if it ended clean."""
        try:
            connection.writer.write(self._requests[region])
            try:
                head = await connection.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as dropped:
                if not dropped.partial:
                    raise _Dropped from None
                raise
            status, length, keep_alive = _parse_head(head)
            body = await connection.reader.readexactly(length)
        except BaseException:
            connection.close()
            raise
        if keep_alive:
            self._idle[region] = connection
        else:
            connection.close()
        if status == PROTOCOL_REFUSED_STATUS:
            self._surface_refusal(region, body)
        if status != 200:
            return None
        value = json.loads(body)
        return value if isinstance(value, dict) else None

    def _surface_refusal(self, region: str, body: bytes) -> None:
        """A peer outside this node's protocol window answers every probe so: say why, once a
        minute (the probe is not retried sooner than its period; the region counts as not
        answering, so its shards move to regions that can serve them)."""
        try:
            error = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            return
        if not isinstance(error, dict) or error.get("code") != PROTOCOL_REFUSED:
            return
        now_s = time.monotonic()
        if now_s - self._refusal_logged_s.get(region, -PROTOCOL_REFUSAL_LOG_EVERY_S) >= (
            PROTOCOL_REFUSAL_LOG_EVERY_S
        ):
            self._refusal_logged_s[region] = now_s
            log.error("region %s refuses this node's peer calls: %s", region, error.get("message"))


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    return host, parts.port or (443 if parts.scheme == "https" else 80)


def _request_bytes(host: str, port: int, peer_secret: str | None, source_region: str) -> bytes:
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 address
    lines = [f"GET {PROBE_PATH} HTTP/1.1", f"host: {authority}", "accept: application/json"]
    lines.append(f"{SOURCE_REGION_HEADER.lower()}: {source_region}")
    lines += [f"{name.lower()}: {value}" for name, value in PEER_PROTOCOL_HEADERS.items()]
    if peer_secret:
        lines.append(f"{PEER_AUTH_HEADER.lower()}: {peer_secret}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _parse_head(head: bytes) -> tuple[int, int, bool]:
    """(status, body length, whether the connection stays open) of an answer's head; a
    ValueError where it is not what a node answers (a status line and a Content-Length)."""
    status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise ValueError(f"not an HTTP answer: {status_line[:80]!r}")
    status = int(rest.partition(" ")[0])
    length: int | None = None
    keep_alive = version == "HTTP/1.1"
    for line in lines:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "connection":
            keep_alive = "close" not in value
        elif name == "transfer-encoding":
            raise ValueError("a chunked health answer")
    if length is None or not 0 <= length <= BODY_BYTES_MAX:
        raise ValueError(f"health answer length {length}")
    return status, length, keep_alive
