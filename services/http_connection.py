"""One HTTP/1.1 connection of a node's listener: the ``asyncio.Protocol`` that parses it (with
``httptools``, llhttp in C) and answers each request, by the fast lane or by the ASGI app.

The node owns this protocol instead of running uvicorn's: what a listener must do per connection
(``services.listeners``: the head's byte bound, the header timeout, the idle connections it may
close, the peer certificate's region, one send per response) and the fast lane's hand-off
straight from the parser have no public hook in uvicorn, whose protocol classes are private
(``uvicorn.protocols``: subclassing them tied the hot path to the next release). What is left
is small and all public: ``asyncio``'s protocol and transport, ``httptools``' parser callbacks,
and the ASGI 3 HTTP spec towards the app (``services.asgi_cycle``).

Requests of a connection are answered one at a time, in order (HTTP/1.1 pipelining): a request
parsed while another is answered waits in ``_pipeline`` (and reading pauses) until the one before
it completes. The fast lane takes a request only when nothing else of the connection is under way
and its whole body came with its head (``services.api.fast_lane``: ``eligible``, ``prepare``,
``serve``); anything it does not take goes to the app as if the lane had never looked at it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from collections import deque
from collections.abc import Coroutine, MutableMapping
from typing import Any, Protocol, cast

import httptools
from starlette.types import ASGIApp

from eventlog.errors import error_body
from services.api.fast_lane import FastLane, LaneRequest, LaneResponse, Respond
from services.api.peer_trust import CERT_REGION_SCOPE_KEY
from services.asgi_cycle import STATUS_LINE, AppCycle
from services.cluster_tls import region_of_certificate

log = logging.getLogger("convplane.http")

#: a request body buffered past this many bytes pauses reading until the app takes it
BODY_BUFFER_BYTES_MAX = 64 * 1024
#: what the parser's refusal says (the JSON 400 of ``_refuse_malformed``)
MALFORMED_MESSAGE = "Invalid HTTP request received."
_ASGI = {"version": "3.0", "spec_version": "2.3"}


class Limits(Protocol):
    """A listener's bounds on each connection (``services.listeners.ListenerConfig``)."""

    @property
    def name(self) -> str: ...
    @property
    def header_timeout_s(self) -> float: ...
    @property
    def header_bytes_max(self) -> int: ...
    @property
    def send_timeout_s(self) -> float: ...


class ListenerSide(Protocol):
    """What a connection needs of its listener (``services.listeners.Listener``)."""

    @property
    def app(self) -> ASGIApp: ...
    @property
    def limits(self) -> Limits: ...
    @property
    def lane(self) -> FastLane | None: ...

    state: dict[str, Any]
    #: connections with no request under way, oldest first
    idle: dict[Connection, None]

    def admit(self, connection: Connection) -> bool: ...
    def forget(self, connection: Connection) -> None: ...
    def run(self, work: Coroutine[Any, Any, None]) -> None: ...
    def default_headers(self) -> list[tuple[bytes, bytes]]: ...


