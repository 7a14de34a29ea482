"""A node's two listeners, and what keeps hostile connections from taking the node down.

A region node serves one app on two sockets:

* the **client listener** (``--port``): chat applications, operators, anyone;
* the **peer listener** (``--peer-port``): other nodes only (probes, placement, forwards). Every
  request on it must carry the cluster's peer secret (401 otherwise), and it has its own
  connection bound, so no number of client connections can keep a probe from being answered
  (a region whose probes go unanswered is suspected and failed over).

Both listeners run ``guarded_protocol``: uvicorn's httptools protocol (the HTTP parser in C:
h11, in Python, cost a node ~8 % of its CPU under load) with these guards.

* **Header timeout.** A connection must send a complete request head within
  ``header_timeout_s`` of connecting, and again of its previous response (the keep-alive idle
  time), else it is closed. uvicorn alone never times out a connection that sends nothing, and
  any single byte cancels its keep-alive timer (slowloris).
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
import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from services.api.fast_lane import FastLane, LaneRequest, LaneResponse, Respond
from services.api.forwarding import PEER_AUTH_HEADER

log = logging.getLogger("convplane.listeners")

_PEER_AUTH = PEER_AUTH_HEADER.lower().encode()


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    name: str  # "client" or "peer", for logs
    connections_max: int
    header_timeout_s: float
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

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
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


class PeerListenerGate:
    """The peer listener's app: the node's app, for callers with the peer secret only."""

    def __init__(self, app: ASGIApp, peer_secret: str) -> None:
        self.app = app
        self._secret = peer_secret.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._authentic(scope):
            body = _error_body("unauthorized", "the peer listener serves nodes of the cluster only")
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def _authentic(self, scope: Scope) -> bool:
        sent = [bytes(v) for k, v in scope.get("headers", ()) if bytes(k) == _PEER_AUTH]
        return len(sent) == 1 and hmac.compare_digest(sent[0], self._secret)
