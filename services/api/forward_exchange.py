"""How an entry node sends a forward batch to its leader: the ``BatchExchange`` port of
``services.api.forward_batch``, and its two adapters.

``StreamBatchExchange`` is what a node uses. A batch is one ``POST /peer/forwarded-appends``
whose answer streams back as NDJSON, one line per item, and the adapter speaks that much
HTTP/1.1 itself: the request written in one piece over a kept-alive connection of its own
(asyncio streams: uvloop's TLS, mutual TLS where the cluster has certificates), the answer parsed
by ``httptools`` (C, the parser uvicorn uses; chunked or ``Content-Length``). Through httpx a
batch cost a forwarding entry node about an eighth of its CPU (``bench/rest.py --py-spy``:
httpx's request and response models, httpcore's pool, anyio's TLS stream, written in Python,
and its line iterator).

``HttpxBatchExchange`` sends the same request through an ``httpx.AsyncClient``: for nodes whose
peers are in-process ASGI apps (the unit tests' planes), which no socket reaches.

The batch's body is built by a callback (``BodyBuilder``) at the last moment before its first
byte is written: after the connection is ready (a TCP and TLS handshake can take a while). So an
item whose caller's deadline passed during the handshake is not in it (the batcher answers it
504, not applied), and the deadlines the others carry count from when they leave.

Outcomes, for the batcher: ``BatchNotSent`` when nothing of the batch left this node (no
connection could be made: refused, failed, or not made in time; or a drill's black-hole drops
calls to the region): safe to send again; the body was never built. ``BatchLost`` when it left
and its answer did not come back whole (the connection broke, the answer was malformed or too
long, the time ran out): what was not answered is unknown. Otherwise the answer lines went to
``on_line`` as they arrived and ``send`` returns None, or the batch's own refusal (any other
status or content type) is returned whole.

Bounds: an answer's head ``HEAD_BYTES_MAX``, an answer line ``LINE_BYTES_MAX``, a refusal's body
``REFUSAL_BYTES_MAX``, kept connections ``idle_max`` per region, a connection reused only while
it has been idle less than ``idle_reuse_s`` (``idle_reuse_s()``: at most ``IDLE_REUSE_S``, and
half the peer listener's ``header_timeout_s``, after which the peer closes it) and never after
any failure. Idle counts from when the connection was made or last answered, as the peer counts
it: a batch that sent nothing on a connection does not restart that time. A connection the peer
already closed is never reused, and a lost batch drops the region's other kept connections too.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import httptools
import httpx

#: an answer's head (its header names and values), at most
HEAD_BYTES_MAX = 16 * 1024
#: an answer line, at most (an item's answer is a small JSON object)
LINE_BYTES_MAX = 1024 * 1024
#: the body of a batch's refusal, at most (an error object)
REFUSAL_BYTES_MAX = 64 * 1024
#: a kept connection idle this long is closed, not reused (well under a listener's 5 s)
IDLE_REUSE_S = 2.0
#: kept connections per region, at most (as many as batches a region may have open)
IDLE_MAX = 16
#: a connection (its TCP and TLS handshake) not made within this sent nothing: the batcher
#: passes over the node (``NodeSettings.forward_connect_timeout_s``)
CONNECT_TIMEOUT_S = 0.5
_READ_BYTES = 64 * 1024
NDJSON = "application/x-ndjson"


def idle_reuse_s(header_timeout_s: float) -> float:
    """How long a kept connection to a peer listener may sit idle and still be reused: well
    inside the listener's own idle close (``header_timeout_s``, a node setting, assumed the same
    on every node of a cluster: ``services.listeners``' header timeout), so that no request is
    written as the peer closes the connection."""
    return min(IDLE_REUSE_S, header_timeout_s / 2)


LineSink = Callable[[bytes], None]
#: the batch's body, built when the request is about to be written; None: nothing left to send
BodyBuilder = Callable[[], bytes | None]


class BatchNotSent(Exception):
    """Nothing of the batch left this node: sending it again is safe."""


class BatchLost(Exception):
    """The batch left and its answer did not come back whole: unanswered items are unknown."""


class _PeerClosed(BatchLost):
    """The peer closed the connection before its answer ended (it restarted, or closed
    connections past its cap): the region's other kept connections may be closed too."""


