"""Routes of regions and placement: the public control view, operator actions, the peer API.

* ``GET /v1/regions``: every region with its status (up / suspected / down, by this node's view
  and what its peers report), capacity weight and who suspects it.
* ``GET /v1/placement``: the committed placement (version, shard -> region, down, evacuated).
* ``GET /v1/conversations/{id}/route``: the region serving the conversation's shard and the
  shard's epoch (answered by that region: a non-leader forwards); ``worker``: the engine replay
  last warmed for it (``services.api.replay_routes.affinity_body``), null when none is known;
  ``model_revision`` and ``cache_salt``: what the next turn must send to hit replay's KV.
* ``POST /v1/admin/regions/{name}/evacuate|restore``: operator moves, committed by the control
  leader (other nodes forward there); operator keys only (``services.api.roles``), each one
  recorded in the audit log.
* ``GET /peer/health``, ``GET /peer/placement``: what nodes ask each other. When the cluster
  file has a ``peer_secret`` they need it in ``X-Convplane-Peer-Auth`` (401 otherwise): a probe
  reply steers failure detection, so only nodes may give one.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request

from eventlog.errors import NotFound, NotLeader, Unauthorized, Unavailable
from regions.drills import REASON_CHARS_MAX
from services.api import control_schemas as bodies
from services.api import schemas
from services.api.context import RequestContext, app_services, request_context
from services.api.forwarding import PEER_AUTH_HEADER
from services.api.openapi import CHAT_APPS, OPERATORS, errors
from services.api.peer_trust import peer_region
from services.api.replay_routes import affinity_body, live_request_fields
from services.api.roles import OPERATOR_ROLES, require_role
from services.control.controller import Controller

control_router = APIRouter(prefix="/v1")
peer_router = APIRouter(prefix="/peer")
Context = Annotated[RequestContext, Depends(request_context)]
ConversationIdPath = Annotated[str, Path(min_length=1, max_length=128, pattern=schemas.ID_PATTERN)]
RegionPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=bodies.REGION_NAME_MAX,
        pattern=bodies.REGION_PATTERN,
        openapi_examples={"region": {"value": "eu-west"}},
    ),
]


def _controller(request: Request) -> Controller:
    controller = app_services(request.app).controller
    if controller is None:
        raise Unavailable("failure detection and placement are not running on this node")
    return controller


def _placement_body(controller: Controller) -> dict[str, Any]:
    return {**controller.placement().to_body(), "control_leader": controller.control_leader()}


@control_router.get("/regions", tags=[OPERATORS], response_model=bodies.Regions)
async def list_regions(ctx: Context) -> dict[str, Any]:
    """Every region with its status (up / suspected / down, by this node's view and its peers'
    reports), capacity weight, who suspects it and how many shards it leads."""
    controller = _controller(ctx.request)
    return {"observer": controller.region, "regions": controller.regions_view()}


@control_router.get("/placement", tags=[OPERATORS], response_model=bodies.Placement)
async def get_placement(ctx: Context) -> dict[str, Any]:
    """The committed placement: shard -> region, regions down and evacuated, its version."""
    return _placement_body(_controller(ctx.request))


@control_router.get(
    "/conversations/{conversation_id}/route",
    tags=[CHAT_APPS],
    response_model=bodies.Route,
    responses=errors(404),
)
async def get_route(ctx: Context, conversation_id: ConversationIdPath) -> Any:
    """Where an inference gateway should send the conversation's next turn: the region leading
    its shard, and the replay worker whose KV for it is warm (null when none is known).
    Answered by the leading region (others forward)."""
    controller = _controller(ctx.request)
    node = controller.node
    shard = node.shard_of(conversation_id)

    async def locate() -> dict[str, Any]:
        leader = node.leader(shard)
        if leader is None or not leader.serving:
            owner = controller.placement().assignment.get(shard)
            raise NotLeader(
                f"{controller.region} does not lead shard {shard}",
                shard=shard,
                leader_region=owner,
                retry_after_s=0.5,
            )
        # another tenant's conversation is a 404, like every other read (no existence oracle)
        info = await ctx.api.log.get_conversation(ctx.tenant.tenant_id, conversation_id)
        return {
            "conversation_id": conversation_id,
            "region": controller.region,
            "node": controller.settings.node_index,
            "node_url": ctx.api.cluster.region(controller.region).node_urls()[
                controller.settings.node_index
            ],
            "shard": shard,
            "epoch": leader.epoch,
            "placement_version": controller.placement().version,
            "worker": affinity_body(ctx.request, ctx.tenant.tenant_id, conversation_id),
            **live_request_fields(ctx.request, ctx.tenant.tenant_id, info.model_revision),
        }

    return await ctx.run(locate, is_write=False)


@control_router.post(
    "/admin/regions/{name}/{action}",
    tags=[OPERATORS],
    response_model=bodies.Placement,
    responses=errors(404, 409),
)
async def region_action(
    ctx: Context,
    name: RegionPath,
    action: Literal["evacuate", "restore"],
    reason: Annotated[str, Query(max_length=REASON_CHARS_MAX)] = "",
) -> Any:
    """An operator move (operator keys only): `evacuate` moves the region's shards away
    (planned handoff, no acked loss), `restore` lets them come back. Committed by the control
    shard's leader (other nodes forward there), recorded in the audit log with `reason` (why
    the operator moved it; "operator request" when not given); answers the new placement.
    404: no such region; 409: the move would leave no region to lead shards."""
    require_role(ctx.tenant, OPERATOR_ROLES)
    controller = _controller(ctx.request)
    if name not in {r.name for r in controller.cluster.regions}:
        raise NotFound(f"no region {name!r}")
    drills = app_services(ctx.request.app).drills

    async def act() -> dict[str, Any]:
        if drills is None:  # a plane without a drill driver keeps no audit log
            await controller.operator(action, name)
        else:
            why = reason.strip() or "operator request"
            await drills.move_region(
                action, name, by=ctx.tenant.tenant_id, role=ctx.tenant.role, reason=why
            )
        return _placement_body(controller)

    return await ctx.run(act, is_write=True)


def _require_peer(request: Request) -> None:
    secret = _controller(request).cluster.peer_secret
    if secret is None:
        return
    sent = request.headers.get(PEER_AUTH_HEADER, "")
    if not hmac.compare_digest(sent.encode(), secret.encode()):
        raise Unauthorized("peer endpoints need the cluster's peer secret")


@peer_router.get("/health", response_model=bodies.PeerHealth)
async def peer_health(request: Request) -> dict[str, Any]:
    """Internal: a node's probe reply (its suspects and led shards) for failure detection.
    A node of a region some of whose node slots nobody leads now answers other regions 503:
    they must not count the region up on its word (``Controller.answers_probes``). Its
    siblings always get the reply: it is how they learn which slots it holds."""
    _require_peer(request)
    controller = _controller(request)
    sibling = peer_region(request.scope) == controller.region
    if not sibling and not controller.answers_probes():
        raise Unavailable(f"a node of {controller.region}, some of whose slots nobody leads now")
    return controller.health_reply()


@peer_router.get("/placement", response_model=bodies.Placement)
async def peer_placement(request: Request) -> dict[str, Any]:
    """Internal: the placement this node holds."""
    _require_peer(request)
    return _placement_body(_controller(request))
