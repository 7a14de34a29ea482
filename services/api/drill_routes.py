"""Routes of drills, the halt switch and the audit log (operator and viewer keys only).

* ``POST /v1/drills`` ``{kind, region, hold_s, reason, dry_run?, force?, guards?, node?}``
  (``node``: a kill drill of that one node of a region of several): preflight,
  then 201 with the drill; ``dry_run``: 200 with the plan, nothing committed. A refused
  preflight is 409 ``preflight_failed``. Committed by the control leader (others forward).
* ``GET /v1/drills``, ``GET /v1/drills/{id}`` (phase, timeline so far),
  ``POST /v1/drills/{id}/abort``, ``GET /v1/drills/{id}/report`` (JSON, or a self-contained
  HTML page with ``Accept: text/html``).
* ``POST /v1/admin/halt`` ``{reason}`` aborts every active drill and refuses new ones until
  ``DELETE /v1/admin/halt``; ``GET /v1/admin/halt`` shows it.
* ``GET /v1/audit?after=&limit=``: operator actions, oldest first; ``next_after`` pages on.
  ``POST /v1/audit`` ``{action, target, reason}`` records one taken outside the API.
* ``/peer/drills/...``: what the drill driver asks other nodes (canary writes and reads, load).

Reads are linearizable: the control shard's leader answers them (other nodes forward there)
after confirming its leadership and applying every record committed before the read began
(``DrillDriver.read_barrier``), so an action acknowledged anywhere shows in every read that
starts after it. While the control shard has no leader they are 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from eventlog.errors import InvalidRequest, NotFound, Unavailable
from regions.drill_kinds import DrillKind
from regions.drill_report import report
from regions.drills import DRILL_TENANT, REASON_CHARS_MAX, Drill, DrillSpec, Guards
from services.api.context import RequestContext, api_state, app_services, request_context
from services.api.control_routes import _require_peer
from services.api.drill_report_html import render
from services.api.event_bodies import ID_PATTERN
from services.api.openapi import errors
from services.api.roles import OBSERVER_ROLES, OPERATOR_ROLES, require_role
from services.api.routes import IDEMPOTENCY_KEY_PATTERN
from services.control.audit_log import (
    AUDIT_ACTION_CHARS_MAX,
    AUDIT_TARGET_CHARS_MAX,
    AuditPostLimiter,
    audit_page,
)
from services.control.drills.canary import CANARY_TIMEOUT_S, append_canary, read_canary
from services.control.drills.driver import DrillDriver

drill_router = APIRouter(prefix="/v1")
drill_peer_router = APIRouter(prefix="/peer/drills")
Context = Annotated[RequestContext, Depends(request_context)]
DrillIdPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
DRILLS_LISTED_MAX = 200
#: the highest node index a region can have (``RegionConfig.more_nodes`` holds at most 15)
NODE_INDEX_MAX = 15
AUDIT_PAGE_MAX = 1000


class DrillGuards(BaseModel):
    """What aborts a drill; each one left out takes its default. The ranges are the ones the
    drill core accepts (``regions.drills.Guards.from_body``), so the schema tells the truth."""

    model_config = ConfigDict(extra="forbid")

    max_rto_s: float | None = Field(default=None, gt=0, le=3600)
    max_error_ratio: float | None = Field(default=None, ge=0, le=1)
    max_ack_p99_ms: float | None = Field(default=None, gt=0, le=600_000)


class DrillRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: DrillKind  # the kinds, spelled once (regions.drill_kinds)
    region: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9-]*$")
    hold_s: float = Field(gt=0, le=3600)
    reason: str = Field(min_length=1, max_length=500)
    dry_run: bool = False
    force: bool = False
    guards: DrillGuards | None = None
    #: kill drills only: kill this node of the region (of several nodes) instead of the region
    node: int | None = Field(default=None, ge=0, le=NODE_INDEX_MAX)


class ReasonRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=500)


class CanaryWrite(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversation_id: str = Field(min_length=1, max_length=128, pattern=ID_PATTERN)
    idempotency_key: str = Field(max_length=255, pattern=IDEMPOTENCY_KEY_PATTERN)
    payload: dict[str, Any]


def _driver(request: Request) -> DrillDriver:
    driver = app_services(request.app).drills
    if driver is None:
        raise Unavailable("drills are not running on this node")
    return driver


def _audit_limiter(request: Request) -> AuditPostLimiter:
    limiter = app_services(request.app).audit_limiter
    if limiter is None:
        raise Unavailable("the audit log is not kept on this node")
    return limiter


def _who(ctx: RequestContext) -> dict[str, str]:
    return {"by": ctx.tenant.tenant_id, "role": ctx.tenant.role}


def _drill(driver: DrillDriver, drill_id: str) -> Drill:
    drill = driver.ops.drills.get(drill_id)
    if drill is None:
        raise NotFound(f"no drill {drill_id!r}")
    return drill


def _drill_body(drill: Drill) -> dict[str, Any]:
    body = report(drill)
    return {
        "drill_id": drill.drill_id,
        "status": drill.phase,
        "phase": drill.phase,
        "verdict": drill.verdict,
        "kind": drill.spec.kind,
        "region": drill.spec.region,
        "node": drill.spec.node,
        "hold_s": drill.spec.hold_s,
        "guards": drill.spec.guards.to_body(),
        "shards_moved": body["shards_moved"],
        "shards_recovered": body["shards_recovered"],
        "canary_acked": body["canary_acked"],
        "canary_errors": body["canary_errors"],
        "canary_lost": body["canary_lost"],
        "rto_max_s": body["rto_max_s"],
        "guards_tripped": body["guards_tripped"],
        "reason": body["reason"],
        "requested_by": body["requested_by"],
        "verdict_reason": body["verdict_reason"],
        "abort_reason": body["abort_reason"],
        "started_at": body["started_at"],
        "injected_at": body["injected_at"],
        "ended_at": body["ended_at"],
        "timeline": body["timeline"],
    }


@drill_router.post(
    "/drills",
    status_code=201,
    responses={
        200: {"description": "`dry_run`: the plan, nothing committed"},
        **errors(403, 404, 409),
    },
)
async def create_drill(ctx: Context, body: DrillRequest) -> Any:
    """Start a drill (operator keys): `evacuate`, `region-loss` or `kill` of one region for
    `hold_s` (`kill` with `node`: only that node of a region of several nodes; 400 for
    another kind, a region of one node or a node it does not have), after preflight (every region up, no other drill, halt off, capacity by the
    region-loss arithmetic on live load; `force` overrides only capacity). 201 with the drill;
    with `dry_run` 200 and the plan (what would move, replay tokens, time bound), changing
    nothing; 404 for a region the plane does not have; 409 `preflight_failed` with the
    reason, or `approval_required` where the approval policy names the region or kind (ask
    with `POST /v1/practice/runs`); 403 `outside_blast_radius` outside the key's scope."""
    require_role(ctx.tenant, OPERATOR_ROLES)
    cluster = api_state(ctx.request).cluster
    if body.region not in cluster.weights():
        raise NotFound(f"no region {body.region!r} in this plane")
    who = _who(ctx)
    try:
        spec = DrillSpec(
            kind=body.kind,
            region=body.region,
            hold_s=body.hold_s,
            reason=body.reason,
            guards=Guards.from_body(
                body.guards.model_dump(exclude_none=True) if body.guards else {}
            ),
            force=body.force,
            requested_by=f"{who['by']} ({who['role']})",
            node=body.node,
        )
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(str(exc)) from exc
    spec.check_node(cluster.region(body.region).node_count)
    driver = _driver(ctx.request)
    practice = app_services(ctx.request.app).practice

    async def create() -> Response:
        if practice is not None:  # the key's blast radius, then the approval policy
            await driver.read_barrier()
            check = practice.check_scope if body.dry_run else practice.check_manual_drill
            check(ctx.tenant.name, body.kind, body.region)
        if body.dry_run:
            plan = await driver.plan(spec)
            return JSONResponse({"dry_run": True, "plan": plan.to_body()}, status_code=200)
        drill, plan = await driver.create(spec, **who)
        return JSONResponse({**_drill_body(drill), "plan": plan.to_body()}, status_code=201)

    return await ctx.run(create, is_write=not body.dry_run)


