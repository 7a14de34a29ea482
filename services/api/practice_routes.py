"""Routes of practice runs (``services.control.practice``): schedules, the calendar, run
requests and approvals, operator alerts, the approval policy and the keys' blast radius.

* ``GET /v1/practice``: schedules, open and recent runs, alerts, policy, scopes (viewer too).
* ``GET /v1/practice/calendar?limit=``: what ran, was skipped or waits for approval, and why.
* ``PUT|DELETE /v1/practice/schedules/{schedule_id}``.
* ``POST /v1/practice/runs`` ``{kind, region, hold_s, reason}``: a run by hand (201); it waits
  for approval where the policy says so. ``POST /v1/practice/runs/{run_id}/approve``: a second
  operator's key approves (the requester's own: 403 ``self_approval``).
* ``PUT /v1/practice/alerts/{name}`` ``{firing, reason}``: a firing alert blocks every start.
* ``PUT /v1/practice/approval-policy`` ``{regions, kinds}``: drills that need approval.
* ``PUT /v1/practice/scopes/{key_name}`` ``{regions, kinds}``: what a key may drill (null: any).

Changes are operator keys' and are committed by the control leader (others forward), with
their audit entries; reads are linearizable as the drills' are.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from eventlog.errors import InvalidRequest, NotFound, Unavailable
from regions.drill_kinds import DrillKind
from regions.drills import Guards
from regions.keys import NAME_PATTERN
from regions.practice import BLOCKED_DATES_MAX, WINDOWS_MAX, Schedule, Scope
from regions.practice_state import CALENDAR_KEPT_MAX
from services.api.context import RequestContext, app_services, request_context
from services.api.drill_routes import DrillGuards
from services.api.openapi import errors
from services.api.roles import OBSERVER_ROLES, OPERATOR_ROLES, require_role
from services.control.practice import PracticeRunner

practice_router = APIRouter(prefix="/v1/practice")
Context = Annotated[RequestContext, Depends(request_context)]
REGION_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
ScheduleIdPath = Annotated[str, Path(pattern=REGION_PATTERN)]
RunIdPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
AlertNamePath = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")]
KeyNamePath = Annotated[str, Path(pattern=NAME_PATTERN)]
RUNS_LISTED_MAX = 50


class ScheduleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    region: str = Field(pattern=REGION_PATTERN)
    kind: DrillKind
    #: UTC weekly windows, e.g. "mon 09:00-17:00"
    windows: list[Annotated[str, Field(max_length=32)]] = Field(
        min_length=1, max_length=WINDOWS_MAX
    )
    hold_s: float = Field(gt=0, le=3600)
    min_interval_s: float = Field(ge=1, le=366 * 86_400)
    chance: float = Field(default=1.0, ge=0, le=1)
    blocked_dates: list[Annotated[str, Field(max_length=10)]] = Field(
        default_factory=list, max_length=BLOCKED_DATES_MAX
    )
    retry_after_skip_s: float = Field(default=300.0, ge=1, le=366 * 86_400)
    needs_approval: bool = False
    enabled: bool = True
    #: its drills' stop conditions; each left out takes its default (as ``POST /v1/drills``)
    guards: DrillGuards | None = None


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    kind: DrillKind
    region: str = Field(pattern=REGION_PATTERN)
    hold_s: float = Field(gt=0, le=3600)
    reason: str = Field(min_length=1, max_length=500)
    #: the drill's stop conditions; each left out takes its default (as ``POST /v1/drills``)
    guards: DrillGuards | None = None


class AlertRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    firing: bool
    reason: str = Field(min_length=1, max_length=500)


class ScopeRequest(BaseModel):
    """Regions and kinds; null: any."""

    model_config = ConfigDict(extra="forbid", strict=True)

    regions: list[Annotated[str, Field(pattern=REGION_PATTERN)]] | None = Field(
        default=None, max_length=64
    )
    kinds: list[DrillKind] | None = None


def _runner(request: Request) -> PracticeRunner:
    runner = app_services(request.app).practice
    if runner is None:
        raise Unavailable("practice runs are not kept on this node")
    return runner


def _who(ctx: RequestContext) -> dict[str, str]:
    return {"by": ctx.tenant.tenant_id, "role": ctx.tenant.role}


def _known_region(runner: PracticeRunner, region: str) -> None:
    if region not in runner.driver.controller.cluster.weights():
        raise NotFound(f"no region {region!r} in this plane")


@practice_router.get("", response_model=dict[str, Any])
async def practice_overview(ctx: Context) -> Any:
    """Schedules, open and recent practice runs, operator alerts, the approval policy and the
    keys' blast radius (operator or viewer keys)."""
    require_role(ctx.tenant, OBSERVER_ROLES)
    runner = _runner(ctx.request)

    async def read() -> dict[str, Any]:
        await runner.driver.read_barrier()
        state = runner.state
        return {
            "schedules": [s.to_body() for s in state.schedules.values()],
            "runs": [r.to_body() for r in list(state.runs.values())[::-1][:RUNS_LISTED_MAX]],
            "alerts": [a.to_body() for a in state.alerts.values()],
            "approval_policy": state.approval_policy.to_body(),
            "scopes": {name: s.to_body() for name, s in sorted(state.scopes.items())},
        }

    return await ctx.run(read, is_write=False)


