"""What a request handler needs: the node's services (``AppServices``, with the request path's
own ``ApiState``) and the request's own tenant and deadline (``RequestContext``), with the one
place that runs a log call under the deadline and turns ``NotLeader`` into a forward.

The app's lifespan (``services.bootstrap.api.open_api``) stores one ``AppServices`` on the app
(``set_app_services``); handlers read it through ``app_services`` only, typed, never by
attribute name from ``app.state``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Request, Response
from starlette.applications import Starlette

from eventlog.clock import Clock
from eventlog.conversations import ConversationLog
from eventlog.errors import DeadlineExceeded, InvariantViolation, NotLeader
from services.api.admission import DEADLINE_SCOPE_KEY
from services.api.auth import Tenants
from services.api.errors import ForwardFailed, OutcomeUnknown
from services.api.forwarding import FORWARDED_HEADER, Forwarder
from services.api.metrics import Metrics
from services.api.peer_trust import peer_region
from services.api.roles import require_read_only_viewer
from services.config import ClusterConfig, NodeSettings, TenantConfig
from services.control.audit_log import AuditPostLimiter
from services.control.controller import Controller
from services.control.drills.driver import DrillDriver
from services.control.key_admin import KeyAdmin
from services.control.practice import PracticeRunner
from services.control.readiness import ReadinessMonitor
from services.logs import bind_request
from services.replay.service import ReplayService
from services.tracing import NodeTracing

T = TypeVar("T")


async def _no_lead_under_way(shard: int, timeout_s: float) -> bool:
    """A node without a controller never prepares a lead for a request to wait for."""
    return False


@dataclass
class ApiState:
    region: str
    settings: NodeSettings
    cluster: ClusterConfig
    log: ConversationLog
    tenants: Tenants
    forwarder: Forwarder
    metrics: Metrics
    clock: Clock
    rng: random.Random
    readiness: Callable[[], tuple[int, int]]  # (shards placed here, shards led now)
    tracing: NodeTracing | None = None  # None: tracing off (services.tracing)
    #: whether another node of this node's region leads the shard while the region does
    #: (``services.control.node_slots``): what this node is sent for it goes there
    led_by_sibling: Callable[[int], bool] = lambda shard: False
    #: whether this node leads the shard once the lead of it under way here has ended,
    #: waiting at most the given seconds (``Controller.await_lead_here``)
    await_lead_here: Callable[[int, float], Awaitable[bool]] = _no_lead_under_way


@dataclass
class AppServices:
    """Everything the app's handlers reach on this node, opened once by the app's lifespan.
    None: this node runs without it (a lone node without a controller, no drill driver, no
    replay engines)."""

    api: ApiState
    controller: Controller | None = None
    drills: DrillDriver | None = None
    key_admin: KeyAdmin | None = None
    audit_limiter: AuditPostLimiter | None = None
    replay: ReplayService | None = None
    loss_readiness: ReadinessMonitor | None = None
    practice: PracticeRunner | None = None


_SERVICES = "convplane_services"


def set_app_services(app: Starlette, services: AppServices) -> None:
    setattr(app.state, _SERVICES, services)


def app_services(app: Starlette) -> AppServices:
    services = getattr(app.state, _SERVICES, None)
    if not isinstance(services, AppServices):
        raise InvariantViolation("the app was used before its lifespan opened its services")
    return services


def api_state(request: Request) -> ApiState:
    return app_services(request.app).api


@dataclass
class RequestContext:
    api: ApiState
    request: Request
    tenant: TenantConfig
    deadline_s: float  # on api.clock.monotonic()
    forwarded: bool

    def remaining_s(self) -> float:
        return self.deadline_s - self.api.clock.monotonic()

    async def run(
        self,
        call: Callable[[], Awaitable[T]],
        *,
        is_write: bool,
        forward_body: bytes | None = None,
        batchable: bool = False,
        repeatable: bool = False,
    ) -> T | Response:
        """Run ``call`` under the deadline; forward to the leader region on NotLeader (with
        ``forward_body`` instead of the request's own body when given; ``batchable`` and
        ``repeatable``: ``Forwarder.forward``'s)."""
        try:
            return await self._within_deadline(call, is_write)
        except NotLeader as exc:
            if not await self._led_here_after_wait(exc):
                try:
                    return await self._redirect(exc, is_write, forward_body, batchable, repeatable)
                except ForwardFailed:  # nothing was sent: the sibling that held the shard's
                    if not await self._led_here_after_wait(exc):  # slot died, and this node
                        raise  # may have taken the slot since
        try:
            return await self._within_deadline(call, is_write)
        except NotLeader as exc:  # lost again at once (a fence): no second wait
            return await self._redirect(exc, is_write, forward_body, batchable, repeatable)

    async def _within_deadline(self, call: Callable[[], Awaitable[T]], is_write: bool) -> T:
        remaining_s = self.remaining_s()
        if remaining_s <= 0:
            raise DeadlineExceeded("the request's deadline passed before it was served")
        try:
            async with asyncio.timeout(remaining_s):
                return await call()
        except (TimeoutError, DeadlineExceeded) as exc:
            if is_write:
                raise OutcomeUnknown(
                    "the deadline passed before the append was acknowledged; its outcome is "
                    "unknown and retrying with the same Idempotency-Key is safe"
                ) from exc
            raise DeadlineExceeded("the request's deadline passed") from exc

    async def _led_here_after_wait(self, exc: NotLeader) -> bool:
        """Whether this node leads the shard after waiting for a lead of it under way here: at
        most as long as a 503 would tell the client to wait before retrying, and half the
        deadline left (the other half is the request's own)."""
        if exc.leader_region not in (None, self.api.region):
            return False
        wait_s = min(self.api.settings.retry_after_default_s, self.remaining_s() / 2)
        return await self.api.await_lead_here(exc.shard, wait_s)

    async def _redirect(
        self,
        exc: NotLeader,
        is_write: bool,
        forward_body: bytes | None,
        batchable: bool,
        repeatable: bool,
    ) -> Response:
        """Forward to the shard's leader (``exc``'s hint, or a sibling node), or raise ``exc``
        when no leader is known elsewhere."""
        leader = exc.leader_region
        if leader in (None, self.api.region) and self.api.led_by_sibling(exc.shard):
            # a node names its own region (or no leader) for a shard of its region that
            # a sibling leads (``LogNode``): the sibling holds the shard's node slot
            leader = self.api.region
        elif leader is None or leader == self.api.region:
            if exc.retry_after_s is None:
                exc.retry_after_s = self.api.settings.retry_after_default_s
            raise exc
        if self.forwarded and not self._may_hop_in_region(leader):
            raise ForwardFailed(
                f"forwarded request reached {self.api.region}, which does not lead shard "
                f"{exc.shard} (hint: {leader}); not forwarding twice",
                retry_after_s=self.api.settings.retry_after_default_s,
            ) from exc
        return await self.api.forwarder.forward(
            self.request,
            target_region=leader,
            shard=exc.shard,
            deadline_s=self.deadline_s,
            is_write=is_write,
            body=forward_body,
            batchable=batchable,
            repeatable=repeatable,
        )

    def _may_hop_in_region(self, leader: str) -> bool:
        """A request another region forwarded here may go on to a sibling node of this region
        once (the forwarding peer's view of which node leads the shard lagged); one a sibling
        forwarded here may not, so no request circles."""
        return leader == self.api.region and peer_region(self.request.scope) not in (
            None,
            self.api.region,
        )


def _deadline_s(api: ApiState, request: Request) -> float:
    """The deadline admission fixed when the request arrived (``X-Convplane-Deadline-Ms``,
    parsed once there): time spent reading the body and queued for a permit is already spent."""
    deadline_s = request.scope.get(DEADLINE_SCOPE_KEY)
    if not isinstance(deadline_s, float):
        raise InvariantViolation("a /v1 request reached a handler without passing admission")
    return deadline_s


async def request_context(request: Request) -> RequestContext:
    """FastAPI dependency: authenticate and fix the deadline (admission already charged the
    tenant's quota, before any work)."""
    api = api_state(request)
    tenant = api.tenants.authenticate(request.headers.get("authorization"))
    require_read_only_viewer(tenant, request.method)
    forwarded = request.headers.get(FORWARDED_HEADER) is not None
    deadline_s = _deadline_s(api, request)
    ctx = RequestContext(api, request, tenant, deadline_s, forwarded)
    bind_request(ctx)  # log lines of this request carry its fields (services.logs)
    return ctx
