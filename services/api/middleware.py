"""The edge of a node, as one pure ASGI middleware (it must see raw bytes and every response).

In order: admission (``services.api.admission``: 401, 429 quota_exceeded, 503 overloaded, 504
deadline_exceeded, before any work), read the body under its limit (413 on
Content-Length or on the bytes actually streamed), check the media type (415) and that the JSON
is well formed, finite and shallow (400), then hand the buffered body to the app. Every response
gets ``X-Convplane-Served-By`` (a forwarded response keeps the serving peer's) and is counted in
the metrics by route template, never by raw path (bounded label cardinality).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import MutableMapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eventlog.errors import ConvplaneError
from services.api.admission import NodeAdmission
from services.api.metrics import Metrics

SERVED_BY_HEADER = b"x-convplane-served-by"
JSON_DEPTH_MAX = 32
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


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


def check_json_body(body: bytes) -> None:
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        raise _Reject(400, "invalid_request", f"malformed JSON body: {exc}"[:300]) from exc
    if _json_depth(value) > JSON_DEPTH_MAX:
        raise _Reject(400, "invalid_request", f"JSON nested deeper than {JSON_DEPTH_MAX}")


def _check_media_type(scope: Scope) -> None:
    content_type = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise _Reject(415, "unsupported_media_type", "request bodies must be application/json")


async def _read_body(scope: Scope, receive: Receive, max_body_bytes: int) -> bytes:
    declared = _header(scope, b"content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise _Reject(400, "invalid_request", "malformed Content-Length")
        if int(declared) > max_body_bytes:
            raise _Reject(413, "payload_too_large", f"body over {max_body_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Reject(400, "invalid_request", "client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_body_bytes:
            raise _Reject(413, "payload_too_large", f"body over {max_body_bytes} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


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
    ) -> None:
        self.app = app
        self.region = region.encode()
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
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
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            latency_s = time.perf_counter() - started_s
            self.metrics.observe_request(template, scope["method"], status_seen[0], latency_s)

    async def _guarded(
        self, scope: Scope, receive: Receive, send: Send, status_seen: list[int]
    ) -> None:
        try:
            entry = await self.admission.enter(scope)
        except ConvplaneError as exc:
            rej = _Reject(exc.http_status, exc.code, exc.message, exc.retryable)
            await _send_error(send, rej, retry_after_s=exc.retry_after_s or self.retry_after_s)
            return
        try:
            if not scope["path"].startswith("/v1/"):
                await self.app(scope, receive, send)
                return
            try:
                receive = await self._checked_body(scope, receive)
            except _Reject as rej:
                await _send_error(send, rej, retry_after_s=self.retry_after_s)
                return
            await self.app(scope, receive, send)
        finally:
            self.admission.exit(entry, status_seen[0])

    async def _checked_body(self, scope: Scope, receive: Receive) -> Receive:
        if scope["method"] not in _BODY_METHODS:
            return receive
        body = await _read_body(scope, receive, self.max_body_bytes)
        if body.strip():
            _check_media_type(scope)
            check_json_body(body)
        return _replaying(body, receive)

    def _stamping(self, send: Send, status_seen: list[int]) -> Send:
        async def stamped(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status_seen[0] = int(message["status"])
                headers = list(message.get("headers", []))
                if not any(bytes(k).lower() == SERVED_BY_HEADER for k, _ in headers):
                    headers.append((SERVED_BY_HEADER, self.region))
                message["headers"] = headers
            await send(message)

        return stamped


async def _send_error(send: Send, rej: _Reject, *, retry_after_s: float) -> None:
    body = json.dumps(
        {"error": {"code": rej.code, "message": rej.message, "retryable": rej.retryable}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if rej.status in (429, 503):
        headers.append((b"retry-after", str(max(1, math.ceil(retry_after_s))).encode()))
    if rej.status == 413:
        headers.append((b"connection", b"close"))  # the rest of the body was not read
    await send({"type": "http.response.start", "status": rej.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
