"""The edge of a node, as one pure ASGI middleware (it must see raw bytes and every response).

In order: arrival (``services.api.admission``: 401, the deadline fixed once, 504
deadline_exceeded if it already passed), read the body under its limit and a deadline
(``body_read_timeout_s`` and the request's own: 408 request_timeout or 504; 413 on Content-Length
or on the bytes actually streamed), check the media type (415) and that the JSON is well formed,
finite and shallow (400), and only then admission (429 quota_exceeded, 503 overloaded): a client
that sends its body slowly holds a connection, never one of the node's admission permits. The
buffered body goes to the app. Every other route's body is read the same way, under its limit
(``max_body_bytes``; ``/peer/`` routes, which only authenticated peers reach,
``peer_body_bytes_max``: a forward batch) and ``body_read_timeout_s``, before its handler runs
or it takes a peer slot; the handler parses it. An over-limit body is read and discarded up to
``discard_body_max_bytes`` before the 413 is sent, so that an ordinary HTTP client, which writes
the whole body before it reads, gets the 413 rather than a reset connection.

A client that does not take its response (each message within ``send_timeout_s``) loses its
connection, and its admission permit is given back: slow readers hold a permit no longer than
slow writers do.

Every response gets ``X-Convplane-Served-By`` (a forwarded response keeps the serving peer's) and
is counted in the metrics by route template and a known method, never by raw path or a raw
method token (bounded label cardinality).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import MutableMapping
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eventlog.errors import ConvplaneError, error_body
from eventlog.http_headers import SERVED_BY_HEADER_RAW
from services.api.admission import Arrival, NodeAdmission
from services.api.metrics import Metrics

JSON_DEPTH_MAX = 32
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class _SlowReader(Exception):
    """The client did not take a response message within ``send_timeout_s``."""


class _Reject(Exception):
    def __init__(self, status: int, code: str, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retryable = status, code, message, retryable


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _json_depth(value: Any) -> int:
    depth, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            depth = max(depth, level)
            if level > JSON_DEPTH_MAX:
                return level
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, level + 1) for child in children)
    return depth


def check_json_body(body: bytes) -> Any:
    """The parsed body, or a 400. orjson parses what it can (UTF-8, integers within 64 bits;
    it refuses NaN and Infinity as ``json`` is told to here); the rest, and every malformed
    body, goes through ``json``, which decides (and words the error)."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            value = json.loads(body, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            raise _Reject(400, "invalid_request", f"malformed JSON body: {exc}"[:300]) from exc
    if _json_depth(value) > JSON_DEPTH_MAX:
        raise _Reject(400, "invalid_request", f"JSON nested deeper than {JSON_DEPTH_MAX}")
    return value


