"""A node's two listeners, and what keeps hostile connections from taking the node down.

A region node serves one app on two sockets:

* the **client listener** (``--port``): chat applications, operators, anyone;
* the **peer listener** (``--peer-port``): other nodes only (probes, placement, forwards). What
  it lets through, and what the client listener keeps out (every ``/peer/`` path), is
  ``services.listener_gates``'s. It has its own connection bound, so no number of client
  connections can keep a probe from being answered (a region whose probes go unanswered is
  suspected and failed over).

Both listeners run ``guarded_protocol``: uvicorn's httptools protocol (the HTTP parser in C:
h11, in Python, cost a node ~8 % of its CPU under load) with these guards.

* **Header timeout.** A connection must send a complete request head within
  ``header_timeout_s`` of connecting, and again of its previous response (the keep-alive idle
  time), else it is closed. uvicorn alone never times out a connection that sends nothing, and
  any single byte cancels its keep-alive timer (slowloris).
* **Head size.** A request head (request line and headers) longer than ``header_bytes_max``
  is answered 431 and its connection closed, before the parser has seen more than that: the
  HTTP parser joins a header's pieces as they arrive, which costs time quadratic in its length
  (a 64 MiB header held the event loop for seconds) and memory for all of it.
* **Peer certificate.** On a TLS listener the region the client's certificate speaks for
  (``services.cluster_tls.region_of_certificate``) goes in every request's scope under
  ``CERT_REGION_SCOPE_KEY``, for the peer listener's gate to check.
* **One send per response.** A response's head and body leave in one write
  (``CoalescedWrites``).
* **The fast lane.** On the client listener, an append whose head and body arrive together,
  or a read of a conversation, that nothing special applies to goes to
  ``services.api.fast_lane`` straight from the parser, instead of through uvicorn's request
  cycle and the app's layers; anything the lane does not take continues down uvicorn's path as
  if the lane had never looked at it. While the lane serves a request, a pipelined one waits
  its turn as it would behind the app.
* **JSON errors.** A request the HTTP parser refuses gets a JSON 400 like every other client
  mistake (uvicorn's own is plain text).
* **Connection bound.** At most ``connections_max`` connections; a new connection past it closes
  the *oldest idle* one (no request under way: connected, or between requests), never one whose
  request is being served. Idle connections therefore cost the attacker more than anybody else.
  With no idle connection to close, the new connection is refused (closed at once).

uvicorn's own ``limit_concurrency`` (a plain-text 503 to every request once the connection
count passes the limit, idle connections included) is not used: admission
(``services.api.admission``) bounds the requests under way, and the guards above bound the rest.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from services.api.fast_lane import FastLane, LaneRequest, LaneResponse, Respond
from services.api.peer_trust import CERT_REGION_SCOPE_KEY
from services.cluster_tls import region_of_certificate

log = logging.getLogger("convplane.listeners")


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    name: str  # "client" or "peer", for logs
    connections_max: int
    header_timeout_s: float
    #: a request head (request line and headers) longer than this is refused 431
    header_bytes_max: int = 64 * 1024
    #: a response the client does not take within this long loses the connection (the
    #: edge's ``send_timeout_s``; here for what the fast lane writes)
    send_timeout_s: float = 10.0


def guarded_protocol(
    limits: ListenerConfig, lane: FastLane | None = None
) -> type[HttpToolsProtocol]:
    """An ``HttpToolsProtocol`` class for one listener (module docstring); pass it as uvicorn's
    ``http``. Each call makes a class of its own: the idle set is per listener. ``lane``: the
    fast lane this listener hands eligible requests to (the client listener's)."""
    #: this listener's idle connections, oldest first (a dict keeps insertion order)
    idle: dict[GuardedProtocol, None] = {}

    class GuardedProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _cycle_when_idle: Any = None
        #: a request the lane may take, its head parsed, its body (if any) arriving
        _lane_pending: LaneRequest | None = None
        #: what the request head under way may still take, in bytes; None: its body is
        #: arriving (a head is only counted until it completes)
        _head_bytes_left: int | None = limits.header_bytes_max
        #: the region the client's TLS certificate speaks for (None: none, or no TLS)
        _cert_region: str | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            ssl_object = transport.get_extra_info("ssl_object")
            if ssl_object is not None:
                self._cert_region = region_of_certificate(ssl_object.getpeercert())
            self.transport = CoalescedWrites(transport, self.loop)  # type: ignore[assignment]
            if len(self.connections) > limits.connections_max and not _evict_oldest_idle():
                log.warning("%s listener: %d connections, none idle: refusing one",
                            limits.name, len(self.connections))  # fmt: skip
                transport.abort()
                return
            self._await_request()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            super().connection_lost(exc)

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

        def _refuse_head(self) -> None:
            if not self.transport.is_closing() and (
                self.cycle is None or self.cycle.response_complete
            ):
                message = f"request head over {limits.header_bytes_max} bytes"
                body = _error_body("request_header_fields_too_large", message)
                self.transport.write(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                    b"content-type: application/json\r\nconnection: close\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(body), body)
                )
            self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[CERT_REGION_SCOPE_KEY] = self._cert_region  # type: ignore[literal-required]

        def _parse(self, data: bytes) -> None:
            super().data_received(data)
            pending, self._lane_pending = self._lane_pending, None
            if pending is not None:  # its body did not come with its head: the app takes it
                self._hand_to_app(pending, complete=False)
            if self._header_timer is not None and self.cycle is not self._cycle_when_idle:
                self._stop_waiting()  # a request head arrived: its body and response are
                # bounded by the app (body read timeout, deadlines)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a pipelined request was already parsed and is under way
            self._await_request()

        # --- the fast lane (services.api.fast_lane) --------------------------------------

        def on_headers_complete(self) -> None:
            self._head_bytes_left = None
            if lane is not None and (self.cycle is None or self.cycle.response_complete):
                parser = self.parser
                try:
                    pending = lane.eligible(
                        self.scope,  # type: ignore[arg-type]  # a TypedDict, filled as a dict
                        parser.get_method(),
                        parser.get_http_version(),
                        self.url,
                        parser.should_keep_alive(),
                    )
                except Exception:  # a bug in the lane must not become the parser's 400
                    log.exception("fast lane: eligible failed; the app serves the request")
                    pending = None
                if pending is not None:
                    self._lane_pending = pending
                    return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if self._lane_pending is not None:
                self._lane_pending.body += body
                return
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._head_bytes_left = limits.header_bytes_max  # the next request's head
            pending, self._lane_pending = self._lane_pending, None
            if pending is None:
                super().on_message_complete()
                return
            assert lane is not None
            try:
                prepared = lane.prepare(pending)
            except Exception:  # a bug in the lane must not become the parser's 400
                log.exception("fast lane: prepare failed; the app serves the request")
                prepared = None
            if prepared is None:
                self._hand_to_app(pending, complete=True)
                return
            cycle = _LaneCycle(pending.keep_alive)
            self.cycle = cycle  # type: ignore[assignment]
            task = self.loop.create_task(lane.serve(prepared, self._responder(cycle)))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

        def _hand_to_app(self, pending: LaneRequest, *, complete: bool) -> None:
            """The request goes the app's way, as if the lane had never looked at it."""
            super().on_headers_complete()
            if pending.body:
                super().on_body(bytes(pending.body))
            if complete:
                super().on_message_complete()

        def _responder(self, cycle: _LaneCycle) -> Respond:
            async def respond(response: LaneResponse) -> bool:
                """Write the answer (as uvicorn's ``send`` would); False: a reader too slow to
                take it within ``send_timeout_s`` lost its connection."""
                if cycle.disconnected:
                    return True  # nobody to answer; uvicorn drops the answer too
                if self.flow.write_paused:
                    try:
                        async with asyncio.timeout(limits.send_timeout_s):
                            await self.flow.drain()
                    except TimeoutError:
                        self.transport.close()
                        return False
                says_close = response.says_close
                keep_alive = cycle.keep_alive and not says_close and not response.close
                head = [STATUS_LINE[response.status]]
                for name, value in (*self.server_state.default_headers, *response.headers):
                    head += [name, b": ", value, b"\r\n"]
                if not cycle.keep_alive and not says_close:
                    head.append(b"connection: close\r\n")
                head += [b"\r\n", response.body]
                self.transport.write(b"".join(head))
                cycle.response_complete = True
                if not keep_alive:
                    self.transport.close()
                self.on_response_complete()
                return True

            return respond

        def send_400_response(self, msg: str) -> None:
            """A request the HTTP parser refuses gets the API's JSON error, not plain text."""
            body = _error_body("invalid_request", msg)
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
            self.transport.close()

        def _await_request(self) -> None:
            self._stop_waiting()
            self._cycle_when_idle = self.cycle
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._timed_out)
            idle[self] = None

        def _stop_waiting(self) -> None:
            idle.pop(self, None)
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _timed_out(self) -> None:
            self._header_timer = None
            idle.pop(self, None)
            if not self.transport.is_closing():
                self.transport.close()

    def _evict_oldest_idle() -> bool:
        for oldest in idle:
            oldest._stop_waiting()
            oldest.transport.close()
            return True
        return False

    GuardedProtocol.__name__ = f"GuardedProtocol_{limits.name}"
    return GuardedProtocol


class _LaneCycle:
    """What uvicorn's protocol reads of a request under way, for one the lane serves: while it
    is not ``response_complete``, a pipelined request waits its turn."""

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.message_event = self  # connection_lost sets it

    def set(self) -> None:
        pass


class CoalescedWrites:
    """A connection's transport whose writes within one event-loop step leave as one send.

    uvicorn writes a response's head and its body separately, and on loopback every send also
    costs the sender the receiver's TCP processing: under load two sends per response were
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


def _error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message, "retryable": False}}).encode()
