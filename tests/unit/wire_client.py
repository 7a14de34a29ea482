"""A node's client listener on the wire, without a socket: the real connection protocol
(``services.http_connection.Connection`` of a ``services.listeners.Listener``, with the node's
fast lane) fed raw HTTP/1.1 bytes through an in-memory transport, on the test's event loop.

``WireConnection.exchange`` writes requests either in one piece (head and body together, as a
load generator sends them: the fast lane may take such a request) or head first and body in a
later write (the lane never takes those: the app serves them), and reads the responses back with
``h11``, the parser httpx itself uses.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp

from services.bootstrap.app import NodeApp
from services.listeners import Listener, ListenerConfig

LOOP_STEPS_MAX = 100_000


class MemoryTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8700), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


@dataclass
class WireResponse:
    status: int
    headers: dict[str, str]
    header_names: list[str]
    body: bytes


class WireConnection:
    """A keep-alive connection to ``app``'s client listener (with its fast lane, unless
    ``lane`` is False or ``app`` is not the node's)."""

    transport: MemoryTransport
    protocol: Any

    def __init__(
        self, app: ASGIApp, *, lane: bool = True, limits: ListenerConfig | None = None
    ) -> None:
        limits = limits or ListenerConfig("client", connections_max=100, header_timeout_s=5.0)
        # no Date header: answers are compared byte for byte
        fast_lane = app.fast_lane if lane and isinstance(app, NodeApp) else None
        self.listener = Listener(app, limits, lane=fast_lane, dated=False)

        def connect() -> None:
            self.transport = MemoryTransport()
            self.protocol = self.listener.connection()
            self.protocol.connection_made(self.transport)

        self._connect = connect
        connect()

    async def exchange(self, *requests: bytes, split_body: bool = False) -> list[WireResponse]:
        """Send ``requests`` (raw HTTP/1.1, each with its body) in one write, or, with
        ``split_body``, each as two writes (head, then body); the answers, in order. A
        connection the server closed is opened again first, as a client would."""
        if self.transport.closed:
            self._connect()
        if split_body:
            for raw in requests:
                head, _, body = raw.partition(b"\r\n\r\n")
                self.protocol.data_received(head + b"\r\n\r\n")
                await asyncio.sleep(0)
                if body:
                    self.protocol.data_received(body)
        else:
            self.protocol.data_received(b"".join(requests))
        answers: list[WireResponse] = []
        for _ in range(LOOP_STEPS_MAX):
            answers += self._read()
            if len(answers) >= len(requests):
                return answers
            await asyncio.sleep(0)
        raise AssertionError(f"{len(answers)} of {len(requests)} answers arrived")

    def _read(self) -> list[WireResponse]:
        """Whole responses written so far (every answer here has a ``Content-Length``)."""
        answers: list[WireResponse] = []
        while True:
            data = self.transport.written
            head_end = data.find(b"\r\n\r\n")
            if head_end < 0:
                return answers
            status_line, *lines = bytes(data[:head_end]).decode("latin-1").split("\r\n")
            pairs = [line.split(":", 1) for line in lines]
            names = [k.strip().lower() for k, _ in pairs]
            headers = {k.strip().lower(): v.strip() for k, v in pairs}
            length = int(headers["content-length"])
            if len(data) < head_end + 4 + length:
                return answers
            body = bytes(data[head_end + 4 : head_end + 4 + length])
            del data[: head_end + 4 + length]
            answers.append(WireResponse(int(status_line.split()[1]), headers, names, body))


def raw_request(
    path: str, body: bytes | None, headers: dict[str, str], method: str = "POST"
) -> bytes:
    """A request as a client writes it (``Content-Length`` added, unless ``body`` is None: a
    request without a body, as a client writes a ``GET``)."""
    lines = [f"{method} {path} HTTP/1.1", "host: node.test"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")
