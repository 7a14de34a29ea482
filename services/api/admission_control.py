"""Admission control: shed load with 429/503 and Retry-After instead of building a queue. Pure.

Three cores, all driven by the time the caller passes in (``now`` / an injected ``Clock``); none
of them sleeps, awaits or raises for an expected outcome. Decisions are values:
``Admitted(permit)``, ``Queued(waiter)`` or ``Shed(status, retry_after_s, code)``.

``AdaptiveLimit``
    A concurrency limit in the spirit of Netflix concurrency-limits' gradient limiter. Each
    finished request reports its latency. ``baseline`` is the minimum latency over the last one
    to two ``baseline_window_s`` windows (the no-load latency); ``recent`` is an EWMA of the
    latest samples. Per sample::

        gradient = clamp(tolerance * baseline / recent, 0.5, 1.0)
        target   = limit * gradient + sqrt(limit)       # sqrt(limit): room to probe upwards
        limit    = clamp((1 - smoothing) * limit + smoothing * target, limit_min, limit_max)

    While latency stays within ``tolerance`` x baseline the limit grows by about
    ``smoothing * sqrt(limit)`` per sample; when queueing inflates latency the limit shrinks
    (to about 4 at worst, where limit/2 = sqrt(limit)). A dropped request (timeout, 503 from
    below) cuts the limit by ``drop_decrease_ratio`` (AIMD's multiplicative decrease). The limit
    does not grow from samples taken while less than half of it was in use: an idle service has
    no evidence that a higher limit is safe. If latency stays high for two windows the baseline
    follows it (a new normal) and the limit recovers.

``DeadlineQueue``
    A bounded FIFO of waiters with deadlines. A waiter whose deadline passed is dropped before it
    gets a permit, never served late.

``TenantBuckets``
    Per-tenant token buckets (``rate_per_s``, ``burst``). ``try_take`` answers ``None`` (taken) or
    the seconds until enough tokens exist (the Retry-After). At most ``tenants_max`` buckets are
    kept; the least recently used is forgotten (that tenant starts again with a full bucket).

``AdmissionController`` puts them together for one region's API::

    decision = controller.admit(tenant, deadline_s)
    Admitted(permit): run the request, then permit.release(latency_s, dropped=...) and
                      controller.dispatch()
    Queued(waiter):   park the request; controller.dispatch() (after every release and on a
                      timer) returns (waiter, Admitted | Shed) for the waiters it settled;
                      controller.cancel(waiter) when the client goes away
    Shed(...):        answer ``status`` with ``Retry-After: shed.retry_after_header``
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from eventlog.clock import Clock
from eventlog.errors import InvariantViolation


class AdmissionConfigError(ValueError):
    """Admission limits that cannot work (a node refuses to start with them): a configuration
    error, never an answer to a request."""


# --- decisions ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shed:
    status: Literal[429, 503]
    retry_after_s: float
    code: str  # "quota_exceeded" | "overloaded" | "deadline_exceeded"

    @property
    def retry_after_header(self) -> str:
        """Retry-After in whole seconds (at least 1), as HTTP wants it."""
        return str(max(1, math.ceil(self.retry_after_s)))


@dataclass(frozen=True, slots=True)
class Admitted:
    permit: Permit


@dataclass(frozen=True, slots=True)
class Waiter:
    waiter_id: int
    tenant: str
    deadline_s: float  # on the controller's clock
    enqueued_s: float


@dataclass(frozen=True, slots=True)
class Queued:
    waiter: Waiter


Decision = Admitted | Queued | Shed


# --- adaptive concurrency limit ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LimitConfig:
    limit_initial: float = 20.0
    limit_min: float = 1.0
    limit_max: float = 1000.0
    tolerance: float = 2.0  # latency up to tolerance x baseline counts as "no queueing"
    smoothing: float = 0.2  # weight of each sample's target in the new limit
    recent_alpha: float = 0.2  # EWMA weight of each latency sample
    baseline_window_s: float = 60.0
    drop_decrease_ratio: float = 0.9

    def validate(self) -> None:
        if not 1 <= self.limit_min <= self.limit_initial <= self.limit_max:
            raise AdmissionConfigError("need 1 <= limit_min <= limit_initial <= limit_max")
        if self.tolerance < 1 or self.baseline_window_s <= 0:
            raise AdmissionConfigError("need tolerance >= 1 and baseline_window_s > 0")
        for name in ("smoothing", "recent_alpha", "drop_decrease_ratio"):
            if not 0 < getattr(self, name) <= 1:
                raise AdmissionConfigError(f"{name} must be in (0, 1]")


class Permit:
    """One admitted request's slot; release it exactly once."""

    __slots__ = ("_limiter", "_released", "inflight_at_start")

    def __init__(self, limiter: AdaptiveLimit, inflight_at_start: int) -> None:
        self._limiter = limiter
        self._released = False
        self.inflight_at_start = inflight_at_start

    def release(self, latency_s: float, dropped: bool = False) -> None:
        """``dropped``: the request timed out or was shed below us (a congestion signal)."""
        if self._released:
            raise InvariantViolation("permit released twice")
        self._released = True
        self._limiter._on_release(self, latency_s, dropped)


