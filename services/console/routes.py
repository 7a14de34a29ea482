"""The console page and the one read endpoint it needs.

* ``GET /console``: the page (``static/index.html``), with a Content-Security-Policy that lets
  it run only its own script and style and talk only to the cluster's regions; its script and
  style are under ``/console/static/``. No key is needed to load it: the key is typed into the
  page, kept in the tab's ``sessionStorage`` and sent as a bearer header, never in a URL.
* ``GET /v1/console/node`` (operator or viewer keys): what only this node knows: the shards it
  leads now and their epochs, appends that entered here (rate and error ratio,
  ``services.api.append_outcomes``) and appends acknowledged on the shards it leads, its replay
  progress, where a browser reaches every region, and the caller's own role.

Why the page reads each region directly, from the browser, instead of asking the node that
served it to gather everything: a drill's target is cut off from its peers
(``services.control.drills.faults``: its calls to other nodes are dropped) or killed outright, and then
no aggregate it served would be current, or it would serve nothing. Each region is the only
authority on its own figures anyway, so the page asks each one itself (a region that does not
answer shows as such, with the age of its last answer), and reads the plane's shared state
(regions, placement, drills, halt, audit: the control shard, the same at every node) from one
source region, moving to the next when that one fails or is the target of a running drill.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.staticfiles import StaticFiles

from services.api.append_outcomes import AppendOutcomeMiddleware, AppendOutcomes
from services.api.context import RequestContext, app_services, request_context
from services.api.openapi import OPERATORS
from services.api.roles import OBSERVER_ROLES, require_role
from services.console.access import ConsoleAccess, ConsoleCorsMiddleware
from services.replay.service import ReplayService

Context = Annotated[RequestContext, Depends(request_context)]
STATIC_PACKAGE = ("services.console", "static")


class ConsoleNode(BaseModel):
    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "region": "us-east",
                    "you": {"tenant_id": "sre-viewer", "role": "viewer"},
                    "browser_urls": {"us-east": "http://127.0.0.1:8700"},
                    "control_leader": "us-east",
                    "placement_version": 3,
                    "led_shards": {"0": 2, "5": 2},
                    "appends": {
                        "window_s": 10,
                        "received_per_s": 4.2,
                        "succeeded_per_s": 4.2,
                        "errors_per_s": 0.0,
                        "error_ratio": 0.0,
                        "acked_led_per_s": 3.9,
                    },
                    "replay": None,
                    "unhealthy_loops": [],
                }
            ]
        },
    )

    region: str
    you: dict[str, str] = Field(description="the caller's key: tenant_id and role")
    browser_urls: dict[str, str] = Field(description="where a browser reaches each region")
    dashboard_url: str | None = Field(
        default=None, description="the operators' Grafana dashboard, when one is configured"
    )
    control_leader: str | None
    placement_version: int | None
    led_shards: dict[str, int] = Field(description="shard -> epoch, of shards led here now")
    appends: dict[str, Any] = Field(
        description="appends that entered here over the last window_s: received, succeeded, "
        "errors (5xx) per second, error_ratio = errors / (successes + errors); acked_led_per_s: "
        "appends acknowledged on shards led here (drill canaries excluded)"
    )
    replay: dict[str, Any] | None = Field(
        description="this region's replay: queued, running, done, tokens, spare prefill; null "
        "when replay does not run on this node"
    )
    unhealthy_loops: list[str]


def install_console(app: FastAPI, access: ConsoleAccess, outcomes: AppendOutcomes) -> None:
    """Routes, static files and the two middlewares, outside the edge (``create_app`` calls it
    after adding ``EdgeMiddleware``): CORS preflights carry no key and must be answered before
    admission would refuse them, and appends refused by admission must still be counted."""
    router = APIRouter()

    @router.get("/console", include_in_schema=False)
    async def console_page() -> HTMLResponse:
        return _page(access)

    @router.get("/v1/console/node", tags=[OPERATORS], response_model=ConsoleNode)
    async def console_node(ctx: Context) -> dict[str, Any]:
        """What only this node knows, for the console (operator or viewer keys): shards led here
        and their epochs, appends that entered here (rate, error ratio), replay progress, and where
        a browser reaches every region. Answered by this node itself, never forwarded."""
        return _node(ctx, access, outcomes)

    app.include_router(router)
    app.mount("/console/static", StaticFiles(packages=[STATIC_PACKAGE]), name="console-static")
    app.add_middleware(AppendOutcomeMiddleware, outcomes=outcomes)
    app.add_middleware(ConsoleCorsMiddleware, access=access)


def _content_security_policy(access: ConsoleAccess) -> str:
    connect = " ".join(("'self'", *access.origins))
    return (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        f"connect-src {connect}; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def _page(access: ConsoleAccess) -> HTMLResponse:
    page = files(STATIC_PACKAGE[0]).joinpath(STATIC_PACKAGE[1], "index.html").read_text("utf-8")
    return HTMLResponse(
        page,
        headers={
            "Content-Security-Policy": _content_security_policy(access),
            "Cache-Control": "no-cache",
            "Referrer-Policy": "no-referrer",
            "X-Content-Type-Options": "nosniff",
        },
    )


def _node(ctx: RequestContext, access: ConsoleAccess, outcomes: AppendOutcomes) -> dict[str, Any]:
    require_role(ctx.tenant, OBSERVER_ROLES)
    services = app_services(ctx.request.app)
    controller, drills, replay = services.controller, services.drills, services.replay
    appends = outcomes.rates().to_body()
    if drills is not None:
        appends["acked_led_per_s"] = round(drills.load.append_rate_per_s(), 2)
    body: dict[str, Any] = {
        "region": ctx.api.region,
        "you": {"tenant_id": ctx.tenant.tenant_id, "role": ctx.tenant.role},
        "browser_urls": access.urls,
        "dashboard_url": access.dashboard_url,
        "control_leader": None,
        "placement_version": None,
        "led_shards": {},
        "appends": appends,
        "replay": _replay_summary(replay) if replay is not None else None,
        "unhealthy_loops": [],
    }
    if controller is not None:
        node = controller.node
        led = {}
        for shard in node.led_shards():
            leader = node.leader(shard)
            if leader is not None and shard != controller.control_shard:
                led[str(shard)] = leader.epoch
        body.update(
            control_leader=controller.control_leader(),
            placement_version=controller.placement().version,
            led_shards=led,
            unhealthy_loops=controller.unhealthy_loops(controller.region),
        )
    return body


def _replay_summary(service: ReplayService) -> dict[str, Any]:
    status = service.status()
    scheduler = status["scheduler"]
    return {
        "queued": scheduler["backlog_sessions"],
        "queued_tokens": scheduler["backlog_tokens"],
        "running": status["dispatched_in_flight"],
        "done": scheduler["replayed_total"],
        "done_tokens": scheduler["replayed_tokens_total"],
        "replayed_tokens_per_s": round(scheduler["replayed_tokens_per_s"], 1),
        "expired": scheduler["expired_total"],
        "cancelled_by_live": scheduler["cancelled_live_total"],
        "spare_tokens_per_s": status["spare_tokens_per_s"],
        "live_tokens_per_s": status["live_tokens_per_s"],
        "engines": len(status["engines"]),
        "engines_unknown": sum(1 for e in status["engines"].values() if e["unknown"]),
        # moved conversations no engine here can replay (no engine; a model revision none
        # serves), by reason and revision: counted, never queued
        "not_replayed": status["not_replayed"],
    }
