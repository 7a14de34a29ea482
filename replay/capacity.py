"""Spare prefill capacity: how many replay tokens per second an engine can take without hurting
live traffic, and the token buckets replay dispatch draws from.

Per engine (``SpareEstimator``)::

    spare_prefill_tokens_per_s = capacity_tokens_per_s * (1 - headroom) - live_tokens_per_s

``live_tokens_per_s`` is measured from the engine's own counters, not predicted: the rate of
*computed* prompt tokens, ``d(vllm:prompt_tokens_total) - d(vllm:prefix_cache_hits_total)``
(prefix-cache hits cost no prefill compute), minus the computed tokens of replay's own requests
(the controller is told each replay outcome). The rate is smoothed by an asymmetric EWMA: it
follows a rise with time constant ``rise_tau_s`` (0.3 s: a step up is 96% tracked within 1 s)
and a fall with ``fall_tau_s`` (3 s), so replay backs off fast and comes back slowly. When live
requests are waiting (``num_requests_waiting`` minus replay requests of ours in flight > 0) the
spare is 0: the engine is saturated.

Dispatch (``CapacityController``, one per worker/engine) grants a replay of ``tokens`` only if
all hold, and then takes from all (all or nothing):

- fewer than ``max_concurrent_replays`` replays of this worker in flight;
- the spare bucket (rate = current spare, depth ``burst_s`` seconds of capacity x headroom);
- the operator's region bucket and the tenant's bucket (``OperatorLimits``, shared by the
  controllers of one region).

A bucket grants when its level reaches ``min(tokens, depth)`` and then goes down by ``tokens``,
possibly below zero: a job bigger than the depth is not starved, and the long-run rate is exact.

Pure: time is read from the injected ``Clock``; ``CapacityPoller`` is the async adapter that
feeds the estimator from ``InferenceEngine.metrics()``.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from eventlog.clock import Clock
from eventlog.errors import DeadlineExceeded, InvariantViolation
from replay.engines.base import EngineUnavailable, InferenceEngine
from replay.model import EngineMetrics


class Grant(StrEnum):
    GRANTED = "granted"
    CONCURRENCY = "concurrency"  # this worker has max_concurrent_replays in flight
    NO_SPARE = "no_spare"  # live traffic uses the engine (or live requests are waiting)
    REGION_LIMIT = "region_limit"
    TENANT_LIMIT = "tenant_limit"


class ReplayCapacityTimeout(DeadlineExceeded):
    code = "replay_capacity_timeout"


@dataclass(frozen=True, slots=True)
class CapacityConfig:
    capacity_tokens_per_s: float  # measured prefill capacity of the engine
    headroom: float = 0.1  # fraction of capacity never given to replay
    rise_tau_s: float = 0.3
    fall_tau_s: float = 3.0
    burst_s: float = 1.0  # spare bucket depth, in seconds of capacity x headroom
    max_concurrent_replays: int = 2
    stale_after_s: float = 5.0  # no metrics for this long => spare 0

    def __post_init__(self) -> None:
        if self.capacity_tokens_per_s <= 0 or not 0 <= self.headroom < 1:
            raise InvariantViolation("capacity must be > 0 and headroom in [0, 1)")
        if self.max_concurrent_replays < 1 or self.rise_tau_s <= 0 or self.fall_tau_s <= 0:
            raise InvariantViolation("bad capacity config")


class TokenBucket:
    """Refills at ``rate_per_s`` up to ``depth``; see the module docstring for debt."""

    def __init__(self, rate_per_s: float, depth: float, now_s: float, level: float = 0.0) -> None:
        if rate_per_s < 0 or depth <= 0:
            raise InvariantViolation("bucket rate must be >= 0 and depth > 0")
        self.rate_per_s = rate_per_s
        self.depth = depth
        self.level = min(level, depth)
        self._at_s = now_s

    def refill(self, now_s: float) -> None:
        elapsed_s = max(0.0, now_s - self._at_s)
        self.level = min(self.depth, self.level + elapsed_s * self.rate_per_s)
        self._at_s = max(self._at_s, now_s)

    def set_rate(self, rate_per_s: float, now_s: float) -> None:
        self.refill(now_s)
        self.rate_per_s = max(0.0, rate_per_s)

    def can_take(self, tokens: float) -> bool:
        return self.level >= min(tokens, self.depth)

    def take(self, tokens: float) -> None:
        self.level -= tokens

    def seconds_until(self, tokens: float) -> float:
        missing = min(tokens, self.depth) - self.level
        if missing <= 0:
            return 0.0
        return math.inf if self.rate_per_s <= 0 else missing / self.rate_per_s


class SpareEstimator:
    """Live prefill demand and spare of one engine, from successive metric snapshots."""

    def __init__(self, config: CapacityConfig) -> None:
        self.config = config
        self.live_tokens_per_s = 0.0
        self.live_waiting = 0.0
        self.last_observed_s: float | None = None
        self._last_computed: float | None = None
        self._replay_computed_since = 0.0

    def note_replay_computed(self, computed_tokens: float) -> None:
        self._replay_computed_since += computed_tokens

    def observe(self, metrics: EngineMetrics, now_s: float, replay_in_flight: int) -> None:
        computed = metrics.prompt_tokens_total - metrics.prefix_cache_hits_total
        self.live_waiting = max(0.0, metrics.num_requests_waiting - replay_in_flight)
        last_s, last = self.last_observed_s, self._last_computed
        self.last_observed_s, self._last_computed = now_s, computed
        if last_s is None or last is None or now_s <= last_s or computed < last:
            self._replay_computed_since = 0.0  # first snapshot, or the engine restarted
            return
        elapsed_s = now_s - last_s
        live = max(0.0, computed - last - self._replay_computed_since)
        self._replay_computed_since = 0.0
        rate = live / elapsed_s
        tau_s = self.config.rise_tau_s if rate > self.live_tokens_per_s else self.config.fall_tau_s
        alpha = 1.0 - math.exp(-elapsed_s / tau_s)
        self.live_tokens_per_s += alpha * (rate - self.live_tokens_per_s)

    def spare_tokens_per_s(self, now_s: float) -> float:
        stale = (
            self.last_observed_s is None or now_s - self.last_observed_s > self.config.stale_after_s
        )
        if stale or self.live_waiting > 0:
            return 0.0
        usable = self.config.capacity_tokens_per_s * (1.0 - self.config.headroom)
        return max(0.0, usable - self.live_tokens_per_s)


class OperatorLimits:
    """Operator caps shared by the controllers of one region: region and per-tenant rates."""

    def __init__(
        self,
        now_s: float,
        *,
        region_tokens_per_s: float | None = None,
        tenant_tokens_per_s: Mapping[str, float] | None = None,
        tenant_default_tokens_per_s: float | None = None,
        burst_s: float = 1.0,
    ) -> None:
        self.region = (
            None
            if region_tokens_per_s is None
            else TokenBucket(
                region_tokens_per_s, region_tokens_per_s * burst_s, now_s, region_tokens_per_s
            )
        )
        self._tenant_rates = dict(tenant_tokens_per_s or {})
        self._tenant_default = tenant_default_tokens_per_s
        self._burst_s = burst_s
        self._tenants: dict[str, TokenBucket] = {}

    def tenant_bucket(self, tenant: str, now_s: float) -> TokenBucket | None:
        bucket = self._tenants.get(tenant)
        if bucket is None:
            rate = self._tenant_rates.get(tenant, self._tenant_default)
            if rate is None:
                return None
            bucket = TokenBucket(rate, max(rate * self._burst_s, 1.0), now_s, rate * self._burst_s)
            self._tenants[tenant] = bucket
        return bucket


@dataclass(slots=True)
class CapacitySnapshot:
    spare_tokens_per_s: float
    live_tokens_per_s: float
    live_waiting: float
    bucket_level_tokens: float
    in_flight: int
    granted_tokens_total: float
    denied: dict[str, int] = field(default_factory=dict)


class CapacityController:
    """Replay admission for one worker's engine (see the module docstring)."""

    def __init__(
        self, config: CapacityConfig, clock: Clock, limits: OperatorLimits | None = None
    ) -> None:
        self.config = config
        self.estimator = SpareEstimator(config)
        self._clock = clock
        self._limits = limits or OperatorLimits(clock.monotonic())
        depth = max(1.0, config.capacity_tokens_per_s * max(config.headroom, 0.05) * config.burst_s)
        self._bucket = TokenBucket(0.0, depth, clock.monotonic())
        self.in_flight = 0
        self.granted_tokens_total = 0.0
        self._denied: dict[str, int] = {}

    def observe(self, metrics: EngineMetrics) -> None:
        now_s = self._clock.monotonic()
        self._bucket.refill(now_s)
        self.estimator.observe(metrics, now_s, self.in_flight)
        self._bucket.set_rate(self.estimator.spare_tokens_per_s(now_s), now_s)

    def try_acquire(self, tokens: int, tenant: str) -> Grant:
        now_s = self._clock.monotonic()
        grant = self._check(tokens, tenant, now_s)
        if grant is not Grant.GRANTED:
            self._denied[grant.value] = self._denied.get(grant.value, 0) + 1
            return grant
        self._bucket.take(tokens)
        if self._limits.region is not None:
            self._limits.region.take(tokens)
        tenant_bucket = self._limits.tenant_bucket(tenant, now_s)
        if tenant_bucket is not None:
            tenant_bucket.take(tokens)
        self.in_flight += 1
        self.granted_tokens_total += tokens
        return grant

    async def acquire(self, tokens: int, tenant: str, deadline_s: float) -> None:
        """Wait (on the injected clock) until granted; ReplayCapacityTimeout at ``deadline_s``
        (a ``Clock.monotonic()`` instant). Polls at most every 0.1 s."""
        while True:
            grant = self.try_acquire(tokens, tenant)
            if grant is Grant.GRANTED:
                return
            now_s = self._clock.monotonic()
            if now_s >= deadline_s:
                raise ReplayCapacityTimeout(f"no replay capacity for {tokens} tokens ({grant})")
            wait_s = min(0.1, deadline_s - now_s, self._bucket.seconds_until(tokens))
            await self._clock.sleep(max(wait_s, 0.001))

    def release(self, computed_tokens: int | None) -> None:
        """A granted replay finished. ``computed_tokens`` = prompt - cached tokens the engine
        reported (None if it failed before the engine counted anything)."""
        if self.in_flight <= 0:
            raise InvariantViolation("release without a granted replay in flight")
        self.in_flight -= 1
        if computed_tokens is not None:
            self.estimator.note_replay_computed(computed_tokens)

    def snapshot(self) -> CapacitySnapshot:
        now_s = self._clock.monotonic()
        self._bucket.refill(now_s)
        return CapacitySnapshot(
            spare_tokens_per_s=self.estimator.spare_tokens_per_s(now_s),
            live_tokens_per_s=self.estimator.live_tokens_per_s,
            live_waiting=self.estimator.live_waiting,
            bucket_level_tokens=self._bucket.level,
            in_flight=self.in_flight,
            granted_tokens_total=self.granted_tokens_total,
            denied=dict(self._denied),
        )

    def _check(self, tokens: int, tenant: str, now_s: float) -> Grant:
        if tokens <= 0:
            raise InvariantViolation("a replay acquires a positive number of tokens")
        if self.in_flight >= self.config.max_concurrent_replays:
            return Grant.CONCURRENCY
        spare_tokens_per_s = self.estimator.spare_tokens_per_s(now_s)
        self._bucket.set_rate(spare_tokens_per_s, now_s)
        # no spare right now (saturated, waiting live requests, stale metrics): deny even if
        # the bucket saved up tokens earlier
        if spare_tokens_per_s <= 0 or not self._bucket.can_take(tokens):
            return Grant.NO_SPARE
        region = self._limits.region
        if region is not None:
            region.refill(now_s)
            if not region.can_take(tokens):
                return Grant.REGION_LIMIT
        tenant_bucket = self._limits.tenant_bucket(tenant, now_s)
        if tenant_bucket is not None:
            tenant_bucket.refill(now_s)
            if not tenant_bucket.can_take(tokens):
                return Grant.TENANT_LIMIT
        return Grant.GRANTED


