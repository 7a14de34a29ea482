"""Routes of the public API. Handlers are thin: validate, call the log under the request's
deadline (``RequestContext.run``), shape the answer. A replayed idempotent append answers
**200** with ``Idempotent-Replayed: true`` and the original body; a fresh one answers 201.

Docstrings are the operations' descriptions in the OpenAPI document; the error responses every
operation shares are added there by ``services.api.openapi``.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from eventlog.conversation_state import repeat_gets_first_result
from eventlog.errors import Forbidden, InvalidRequest
from eventlog.http_headers import (
    IDEMPOTENCY_KEY_HEADER,
    IDEMPOTENT_REPLAYED_HEADER,
    TENANT_HEADER,
)
from replay import read_grant
from replay.read_grant import READ_GRANT_CHARS_MAX, READ_GRANT_HEADER
from services.api import schemas
from services.api.context import (
    RequestContext,
    _deadline_s,
    api_state,
    app_services,
    request_context,
)
from services.api.event_bodies import AnyEvent, payload_of
from services.api.forwarding import FORWARDED_HEADER
from services.api.openapi import CHAT_APPS, OPERATORS, errors, event_body
from services.api.paging import within_bytes
from services.replay.config import ANY_REGION

# Printable ASCII without surrounding spaces (HTTP strips those, so the server never sees them).
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]([\x20-\x7e]{0,253}[\x21-\x7e])?$"

#: the context an append runs in when tracing is off (one shared object: nothing allocated)
NOT_TRACED = nullcontext()

router = APIRouter(prefix="/v1", tags=[CHAT_APPS])
Context = Annotated[RequestContext, Depends(request_context)]


async def read_context(
    request: Request,
    on_behalf_of: Annotated[
        str | None,
        Header(
            alias=TENANT_HEADER,
            max_length=128,
            description="replay worker keys only: the tenant it reads for (ignored otherwise)",
        ),
    ] = None,
    grant: Annotated[
        str | None,
        Header(
            alias=READ_GRANT_HEADER,
            max_length=READ_GRANT_CHARS_MAX,
            description="replay worker keys only: the read grant of the replay job it reads for",
        ),
    ] = None,
) -> RequestContext:
    """``request_context`` for reads, which a replay worker key may also make on behalf of
    the tenant named in ``X-Convplane-Tenant`` (not charged to the tenant's quota: replay reads
    are paced by the replay service's own limits)."""
    api = api_state(request)
    authorization = request.headers.get("authorization")
    key_region = api.tenants.worker_key_region(authorization)
    if key_region is None:
        return await request_context(request)
    tenant = api.tenants.authenticate_read(authorization, on_behalf_of)
    forwarded = request.headers.get(FORWARDED_HEADER) is not None
    if not forwarded:  # a forward was checked at its entry node (admission drops an untrusted one)
        _check_read_grant(request, key_region, tenant.tenant_id, grant)
    return RequestContext(api, request, tenant, _deadline_s(api, request), forwarded)


def _check_read_grant(request: Request, key_region: str, tenant_id: str, grant: str | None) -> None:
    """A worker key reads one thing: the transcript its replay job's read grant names
    (``replay.read_grant``), for a job of its own region. The plane signs the grant when it
    dispatches the job, so the key alone reads no tenant's conversation, and one region's
    stolen key reads nothing of another region's jobs."""
    api = api_state(request)
    if getattr(request.scope.get("route"), "name", None) != "list_events":
        raise Forbidden("a replay worker key reads transcripts only")
    granted = read_grant.verify(
        api.cluster.replay.read_grant_key(api.cluster.peer_secret),
        grant,
        tenant_id=tenant_id,
        conversation_id=request.path_params.get("conversation_id", ""),
        now_ms=api.clock.wall_ms(),
    )
    if key_region not in (ANY_REGION, granted.region):
        raise Forbidden(
            f"this worker key reads for {key_region}'s replay jobs, not {granted.region}'s"
        )


ReadContext = Annotated[RequestContext, Depends(read_context)]
#: events in a page when the request does not say
EVENTS_PAGE_DEFAULT = 100
ConversationIdPath = Annotated[str, Path(min_length=1, max_length=128, pattern=schemas.ID_PATTERN)]
AttemptIdPath = Annotated[
    str, Path(min_length=1, max_length=schemas.ATTEMPT_ID_MAX, pattern=schemas.ID_PATTERN)
]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias=IDEMPOTENCY_KEY_HEADER,
        max_length=255,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="makes the append safe to retry: a retry with the same key and body returns "
        "the original result (200, Idempotent-Replayed: true); with another body, 409 "
        "idempotency_key_reused",
    ),
]


def _conversation_id(ctx: RequestContext) -> str:
    return f"c-{ctx.api.rng.getrandbits(96):024x}"