class Connection(asyncio.Protocol):
    """One client's connection to ``listener`` (module docstring)."""

    def __init__(self, listener: ListenerSide) -> None:
        self.listener = listener
        self._limits = listener.limits
        #: what a response the client does not take may wait (``CycleOwner``)
        self.send_timeout_s = listener.limits.send_timeout_s
        self.default_headers = listener.default_headers
        self._lane = listener.lane
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self._parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self._server: tuple[str, int] | None = None
        self._client: tuple[str, int] | None = None
        self._scheme = "http"
        self._cert_region: str | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._reading = True
        self._header_timer: asyncio.TimerHandle | None = None
        #: what the request head under way may still take, in bytes; None: its body is
        #: arriving (a head is only counted until it completes)
        self._head_bytes_left: int | None = self._limits.header_bytes_max
        # the request being parsed
        self._url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self._scope: dict[str, Any] = {}
        self._expect_100 = False
        #: a request the lane may take, its head parsed, its body (if any) arriving
        self._lane_pending: LaneRequest | None = None
        #: the app's request whose body is arriving (it may be answered already, or wait)
        self._receiving: AppCycle | None = None
        #: the request being answered; None: none is
        self.cycle: AppCycle | _LaneCycle | None = None
        #: requests parsed while another is answered, oldest first
        self._pipeline: deque[AppCycle] = deque()

    # --- the transport's side --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        transport = cast(asyncio.Transport, transport)
        self._server = _address(transport.get_extra_info("sockname"))
        self._client = _address(transport.get_extra_info("peername"))
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            self._scheme = "https"
            self._cert_region = region_of_certificate(ssl_object.getpeercert())
        self.transport = CoalescedWrites(transport, self._loop)  # type: ignore[assignment]
        if not self.listener.admit(self):
            transport.abort()
            return
        self._await_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.forget(self)
        self._stop_waiting()
        for cycle in (self.cycle, self._receiving, *self._pipeline):
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
            if isinstance(cycle, AppCycle):
                cycle.message_event.set()
        self._pipeline.clear()
        self._writable.set()  # a writer waiting to drain finds the connection gone
        if exc is None:
            self.transport.close()

    def eof_received(self) -> None:
        pass

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    @property
    def write_paused(self) -> bool:
        return not self._writable.is_set()

    async def drain(self) -> None:
        await self._writable.wait()

    def pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        """Parse ``data``, but no more of a request head than ``header_bytes_max``."""
        while data:
            left = self._head_bytes_left
            if left is None or len(data) <= left:
                if left is not None:
                    self._head_bytes_left = left - len(data)
                self._parse(data)
                return
            self._head_bytes_left = 0
            self._parse(data[:left])
            if self._head_bytes_left == 0 or self.transport.is_closing():
                self._refuse_head()  # the head went on past its bound
                return
            data = data[left:]  # the head ended within the bound: parse on

    def _parse(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no protocol to upgrade to: the request was answered as plain HTTP
        except httptools.HttpParserError:
            log.warning("%s listener: %s", self._limits.name, MALFORMED_MESSAGE)
            self._refuse_malformed()
            return
        pending, self._lane_pending = self._lane_pending, None
        if pending is not None:  # its body did not come with its head: the app takes it
            self._hand_to_app(pending, complete=False)

    def shutdown(self) -> None:
        """The node stops: close now if idle, else after the answer under way."""
        if self.cycle is None:
            self.transport.close()
            return
        self.cycle.keep_alive = False
        for cycle in self._pipeline:
            cycle.keep_alive = False

    # --- the parser's callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self.headers = []
        self._expect_100 = False
        self._scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": "1.1",
            "server": self._server,
            "client": self._client,
            "scheme": self._scheme,
            "root_path": "",
            "headers": self.headers,
            "state": self.listener.state.copy(),
            CERT_REGION_SCOPE_KEY: self._cert_region,
        }

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        value = value.rstrip(b" \t")  # llhttp keeps trailing whitespace (RFC 9110 5.5: not)
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_100 = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._head_bytes_left = None
        self._stop_waiting()  # the body and the answer are bounded by the app and the lane
        parser = self._parser
        method = parser.get_method()
        http_version = parser.get_http_version()
        keep_alive = http_version != "1.0" and parser.should_keep_alive()
        if self._lane is not None and self.cycle is None:
            try:
                pending = self._lane.eligible(
                    self._scope, method, http_version, self._url, keep_alive
                )
            except Exception:  # a bug in the lane must not become the parser's 400
                log.exception("fast lane: eligible failed; the app serves the request")
                pending = None
            if pending is not None:
                self._lane_pending = pending
                return
        self._to_app(self._scope, method, http_version, self._url, keep_alive)

    def on_body(self, body: bytes) -> None:
        if self._lane_pending is not None:
            self._lane_pending.body += body
            return
        cycle = self._receiving
        if cycle is None or cycle.response_complete:
            return
        cycle.body += body
        if len(cycle.body) > BODY_BUFFER_BYTES_MAX:
            self.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        self._head_bytes_left = self._limits.header_bytes_max  # the next request's head
        pending, self._lane_pending = self._lane_pending, None
        if pending is not None:
            self._to_lane(pending)
            return
        cycle, self._receiving = self._receiving, None
        if cycle is not None and not cycle.response_complete:
            cycle.more_body = False
            cycle.message_event.set()

    # --- the app's way -------------------------------------------------------------------------

    def _to_app(
        self,
        scope: MutableMapping[str, Any],
        method: bytes,
        http_version: str,
        url: bytes,
        keep_alive: bool,
    ) -> None:
        """A request for the app: its scope completed as the ASGI spec says, then answered now
        or after the requests before it."""
        scope["method"] = method.decode("ascii")
        scope["http_version"] = http_version
        parsed = httptools.parse_url(url)
        raw_path = parsed.path
        path = raw_path.decode("ascii")
        scope["path"] = urllib.parse.unquote(path) if "%" in path else path
        scope["raw_path"] = raw_path
        scope["query_string"] = parsed.query or b""
        cycle = AppCycle(self, scope, keep_alive=keep_alive, expect_100=self._expect_100)
        self._receiving = cycle
        if self.cycle is None:
            self._start(cycle)
        else:  # pipelined: it waits its turn, and reading pauses meanwhile
            self.pause_reading()
            self._pipeline.append(cycle)

    def _hand_to_app(self, pending: LaneRequest, *, complete: bool) -> None:
        """The request goes the app's way, as if the lane had never looked at it."""
        scope = pending.scope
        method = scope["method"].encode("ascii")
        url = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
        self._to_app(scope, method, "1.1", url, pending.keep_alive)
        if pending.body:
            self.on_body(bytes(pending.body))
        if complete:
            self.on_message_complete()

    def _start(self, cycle: AppCycle) -> None:
        self.cycle = cycle
        self.listener.run(cycle.run_asgi(self.listener.app))

    # --- the lane's way ------------------------------------------------------------------------

    def _to_lane(self, pending: LaneRequest) -> None:
        assert self._lane is not None
        try:
            prepared = self._lane.prepare(pending)
        except Exception:  # a bug in the lane must not become the parser's 400
            log.exception("fast lane: prepare failed; the app serves the request")
            prepared = None
        if prepared is None:
            self._hand_to_app(pending, complete=True)
            return
        cycle = _LaneCycle(pending.keep_alive)
        self.cycle = cycle
        self.listener.run(self._lane.serve(prepared, self._responder(cycle)))

    def _responder(self, cycle: _LaneCycle) -> Respond:
        async def respond(response: LaneResponse) -> bool:
            """Write the answer in one piece; False: a reader too slow to take it within
            ``send_timeout_s`` lost its connection."""
            if cycle.disconnected:
                return True  # nobody to answer
            if self.write_paused:
                try:
                    async with asyncio.timeout(self._limits.send_timeout_s):
                        await self.drain()
                except TimeoutError:
                    self.transport.close()
                    return False
                if cycle.disconnected:
                    return True
            says_close = response.says_close
            keep_alive = cycle.keep_alive and not says_close and not response.close
            head = [STATUS_LINE[response.status]]
            for name, value in (*self.default_headers(), *response.headers):
                head += [name, b": ", value, b"\r\n"]
            if not cycle.keep_alive and not says_close:
                head.append(b"connection: close\r\n")
            head += [b"\r\n", response.body]
            self.transport.write(b"".join(head))
            cycle.response_complete = True
            if not keep_alive:
                self.transport.close()
            self.answered()
            return True

        return respond

    # --- between requests -------------------------------------------------------------------

    def answered(self) -> None:
        """The answer under way is written: the next request's turn, or wait for one."""
        self.cycle = None
        if self.transport.is_closing():
            return
        self.resume_reading()
        if self._pipeline:
            self._start(self._pipeline.popleft())
        else:
            self._await_request()

    def _await_request(self) -> None:
        """Idle: a request head must come within ``header_timeout_s``, and the listener may
        close this connection for a new one."""
        self._stop_waiting()
        self._header_timer = self._loop.call_later(self._limits.header_timeout_s, self._timed_out)
        self.listener.idle[self] = None

    def _stop_waiting(self) -> None:
        self.listener.idle.pop(self, None)
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _timed_out(self) -> None:
        self._header_timer = None
        self.listener.idle.pop(self, None)
        if not self.transport.is_closing():
            self.transport.close()

    def evict(self) -> None:
        """Closed for a new connection (this one is idle: ``Listener.admit``)."""
        self._stop_waiting()
        self.transport.close()

    # --- refusals before the app --------------------------------------------------------------

    def _refuse_head(self) -> None:
        if not self.transport.is_closing() and self.cycle is None:
            message = f"request head over {self._limits.header_bytes_max} bytes"
            body = error_bytes("request_header_fields_too_large", message)
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                b"content-type: application/json\r\nconnection: close\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
        self.transport.close()

    def _refuse_malformed(self) -> None:
        """A request the HTTP parser refuses gets the API's JSON error."""
        body = error_bytes("invalid_request", MALFORMED_MESSAGE)
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        self.transport.close()


class _LaneCycle:
    """A request the lane serves: while it is under way, a pipelined request waits its turn."""

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False


class CoalescedWrites:
    """A connection's transport whose writes within one event-loop step leave as one send.

    An ASGI app writes a response's head and its body separately, and on loopback every send
    also costs the sender the receiver's TCP processing: under load two sends per response were
    the largest single cost of a node (``bench/rest.py`` under py-spy). Writes are joined and
    handed to the real transport at the end of the step (``call_soon``); ``close`` sends what
    is pending first, ``abort`` drops it. Everything else is the real transport's.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def _flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def error_bytes(code: str, message: str) -> bytes:
    return json.dumps(error_body(code, message)).encode()


def _address(value: Any) -> tuple[str, int] | None:
    """A socket's ``(host, port)`` as the ASGI scope carries it (None: not an IP socket)."""
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None