class CapacityPoller:
    """Async adapter: feeds a controller from its engine's metrics every ``interval_s``.

    Each scrape runs under ``timeout_s``. A failed scrape is not fed (after ``stale_after_s``
    without metrics the spare reads 0); the next attempt backs off exponentially with jitter from
    the injected rng, up to ``backoff_max_s``.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        controller: CapacityController,
        clock: Clock,
        rng: random.Random,
        *,
        interval_s: float = 0.25,
        timeout_s: float = 1.0,
        backoff_max_s: float = 5.0,
    ) -> None:
        self._engine = engine
        self._controller = controller
        self._clock = clock
        self._rng = rng
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._backoff_max_s = backoff_max_s
        self.failures_total = 0

    async def poll_once(self) -> bool:
        try:
            async with asyncio.timeout(self._timeout_s):
                metrics = await self._engine.metrics()
        except (TimeoutError, EngineUnavailable):
            self.failures_total += 1
            return False
        self._controller.observe(metrics)
        return True

    async def run(self) -> None:
        delay_s = self._interval_s
        while True:
            if await self.poll_once():
                delay_s = self._interval_s
            else:
                delay_s = min(self._backoff_max_s, delay_s * 2)
            await self._clock.sleep(delay_s * (0.75 + 0.5 * self._rng.random()))
