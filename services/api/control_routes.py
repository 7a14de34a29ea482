"""Routes of regions and placement: the public control view, operator actions, the peer API.

* ``GET /v1/regions``: every region with its status (up / suspected / down, by this node's view
  and what its peers report), capacity weight and who suspects it.
* ``GET /v1/placement``: the committed placement (version, shard -> region, down, evacuated).
* ``GET /v1/conversations/{id}/route``: the region serving the conversation's shard and the
  shard's epoch (answered by that region: a non-leader forwards); ``worker``: the engine replay
  last warmed for it (``services.replay.routes.affinity_body``), null when none is known.
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

from fastapi import APIRouter, Depends, Path, Request

from eventlog.errors import NotLeader, Unauthorized, Unavailable
from services.api import schemas
from services.api.context import RequestContext, request_context
from services.api.forwarding import PEER_AUTH_HEADER
from services.api.roles import OPERATORS, require_role
from services.controller import Controller
from services.replay.routes import affinity_body

control_router = APIRouter(prefix="/v1")
peer_router = APIRouter(prefix="/peer")
Context = Annotated[RequestContext, Depends(request_context)]
ConversationIdPath = Annotated[str, Path(min_length=1, max_length=128, pattern=schemas.ID_PATTERN)]
RegionPath = Annotated[str, Path(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9-]*$")]


def _controller(request: Request) -> Controller:
    controller = getattr(request.app.state, "controller", None)
    if not isinstance(controller, Controller):
        raise Unavailable("failure detection and placement are not running on this node")
    return controller


def _placement_body(controller: Controller) -> dict[str, Any]:
    return {**controller.placement().to_body(), "control_leader": controller.control_leader()}


@control_router.get("/regions")
async def list_regions(ctx: Context) -> dict[str, Any]:
    controller = _controller(ctx.request)
    return {"observer": controller.region, "regions": controller.regions_view()}


@control_router.get("/placement")
async def get_placement(ctx: Context) -> dict[str, Any]:
    return _placement_body(_controller(ctx.request))


@control_router.get("/conversations/{conversation_id}/route")
async def get_route(ctx: Context, conversation_id: ConversationIdPath) -> Any:
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
        return {
            "conversation_id": conversation_id,
            "region": controller.region,
            "shard": shard,
            "epoch": leader.epoch,
            "placement_version": controller.placement().version,
            "worker": affinity_body(ctx.request, ctx.tenant.tenant_id, conversation_id),
        }

    return await ctx.run(locate, is_write=False)


@control_router.post("/admin/regions/{name}/{action}")
async def region_action(
    ctx: Context, name: RegionPath, action: Literal["evacuate", "restore"]
) -> Any:
    require_role(ctx.tenant, OPERATORS)
    controller = _controller(ctx.request)
    drills = getattr(ctx.request.app.state, "drills", None)

    async def act() -> dict[str, Any]:
        await controller.operator(action, name)
        if drills is not None:
            who, role = ctx.tenant.tenant_id, ctx.tenant.role
            await drills.audit(who, role, f"region.{action}", name, "operator request", {})
        return _placement_body(controller)

    return await ctx.run(act, is_write=True)


def _require_peer(request: Request) -> None:
    secret = _controller(request).cluster.peer_secret
    if secret is None:
        return
    sent = request.headers.get(PEER_AUTH_HEADER, "")
    if not hmac.compare_digest(sent.encode(), secret.encode()):
        raise Unauthorized("peer endpoints need the cluster's peer secret")


@peer_router.get("/health")
async def peer_health(request: Request) -> dict[str, Any]:
    _require_peer(request)
    return _controller(request).health_reply()


@peer_router.get("/placement")
async def peer_placement(request: Request) -> dict[str, Any]:
    _require_peer(request)
    return _placement_body(_controller(request))