@dataclass(frozen=True)
class BatchRefused:
    """The batch's own answer (not NDJSON): every item's. Header names lower-cased."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class BatchExchange(Protocol):
    async def send(
        self,
        region: str,
        url: str,
        body: BodyBuilder,
        headers: Mapping[str, str],
        timeout_s: float,
        on_line: LineSink,
    ) -> BatchRefused | None:
        """POST the body ``body()`` builds once a connection is ready to ``url`` (``region``'s
        peer listener) within ``timeout_s`` (when it builds None, nothing is sent and None is
        returned); each NDJSON answer line to ``on_line``; raises ``BatchNotSent`` or
        ``BatchLost``. ``on_line`` may raise ``BatchLost`` (a malformed line): the adapter
        lets it through as it is and does not keep the connection."""

    async def close(self) -> None:
        """Close kept connections."""


# --- over httpx (in-process peers) ---------------------------------------------------------


class HttpxBatchExchange:
    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        blocked: Callable[[str], bool] = lambda region: False,
        owned: bool = False,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        """``blocked``, ``connect_timeout_s``: as ``StreamBatchExchange``'s; ``owned``:
        ``close`` closes ``client``."""
        self._client = client
        self._connect_timeout_s = connect_timeout_s
        self._blocked = blocked
        self._owned = owned

    async def send(
        self,
        region: str,
        url: str,
        body: BodyBuilder,
        headers: Mapping[str, str],
        timeout_s: float,
        on_line: LineSink,
    ) -> BatchRefused | None:
        if self._blocked(region):
            raise BatchNotSent(f"{region} is black-holed by a drill")
        content = body()  # in-process peers: no connection to wait for
        if content is None:
            return None
        try:
            async with self._client.stream(
                "POST",
                url,
                content=content,
                headers=dict(headers),
                timeout=httpx.Timeout(timeout_s, connect=min(self._connect_timeout_s, timeout_s)),
            ) as reply:
                content_type = reply.headers.get("content-type", "")
                if reply.status_code != 200 or not content_type.startswith(NDJSON):
                    answer = {k.lower(): v for k, v in reply.headers.items()}
                    return BatchRefused(reply.status_code, answer, await reply.aread())
                async for line in reply.aiter_lines():
                    if line:
                        on_line(line.encode())
                return None
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing was sent
            raise BatchNotSent(f"{region}: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise BatchLost(f"{region}: {exc!r}") from exc

    async def close(self) -> None:
        if self._owned:
            await self._client.aclose()


# --- over connections of its own -------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    tls: bool
    head: bytes  # the request line and the fixed headers, ending before content-length


@dataclass(eq=False)  # by identity: kept in sets
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    #: since when the peer waits for a request on it (it connected, or it answered one): the
    #: peer listener's keep-alive time runs from there
    idle_since_s: float
    #: the node it reaches (``host``, ``port``): a region's leading node may change
    address: tuple[str, int] = ("", 0)

    def close(self) -> None:
        self.writer.close()

    def reusable(self, now_s: float, idle_reuse_s: float) -> bool:
        return (
            now_s - self.idle_since_s < idle_reuse_s
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )


@dataclass
class _Answer:
    """``httptools`` callbacks: the head, then the body as lines (NDJSON) or whole (refusal).
    An answer that breaks a bound is ``broken`` (lost); bytes after it are ``extra`` (the
    answer stands, the connection is not kept)."""

    parser: httptools.HttpResponseParser | None = None
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    head_bytes: int = 0
    streaming: bool = False
    pending: bytearray = field(default_factory=bytearray)
    lines: list[bytes] = field(default_factory=list)
    refusal: bytearray = field(default_factory=bytearray)
    complete: bool = False
    keep_alive: bool = False
    broken: str | None = None  # a bound broken: the answer is lost
    extra: bool = False  # bytes after the answer: the connection is not kept

    def on_message_begin(self) -> None:
        if self.complete:
            self.extra = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.complete or self.broken:
            return
        self.head_bytes += len(name) + len(value)
        if self.head_bytes > HEAD_BYTES_MAX:
            self.broken = f"an answer head longer than {HEAD_BYTES_MAX} bytes"
            return
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self.complete or self.parser is None:
            return
        self.status = self.parser.get_status_code()
        content_type = self.headers.get("content-type", "")
        self.streaming = self.status == 200 and content_type.startswith(NDJSON)

    def on_body(self, body: bytes) -> None:
        if self.complete or self.broken:
            return
        if not self.streaming:
            self.refusal += body
            if len(self.refusal) > REFUSAL_BYTES_MAX:
                self.broken = f"a batch refusal longer than {REFUSAL_BYTES_MAX} bytes"
            return
        self.pending += body
        *whole, rest = self.pending.split(b"\n")
        self.lines += [bytes(line) for line in whole if line]
        self.pending = bytearray(rest)
        if len(self.pending) > LINE_BYTES_MAX or any(len(x) > LINE_BYTES_MAX for x in whole):
            self.broken = f"an answer line longer than {LINE_BYTES_MAX} bytes"

    def on_message_complete(self) -> None:
        if self.complete or self.parser is None:
            return
        self.keep_alive = self.parser.should_keep_alive()  # llhttp forgets it afterwards
        if self.streaming and self.pending:
            self.lines.append(bytes(self.pending))
            self.pending = bytearray()
        self.complete = True


class StreamBatchExchange:
    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None,
        blocked: Callable[[str], bool] = lambda region: False,
        idle_max: int = IDLE_MAX,
        idle_reuse_s: float = IDLE_REUSE_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        """``ssl_context``: the cluster's client context for ``https`` peers (None: the
        system's trust store); ``blocked(region)``: whether a drill's black-hole drops calls to
        it now; ``idle_reuse_s``: ``idle_reuse_s(header_timeout_s)`` of the cluster;
        ``connect_timeout_s``: a connection not made within it sent nothing."""
        self._ssl = ssl_context
        self._connect_timeout_s = connect_timeout_s
        self._blocked = blocked
        self._idle_max = idle_max
        self._idle_reuse_s = idle_reuse_s
        self._targets: dict[tuple[str, ...], _Target] = {}  # by URL and headers
        self._idle: dict[str, list[_Connection]] = {}
        self._open: set[_Connection] = set()

    async def send(
        self,
        region: str,
        url: str,
        body: BodyBuilder,
        headers: Mapping[str, str],
        timeout_s: float,
        on_line: LineSink,
    ) -> BatchRefused | None:
        if self._blocked(region):
            raise BatchNotSent(f"{region} is black-holed by a drill")
        target = self._target(url, headers)
        sent = False  # whether any byte of the request may have left
        try:
            async with asyncio.timeout(timeout_s):
                connection = self._kept(region, target) or await self._connect(region, target)
                try:
                    content = body()
                    if content is None:  # every item was answered while it connected
                        self._keep(region, connection, answered=False)
                        return None
                    sent = True
                    connection.writer.write(
                        target.head + b"content-length: %d\r\n\r\n" % len(content) + content
                    )
                    refused = await self._read(region, connection, on_line)
                except BaseException:
                    self._discard(connection)
                    raise
        except TimeoutError as exc:
            if not sent:  # the connection (its TCP or TLS handshake) did not come in time
                raise BatchNotSent(f"{region}: no connection within {timeout_s:.3f} s") from exc
            raise BatchLost(f"{region}: no whole answer within {timeout_s:.3f} s") from exc
        except OSError as exc:  # the connection broke
            self._drop_idle(region)
            raise BatchLost(f"{region}: {exc!r}") from exc
        except (httptools.HttpParserError, UnicodeDecodeError) as exc:
            raise BatchLost(f"{region}: {exc!r}") from exc
        except _PeerClosed:
            self._drop_idle(region)
            raise
        return refused

    async def close(self) -> None:
        for connection in list(self._open):
            self._discard(connection)
        self._idle.clear()

    def _target(self, url: str, headers: Mapping[str, str]) -> _Target:
        key = (url, *(f"{name}: {value}" for name, value in headers.items()))
        target = self._targets.get(key)
        if target is None:
            parts = urlsplit(url)
            tls = parts.scheme == "https"
            host = parts.hostname or "127.0.0.1"
            port = parts.port or (443 if tls else 80)
            authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            lines = [f"POST {parts.path or '/'} HTTP/1.1", f"host: {authority}"]
            lines += [f"{name.lower()}: {value}" for name, value in headers.items()]
            head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
            target = self._targets[key] = _Target(host, port, tls, head)
        return target

    def _kept(self, region: str, target: _Target) -> _Connection | None:
        idle = self._idle.get(region)
        now_s = time.monotonic()
        while idle:
            connection = idle.pop()  # the most recently used: the likeliest to be alive
            if connection.address == (target.host, target.port) and connection.reusable(
                now_s, self._idle_reuse_s
            ):
                return connection
            self._discard(connection)
        return None

    async def _connect(self, region: str, target: _Target) -> _Connection:
        context = None
        if target.tls:  # the cluster's mutual TLS, else the system's trust store
            context = self._ssl or ssl.create_default_context()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                reader, writer = await asyncio.open_connection(
                    target.host,
                    target.port,
                    ssl=context,
                    server_hostname=target.host if context else None,
                )
        except TimeoutError as exc:  # dropped packets, or a handshake that never ends (an
            # OSError too: caught first)
            raise BatchNotSent(
                f"{region}: no connection within {self._connect_timeout_s:.3f} s"
            ) from exc
        except OSError as exc:  # refused, unreachable, a failed handshake: nothing was sent
            raise BatchNotSent(f"{region}: {exc!r}") from exc
        connection = _Connection(reader, writer, time.monotonic(), (target.host, target.port))
        self._open.add(connection)
        return connection

    async def _read(
        self, region: str, connection: _Connection, on_line: LineSink
    ) -> BatchRefused | None:
        answer = _Answer()
        parser = answer.parser = httptools.HttpResponseParser(answer)
        while not answer.complete:
            data = await connection.reader.read(_READ_BYTES)
            if not data:
                raise _PeerClosed("the peer closed the connection before its answer ended")
            parser.feed_data(data)
            if answer.broken:
                raise BatchLost(answer.broken)
            lines, answer.lines = answer.lines, []
            for line in lines:
                on_line(line)
        if answer.keep_alive and not answer.extra:
            self._keep(region, connection)
        else:
            self._discard(connection)
        if answer.streaming:
            return None
        return BatchRefused(answer.status, answer.headers, bytes(answer.refusal))

    def _keep(self, region: str, connection: _Connection, *, answered: bool = True) -> None:
        """Back to the region's idle connections, for the next batch. ``answered``: the peer
        just answered a request on it (its idle time starts now); else nothing was sent, and
        its idle time runs on from where it was."""
        idle = self._idle.setdefault(region, [])
        if len(idle) >= self._idle_max:
            self._discard(connection)
            return
        if answered:
            connection.idle_since_s = time.monotonic()
        idle.append(connection)

    def _drop_idle(self, region: str) -> None:
        """After a batch lost to a broken or closed connection: the region's other kept
        connections may be broken the same way (the peer restarted, or closed connections past
        its cap), so a batch sent again goes on a new one. (Not after a timeout or a malformed
        answer: those say nothing of the other connections.)"""
        for connection in self._idle.pop(region, []):
            self._discard(connection)

    def _discard(self, connection: _Connection) -> None:
        connection.close()
        self._open.discard(connection)