@drill_router.get("/drills", response_model=dict[str, Any])
async def list_drills(
    ctx: Context, limit: Annotated[int, Query(ge=1, le=DRILLS_LISTED_MAX)] = 50
) -> Any:
    """The most recent drills, newest first, and the drill driver's health (operator or viewer
    keys)."""
    require_role(ctx.tenant, OBSERVER_ROLES)
    driver = _driver(ctx.request)

    async def read() -> dict[str, Any]:
        await driver.read_barrier()
        drills = list(driver.ops.drills.values())[::-1][:limit]
        return {"drills": [_drill_body(d) for d in drills], "driver": driver.health()}

    return await ctx.run(read, is_write=False)


@drill_router.get("/drills/{drill_id}", response_model=dict[str, Any], responses=errors(404))
async def get_drill(ctx: Context, drill_id: DrillIdPath) -> Any:
    """A drill: status, phase, guards, and its timeline so far (operator or viewer keys)."""
    require_role(ctx.tenant, OBSERVER_ROLES)
    driver = _driver(ctx.request)

    async def read() -> dict[str, Any]:
        await driver.read_barrier()
        return _drill_body(_drill(driver, drill_id))

    return await ctx.run(read, is_write=False)


@drill_router.post("/drills/{drill_id}/abort", responses=errors(404))
async def abort_drill(ctx: Context, drill_id: DrillIdPath, body: ReasonRequest) -> Any:
    """Abort a drill (operator keys): the target is restored at once; verdict `aborted`."""
    require_role(ctx.tenant, OPERATOR_ROLES)
    driver = _driver(ctx.request)

    async def abort() -> dict[str, Any]:
        return _drill_body(await driver.abort(drill_id, reason=body.reason, **_who(ctx)))

    return await ctx.run(abort, is_write=True)