@router.post(
    "/conversations",
    status_code=201,
    response_model=schemas.ConversationCreated,
    responses=errors(409),
)
async def create_conversation(
    ctx: Context, body: schemas.CreateConversationRequest | None = None
) -> Any:
    """Create a conversation (a tenant key). Its shard's leader region commits it at a quorum
    like any event. The answer links to the conversation's other operations."""
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
    responses={
        200: {
            "model": schemas.EventAppended,
            "description": "a retry of an append that committed: the original result",
            "headers": {
                IDEMPOTENT_REPLAYED_HEADER: {
                    "required": True,
                    "schema": {"type": "string", "enum": ["true"]},
                }
            },
        },
        **errors(404, 409),
    },
)
async def append_event(
    ctx: Context,
    conversation_id: ConversationIdPath,
    body: Annotated[AnyEvent, event_body()],
    idempotency_key: IdempotencyKey = None,
) -> Any:
    """Append an event (a tenant key); acknowledged (201) once a quorum of regions holds it
    durably, and `acked_by` names them. The body's `type` selects the payload's shape. A 503 or
    504 means the outcome is unknown: retry with the same `Idempotency-Key`, which is always
    safe. 409: `seq_conflict` (`expected_seq` is not the last seq), `effect_conflict`,
    `unknown_attempt`, `idempotency_key_reused`."""
    started_s = ctx.api.clock.monotonic()
    tracing = ctx.api.tracing  # None unless tracing is on: then replica calls join this trace
    traced = tracing.appending(ctx.tenant.tenant_id, conversation_id) if tracing else NOT_TRACED
    with traced:
        result = await ctx.run(
            lambda: ctx.api.log.append_event(
                ctx.tenant.tenant_id,
                conversation_id,
                body.type,
                payload_of(body),
                token_count=body.token_count,
                expected_seq=body.expected_seq,
                idempotency_key=idempotency_key,
            ),
            is_write=True,
            batchable=True,
            repeatable=repeat_gets_first_result(body.type, idempotency_key),
        )
    if isinstance(result, Response):
        return result
    ctx.api.metrics.observe_ack(ctx.api.clock.monotonic() - started_s)
    content = schemas.EventAppended.of(result).model_dump(mode="json")
    if result.replayed:
        return JSONResponse(content, status_code=200, headers={IDEMPOTENT_REPLAYED_HEADER: "true"})
    return JSONResponse(content, status_code=201)


@router.get(
    "/conversations/{conversation_id}", response_model=schemas.Conversation, responses=errors(404)
)
async def get_conversation(ctx: ReadContext, conversation_id: ConversationIdPath) -> Any:
    """The conversation's last committed seq, home region, leader epoch and model revision
    (a linearizable read: answered by the shard's leader after it confirms it still leads)."""
    result = await ctx.run(
        lambda: ctx.api.log.get_conversation(ctx.tenant.tenant_id, conversation_id),
        is_write=False,
    )
    if isinstance(result, Response):
        return result
    return schemas.Conversation.of(result)


@router.get(
    "/conversations/{conversation_id}/events",
    response_model=schemas.EventPage,
    responses=errors(404),
)
async def list_events(
    ctx: ReadContext,
    conversation_id: ConversationIdPath,
    after_seq: Annotated[int, Query(ge=0, le=schemas.JSON_INT_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=schemas.EVENTS_PAGE_MAX)] = EVENTS_PAGE_DEFAULT,
) -> Any:
    """The committed transcript, in seq order, `limit` events after `after_seq`; pass
    `next_after_seq` as `after_seq` to read the next page (an empty page: the end)."""
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
    responses=errors(404),
)
async def tool_attempt(
    ctx: Context, conversation_id: ConversationIdPath, attempt_id: AttemptIdPath
) -> Any:
    """Whether a tool attempt's effect committed: ask this after a failover before running the
    tool again (404 when the attempt was never recorded)."""
    result = await ctx.run(
        lambda: ctx.api.log.tool_attempt(ctx.tenant.tenant_id, conversation_id, attempt_id),
        is_write=False,
    )
    if isinstance(result, Response):
        return result
    return schemas.ToolAttempt.of(result)


ops_router = APIRouter(tags=[OPERATORS])


@ops_router.get(
    "/healthz",
    response_model=schemas.Health,
    responses={503: {"model": schemas.Health, "description": "still taking its shards"}},
)
async def healthz(request: Request) -> Any:
    """Readiness, no key needed: 200 once the region leads every shard placed on it, 503
    (with `Retry-After`) until then."""
    services = app_services(request.app)
    api = services.api
    placed, led = api.readiness()
    controller = services.controller
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


@ops_router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
async def metrics(request: Request) -> Response:
    """Prometheus metrics of this node, no key needed."""
    return Response(api_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
