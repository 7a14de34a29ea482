"""Routes of the public API. Handlers are thin: validate, call the log under the request's
deadline (``RequestContext.run``), shape the answer. A replayed idempotent append answers
**200** with ``Idempotent-Replayed: true`` and the original body; a fresh one answers 201.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from eventlog.errors import InvalidRequest
from services.api import schemas
from services.api.context import RequestContext, _deadline_s, api_state, request_context
from services.api.forwarding import FORWARDED_HEADER
from services.api.paging import within_bytes

IDEMPOTENCY_KEY_RE = re.compile(r"[\x20-\x7e]{1,255}")
ATTEMPT_ID_MAX = 255

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": schemas.ErrorBody, "description": text}
    for status, text in {
        400: "invalid request",
        401: "missing or unknown API key",
        404: "no such conversation",
        409: "seq, effect or idempotency-key conflict",
        413: "body too large",
        415: "body is not JSON",
        429: "tenant over quota",
        503: "unavailable (retryable)",
        504: "deadline exceeded",
    }.items()
}

router = APIRouter(prefix="/v1", responses=_ERRORS)
Context = Annotated[RequestContext, Depends(request_context)]
TENANT_HEADER = "X-Convplane-Tenant"


async def read_context(request: Request) -> RequestContext:
    """``request_context`` for reads, which the replay service key may also make on behalf of
    the tenant named in ``X-Convplane-Tenant`` (not charged to the tenant's quota: replay reads
    are paced by the replay service's own limits)."""
    api = api_state(request)
    authorization = request.headers.get("authorization")
    if not api.tenants.is_service_key(authorization):
        return await request_context(request)
    tenant = api.tenants.authenticate_read(authorization, request.headers.get(TENANT_HEADER))
    forwarded = request.headers.get(FORWARDED_HEADER) is not None
    return RequestContext(api, request, tenant, _deadline_s(api, request), forwarded)


ReadContext = Annotated[RequestContext, Depends(read_context)]
ConversationIdPath = Annotated[str, Path(min_length=1, max_length=128, pattern=schemas.ID_PATTERN)]
AttemptIdPath = Annotated[
    str, Path(min_length=1, max_length=ATTEMPT_ID_MAX, pattern=schemas.ID_PATTERN)
]


def _conversation_id(ctx: RequestContext) -> str:
    return f"c-{ctx.api.rng.getrandbits(96):024x}"


@router.post("/conversations", status_code=201, response_model=schemas.ConversationCreated)
async def create_conversation(
    ctx: Context, body: schemas.CreateConversationRequest | None = None
) -> Any:
    body = body or schemas.CreateConversationRequest()
    metadata_bytes = len(json.dumps(body.metadata, separators=(",", ":")))
    if metadata_bytes > ctx.api.settings.max_metadata_bytes:
        raise InvalidRequest(f"metadata over {ctx.api.settings.max_metadata_bytes} bytes")
    conversation_id = body.conversation_id or _conversation_id(ctx)
    model_revision = body.model_revision or ctx.api.cluster.default_model_revision
    # A forwarded create carries the id chosen here, so the leader does not choose another.
    forward_body = json.dumps(
        {
            "conversation_id": conversation_id,
            "model_revision": model_revision,
            "metadata": body.metadata,
        }
    ).encode()
    result = await ctx.run(
        lambda: ctx.api.log.create_conversation(
            ctx.tenant.tenant_id, conversation_id, model_revision, body.metadata
        ),
        is_write=True,
        forward_body=forward_body,
    )
    if isinstance(result, Response):
        return result
    return schemas.ConversationCreated.of(result)


@router.post(
    "/conversations/{conversation_id}/events",
    status_code=201,
    response_model=schemas.EventAppended,
    responses={200: {"model": schemas.EventAppended, "description": "idempotent replay"}},
)
async def append_event(
    ctx: Context,
    conversation_id: ConversationIdPath,
    body: schemas.AppendEventRequest,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> Any:
    if idempotency_key is not None and not IDEMPOTENCY_KEY_RE.fullmatch(idempotency_key):
        raise InvalidRequest("Idempotency-Key must be 1-255 printable ASCII characters")
    started_s = ctx.api.clock.monotonic()
    result = await ctx.run(
        lambda: ctx.api.log.append_event(
            ctx.tenant.tenant_id,
            conversation_id,
            body.type,
            body.payload,
            token_count=body.token_count,
            expected_seq=body.expected_seq,
            idempotency_key=idempotency_key,
        ),
        is_write=True,
    )
    if isinstance(result, Response):
        return result
    ctx.api.metrics.ack_latency.observe(ctx.api.clock.monotonic() - started_s)
    content = schemas.EventAppended.of(result).model_dump(mode="json")
    if result.replayed:
        return JSONResponse(content, status_code=200, headers={"Idempotent-Replayed": "true"})
    return JSONResponse(content, status_code=201)


@router.get("/conversations/{conversation_id}", response_model=schemas.Conversation)
async def get_conversation(ctx: ReadContext, conversation_id: ConversationIdPath) -> Any:
    result = await ctx.run(
        lambda: ctx.api.log.get_conversation(ctx.tenant.tenant_id, conversation_id),
        is_write=False,
    )
    if isinstance(result, Response):
        return result
    return schemas.Conversation.of(result)


@router.get("/conversations/{conversation_id}/events", response_model=schemas.EventPage)
async def list_events(
    ctx: ReadContext,
    conversation_id: ConversationIdPath,
    after_seq: Annotated[int, Query(ge=0, le=schemas.JSON_INT_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=schemas.EVENTS_PAGE_MAX)] = 100,
) -> Any:
    result = await ctx.run(
        lambda: ctx.api.log.list_events(ctx.tenant.tenant_id, conversation_id, after_seq, limit),
        is_write=False,
    )
    if isinstance(result, Response):
        return result
    events = [
        schemas.Event.of(r) for r in within_bytes(result, ctx.api.settings.events_page_bytes_max)
    ]
    next_after_seq = events[-1].seq if events else after_seq
    return schemas.EventPage(events=events, next_after_seq=next_after_seq)


@router.get(
    "/conversations/{conversation_id}/tool-attempts/{attempt_id}",
    response_model=schemas.ToolAttempt,
)
async def tool_attempt(
    ctx: Context, conversation_id: ConversationIdPath, attempt_id: AttemptIdPath
) -> Any:
    result = await ctx.run(
        lambda: ctx.api.log.tool_attempt(ctx.tenant.tenant_id, conversation_id, attempt_id),
        is_write=False,
    )
    if isinstance(result, Response):
        return result
    return schemas.ToolAttempt.of(result)


ops_router = APIRouter()


@ops_router.get(
    "/healthz", response_model=schemas.Health, responses={503: {"model": schemas.Health}}
)
async def healthz(request: Request) -> Any:
    api = api_state(request)
    placed, led = api.readiness()
    controller = getattr(request.app.state, "controller", None)
    unhealthy = controller.supervisor.unhealthy() if controller is not None else []
    ready = led >= placed and not unhealthy
    health = schemas.Health(
        status="degraded" if unhealthy else "ok" if ready else "starting",
        region=api.region,
        shards_placed=placed,
        shards_led=led,
        unhealthy_loops=unhealthy,
    )
    if ready:
        return health
    headers = {"Retry-After": "1"}
    return JSONResponse(health.model_dump(), status_code=503, headers=headers)


@ops_router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    return Response(api_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
