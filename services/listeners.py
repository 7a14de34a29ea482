"""A node's two listeners, and what keeps hostile connections from taking the node down.

A region node serves one app on two sockets:

* the **client listener** (``--port``): chat applications, operators, anyone;
* the **peer listener** (``--peer-port``): other nodes only (probes, placement, forwards). What
  it lets through, and what the client listener keeps out (every ``/peer/`` path), is
  ``services.bootstrap.listener_gates``'s. It has its own connection bound, so no number of client
  connections can keep a probe from being answered (a region whose probes go unanswered is
  suspected and failed over).

**The node runs its own HTTP/1.1 server.** Each listener is an ``asyncio`` server
(``loop.create_server``) whose connections are ``services.http_connection.Connection``: the
``httptools`` parser (llhttp, in C: h11, in Python, cost a node ~8 % of its CPU under load), the
guards below, the fast lane, and the ASGI 3 spec towards the app for everything else;
``services.asgi_lifespan`` runs the app's lifespan and ``services.bootstrap.serve`` stops both listeners
gracefully. Until this, the guards and the lane lived in a subclass of uvicorn's private
``HttpToolsProtocol`` (``uvicorn.protocols``): none of them has a public hook in uvicorn, and
the hot path would have broken with any uvicorn release that reshaped its internals. Owning the
few hundred lines openly, on public interfaces only (``asyncio``, ``httptools``, ASGI), costs
less than that risk; an import-linter contract keeps the product off ``uvicorn.protocols``.

The guards, per connection:

* **Header timeout.** A connection must send a complete request head within
  ``header_timeout_s`` of connecting, and again of its previous response (the keep-alive idle
  time), else it is closed (slowloris: a single byte does not restart the time).
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
  ``services.api.fast_lane`` straight from the parser, instead of through the ASGI cycle and
  the app's layers; anything the lane does not take continues to the app as if the lane had
  never looked at it. While the lane serves a request, a pipelined one waits its turn as it
  would behind the app. It is the only way in for an append besides the app's own route.
* **JSON errors.** A request the HTTP parser refuses gets a JSON 400 like every other client
  mistake.
* **Connection bound.** At most ``connections_max`` connections; a new connection past it closes
  the *oldest idle* one (no request under way: connected, or between requests), never one whose
  request is being served. Idle connections therefore cost the attacker more than anybody else.
  With no idle connection to close, the new connection is refused (closed at once).

There is no per-connection request concurrency limit: admission (``services.api.admission``)
bounds the requests under way, and the guards above bound the rest.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

from starlette.types import ASGIApp

from services.api.fast_lane import FastLane
from services.http_connection import Connection

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


class Listener:
    """One listener: its connections, their guards' shared state, and the tasks answering
    them. ``lane``: the fast lane this listener hands eligible requests to (the client
    listener's); ``dated``: every response carries ``Date`` (RFC 9110; off for tests that
    compare answers byte for byte); ``state``: the app's lifespan state, a copy per request."""

    def __init__(
        self,
        app: ASGIApp,
        limits: ListenerConfig,
        *,
        lane: FastLane | None = None,
        dated: bool = True,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.app = app
        self.limits = limits
        self.lane = lane
        self.state = state or {}
        self.connections: set[Connection] = set()
        #: connections with no request under way, oldest first (a dict keeps insertion order)
        self.idle: dict[Connection, None] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self._dated = dated
        self._date_s = -1
        self._default_headers: list[tuple[bytes, bytes]] = []
        self._server: asyncio.Server | None = None
        self._quiet = asyncio.Event()

    def connection(self) -> Connection:
        """The protocol factory for ``loop.create_server``."""
        return Connection(self)

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> int:
        """Listen on ``host:port``; the port bound (``port`` 0: any free one)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.connection, host, port, ssl=ssl_context)
        bound = self._server.sockets[0].getsockname()[1]
        log.info(
            "%s listener on %s:%d%s", self.limits.name, host, bound, " (TLS)" if ssl_context else ""
        )
        return int(bound)

    def admit(self, connection: Connection) -> bool:
        """Count a new connection; past ``connections_max`` close the oldest idle one for it,
        and with none idle refuse it (False)."""
        if len(self.connections) >= self.limits.connections_max:
            oldest = next(iter(self.idle), None)
            if oldest is None:
                log.warning(
                    "%s listener: %d connections, none idle: refusing one",
                    self.limits.name,
                    len(self.connections),
                )
                return False
            oldest.evict()
        self.connections.add(connection)
        return True

    def forget(self, connection: Connection) -> None:
        self.connections.discard(connection)
        self.idle.pop(connection, None)
        self._note_quiet()

    def run(self, work: Coroutine[Any, Any, None]) -> None:
        """Answer a request in a task of its own (cancelled if shutdown outlasts its grace)."""
        task = asyncio.get_running_loop().create_task(work)
        task.add_done_callback(self._task_done)
        self.tasks.add(task)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._note_quiet()

    def _note_quiet(self) -> None:
        if not self.connections and not self.tasks:
            self._quiet.set()  # what ``drained`` waits for

    def default_headers(self) -> list[tuple[bytes, bytes]]:
        """What every response starts with: ``Date``, formatted once a second."""
        if not self._dated:
            return self._default_headers
        now_s = int(time.time())
        if now_s != self._date_s:
            self._date_s = now_s
            self._default_headers = [(b"date", formatdate(now_s, usegmt=True).encode())]
        return self._default_headers

    def stop_accepting(self) -> None:
        """No new connection; idle ones close now, busy ones after their answer."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.shutdown()

    async def drained(self) -> None:
        """Every connection closed and every request's task done."""
        self._quiet.clear()
        if self.connections or self.tasks:
            await self._quiet.wait()

    def abort(self) -> None:
        """The grace ran out: cancel what still runs and drop every connection."""
        for task in list(self.tasks):
            task.cancel()
        for connection in list(self.connections):
            connection.transport.abort()
