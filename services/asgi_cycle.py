"""One HTTP/1.1 request answered by an ASGI app, as the ASGI 3 HTTP spec words it: the
``receive`` that hands the app the request body as the connection parses it, and the ``send``
that writes the app's response (``Content-Length`` or chunked, ``HEAD``, ``Connection: close``,
``Expect: 100-continue``) to the connection (``services.http_connection``, which owns the
socket, the parsing and the order of a connection's requests)."""

from __future__ import annotations

import asyncio
import http
import logging
import re
from collections.abc import MutableMapping
from typing import Any, Protocol

log = logging.getLogger("convplane.http")

_HEADER_NAME_INVALID = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_HEADER_VALUE_INVALID = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


STATUS_LINE = {status: _status_line(status) for status in range(100, 600)}
_BUG_RESPONSE = (
    500,
    [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", b"21"),
        (b"connection", b"close"),
    ],
    b"Internal Server Error",
)


class CycleOwner(Protocol):
    """What a cycle needs of its connection."""

    transport: asyncio.Transport
    send_timeout_s: float

    @property
    def cycle(self) -> object:
        """The request being answered (a cycle's answer completes only its own turn)."""

    @property
    def write_paused(self) -> bool: ...

    async def drain(self) -> None: ...

    def resume_reading(self) -> None: ...

    def default_headers(self) -> list[tuple[bytes, bytes]]: ...

    def answered(self) -> None: ...


class AppCycle:
    """One request answered by the ASGI app: ``receive`` and ``send`` as the ASGI 3 HTTP spec
    words them, over the connection."""

    def __init__(
        self,
        connection: CycleOwner,
        scope: MutableMapping[str, Any],
        *,
        keep_alive: bool,
        expect_100: bool,
    ) -> None:
        self._connection = connection
        self.scope = scope
        self.keep_alive = keep_alive
        self._waiting_for_100 = expect_100
        self.message_event = asyncio.Event()
        self.disconnected = False
        self.body = bytearray()
        self.more_body = True
        self._started = False
        self.response_complete = False
        self._chunked: bool | None = None
        self._length_left = 0

    async def run_asgi(self, app: Any) -> None:
        try:
            result = await app(self.scope, self.receive, self.send)
        except Exception:  # the app's bug
            log.exception("the app failed on a request")
            if not self._started:
                await self._send_bug()
            else:
                self._connection.transport.close()
            return
        if result is not None:
            log.error("the app returned %r instead of None", result)
            self._connection.transport.close()
        elif not self._started and not self.disconnected:
            log.error("the app returned without starting a response")
            await self._send_bug()
        elif not self.response_complete and not self.disconnected:
            log.error("the app returned without completing its response")
            self._connection.transport.close()

    async def _send_bug(self) -> None:
        """A 500, as a bug's answer; a client that does not take it within ``send_timeout_s``
        loses its connection (the app's edge gave up on the same slow reader already)."""
        status, headers, body = _BUG_RESPONSE
        try:
            async with asyncio.timeout(self._connection.send_timeout_s):
                await self.send(
                    {"type": "http.response.start", "status": status, "headers": headers}
                )
                await self.send({"type": "http.response.body", "body": body})
        except TimeoutError:
            self._connection.transport.close()

    async def send(self, message: Any) -> None:
        connection = self._connection
        if connection.write_paused and not self.disconnected:
            await connection.drain()
        if self.disconnected:
            return
        if not self._started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {message['type']}")
            self._started = True
            self._waiting_for_100 = False
            connection.transport.write(self._head(message))
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(f"expected http.response.body, got {message['type']}")
            self._write_body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"{message['type']} after the response completed")

    def _head(self, message: Any) -> bytes:
        status = int(message["status"])
        head = [STATUS_LINE[status]]
        says_close = False
        for name, value in (
            *self._connection.default_headers(),
            *message.get("headers", ()),
        ):
            if _HEADER_NAME_INVALID.search(name) or _HEADER_VALUE_INVALID.search(value):
                raise RuntimeError(f"invalid response header {name!r}")
            name = name.lower()
            if name == b"content-length" and self._chunked is None:
                self._length_left = int(value)
                self._chunked = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self._length_left = 0
                self._chunked = True
            elif name == b"connection" and b"close" in [
                t.strip().lower() for t in value.split(b",")
            ]:
                self.keep_alive = False
                says_close = True
            head += [name, b": ", value, b"\r\n"]
        if not self.keep_alive and not says_close:
            head.append(b"connection: close\r\n")
        if self._chunked is None and self.scope["method"] != "HEAD" and status not in (204, 304):
            self._chunked = True
            head.append(b"transfer-encoding: chunked\r\n")
        head.append(b"\r\n")
        return b"".join(head)

    def _write_body(self, body: bytes, more_body: bool) -> None:
        transport = self._connection.transport
        if self.scope["method"] == "HEAD":
            self._length_left = 0
        elif self._chunked:
            chunk = [b"%x\r\n" % len(body), body, b"\r\n"] if body else []
            if not more_body:
                chunk.append(b"0\r\n\r\n")
            transport.write(b"".join(chunk))
        else:
            if len(body) > self._length_left:
                raise RuntimeError("response body longer than its Content-Length")
            self._length_left -= len(body)
            transport.write(body)
        if more_body:
            return
        if self._length_left != 0:
            raise RuntimeError("response body shorter than its Content-Length")
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            transport.close()
        if self._connection.cycle is self:
            self._connection.answered()

    async def receive(self) -> Any:
        connection = self._connection
        if self._waiting_for_100 and not connection.transport.is_closing():
            connection.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._waiting_for_100 = False
        if not self.disconnected and not self.response_complete:
            connection.resume_reading()
            await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        message = {"type": "http.request", "body": bytes(self.body), "more_body": self.more_body}
        self.body = bytearray()
        return message
