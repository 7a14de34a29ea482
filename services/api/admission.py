"""Admission of one region node's requests: the adapter around ``services.api.admission_control``.

``NodeAdmission`` is built (empty) by ``create_app``; the lifespan ``open``s it with the node's
clock, the cluster's tenants and the node's limits, which builds one ``AdmissionController`` and
starts the sweeper; ``close`` stops it. ``EdgeMiddleware`` calls ``arrive(scope)`` first, then
reads the body, then ``admit(scope, arrival)``, and ``exit(entry, status)`` after the response,
so no request does any work before it was admitted, and none holds a permit while its body
is still arriving (``enter`` is ``arrive`` then ``admit``):

* ``/v1/...``: ``arrive`` authenticates the API key (401; the replay service key is admitted
  unmetered, the routes decide what it may do) and fixes the deadline once
  (``X-Convplane-Deadline-Ms``; already passed: 504 ``deadline_exceeded``), kept in the scope
  under ``DEADLINE_SCOPE_KEY`` for the handlers, so time spent reading the body and queued here
  is taken from the request's budget. ``admit`` asks the controller: tenant over quota -> 429
  ``quota_exceeded``; limit reached and queue full, or queued past the deadline -> 503
  ``overloaded``. Both carry ``Retry-After``. The limit's latency sample runs from admission
  (after any queueing) to the response; a 504, or a 503 that came after the deadline passed,
  counts as a drop (a congestion signal).
* ``/peer/...`` (placement, drills, forward batches): not admitted as a tenant; at most
  ``peer_in_flight_max`` at once, beyond it 503. Only the peer listener serves these, and only
  to callers its gate authenticated (``services.bootstrap.listener_gates``), so no stranger holds one of
  these slots. ``/peer/health`` (the probe) takes none: a region's health answer waits for
  nothing, so it is down only when it is (a probe costs the node a dictionary's worth).
* Anything else (health, metrics, docs) passes untouched.

Node-to-node trust. A forward carries ``X-Convplane-Forwarded`` and is trusted only when the peer
listener's gate authenticated its sender as a node of the cluster (``services.api.peer_trust``:
its certificate's region, with TLS); no header grants it, the peer secret included. A trusted
forward was charged at the entry node, so here it takes no tenant quota: it is admitted under
``UNMETERED_TENANT``, whose bucket never binds, and shares the concurrency limit and queue with
everything else (the leader's log is the resource being protected). A forwarded header on any
other request is removed before the app sees it: the request is a normal client request
(charged, admitted, forwardable once). No error is returned, and it gains nothing;
``convplane_peer_auth_failures`` counts these. The peer-auth header never reaches the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from eventlog.clock import Clock
from eventlog.errors import (
    ConvplaneError,
    DeadlineExceeded,
    InvalidRequest,
    InvariantViolation,
    Overloaded,
    QuotaExceeded,
    Unavailable,
)
from regions.keys import KEYS_KEPT_MAX
from services.api.admission_control import (
    AdaptiveLimit,
    AdmissionConfig,
    AdmissionController,
    Admitted,
    LimitConfig,
    Permit,
    Quota,
    Shed,
    TenantBuckets,
    Waiter,
)
from services.api.auth import Tenants
from services.api.forwarding import DEADLINE_HEADER, FORWARDED_HEADER, PEER_AUTH_HEADER
from services.api.metrics import Metrics
from services.api.peer_trust import peer_region
from services.config import ClusterConfig, NodeSettings, TenantConfig

log = logging.getLogger("convplane.admission")

#: the bucket of trusted forwards: never a real tenant (TenantConfig.tenant_id has min_length=1)
UNMETERED_TENANT = ""
#: a quota that never binds: forwards were charged at their entry node
_UNMETERED = Quota(rate_per_s=1e12, burst=1e12)
#: the quota of a tenant the cluster file does not list (its keys were created through
#: ``/v1/admin/keys``): TenantConfig's defaults, the quota ``services.api.auth`` gives its keys
_UNLISTED = Quota(
    rate_per_s=TenantConfig.model_fields["requests_per_s"].default,
    burst=float(TenantConfig.model_fields["burst"].default),
)
#: a 503 that arrives this close to the deadline is a timeout (a drop) for the limit
_DEADLINE_SLACK_S = 0.001
_INT_RE = re.compile(r"-?[0-9]{1,12}")
_FORWARDED = FORWARDED_HEADER.lower().encode()
_PEER_AUTH = PEER_AUTH_HEADER.lower().encode()

Scope = MutableMapping[str, Any]


#: the scope key under which ``arrive`` leaves the request's deadline (on the node's clock)
DEADLINE_SCOPE_KEY = "convplane.deadline_s"
#: the probe: answered from memory, on no slot (module docstring)
PROBE_PATH = "/peer/health"


@dataclass(frozen=True, slots=True)
class Arrival:
    """An authenticated /v1 request, not yet admitted."""

    tenant_key: str
    deadline_s: float


@dataclass(frozen=True, slots=True)
class Entry:
    """An admitted request: a permit of the limit (``None`` for peer endpoints)."""

    permit: Permit | None
    admitted_s: float
    deadline_s: float


class _Open:
    """What exists between ``open`` and ``close``."""

    def __init__(
        self, controller: AdmissionController, tenants: Tenants, settings: NodeSettings
    ) -> None:
        self.controller = controller
        self.tenants = tenants
        self.settings = settings
        self.sweeper: asyncio.Task[None] | None = None


class NodeAdmission:
    """One node's admission (module docstring). Build in ``create_app``, ``open`` in lifespan."""

    def __init__(self, metrics: Metrics) -> None:
        self._clock: Clock | None = None
        self._open: _Open | None = None
        self._waiting: dict[int, asyncio.Future[Admitted | Shed]] = {}
        self._peer_in_flight = 0
        self.rejections = Counter(
            "convplane_admission_rejections",
            "requests refused before any work, by reason",
            ["reason"],
            registry=metrics.registry,
        )
        self.peer_auth_failures = Counter(
            "convplane_peer_auth_failures",
            "forwarded requests from no authenticated peer (served as client requests)",
            registry=metrics.registry,
        )
        gauges = {
            "convplane_admission_limit": ("current adaptive concurrency limit", self._limit),
            "convplane_admission_in_flight": ("admitted /v1 requests under way", self._inflight),
            "convplane_admission_queue_length": ("requests waiting for a permit", self._queued),
            "convplane_peer_in_flight": ("/peer requests under way", self._peers),
        }
        for name, (text, read) in gauges.items():
            Gauge(name, text, registry=metrics.registry).set_function(read)

    # --- lifecycle -------------------------------------------------------------------------

    def open(
        self, *, settings: NodeSettings, cluster: ClusterConfig, tenants: Tenants, clock: Clock
    ) -> None:
        if self._open is not None:
            raise InvariantViolation("admission opened twice")
        controller = build_admission_controller(settings, cluster, clock)
        if cluster.peer_secret is None and len(cluster.regions) > 1:
            log.warning("cluster file has no peer_secret: forwards are charged at every hop")
        self._clock = clock
        self._open = _Open(controller, tenants, settings)
        self._open.sweeper = asyncio.create_task(self._sweep(), name="admission-sweeper")

    async def close(self) -> None:
        opened, self._open = self._open, None
        if opened is None:
            return
        if opened.sweeper is not None:
            opened.sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await opened.sweeper
        closing = Shed(503, opened.settings.retry_after_default_s, "overloaded")
        for waiter_id in list(self._waiting):
            self._settle_one(waiter_id, closing)

    async def _sweep(self) -> None:
        """Settle waiters on a timer too: an expired one must not wait for the next release."""
        opened, clock = self._open, self._clock
        assert opened is not None and clock is not None
        while True:
            await clock.sleep(opened.settings.admission_sweep_s)
            self._settle(opened.controller.dispatch())

    # --- the middleware's two calls --------------------------------------------------------

    async def enter(self, scope: Scope) -> Entry | None:
        """``arrive`` then ``admit``: for requests whose body is not read first."""
        return await self.admit(scope, self.arrive(scope))

    def arrive(self, scope: Scope) -> Arrival | None:
        """Authenticate a /v1 request and fix its deadline, or raise the ``ConvplaneError`` to
        answer; ``None`` for anything else."""
        if not scope["path"].startswith("/v1/"):
            return None
        opened, clock = self._open, self._clock
        if opened is None or clock is None:
            raise Unavailable("the node is starting or stopping", retry_after_s=1.0)
        trusted = self._trusted_forward(scope)
        tenant_key = self._tenant_key(_header(scope, b"authorization"), trusted, opened)
        now_s = clock.monotonic()
        deadline_s = now_s + _budget_ms(scope, opened.settings) / 1000
        if deadline_s <= now_s:
            self.rejections.labels("deadline_exceeded").inc()
            raise DeadlineExceeded("the request's deadline passed before it was admitted")
        scope[DEADLINE_SCOPE_KEY] = deadline_s
        return Arrival(tenant_key, deadline_s)

    def remaining_s(self, arrival: Arrival) -> float:
        """What is left of an arrived request's budget."""
        if self._clock is None:
            raise InvariantViolation("admission asked for the time while closed")
        return arrival.deadline_s - self._clock.monotonic()

    async def admit(self, scope: Scope, arrival: Arrival | None) -> Entry | None:
        """Admit an arrived request or raise the ``ConvplaneError`` to answer; ``None``: not
        gated (neither /v1 nor /peer)."""
        if scope["path"].startswith("/peer/"):
            return None if scope["path"] == PROBE_PATH else self._enter_peer()
        if arrival is None:
            return None
        clock = self._clock
        if self._open is None or clock is None:
            raise Unavailable("the node is starting or stopping", retry_after_s=1.0)
        permit = await self._acquire(arrival.tenant_key, arrival.deadline_s)
        return Entry(permit, clock.monotonic(), arrival.deadline_s)

    def exit(self, entry: Entry | None, status: int) -> None:
        """The response went out: release the permit with its latency, settle waiters."""
        if entry is None:
            return
        if entry.permit is None:
            self._peer_in_flight -= 1
            return
        opened, clock = self._open, self._clock
        if clock is None:
            raise InvariantViolation("admission exit without a clock")
        now_s = clock.monotonic()
        timed_out = now_s >= entry.deadline_s - _DEADLINE_SLACK_S
        dropped = status == 504 or (status == 503 and timed_out)
        entry.permit.release(max(0.0, now_s - entry.admitted_s), dropped=dropped)
        if opened is not None:
            self._settle(opened.controller.dispatch())

    # --- internals -------------------------------------------------------------------------

    def _enter_peer(self) -> Entry:
        opened = self._open
        limit = opened.settings.peer_in_flight_max if opened else 0
        if self._peer_in_flight >= limit:
            self.rejections.labels("peer_overloaded").inc()
            raise Overloaded("too many peer requests under way", retry_after_s=1.0)
        self._peer_in_flight += 1
        return Entry(None, 0.0, 0.0)

    @staticmethod
    def _tenant_key(authorization: str | None, trusted: bool, opened: _Open) -> str:
        """The bucket to charge: the tenant's, or the unmetered one for trusted forwards and for
        the replay service key (paced by the replay service's own limits). 401 if neither."""
        if opened.tenants.is_service_key(authorization):
            return UNMETERED_TENANT
        tenant = opened.tenants.authenticate(authorization)
        return UNMETERED_TENANT if trusted else tenant.tenant_id

    def _trusted_forward(self, scope: Scope) -> bool:
        """True for a forward from a peer the peer listener authenticated; strips what the
        app must not see."""
        headers = list(scope.get("headers", ()))
        forwarded = any(bytes(k) == _FORWARDED for k, _ in headers)
        trusted = forwarded and peer_region(scope) is not None
        if forwarded and not trusted:
            self.peer_auth_failures.inc()
        drop = {_PEER_AUTH} if trusted else {_PEER_AUTH, _FORWARDED}
        scope["headers"] = [(k, v) for k, v in headers if bytes(k) not in drop]
        return trusted

    async def _acquire(self, tenant_key: str, deadline_s: float) -> Permit:
        opened, clock = self._open, self._clock
        assert opened is not None and clock is not None
        decision = opened.controller.admit(tenant_key, deadline_s)
        if isinstance(decision, Admitted):
            return decision.permit
        if isinstance(decision, Shed):
            raise self._rejection(decision)
        waiter = decision.waiter
        future: asyncio.Future[Admitted | Shed] = asyncio.get_running_loop().create_future()
        self._waiting[waiter.waiter_id] = future
        try:
            async with asyncio.timeout(max(0.0, deadline_s - clock.monotonic())):
                outcome = await future
        except TimeoutError:  # still queued when its deadline came
            self._abandon(waiter, future)
            raise self._queue_expired() from None
        except BaseException:  # the client went away, or shutdown
            self._abandon(waiter, future)
            raise
        if isinstance(outcome, Admitted):
            return outcome.permit
        if outcome.status == 429:
            raise InvariantViolation("a queued request was refused for its quota")
        raise self._queue_expired()

    def _abandon(self, waiter: Waiter, future: asyncio.Future[Admitted | Shed]) -> None:
        """A waiter gave up: take it out of the queue, or give back a permit granted too late."""
        self._waiting.pop(waiter.waiter_id, None)
        opened = self._open
        if opened is not None and opened.controller.cancel(waiter):
            return
        if future.done() and not future.cancelled():
            outcome = future.result()
            if isinstance(outcome, Admitted):
                outcome.permit.release(0.0, dropped=True)  # unused: the caller gave up waiting
                if opened is not None:
                    self._settle(opened.controller.dispatch())

    def _settle(self, settled: list[tuple[Waiter, Admitted | Shed]]) -> None:
        for waiter, outcome in settled:
            self._settle_one(waiter.waiter_id, outcome)

    def _settle_one(self, waiter_id: int, outcome: Admitted | Shed) -> None:
        future = self._waiting.pop(waiter_id, None)
        if future is not None and not future.done():
            future.set_result(outcome)
        elif isinstance(outcome, Admitted):
            # the waiter's task was cancelled after the core granted it a permit: return it
            # (as a drop: whoever waited gave up) and let the next waiter have the slot
            outcome.permit.release(0.0, dropped=True)
            if self._open is not None:
                self._settle(self._open.controller.dispatch())

    def _queue_expired(self) -> ConvplaneError:
        """Queued past its deadline (or shut down): the region could not serve it in time."""
        self.rejections.labels("queue_expired").inc()
        retry_after_s = self._open.settings.retry_after_default_s if self._open else 1.0
        return Overloaded(
            "region overloaded: the request waited past its deadline", retry_after_s=retry_after_s
        )

    def _rejection(self, rejected: Shed) -> ConvplaneError:
        if rejected.status == 429:
            self.rejections.labels("quota_exceeded").inc()
            return QuotaExceeded(
                "tenant over its request quota", retry_after_s=rejected.retry_after_s
            )
        if rejected.code == "deadline_exceeded":
            self.rejections.labels("deadline_exceeded").inc()
            return DeadlineExceeded("the request's deadline passed before it was admitted")
        self.rejections.labels("overloaded").inc()
        return Overloaded(
            "region overloaded: concurrency limit reached and queue full",
            retry_after_s=rejected.retry_after_s,
        )

    # --- metrics readers -------------------------------------------------------------------

    def _limit(self) -> float:
        return float(self._open.controller.limit.limit) if self._open else 0.0

    def _inflight(self) -> float:
        return float(self._open.controller.limit.inflight) if self._open else 0.0

    def _queued(self) -> float:
        return float(len(self._open.controller.queue)) if self._open else 0.0

    def _peers(self) -> float:
        return float(self._peer_in_flight)