@drill_router.get("/drills/{drill_id}/report", response_model=None, responses=errors(404))
async def drill_report(ctx: Context, drill_id: DrillIdPath) -> Any:
    """A drill's report: JSON (RTO per moved shard, canaries acked and lost, guards tripped,
    timeline; where engines are attached, replay's throughput against the planner's, the
    cache-recovery curve with its target check, and live TTFT per survivor before, during and
    after), or with `Accept: text/html` a self-contained page with inline charts."""
    require_role(ctx.tenant, OBSERVER_ROLES)
    driver = _driver(ctx.request)

    async def read() -> dict[str, Any] | HTMLResponse:
        await driver.read_barrier()
        body = report(_drill(driver, drill_id))
        if "text/html" in ctx.request.headers.get("accept", ""):
            return HTMLResponse(render(body))
        return body

    return await ctx.run(read, is_write=False)


@drill_router.get("/admin/halt", response_model=dict[str, Any])
async def get_halt(ctx: Context) -> Any:
    """The halt switch: whether new drills are refused, and why (operator or viewer keys)."""
    require_role(ctx.tenant, OBSERVER_ROLES)
    driver = _driver(ctx.request)

    async def read() -> dict[str, Any]:
        await driver.read_barrier()
        return driver.ops.halt.to_body()

    return await ctx.run(read, is_write=False)


@drill_router.post("/admin/halt")
async def halt_on(ctx: Context, body: ReasonRequest) -> Any:
    """Halt (operator keys): abort every active drill and refuse new ones until turned off."""
    return await _set_halt(ctx, True, body.reason)


@drill_router.delete("/admin/halt")
async def halt_off(ctx: Context, reason: Annotated[str, Query(max_length=500)] = "") -> Any:
    """Lift the halt switch (operator keys): drills may start again."""
    return await _set_halt(ctx, False, reason or "halt lifted")


async def _set_halt(ctx: RequestContext, on: bool, reason: str) -> Any:
    require_role(ctx.tenant, OPERATOR_ROLES)
    driver = _driver(ctx.request)

    async def flip() -> dict[str, Any]:
        return await driver.set_halt(on, reason=reason, **_who(ctx))

    return await ctx.run(flip, is_write=True)


