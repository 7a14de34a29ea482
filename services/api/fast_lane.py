"""The fast lane: ``POST /v1/conversations/{id}/events`` (an append), ``GET
/v1/conversations/{id}`` and ``GET /v1/conversations/{id}/events`` (linearizable reads of the
conversation and of a page of its transcript) served straight from the client listener's HTTP
parser, by the same parts the app would run them through.

Appends are what chat applications call most, and reads of their conversations come with
them. Under ``bench/rest.py`` a node spent about half of its CPU per append around the handler
rather than in it: the server's ASGI request cycle and its messages, the app's middleware layers
(each wrapping ``send`` and ``receive``), Starlette's response machinery; and about a third of
its CPU per read. The lane skips those layers, not their work: the client listener's
connection (``services.http_connection``) hands it the request head and body, and it runs the steps the layers would run, in one place:

1. **Eligible** (``eligible``, on the request head): an HTTP/1.1 ``POST`` to the append path
   (no query, no percent-escapes), one ``Content-Length`` within ``max_body_bytes``, one
   ``Authorization``, one JSON ``Content-Type``, and nothing the layers treat specially
   (``Origin``: CORS; ``Transfer-Encoding``, ``Expect``, ``Upgrade``; the forwarding headers).
   Or an HTTP/1.1 ``GET`` of the conversation's path (no query) or of its events' (a query of
   ``after_seq`` and ``limit`` only, each at most once, in plain digits within the route's
   bounds), no percent-escapes, one ``Authorization``, none of those headers, and no body nor
   any header a read's route reads (``X-Convplane-Tenant``) or its body checks would
   (``Content-Length``, ``Content-Type``, ``Idempotency-Key``). The listener takes the lane
   only when the whole body arrived with the head and no other request of the connection is
   under way.
2. **Prepared** (``prepare``, on the body; still nothing done or counted): JSON parsed as the
   edge parses it (``check_json_body``), the route's own checks (``AppendCheck``), a tenant key
   whose role may write (a read: a key whose role may read, as the app checks it; a service
   key's reads, on behalf of a tenant, take the app). Whatever a check would refuse goes back
   to the app untouched, so every refusal of a malformed request is the app's own, word for
   word.
3. **Served** (``serve``): admission as the edge does it (``NodeAdmission.arrive`` and ``admit``:
   401, 429, 503, 504, worded by ``edge_error``), the route's handler itself
   (``routes.append_event``, ``get_conversation`` or ``list_events``: the log call under the
   deadline, a forward on ``NotLeader``; a read's model as FastAPI serializes a
   ``response_model``, without validating again the model the route just built), an error as
   the app's handler words it (``refusal``), the headers the layers add
   (``X-Convplane-Served-By``, CORS's ``Vary``), and the request counted where the layers count
   it: the request metrics, the console's append outcomes (appends only), the admission
   limit's latency. A bug (any other exception) is logged and answered 500, and the connection
   closed, as the app's error middleware and the server's ASGI cycle do.

The leader of a forward batch (``services.api.forward_batch``) hands its items to the lane too
(``serve_forwarded``; the batch route gets the lane as an argument: ``forward_batch_router``): each
is prepared and served as above, as the trusted forward it is (its admission is the forward's, its
``NotLeader`` is not forwarded again, the console does not count it: it entered another node), and
what the lane does not take goes through the app.

``tests/unit/test_fast_lane.py`` sends the same requests, and the same forwarded items,
through the lane and through the app and compares the answers and the metrics. The lane is off
while tracing is on (the FastAPI instrumentation makes each request's span) and on the peer
listener.

Where the two differ, on purpose or by a hair: a client that does not take its answer within
``send_timeout_s`` loses its connection with nothing written (on the app's path the edge counts
the same 408, and the server then tries a 500 for another ``send_timeout_s``); and the deadline and
the request's latency are fixed once the body is in, not when the head arrived (the lane only
takes bodies that came in the head's own packet).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message

from eventlog.errors import ConvplaneError, InvariantViolation, Unavailable
from eventlog.http_headers import FORWARDED_HEADER_RAW, SERVED_BY_HEADER_RAW
from services.api import routes
from services.api.admission import DEADLINE_SCOPE_KEY, Entry, NodeAdmission
from services.api.append_check import AppendCheck, declared_route, valid_conversation_id
from services.api.append_outcomes import AppendOutcomes
from services.api.context import ApiState, RequestContext
from services.api.errors import refusal
from services.api.event_bodies import AnyEvent
from services.api.metrics import Metrics
from services.api.middleware import edge_error, is_json_media_type, json_body_or_none
from services.api.roles import require_read_only_viewer
from services.api.schemas import EVENTS_PAGE_MAX, JSON_INT_MAX
from services.config import TenantConfig
from services.logs import bind_request

log = logging.getLogger("convplane.fast_lane")

Headers = list[tuple[bytes, bytes]]
Kind = Literal["append", "conversation", "events"]
#: the append path as the client sent it: an id of the characters ids may hold (no escapes)
_APPEND_URL = re.compile(rb"^/v1/conversations/([A-Za-z0-9._:-]+)/events$")
#: the paths of the reads the lane takes, the same way: the conversation, a page of its events
_CONVERSATION_PATH = re.compile(rb"^/v1/conversations/([A-Za-z0-9._:-]+)$")
_EVENTS_PATH = re.compile(rb"^/v1/conversations/([A-Za-z0-9._:-]+)/events$")
#: an events page's query the lane takes: each parameter at most once, plain decimal digits
_PAGE_VALUE = rb"(0|[1-9][0-9]{0,15})"
_PAGE_QUERY = re.compile(
    rb"^(after_seq|limit)=" + _PAGE_VALUE + rb"(?:&(after_seq|limit)=" + _PAGE_VALUE + rb")?$"
)
#: what a read may not carry to take the lane: a body, or a header its route reads
#: (``X-Convplane-Tenant``, ``X-Convplane-Replay-Grant``: a worker key's reads for a tenant)
_READ_DECLINED_HEADERS = frozenset(
    {
        b"content-length",
        b"content-type",
        b"idempotency-key",
        b"x-convplane-tenant",
        b"x-convplane-replay-grant",
    }
)
#: request headers that some layer of the app treats specially: such a request takes the app
_DECLINED_HEADERS = frozenset(
    {
        b"origin",
        b"transfer-encoding",
        b"expect",
        b"upgrade",
        b"x-convplane-forwarded",
        b"x-convplane-peer-auth",
    }
)
#: what the app's error middleware answers to a bug (and the server then closes the connection)
_BUG_HEADERS: Headers = [
    (b"content-length", b"21"),
    (b"content-type", b"text/plain; charset=utf-8"),
]
_BUG_BODY = b"Internal Server Error"
#: the metrics' route label of a request refused before the app routed it (as the edge counts)
_UNROUTED = "unmatched"


@dataclass(slots=True)
class LaneRequest:
    """An eligible request: its scope (completed as the ASGI spec says) and what the lane
    read from its head; ``body`` fills as the parser delivers it."""

    scope: MutableMapping[str, Any]
    conversation_id: str
    authorization: str
    content_length: int
    idempotency_keys: list[bytes]
    keep_alive: bool
    #: what the request is: an append, or a read of the conversation or of a page of its events
    kind: Kind = "append"
    #: an events page's ``(after_seq, limit)`` (None: not an events page)
    page: tuple[int, int] | None = None
    #: an item of a forward batch (``serve_forwarded``); ``eligible`` declines a client's
    #: request that says it is a forward
    forwarded: bool = False
    body: bytearray = field(default_factory=bytearray)


@dataclass(slots=True)
class Prepared:
    request: LaneRequest
    tenant: TenantConfig
    event: AnyEvent | None  # None: a read
    idempotency_key: str | None
    body: bytes


@dataclass(slots=True)
class LaneResponse:
    status: int
    headers: Headers
    body: bytes
    #: close the connection after it, whatever its headers say (a bug's answer)
    close: bool = False

    @property
    def says_close(self) -> bool:
        """Whether the answer says ``Connection: close``."""
        return any(k == b"connection" and v.lower() == b"close" for k, v in self.headers)


#: the listener's side: writes a response (False: the client did not take it in time)
Respond = Callable[[LaneResponse], Awaitable[bool]]


class FastLane:
    """Built (closed) by ``create_app``; ``open``ed by the lifespan with the app's state."""

    def __init__(
        self,
        *,
        region: str,
        metrics: Metrics,
        admission: NodeAdmission,
        outcomes: AppendOutcomes,
        max_body_bytes: int,
        retry_after_default_s: float,
        check: AppendCheck,
    ) -> None:
        self._served_by = region.encode()
        self._metrics = metrics
        self._admission = admission
        self._outcomes = outcomes
        self._max_body_bytes = max_body_bytes
        self._retry_after_default_s = retry_after_default_s
        self._check = check
        self._routes: dict[Kind, APIRoute] = {
            "append": declared_route(routes.append_event.__name__),
            "conversation": declared_route(routes.get_conversation.__name__),
            "events": declared_route(routes.list_events.__name__),
        }
        self._api: ApiState | None = None

    def open(self, api: ApiState) -> None:
        """Serve from now on, unless tracing is on (module docstring)."""
        self._api = api if api.tracing is None else None

    def close(self) -> None:
        self._api = None

    # --- 1. the head -----------------------------------------------------------------------

    def eligible(
        self,
        scope: MutableMapping[str, Any],
        method: bytes,
        http_version: str,
        url: bytes,
        keep_alive: bool,
    ) -> LaneRequest | None:
        """A request the lane may take, by its head (``scope["headers"]``: names lower-cased,
        as the connection collects them); None: the app serves it."""
        if self._api is None or http_version != "1.1" or scope.get("root_path"):
            return None
        if method == b"GET":
            return self._eligible_read(scope, url, keep_alive)
        matched = _APPEND_URL.match(url) if method == b"POST" else None
        if matched is None:
            return None
        length = authorization = content_type = None
        keys: list[bytes] = []
        for name, value in scope["headers"]:
            if name == b"content-length":
                if length is not None or not value.isdigit():
                    return None
                length = int(value)
            elif name == b"authorization":
                if authorization is not None:
                    return None
                authorization = value
            elif name == b"content-type":
                if content_type is not None:
                    return None
                content_type = value
            elif name == b"idempotency-key":
                keys.append(value)
            elif name in _DECLINED_HEADERS:
                return None
        if length is None or length > self._max_body_bytes or authorization is None:
            return None
        if content_type is None or not is_json_media_type(content_type.decode("latin-1")):
            return None
        _claim(scope, "POST", url, b"")
        return LaneRequest(
            scope=scope,
            conversation_id=matched.group(1).decode("ascii"),
            authorization=authorization.decode("latin-1"),
            content_length=length,
            idempotency_keys=keys,
            keep_alive=keep_alive,
        )

    def _eligible_read(
        self, scope: MutableMapping[str, Any], url: bytes, keep_alive: bool
    ) -> LaneRequest | None:
        path, question_mark, query = url.partition(b"?")
        if question_mark and not query:
            return None
        kind: Kind = "conversation"
        page = None
        matched = _CONVERSATION_PATH.match(path)
        if matched is None:
            kind = "events"
            matched = _EVENTS_PATH.match(path)
            page = _page(query)
            if matched is None or page is None:
                return None
        elif query:
            return None
        authorization = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                if authorization is not None:
                    return None
                authorization = value
            elif name in _DECLINED_HEADERS or name in _READ_DECLINED_HEADERS:
                return None
        if authorization is None:
            return None
        _claim(scope, "GET", path, query)
        return LaneRequest(
            scope=scope,
            conversation_id=matched.group(1).decode("ascii"),
            authorization=authorization.decode("latin-1"),
            content_length=0,
            idempotency_keys=[],
            keep_alive=keep_alive,
            kind=kind,
            page=page,
        )

    # --- 2. the body -----------------------------------------------------------------------

    def prepare(self, request: LaneRequest) -> Prepared | None:
        """The checks that refuse a malformed request, none of which changes anything; None:
        the app serves it (and words the refusal)."""
        api = self._api
        body = bytes(request.body)
        if api is None or len(body) != request.content_length:
            return None
        if request.kind != "append":
            if not valid_conversation_id(request.conversation_id):
                return None
            tenant = self._tenant(api, request.authorization, "GET")
            return None if tenant is None else Prepared(request, tenant, None, None, body)
        if not body.strip():
            return None
        parsed = json_body_or_none(body)
        if parsed is None:  # refused (a body of JSON null is refused by the route too)
            return None
        accepted = self._check.accepted(request.conversation_id, request.idempotency_keys, parsed)
        if accepted is None:
            return None
        tenant = self._tenant(api, request.authorization, "POST")
        if tenant is None:
            return None
        event, idempotency_key = accepted
        return Prepared(request, tenant, event, idempotency_key, body)

    @staticmethod
    def _tenant(api: ApiState, authorization: str, method: str) -> TenantConfig | None:
        """The tenant whose key may make the request; None: the app refuses it (or serves a
        service key's)."""
        tenants = api.tenants
        if tenants.is_service_key(authorization):
            return None
        try:
            tenant = tenants.authenticate(authorization)
            require_read_only_viewer(tenant, method)
        except ConvplaneError:
            return None
        return tenant

    # --- forwarded appends ------------------------------------------------------------------

    async def serve_forwarded(
        self,
        scope: MutableMapping[str, Any],
        conversation_id: str,
        authorization: str,
        idempotency_keys: list[bytes],
        body: bytes,
    ) -> LaneResponse | None:
        """One item of a forward batch (``services.api.forward_batch``), its ``scope`` built
        as the app would get it, prepared and served as a client's append is; None: the app
        serves it (the lane is closed, or a check would refuse it)."""
        if self._api is None or len(body) > self._max_body_bytes:
            return None
        pending = LaneRequest(
            scope=scope,
            conversation_id=conversation_id,  # checked by prepare, as a client's
            authorization=authorization,
            content_length=len(body),
            idempotency_keys=idempotency_keys,
            keep_alive=True,
            forwarded=True,
            body=bytearray(body),
        )
        try:
            prepared = self.prepare(pending)
        except Exception:  # a bug in the lane: the app serves it, as on the listener
            log.exception("fast lane: prepare failed; the app serves the forwarded append")
            return None
        if prepared is None:
            return None
        answers: list[LaneResponse] = []

        async def respond(response: LaneResponse) -> bool:
            answers.append(response)
            return True

        await self.serve(prepared, respond)
        return answers[0]

    # --- 3. the answer ---------------------------------------------------------------------

    async def serve(self, prepared: Prepared, respond: Respond) -> None:
        """Admit, answer and respond, counting the request as the edge counts it."""
        started_s = time.perf_counter()
        status = answered = 500
        entry = None
        kind = prepared.request.kind
        template = self._routes[kind].path
        # the console counts the appends that entered this node only
        entering = kind == "append" and not prepared.request.forwarded
        try:
            try:
                entry = await self._admit(prepared.request.scope)
            except ConvplaneError as exc:
                retry_after_s = exc.retry_after_s or self._retry_after_default_s
                response = self._edge_refusal(exc, retry_after_s)
                template = _UNROUTED  # the edge refuses these before the app routes them
            else:
                response = await self._answer(prepared)
            status = answered = response.status
            if not await respond(response):
                status = 408  # a slow reader lost its connection, as at the edge
        except Exception:  # a bug: answered as the app's error middleware answers one
            log.exception("fast lane: unexpected error")
            await respond(LaneResponse(500, list(_BUG_HEADERS), _BUG_BODY, close=True))
        finally:
            self._admission.exit(entry, answered)
            if entering:
                self._outcomes.record(answered)
            latency_s = time.perf_counter() - started_s
            method = "POST" if kind == "append" else "GET"
            self._metrics.observe_request(template, method, status, latency_s)

    async def _admit(self, scope: MutableMapping[str, Any]) -> Entry | None:
        """The edge's admission: 401 and the deadline on arrival, then a permit (429, 503)."""
        if self._api is None:
            raise Unavailable("the node is starting or stopping", retry_after_s=1.0)
        return await self._admission.admit(scope, self._admission.arrive(scope))

    async def _answer(self, prepared: Prepared) -> LaneResponse:
        """The route's handler on the request, and its answer as the layers send it."""
        api = self._api
        if api is None:
            raise InvariantViolation("the fast lane answered while closed")
        request = prepared.request
        scope = request.scope
        scope["path_params"] = {"conversation_id": request.conversation_id}
        scope["route"] = self._routes[request.kind]
        ctx = RequestContext(
            api,
            Request(scope, _replaying(prepared.body)),
            prepared.tenant,
            scope[DEADLINE_SCOPE_KEY],
            # admission kept the forward's header on a trusted forward only
            forwarded=request.forwarded and _forwarded(scope),
        )
        bind_request(ctx)  # log lines of this request carry its fields (services.logs)
        conversation_id = request.conversation_id
        try:
            if prepared.event is not None:
                answer = await routes.append_event(
                    ctx, conversation_id, prepared.event, prepared.idempotency_key
                )
            elif request.page is not None:  # an events page
                after_seq, limit = request.page
                answer = _as_json(await routes.list_events(ctx, conversation_id, after_seq, limit))
            else:
                answer = _as_json(await routes.get_conversation(ctx, conversation_id))
        except ConvplaneError as exc:
            answer = refusal(exc, self._retry_after_default_s, self._metrics.count_error)
        status, headers, body = _rendered(answer)
        return LaneResponse(status, self._stamped(headers), body)

    def _edge_refusal(self, exc: ConvplaneError, retry_after_s: float) -> LaneResponse:
        headers, body = edge_error(
            exc.http_status,
            exc.code,
            exc.message,
            retryable=exc.retryable,
            retry_after_s=retry_after_s,
        )
        return LaneResponse(exc.http_status, self._stamped(headers), body)

    def _stamped(self, headers: Headers) -> Headers:
        """What the layers add on the way out: the edge's ``X-Convplane-Served-By`` (a
        forwarded answer keeps the serving peer's), then CORS's ``Vary: Origin``."""
        if not any(k == SERVED_BY_HEADER_RAW for k, _ in headers):
            headers.append((SERVED_BY_HEADER_RAW, self._served_by))
        varies = [v for k, v in headers if k == b"vary"]
        if varies:
            headers = [(k, v) for k, v in headers if k != b"vary"]
            headers.append((b"vary", b", ".join([*varies, b"Origin"])))
        else:
            headers.append((b"vary", b"Origin"))
        return headers