def build_admission_controller(
    settings: NodeSettings, cluster: ClusterConfig, clock: Clock
) -> AdmissionController:
    """The node's admission controller: limits from ``settings`` (initial and min capped at
    ``max_in_flight``), one quota per listed tenant and the default one for each other tenant
    (one whose keys were created through the API), plus the unmetered bucket of forwards."""
    limit_max = float(settings.max_in_flight)
    limit_initial = min(float(settings.admission_limit_initial), limit_max)
    limit_config = LimitConfig(
        limit_initial=limit_initial,
        limit_min=min(float(settings.admission_limit_min), limit_initial),
        limit_max=limit_max,
        tolerance=settings.admission_tolerance,
        baseline_window_s=settings.admission_baseline_window_s,
    )
    quotas = {t.tenant_id: Quota(t.requests_per_s, float(t.burst)) for t in cluster.tenants}
    quotas[UNMETERED_TENANT] = _UNMETERED
    # a tenant per created key at most, besides the listed ones
    buckets = TenantBuckets(_UNLISTED, quotas, tenants_max=len(quotas) + KEYS_KEPT_MAX)
    config = AdmissionConfig(
        queue_max=settings.admission_queue_max,
        overloaded_retry_after_s=settings.retry_after_default_s,
    )
    return AdmissionController(clock, AdaptiveLimit(clock, limit_config), buckets, config)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if bytes(key) == name:
            return bytes(value).decode("latin-1")
    return None


def _budget_ms(scope: Scope, settings: NodeSettings) -> int:
    raw = _header(scope, DEADLINE_HEADER.lower().encode())
    if raw is None:
        return settings.default_deadline_ms
    raw = raw.strip()
    if not _INT_RE.fullmatch(raw):
        raise InvalidRequest(f"{DEADLINE_HEADER} must be an integer number of milliseconds")
    return min(int(raw), settings.max_deadline_ms)