class AdaptiveLimit:
    """Gradient concurrency limit (module docstring); ``clock`` ages the baseline windows."""

    def __init__(self, clock: Clock, config: LimitConfig | None = None) -> None:
        self.config = config or LimitConfig()
        self.config.validate()
        self._clock = clock
        self._estimate = self.config.limit_initial
        self._inflight = 0
        self._recent_s: float | None = None
        self._window_start_s: float | None = None
        self._min_current_s = math.inf
        self._min_previous_s = math.inf

    @property
    def limit(self) -> int:
        return int(self._estimate)

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def baseline_s(self) -> float:
        return min(self._min_current_s, self._min_previous_s)

    def try_acquire(self) -> Permit | None:
        if self._inflight >= self.limit:
            return None
        self._inflight += 1
        return Permit(self, self._inflight)

    def _on_release(self, permit: Permit, latency_s: float, dropped: bool) -> None:
        if self._inflight <= 0:
            raise InvariantViolation("release without a matching acquire")
        self._inflight -= 1
        if dropped:
            self._set_estimate(self._estimate * self.config.drop_decrease_ratio)
            return
        if not latency_s >= 0:
            raise InvariantViolation(f"negative or NaN latency {latency_s}")
        self._observe(latency_s)
        recent_s, baseline_s = self._recent_s, self.baseline_s
        if recent_s is None:
            raise InvariantViolation("no latency sample after _observe")
        gradient = (
            1.0 if recent_s <= 0 else tolerance_ratio(self.config.tolerance, baseline_s, recent_s)
        )
        target = self._estimate * gradient + math.sqrt(self._estimate)
        if target > self._estimate and permit.inflight_at_start < self._estimate / 2:
            return  # app-limited: no evidence that more concurrency is safe
        smoothing = self.config.smoothing
        self._set_estimate((1 - smoothing) * self._estimate + smoothing * target)

    def _observe(self, latency_s: float) -> None:
        now = self._clock.monotonic()
        window_s = self.config.baseline_window_s
        if self._window_start_s is None:
            self._window_start_s = now
        elif now - self._window_start_s >= window_s:
            stale = now - self._window_start_s >= 2 * window_s
            self._min_previous_s = math.inf if stale else self._min_current_s
            self._min_current_s = math.inf
            self._window_start_s = now
        self._min_current_s = min(self._min_current_s, latency_s)
        alpha = self.config.recent_alpha
        previous = self._recent_s
        self._recent_s = (
            latency_s if previous is None else previous + alpha * (latency_s - previous)
        )

    def _set_estimate(self, value: float) -> None:
        self._estimate = min(self.config.limit_max, max(self.config.limit_min, value))


def tolerance_ratio(tolerance: float, baseline_s: float, recent_s: float) -> float:
    """The gradient: 1 while recent <= tolerance x baseline, falling to at most a halving."""
    return min(1.0, max(0.5, tolerance * baseline_s / recent_s))


# --- bounded wait queue with deadlines ---------------------------------------------------------


class DeadlineQueue:
    """FIFO of waiters, at most ``maxsize``; expired waiters are dropped, never served."""

    def __init__(self, maxsize: int) -> None:
        if maxsize < 0:
            raise AdmissionConfigError("queue maxsize must be >= 0")
        self.maxsize = maxsize
        self._waiters: OrderedDict[int, Waiter] = OrderedDict()

    def __len__(self) -> int:
        return len(self._waiters)

    def offer(self, waiter: Waiter) -> bool:
        if len(self._waiters) >= self.maxsize:
            return False
        self._waiters[waiter.waiter_id] = waiter
        return True

    def remove(self, waiter: Waiter) -> bool:
        return self._waiters.pop(waiter.waiter_id, None) is not None

    def expire(self, now_s: float) -> list[Waiter]:
        """Drop and return every waiter whose deadline is at or before ``now_s``."""
        expired = [w for w in self._waiters.values() if w.deadline_s <= now_s]
        for waiter in expired:
            del self._waiters[waiter.waiter_id]
        return expired

    def pop_live(self, now_s: float) -> tuple[Waiter | None, list[Waiter]]:
        """The oldest waiter still within its deadline, and the expired ones skipped to find it."""
        expired: list[Waiter] = []
        while self._waiters:
            _, waiter = self._waiters.popitem(last=False)
            if waiter.deadline_s > now_s:
                return waiter, expired
            expired.append(waiter)
        return None, expired