def _claim(scope: MutableMapping[str, Any], method: str, path: bytes, query: bytes) -> None:
    """Complete the scope the lane takes, as the connection completes it for the app."""
    scope["method"] = method
    scope["path"] = path.decode("ascii")
    scope["raw_path"] = path
    scope["query_string"] = query


def _page(query: bytes) -> tuple[int, int] | None:
    """An events page's ``(after_seq, limit)`` from its query, where the route would take them
    as they are; None: the app reads the query (anything else in it, escapes, a repeated
    parameter, a value out of the route's bounds)."""
    after_seq, limit = 0, routes.EVENTS_PAGE_DEFAULT
    if query:
        matched = _PAGE_QUERY.match(query)
        if matched is None or matched.group(1) == matched.group(3):
            return None
        for name, value in ((matched.group(1), matched.group(2)), matched.group(3, 4)):
            if name == b"after_seq":
                after_seq = int(value)
            elif name == b"limit":
                limit = int(value)
    if after_seq > JSON_INT_MAX or not 1 <= limit <= EVENTS_PAGE_MAX:
        return None
    return after_seq, limit


def _forwarded(scope: MutableMapping[str, Any]) -> bool:
    """Whether the request's headers (after admission) still say it is a forward."""
    return any(k == FORWARDED_HEADER_RAW for k, _ in scope["headers"])


def _replaying(body: bytes) -> Callable[[], Awaitable[Message]]:
    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _as_json(answer: Any) -> Any:
    """A route's model as the app sends it (FastAPI serializes a route's ``response_model``
    to JSON with pydantic); a response (a forward's relayed answer) as it is."""
    if isinstance(answer, BaseModel):
        return Response(answer.model_dump_json(), media_type="application/json")
    return answer


def _rendered(answer: Any) -> tuple[int, Headers, bytes]:
    """The route's answer (a plain Starlette response: its own JSON, an error's, or a
    forward's relayed answer) as (status, headers, body)."""
    body = getattr(answer, "body", None)
    if not isinstance(body, bytes):
        raise InvariantViolation(f"a route answered the lane a {type(answer).__name__}")
    return int(answer.status_code), list(answer.raw_headers), body
