"""Routes of the replay service.

* ``GET /v1/replays``: this region's replay status (backlog, counters, spare, engines and their
  URLs, workers): operator and viewer keys only (a tenant sees no other tenant's plumbing).
* ``POST /v1/replays``: operator keys only (never a replay worker key: a job a worker key
  could queue would grant it the transcript): replay
  ``{"tenant_id": ..., "conversation_ids": [...]}`` (ids are namespaced by tenant)
  (each must be led by this region; the answer says, per id) or ``{"shard": n}`` (must be led
  here: 503 ``not_led_here`` names the leader otherwise).
* ``live_request_fields``: the ``model_revision`` and ``cache_salt`` of ``/route``.
* ``GET /v1/conversations/{id}/affinity``: the worker and engine whose KV for the conversation
  was last rebuilt by replay (``worker`` null when none is known), answered by the region that
  leads the conversation's shard (other regions forward). A tenant sees only its own.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request

from eventlog.errors import InvalidRequest, NotLeader, Unavailable
from replay.cache_salt import cache_salt_for
from services.api import control_schemas as bodies
from services.api import schemas
from services.api.context import RequestContext, api_state, app_services, request_context
from services.api.openapi import CHAT_APPS, OPERATORS, errors
from services.api.roles import OBSERVER_ROLES, OPERATOR_ROLES, require_role
from services.replay.service import ReplayService

replay_router = APIRouter(prefix="/v1")
Context = Annotated[RequestContext, Depends(request_context)]
ConversationIdPath = Annotated[str, Path(min_length=1, max_length=128, pattern=schemas.ID_PATTERN)]


def _service(request: Request) -> ReplayService:
    service = app_services(request.app).replay
    if service is None:
        raise Unavailable("replay is not running on this node")
    return service


@replay_router.get("/replays", tags=[OPERATORS], response_model=bodies.ReplayStatus)
async def replay_status(ctx: Context) -> dict[str, Any]:
    """This region's replay: backlog, counters, spare prefill, engines, workers (operator or
    viewer keys)."""
    require_role(ctx.tenant, OBSERVER_ROLES)
    return _service(ctx.request).status()


@replay_router.post(
    "/replays", status_code=202, tags=[OPERATORS], response_model=bodies.ReplayAccepted
)
async def request_replay(ctx: Context, body: bodies.ReplayRequest) -> dict[str, Any]:
    """Replay conversations, or a whole shard, led by this region (operator keys only).
    202: queued; the answer says what happened to each."""
    require_role(ctx.tenant, OPERATOR_ROLES)
    service = _service(ctx.request)
    if isinstance(body, bodies.ReplayShard):
        if body.shard >= service.shard_count:
            raise InvalidRequest(f"shard must be < {service.shard_count}")
        report = await service.replay_shard(body.shard)
        return {
            "shard": body.shard,
            "accepted": report.accepted,
            "outside_window": report.outside_window,
            "rejected_full": report.rejected_full,
            "superseded": report.superseded,
        }
    outcome = await service.replay_conversations(body.tenant_id, body.conversation_ids)
    return {"conversations": outcome}


def live_request_fields(request: Request, tenant_id: str, model_revision: str) -> dict[str, str]:
    """What ``/route`` tells an inference gateway to send with the conversation's next turn so
    that it hits the KV replay warmed: the pinned model revision (the engine's served model
    name) and the tenant's ``cache_salt`` (``replay.cache_salt``), the values replay used."""
    cluster = api_state(request).cluster
    salt_key = cluster.replay.salt_key(cluster.peer_secret)
    return {"model_revision": model_revision, "cache_salt": cache_salt_for(salt_key, tenant_id)}


def affinity_body(request: Request, tenant_id: str, conversation_id: str) -> dict[str, Any] | None:
    """The ``worker`` object of ``/route`` and ``/affinity`` (None: no warm engine known)."""
    service = app_services(request.app).replay
    if service is None:
        return None
    affinity = service.affinity_of(tenant_id, conversation_id)
    if affinity is None:
        return None
    return {
        "worker_id": affinity.worker_id,
        "engine_id": affinity.engine_id,
        "engine_url": service.engine_urls.get(affinity.engine_id),
        "model_revision": affinity.model_revision,
        "warm_since": schemas.iso_utc(affinity.warm_since_ms),
        "prompt_tokens": affinity.prompt_tokens,
    }


@replay_router.get(
    "/conversations/{conversation_id}/affinity",
    tags=[CHAT_APPS],
    response_model=bodies.Affinity,
    responses=errors(404),
)
async def get_affinity(ctx: Context, conversation_id: ConversationIdPath) -> Any:
    """The worker and engine whose KV for the conversation replay last rebuilt (null when none
    is known); answered by the region leading the conversation's shard."""
    service = _service(ctx.request)
    node = service.lister.node
    shard = node.shard_of(conversation_id)

    async def locate() -> dict[str, Any]:
        if not node.leads(shard):
            controller = app_services(ctx.request.app).controller
            owner = None if controller is None else controller.placement().assignment.get(shard)
            raise NotLeader(
                f"{service.region} does not lead shard {shard}",
                shard=shard,
                leader_region=owner,
                retry_after_s=0.5,
            )
        # another tenant's conversation is a 404, like every other read (no existence oracle)
        await ctx.api.log.get_conversation(ctx.tenant.tenant_id, conversation_id)
        return {
            "conversation_id": conversation_id,
            "region": service.region,
            "shard": shard,
            "worker": affinity_body(ctx.request, ctx.tenant.tenant_id, conversation_id),
        }

    return await ctx.run(locate, is_write=False)