# --- per-tenant token buckets ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quota:
    rate_per_s: float
    burst: float

    def validate(self) -> None:
        if not (self.rate_per_s > 0 and self.burst >= 1):
            raise AdmissionConfigError("a quota needs rate_per_s > 0 and burst >= 1")


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated_s: float


class TenantBuckets:
    def __init__(
        self,
        default: Quota,
        overrides: Mapping[str, Quota] | None = None,
        tenants_max: int = 10_000,
    ) -> None:
        for quota in (default, *(overrides or {}).values()):
            quota.validate()
        if tenants_max < 1:
            raise AdmissionConfigError("tenants_max must be >= 1")
        self._default = default
        self._overrides = dict(overrides or {})
        self._tenants_max = tenants_max
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def quota(self, tenant: str) -> Quota:
        return self._overrides.get(tenant, self._default)

    def try_take(self, tenant: str, now_s: float, cost: float = 1.0) -> float | None:
        """Take ``cost`` tokens: ``None`` when taken, else seconds until they would be there."""
        quota = self.quota(tenant)
        if not 0 < cost <= quota.burst:
            raise AdmissionConfigError(f"cost {cost} must be in (0, burst={quota.burst}]")
        bucket = self._bucket(tenant, quota, now_s)
        elapsed_s = max(0.0, now_s - bucket.updated_s)
        bucket.tokens = min(quota.burst, bucket.tokens + elapsed_s * quota.rate_per_s)
        bucket.updated_s = max(bucket.updated_s, now_s)
        if bucket.tokens >= cost:
            bucket.tokens -= cost
            return None
        return (cost - bucket.tokens) / quota.rate_per_s

    def _bucket(self, tenant: str, quota: Quota, now_s: float) -> _Bucket:
        bucket = self._buckets.get(tenant)
        if bucket is None:
            while len(self._buckets) >= self._tenants_max:
                self._buckets.popitem(last=False)
            bucket = self._buckets[tenant] = _Bucket(tokens=quota.burst, updated_s=now_s)
        self._buckets.move_to_end(tenant)
        return bucket

    def __len__(self) -> int:
        return len(self._buckets)


# --- one region's admission --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    queue_max: int = 100
    overloaded_retry_after_s: float = 1.0  # what a 503 from a full queue tells callers


class AdmissionController:
    """Quota, then a permit, then a place in the queue, else 503 (module docstring)."""

    def __init__(
        self,
        clock: Clock,
        limit: AdaptiveLimit,
        quotas: TenantBuckets,
        config: AdmissionConfig | None = None,
    ) -> None:
        self.config = config or AdmissionConfig()
        self._clock = clock
        self.limit = limit
        self.quotas = quotas
        self.queue = DeadlineQueue(self.config.queue_max)
        self._next_waiter_id = 1

    def admit(self, tenant: str, deadline_s: float, cost: float = 1.0) -> Decision:
        now_s = self._clock.monotonic()
        if deadline_s <= now_s:
            return Shed(503, 0.0, "deadline_exceeded")
        retry_after_s = self.quotas.try_take(tenant, now_s, cost)
        if retry_after_s is not None:
            return Shed(429, retry_after_s, "quota_exceeded")
        if not self.queue:  # FIFO: nobody overtakes a waiter
            permit = self.limit.try_acquire()
            if permit is not None:
                return Admitted(permit)
        waiter = Waiter(self._next_waiter_id, tenant, deadline_s, now_s)
        self._next_waiter_id += 1
        if self.queue.offer(waiter):
            return Queued(waiter)
        return Shed(503, self.config.overloaded_retry_after_s, "overloaded")

    def dispatch(self) -> list[tuple[Waiter, Admitted | Shed]]:
        """Settle waiters: expired ones get 503, the oldest live ones get free permits."""
        now_s = self._clock.monotonic()
        expired = Shed(503, 0.0, "deadline_exceeded")
        settled: list[tuple[Waiter, Admitted | Shed]] = [
            (w, expired) for w in self.queue.expire(now_s)
        ]
        while self.queue:
            permit = self.limit.try_acquire()
            if permit is None:
                break
            waiter, skipped = self.queue.pop_live(now_s)
            if waiter is None or skipped:  # expire() just removed every expired waiter
                raise InvariantViolation("expired waiter left in the queue after expire()")
            settled.append((waiter, Admitted(permit)))
        return settled

    def cancel(self, waiter: Waiter) -> bool:
        """The caller gave up on a queued request; True if it was still queued."""
        return self.queue.remove(waiter)