@practice_router.get("/calendar", response_model=dict[str, Any])
async def practice_calendar(
    ctx: Context, limit: Annotated[int, Query(ge=1, le=CALENDAR_KEPT_MAX)] = 100
) -> Any:
    """What practice ran, skipped or holds for approval, and why, newest first (operator or
    viewer keys)."""
    require_role(ctx.tenant, OBSERVER_ROLES)
    runner = _runner(ctx.request)

    async def read() -> dict[str, Any]:
        await runner.driver.read_barrier()
        entries = list(runner.state.calendar)[::-1][:limit]
        return {"entries": [e.to_body() for e in entries]}

    return await ctx.run(read, is_write=False)


@practice_router.put("/schedules/{schedule_id}", responses=errors(403, 404))
async def put_schedule(ctx: Context, schedule_id: ScheduleIdPath, body: ScheduleRequest) -> Any:
    """Create or replace a schedule (operator keys; its region and kind inside the key's
    blast radius)."""
    require_role(ctx.tenant, OPERATOR_ROLES)
    runner = _runner(ctx.request)
    _known_region(runner, body.region)
    try:
        schedule = Schedule.from_body(
            {
                **body.model_dump(exclude_none=True),
                "schedule_id": schedule_id,
                "by": ctx.tenant.name,
            }
        )
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(str(exc)) from exc

    async def put() -> dict[str, Any]:
        return (await runner.put_schedule(schedule, **_who(ctx))).to_body()

    return await ctx.run(put, is_write=True)


@practice_router.delete("/schedules/{schedule_id}", responses=errors(404))
async def delete_schedule(ctx: Context, schedule_id: ScheduleIdPath) -> Any:
    """Delete a schedule (operator keys); its calendar entries stay."""
    require_role(ctx.tenant, OPERATOR_ROLES)
    runner = _runner(ctx.request)

    async def delete() -> dict[str, Any]:
        await runner.delete_schedule(schedule_id, **_who(ctx))
        return {"deleted": schedule_id}

    return await ctx.run(delete, is_write=True)


@practice_router.post("/runs", status_code=201, responses=errors(403, 404))
async def request_practice_run(ctx: Context, body: RunRequest) -> Any:
    """A practice run by hand (operator keys): it starts at once, or waits in
    `awaiting_approval` where the approval policy names its region or kind; 403 outside the
    key's blast radius."""
    require_role(ctx.tenant, OPERATOR_ROLES)
    runner = _runner(ctx.request)
    _known_region(runner, body.region)

    async def request() -> dict[str, Any]:
        run = await runner.request_run(
            body.kind, body.region, body.hold_s, body.reason, key_name=ctx.tenant.name,
            guards=Guards.from_body(body.guards.model_dump(exclude_none=True) if body.guards else {}),
            **_who(ctx),
        )  # fmt: skip
        return run.to_body()

    return await ctx.run(request, is_write=True)


@practice_router.post("/runs/{run_id}/approve", responses=errors(403, 404, 409))
async def approve_practice_run(ctx: Context, run_id: RunIdPath) -> Any:
    """Approve a run that awaits approval (a second operator's key: the requester's own is
    403 `self_approval`); it starts at the control leader's next practice tick."""
    require_role(ctx.tenant, OPERATOR_ROLES)
    runner = _runner(ctx.request)

    async def approve() -> dict[str, Any]:
        run = await runner.approve(run_id, key_name=ctx.tenant.name, **_who(ctx))
        return run.to_body()

    return await ctx.run(approve, is_write=True)


@practice_router.put("/alerts/{name}")
async def set_practice_alert(ctx: Context, name: AlertNamePath, body: AlertRequest) -> Any:
    """Fire or clear an operator alert (operator keys): while one fires, no practice run
    starts (the skip is in the calendar with the alert's reason)."""
    require_role(ctx.tenant, OPERATOR_ROLES)
    runner = _runner(ctx.request)

    async def put() -> dict[str, Any]:
        alert = await runner.set_alert(name, body.firing, body.reason, **_who(ctx))
        return alert.to_body()

    return await ctx.run(put, is_write=True)


@practice_router.put("/approval-policy", responses=errors(403))
async def set_approval_policy(ctx: Context, body: ScopeRequest) -> Any:
    """The regions and kinds whose drills need a second operator's approval (operator keys
    without a blast radius; null or empty: none)."""
    require_role(ctx.tenant, OPERATOR_ROLES)
    runner = _runner(ctx.request)
    scope = Scope.from_body({"regions": body.regions or [], "kinds": body.kinds or []})

    async def put() -> dict[str, Any]:
        return (await runner.set_policy(scope, key_name=ctx.tenant.name, **_who(ctx))).to_body()

    return await ctx.run(put, is_write=True)


@practice_router.put("/scopes/{key_name}", responses=errors(403))
async def set_key_scope(ctx: Context, key_name: KeyNamePath, body: ScopeRequest) -> Any:
    """A key's blast radius (operator keys without one of their own): the regions and kinds
    it may drill, null: any. A drill outside it, by hand or approved, is 403
    `outside_blast_radius`."""
    require_role(ctx.tenant, OPERATOR_ROLES)
    runner = _runner(ctx.request)
    scope = Scope.from_body(body.model_dump())

    async def put() -> dict[str, Any]:
        scoped = await runner.set_scope(key_name, scope, caller=ctx.tenant.name, **_who(ctx))
        return scoped.to_body()

    return await ctx.run(put, is_write=True)