@drill_router.get("/audit", response_model=dict[str, Any])
async def audit(
    ctx: Context,
    after: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=AUDIT_PAGE_MAX)] = 100,
) -> Any:
    """The audit log, oldest first from `after`: every operator action with who, role, when,
    what and why (operator or viewer keys)."""
    require_role(ctx.tenant, OBSERVER_ROLES)
    driver = _driver(ctx.request)

    async def read() -> dict[str, Any]:
        await driver.read_barrier()
        entries = await audit_page(driver.controller, driver.ops, after, limit)
        return {
            "entries": [e.to_body() for e in entries],
            "next_after": entries[-1].lsn if entries else after,
        }

    return await ctx.run(read, is_write=False)


class AuditRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: str = Field(
        min_length=1, max_length=AUDIT_ACTION_CHARS_MAX, pattern=r"^[a-z][a-z0-9._-]*$"
    )
    target: str = Field(min_length=1, max_length=AUDIT_TARGET_CHARS_MAX)
    reason: str = Field(min_length=1, max_length=REASON_CHARS_MAX)


@drill_router.post("/audit", status_code=201)
async def record_audit(ctx: Context, body: AuditRequest) -> Any:
    """An operator action taken outside the API (``convplane keys create --cluster-file`` edits
    the cluster file) is recorded here; ``by`` and ``role`` are the caller's key's. At most
    ``AUDIT_POSTS_PER_S`` per operator key (bursts of ``AUDIT_POSTS_BURST``): 429 past it."""
    require_role(ctx.tenant, OPERATOR_ROLES)
    driver = _driver(ctx.request)
    limiter = _audit_limiter(ctx.request)

    async def record() -> dict[str, Any]:
        await driver.read_barrier()  # limited where it commits: at the control shard's leader
        limiter.admit(ctx.tenant.name)
        await driver.audit(
            ctx.tenant.tenant_id,
            ctx.tenant.role,
            body.action,
            body.target,
            body.reason,
            {"recorded_via": "POST /v1/audit"},
        )
        return {"recorded": True}

    return await ctx.run(record, is_write=True)


# --- what the drill driver asks other nodes ----------------------------------------------------


@drill_peer_router.post("/canary", responses=errors(409))
async def peer_canary_write(request: Request, body: CanaryWrite) -> dict[str, Any]:
    """Internal: a drill's canary write, at the node that leads the canary's shard; the answer
    names the node (a node kill's RTO counts only writes its region's other nodes served)."""
    _require_peer(request)
    api = api_state(request)
    async with asyncio.timeout(CANARY_TIMEOUT_S):
        await append_canary(
            api.log,
            api.cluster.default_model_revision,
            body.conversation_id,
            body.idempotency_key,
            body.payload,
        )
    return {"served_by": api.region, "node": api.settings.node_index}


@drill_peer_router.get("/canary", responses=errors(404))
async def peer_canary_read(
    request: Request,
    conversation_id: Annotated[str, Query(min_length=1, max_length=128)],
    after_seq: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    """Internal: a drill's canary events, read back at the node that leads their shard."""
    _require_peer(request)
    api = api_state(request)
    async with asyncio.timeout(CANARY_TIMEOUT_S * 5):
        events = await read_canary(api.log, conversation_id, after_seq)
    return {"tenant": DRILL_TENANT, "events": events}


@drill_peer_router.get("/load")
async def peer_load(request: Request) -> dict[str, Any]:
    """Internal: this node's measured append rate, how the live appends that entered it
    ended, and its replay's prefill numbers, for a drill's capacity preflight and its report."""
    _require_peer(request)
    replay = app_services(request.app).replay
    load = _driver(request).load
    succeeded, errors = load.entry_rates()
    return {
        "append_rate_per_s": load.append_rate_per_s(),
        "live_succeeded_per_s": succeeded,
        "live_errors_per_s": errors,
        "replay": None if replay is None else replay.drill_view(),  # None: no engines here
    }