def is_json_media_type(content_type: str | None) -> bool:
    media_type = (content_type or "").split(";")[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def json_body_or_none(body: bytes) -> Any:
    """``check_json_body``'s value, or None where it refuses the body (the fast lane hands
    such a request to the app, which words the refusal)."""
    try:
        return check_json_body(body)
    except _Reject:
        return None


def _check_media_type(scope: Scope) -> None:
    if not is_json_media_type(_header(scope, b"content-type")):
        raise _Reject(415, "unsupported_media_type", "request bodies must be application/json")


async def _read_body(
    scope: Scope, receive: Receive, max_body_bytes: int, discard_max_bytes: int
) -> bytes:
    too_large = _Reject(413, "payload_too_large", f"body over {max_body_bytes} bytes")
    declared = _header(scope, b"content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise _Reject(400, "invalid_request", "malformed Content-Length")
        if int(declared) > max_body_bytes:
            if int(declared) <= discard_max_bytes:
                await _discard_body(receive, discard_max_bytes)
            raise too_large
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Reject(400, "invalid_request", "client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        more = bool(message.get("more_body", False))
        if size > max_body_bytes:
            chunks.clear()
            if more:
                await _discard_body(receive, discard_max_bytes - size)
            raise too_large
        chunks.append(chunk)
        if not more:
            return b"".join(chunks)


async def _discard_body(receive: Receive, budget_bytes: int) -> None:
    """Read and drop the rest of a body, at most ``budget_bytes`` (then give up: the response
    closes the connection, and the client may see a reset instead of the 413)."""
    while budget_bytes >= 0:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        budget_bytes -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _replaying(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class EdgeMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        region: str,
        metrics: Metrics,
        max_body_bytes: int,
        admission: NodeAdmission,
        retry_after_s: float,
        body_read_timeout_s: float,
        discard_body_max_bytes: int,
        send_timeout_s: float,
        peer_body_bytes_max: int,
    ) -> None:
        self.app = app
        self.region = region.encode()
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.peer_body_bytes_max = peer_body_bytes_max
        self.body_read_timeout_s = body_read_timeout_s
        self.discard_body_max_bytes = discard_body_max_bytes
        self.send_timeout_s = send_timeout_s
        self.admission = admission
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started_s = time.perf_counter()
        status_seen = [500]
        send = self._stamping(send, status_seen)
        try:
            await self._guarded(scope, receive, send, status_seen)
        except _SlowReader:
            # the permit went back in _guarded; returning with the response incomplete makes
            # the server close the connection
            status_seen[0] = 408
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            latency_s = time.perf_counter() - started_s
            self.metrics.observe_request(template, scope["method"], status_seen[0], latency_s)

    async def _guarded(
        self, scope: Scope, receive: Receive, send: Send, status_seen: list[int]
    ) -> None:
        try:
            arrival = self.admission.arrive(scope)
            if arrival is not None:
                receive = await self._checked_body(scope, receive, arrival)
            elif scope["method"] in _BODY_METHODS:
                receive = await self._bounded_body(scope, receive)
            entry = await self.admission.admit(scope, arrival)
        except ConvplaneError as exc:
            rej = _Reject(exc.http_status, exc.code, exc.message, exc.retryable)
            await _send_error(send, rej, retry_after_s=exc.retry_after_s or self.retry_after_s)
            return
        except _Reject as rej:
            await _send_error(send, rej, retry_after_s=self.retry_after_s)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.exit(entry, status_seen[0])

    async def _checked_body(self, scope: Scope, receive: Receive, arrival: Arrival) -> Receive:
        """The whole body, read before admission, within ``body_read_timeout_s`` and the
        request's deadline (whichever ends first names the error)."""
        if scope["method"] not in _BODY_METHODS:
            return receive
        remaining_s = self.admission.remaining_s(arrival)
        timeout_s = min(self.body_read_timeout_s, remaining_s)
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                body = await _read_body(
                    scope, receive, self.max_body_bytes, self.discard_body_max_bytes
                )
        except TimeoutError:
            if remaining_s <= self.body_read_timeout_s:
                raise _Reject(
                    504,
                    "deadline_exceeded",
                    "the deadline passed while the request body was still arriving",
                ) from None
            raise _Reject(
                408,
                "request_timeout",
                f"the request body did not arrive within {self.body_read_timeout_s:g} s",
                retryable=True,
            ) from None
        if body.strip():
            _check_media_type(scope)
            check_json_body(body)  # the route parses it again; a 400 must come first
        return _replaying(body, receive)

    async def _bounded_body(self, scope: Scope, receive: Receive) -> Receive:
        """The whole body of a request outside /v1, read within its limit (413) and
        ``body_read_timeout_s`` (408); its handler parses it."""
        peer = scope["path"].startswith("/peer/")
        limit_bytes = self.peer_body_bytes_max if peer else self.max_body_bytes
        try:
            async with asyncio.timeout(self.body_read_timeout_s):
                body = await _read_body(scope, receive, limit_bytes, self.discard_body_max_bytes)
        except TimeoutError:
            raise _Reject(
                408,
                "request_timeout",
                f"the request body did not arrive within {self.body_read_timeout_s:g} s",
                retryable=True,
            ) from None
        return _replaying(body, receive)

    def _stamping(self, send: Send, status_seen: list[int]) -> Send:
        async def stamped(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status_seen[0] = int(message["status"])
                headers = list(message.get("headers", []))
                if not any(bytes(k).lower() == SERVED_BY_HEADER_RAW for k, _ in headers):
                    headers.append((SERVED_BY_HEADER_RAW, self.region))
                message["headers"] = headers
            try:
                async with asyncio.timeout(self.send_timeout_s):
                    await send(message)
            except TimeoutError:
                raise _SlowReader from None

        return stamped


def edge_error(
    status: int, code: str, message: str, *, retryable: bool, retry_after_s: float
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and body of a refusal at the edge (the fast lane answers the same)."""
    body = json.dumps(error_body(code, message, retryable=retryable)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status in (429, 503):
        headers.append((b"retry-after", str(max(1, math.ceil(retry_after_s))).encode()))
    if status in (408, 413, 504):
        headers.append((b"connection", b"close"))  # the rest of the body may be unread
    return headers, body


async def _send_error(send: Send, rej: _Reject, *, retry_after_s: float) -> None:
    headers, body = edge_error(
        rej.status, rej.code, rej.message, retryable=rej.retryable, retry_after_s=retry_after_s
    )
    await send({"type": "http.response.start", "status": rej.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
