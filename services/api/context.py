"""What a request handler needs: the node's services (``ApiState``) and the request's own
tenant and deadline (``RequestContext``), with the one place that runs a log call under the
deadline and turns ``NotLeader`` into a forward.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Request, Response

from eventlog.clock import Clock
from eventlog.conversations import ConversationLog
from eventlog.errors import DeadlineExceeded, InvalidRequest, NotLeader
from services.api.auth import Tenants
from services.api.errors import ForwardFailed, OutcomeUnknown
from services.api.forwarding import DEADLINE_HEADER, FORWARDED_HEADER, Forwarder
from services.api.metrics import Metrics
from services.api.roles import require_read_only_viewer
from services.config import ClusterConfig, NodeSettings, TenantConfig

T = TypeVar("T")
_INT_RE = re.compile(r"-?[0-9]{1,12}")


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


def api_state(request: Request) -> ApiState:
    state = request.app.state.api
    assert isinstance(state, ApiState)
    return state


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
    ) -> T | Response:
        """Run ``call`` under the deadline; forward to the leader region on NotLeader (with
        ``forward_body`` instead of the request's own body when given)."""
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
        except NotLeader as exc:
            leader = exc.leader_region
            if leader is None or leader == self.api.region:
                if exc.retry_after_s is None:
                    exc.retry_after_s = self.api.settings.retry_after_default_s
                raise
            if self.forwarded:
                raise ForwardFailed(
                    f"forwarded request reached {self.api.region}, which does not lead shard "
                    f"{exc.shard} (hint: {leader}); not forwarding twice",
                    retry_after_s=self.api.settings.retry_after_default_s,
                ) from exc
            return await self.api.forwarder.forward(
                self.request,
                target_region=leader,
                deadline_s=self.deadline_s,
                is_write=is_write,
                body=forward_body,
            )


def _deadline_s(api: ApiState, request: Request) -> float:
    raw = request.headers.get(DEADLINE_HEADER)
    budget_ms = api.settings.default_deadline_ms
    if raw is not None:
        raw = raw.strip()
        if not _INT_RE.fullmatch(raw):
            raise InvalidRequest(f"{DEADLINE_HEADER} must be an integer number of milliseconds")
        budget_ms = min(int(raw), api.settings.max_deadline_ms)
    return api.clock.monotonic() + budget_ms / 1000


async def request_context(request: Request) -> RequestContext:
    """FastAPI dependency: authenticate and fix the deadline (admission already charged the
    tenant's quota, before any work)."""
    api = api_state(request)
    tenant = api.tenants.authenticate(request.headers.get("authorization"))
    require_read_only_viewer(tenant, request.method)
    forwarded = request.headers.get(FORWARDED_HEADER) is not None
    deadline_s = _deadline_s(api, request)
    return RequestContext(api, request, tenant, deadline_s, forwarded)
