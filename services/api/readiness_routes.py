"""``GET /v1/readiness?refresh=``: how ready the plane is to lose each region (operator and
viewer keys): per region and for the plane a status (``ready``, ``at_risk``, ``not_ready``), a
score from 0 to 100 and what went into it (``regions.readiness`` states the formula).

The control shard's leader answers (other nodes forward there, as drill reads do): it holds the
drill records the score reads and keeps the evaluation fresh (``services.control.readiness``).
``refresh=true`` evaluates now instead of answering the last evaluation.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from eventlog.errors import Unavailable
from services.api.context import RequestContext, app_services, request_context
from services.api.roles import OBSERVER_ROLES, require_role
from services.control.readiness import ReadinessMonitor

readiness_router = APIRouter(prefix="/v1")
Context = Annotated[RequestContext, Depends(request_context)]


def _monitor(request: Request) -> ReadinessMonitor:
    monitor = app_services(request.app).loss_readiness
    if monitor is None:
        raise Unavailable("readiness is not evaluated on this node")
    return monitor


@readiness_router.get("/readiness", response_model=dict[str, Any])
async def get_readiness(ctx: Context, refresh: Annotated[bool, Query()] = False) -> Any:
    """Readiness to lose each region (operator or viewer keys): whether quorum holds without
    it, whether the survivors' capacity serves the moved load at current rates, the lower
    bound on replaying the moved conversations, and the age and outcome of its last passed
    drill, folded into a status and a 0-100 score per region and for the plane (its least
    ready region). `refresh=true` evaluates now; otherwise the last evaluation, at most
    `readiness_interval_s` old."""
    require_role(ctx.tenant, OBSERVER_ROLES)
    monitor = _monitor(ctx.request)

    async def read() -> dict[str, Any]:
        await monitor.read_barrier()
        return (await monitor.read(refresh=refresh)).to_body()

    return await ctx.run(read, is_write=False)
