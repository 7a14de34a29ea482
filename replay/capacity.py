"""Spare prefill capacity: how many replay tokens per second an engine can take without hurting
live traffic, and the token buckets replay dispatch draws from.

Per engine (``SpareEstimator``)::

    spare_prefill_tokens_per_s = capacity_tokens_per_s * (1 - headroom) - live_tokens_per_s

``live_tokens_per_s`` is measured from the engine's own counters, not predicted: the rate of
*computed* prompt tokens, ``vllm:prompt_tokens_by_source_total{source="local_compute"}``
(prefix-cache hits cost no prefill compute), minus the computed tokens of replay's own requests
(the controller is told each replay outcome; a replay counted before it is reported is taken
off later intervals, never clamped away). That series is counted at the same moment as
``vllm:prompt_tokens_total``. Servers without it fall back to ``prompt_tokens_total -
prefix_cache_hits_total``, but vLLM counts hits when a request is *scheduled* and prompt tokens
when its prefill completes, so under chunked prefill hits run steps ahead and the difference
dips: the fallback is held at its running maximum (a dip reads as no live work until the
prompt tokens catch up; the total is unchanged). **Any counter going down** is an engine
restart: the window and replay's own accounting start over (``restarts_total``); a dip of the
fallback difference alone is not. vLLM V1 counts a prompt when its prefill completes, so
the counter moves in lumps of whole prompts; the estimate must be unbiased over such lumps,
because any bias becomes lost replay throughput (an earlier fast-rise/slow-fall EWMA read 60%
high at 60% load and gave replay a fifth of the spare). So:

- the base estimate is the plain mean rate over the last ``spare_window_s`` (5 s): unbiased;
- a rise detector with a deadband: when the mean over the last ``rise_window_s`` (2 s) exceeds
  the mean of the window's older part by more than ``rise_deadband`` x capacity (0.7) *while
  live requests wait*, the
  excess is added at once and then decays with ``fall_tau_s`` (3 s), so replay backs off
  within two seconds of a real surge and returns slowly. Completion lumps of ordinary load stay
  inside the deadband: measured in bench/replay.py, a 1 s window with a 0.25 deadband fired on
  noise alone and cost 25% of replay throughput; this setting never fires at 60% load.

When live requests are waiting (``num_requests_waiting`` minus replay requests of ours that
can be waiting in that engine, i.e. sent to it and not finished; in vLLM: requests never
scheduled yet) in ``waiting_scrapes_to_stop`` (3) scrapes in a row, the spare reads 0 and
nothing is granted, but the spare bucket keeps the credit it earns at the measured rate (up to
its depth): a waiting queue at 60% load lasts a step or two, and replay runs at a lower priority
anyway, so dropping the credit would only lose throughput. One scrape is not enough: a request
that arrived during the step in progress waits for it, so at 60% load a third of scrapes see
one (bench/replay.py), and stopping on each cost replay 5% of its makespan (3 in a row:
makespan 1.045 x its bound and live TTFT p99 733 ms vs 848 ms without replay; 2: 1.049).

Dispatch (``CapacityController``, one per worker/engine) grants a replay of ``tokens`` only if
all hold, and then takes from all (all or nothing):

- fewer than ``max_concurrent_replays`` replays of this worker in flight;
- the spare bucket (rate = current spare, depth ``burst_s`` seconds of capacity x headroom);
- on an engine whose priority scheduling is unverified (``set_priority_verified``): no live
  request in the engine at the last scrape (running or waiting, replay's own taken off), and
  ``unverified_priority_share`` of the spare. The self-check's queue probe could not tell how
  such an engine schedules; one it saw serving first-come-first-served is unfit and gets no
  replay. Under FCFS a replay beside live requests shares each step's token budget with them
  and a live request that arrives during its prefill queues behind it (measured on vLLM's CPU
  build in FCFS mode: live TTFT p99 2.06x of no replay with the half share alone,
  bench/RESULTS.md);
- the operator's region bucket and the tenant's bucket (``OperatorConfig``, shared by the
  controllers of one region).

A bucket grants when its level reaches ``min(tokens, depth)`` and then goes down by ``tokens``,
possibly below zero: a job bigger than the depth is not starved, and the long-run rate is exact.

Pure: time is read from the injected ``Clock``; ``CapacityPoller`` is the async adapter that
feeds the estimator from ``InferenceEngine.metrics()``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from eventlog.backoff import Backoff, jittered
from eventlog.clock import Clock
from eventlog.errors import DeadlineExceeded, InvariantViolation
from replay.engines.base import EngineUnavailable, InferenceEngine
from replay.model import EngineMetrics

log = logging.getLogger(__name__)


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
    fall_tau_s: float = 3.0  # a detected surge's excess decays with this time constant
    burst_s: float = 1.0  # spare bucket depth, in seconds of capacity x headroom
    max_concurrent_replays: int = 2
    stale_after_s: float = 5.0  # no metrics for this long => spare 0
    spare_window_s: float = 5.0  # live rate = mean over this window
    rise_window_s: float = 2.0  # a surge is judged over this window ...
    rise_deadband: float = 0.7  # ... when it beats the older mean by this fraction of capacity
    #: live requests seen waiting in this many consecutive scrapes stop replay grants: a
    #: request that arrived during the step in progress waits for that step, so one scrape
    #: seeing a waiting request is ordinary at any load (a third of scrapes at 60% in
    #: bench/replay.py); a queue that outlives a scrape interval is not
    waiting_scrapes_to_stop: int = 3
    #: the fraction of the spare replay takes on an engine whose priority scheduling is
    #: unverified (the self-check's queue probe could not tell, and nobody declared it). It
    #: may serve FCFS, where replay queues level with live requests, so it leaves room for
    #: the live requests that arrive while it prefills.
    unverified_priority_share: float = 0.5

    def __post_init__(self) -> None:
        if self.capacity_tokens_per_s <= 0 or not 0 <= self.headroom < 1:
            raise InvariantViolation("capacity must be > 0 and headroom in [0, 1)")
        windows_ok = 0 < self.rise_window_s <= self.spare_window_s
        if self.max_concurrent_replays < 1 or self.fall_tau_s <= 0 or not windows_ok:
            raise InvariantViolation("bad capacity config")
        if self.rise_deadband < 0 or self.waiting_scrapes_to_stop < 1:
            raise InvariantViolation("rise_deadband must be >= 0, waiting_scrapes_to_stop >= 1")
        if not 0 < self.unverified_priority_share <= 1:
            raise InvariantViolation("unverified_priority_share must be in (0, 1]")


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

    SAMPLES_MAX = 1024  # polls inside one spare window, at most (older ones are dropped)

    def __init__(self, config: CapacityConfig) -> None:
        self.config = config
        self.live_tokens_per_s = 0.0
        self.live_waiting = 0.0
        self.waiting_scrapes = 0  # consecutive scrapes that saw live requests waiting
        self.last_observed_s: float | None = None
        self._last_computed: float | None = None
        self._last_counters: tuple[float, ...] | None = None
        self.restarts_total = 0
        self._replay_computed_since = 0.0
        self._live_total = 0.0  # live computed tokens since the first snapshot
        self._samples: deque[tuple[float, float]] = deque(maxlen=self.SAMPLES_MAX)
        self._surge_tokens_per_s = 0.0  # excess of a detected rise, at ``_surge_at_s``
        self._surge_at_s = 0.0
        #: the fraction of the spare replay may take (``unverified_priority_share`` on an
        #: engine whose priority scheduling the worker's self-check could not verify)
        self.spare_share = 1.0
        #: no spare while any live request is in the engine (set with the share above): on
        #: an engine that may schedule first-come-first-served, a replay admitted next to live
        #: requests is served level with them, and a live request arriving during its prefill
        #: waits behind it
        self.idle_only = False
        #: live requests in the engine at the last scrape: running or waiting, less replay's
        self.live_in_engine = 0.0

    def note_replay_computed(self, computed_tokens: float) -> None:
        self._replay_computed_since += computed_tokens

    def observe(self, metrics: EngineMetrics, now_s: float, replays_at_engine: int) -> None:
        """``replays_at_engine``: replay requests of ours sent to this engine (or these
        engines) and not finished, the most of them its waiting gauge can hold."""
        self.live_waiting = max(0.0, metrics.num_requests_waiting - replays_at_engine)
        in_engine = metrics.num_requests_running + metrics.num_requests_waiting
        self.live_in_engine = max(0.0, in_engine - replays_at_engine)
        self.waiting_scrapes = self.waiting_scrapes + 1 if self.live_waiting > 0 else 0
        last_s = self.last_observed_s
        if last_s is not None and now_s <= last_s:
            return  # no time passed: nothing to learn
        counters = metrics.counters()
        restarted = self._last_counters is not None and any(
            now < before for now, before in zip(counters, self._last_counters, strict=True)
        )
        self._last_counters = counters
        last = None if restarted else self._last_computed
        computed = _computed_tokens(metrics)
        if last is not None and metrics.computed_prompt_tokens_total is None:
            computed = max(computed, last)  # the fallback's dips (module docstring)
        self.last_observed_s, self._last_computed = now_s, computed
        if last is None:  # first snapshot, or the engine restarted
            self.restarts_total += restarted
            self._replay_computed_since = 0.0
            self._samples.clear()
            self._samples.append((now_s, self._live_total))
            return
        # replay tokens reported but not yet counted (or the reverse) carry over: no clamping
        self._live_total += computed - last - self._replay_computed_since
        self._replay_computed_since = 0.0
        self._samples.append((now_s, self._live_total))
        horizon_s = now_s - self.config.spare_window_s
        while len(self._samples) > 1 and self._samples[1][0] <= horizon_s:
            self._samples.popleft()  # keep one sample at or before the window's start
        self.live_tokens_per_s = self._estimate(now_s)

    def _rate_over(self, window_s: float, now_s: float) -> float:
        """Mean live rate since the newest sample at least ``window_s`` old (or the oldest)."""
        start_s, start_total = self._samples[0]
        for at_s, total in reversed(self._samples):
            if at_s <= now_s - window_s + 1e-9:
                start_s, start_total = at_s, total
                break
        if now_s <= start_s:
            return 0.0
        return max(0.0, (self._live_total - start_total) / (now_s - start_s))

    def _rate_between(self, older_s: float, newer_s: float, now_s: float) -> float:
        """Mean live rate from ``older_s`` to ``newer_s`` ago (0 if no sample spans it)."""
        start = end = None
        for at_s, total in reversed(self._samples):
            if end is None and at_s <= now_s - newer_s + 1e-9:
                end = (at_s, total)
            if at_s <= now_s - older_s + 1e-9:
                start = (at_s, total)
                break
        start = start or self._samples[0]
        if end is None or end[0] <= start[0]:
            return 0.0
        return max(0.0, (end[1] - start[1]) / (end[0] - start[0]))

    def _estimate(self, now_s: float) -> float:
        base = self._rate_over(self.config.spare_window_s, now_s)
        recent = self._rate_over(self.config.rise_window_s, now_s)
        before = self._rate_between(self.config.spare_window_s, self.config.rise_window_s, now_s)
        decay = math.exp(-(now_s - self._surge_at_s) / self.config.fall_tau_s)
        surge = self._surge_tokens_per_s * decay
        deadband = self.config.rise_deadband * self.config.capacity_tokens_per_s
        if recent - before > deadband and self.live_waiting > 0:
            if recent - base > surge:
                surge = recent - base
            self._surge_tokens_per_s, self._surge_at_s = surge, now_s
        return base + surge

    def _stale(self, now_s: float) -> bool:
        last_s = self.last_observed_s
        return last_s is None or now_s - last_s > self.config.stale_after_s

    def rate_spare_tokens_per_s(self, now_s: float) -> float:
        """Spare from the measured live rate alone (ignores waiting requests): the rate at
        which the spare bucket earns credit."""
        if self._stale(now_s):
            return 0.0
        usable = self.config.capacity_tokens_per_s * (1.0 - self.config.headroom)
        return max(0.0, usable - self.live_tokens_per_s) * self.spare_share

    def spare_tokens_per_s(self, now_s: float) -> float:
        if self.waiting_scrapes >= self.config.waiting_scrapes_to_stop:
            return 0.0
        if self.idle_only and self.live_in_engine > 0:
            return 0.0
        return self.rate_spare_tokens_per_s(now_s)


def _computed_tokens(metrics: EngineMetrics) -> float:
    if metrics.computed_prompt_tokens_total is not None:
        return metrics.computed_prompt_tokens_total
    return metrics.prompt_tokens_total - (metrics.prefix_cache_hits_total or 0.0)


class OperatorConfig:
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
        self, config: CapacityConfig, clock: Clock, limits: OperatorConfig | None = None
    ) -> None:
        self.config = config
        self.estimator = SpareEstimator(config)
        self._clock = clock
        self._limits = limits or OperatorConfig(clock.monotonic())
        depth = max(1.0, config.capacity_tokens_per_s * max(config.headroom, 0.05) * config.burst_s)
        self._bucket = TokenBucket(0.0, depth, clock.monotonic())
        self.in_flight = 0
        self.granted_tokens_total = 0.0
        self._denied: dict[str, int] = {}

    def observe(self, metrics: EngineMetrics, replays_at_engine: int | None = None) -> None:
        """Feed a scrape. ``replays_at_engine`` defaults to this controller's replays in flight
        (a worker's controller: its grants are its requests at its engine)."""
        now_s = self._clock.monotonic()
        self._bucket.refill(now_s)
        at_engine = self.in_flight if replays_at_engine is None else replays_at_engine
        self.estimator.observe(metrics, now_s, at_engine)
        self._bucket.set_rate(self.estimator.rate_spare_tokens_per_s(now_s), now_s)

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

    def set_priority_verified(self, verified: bool) -> None:
        """Replay's share of the spare: all of it, or on an engine whose priority scheduling is
        unverified ``unverified_priority_share`` of it, and only while no live request is in
        the engine (``SpareEstimator.idle_only``)."""
        now_s = self._clock.monotonic()
        self._bucket.refill(now_s)
        share = 1.0 if verified else self.config.unverified_priority_share
        self.estimator.spare_share = share
        self.estimator.idle_only = not verified
        self._bucket.set_rate(self.estimator.rate_spare_tokens_per_s(now_s), now_s)

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
        self._bucket.set_rate(self.estimator.rate_spare_tokens_per_s(now_s), now_s)
        # no spare right now (saturated, waiting live requests, stale metrics): deny even if
        # the bucket saved up tokens earlier (waiting keeps the credit; see the docstring)
        if self.estimator.spare_tokens_per_s(now_s) <= 0 or not self._bucket.can_take(tokens):
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


async def poll_forever(
    poll_once: Callable[[], Awaitable[object]],
    clock: Clock,
    rng: random.Random,
    interval_s: float,
    backoff_max_s: float,
    keep_polling: Callable[[], bool] = lambda: True,
) -> None:
    """Call ``poll_once`` while ``keep_polling()``: every ``interval_s`` while it answers truthy;
    after a falsy answer twice the last wait, doubling up to ``backoff_max_s``. Every wait is
    jittered +-25 % from ``rng``."""
    backoff = Backoff(min(interval_s * 2, backoff_max_s), backoff_max_s, rng, low=0.75, width=0.5)
    while keep_polling():
        if await poll_once():
            backoff.reset()
            delay_s = jittered(interval_s, rng, low=0.75, width=0.5)
        else:
            delay_s = backoff.next_s()
        await clock.sleep(delay_s)


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
        #: why the engine's capacity is unknown (its last scrape failed), None when known
        self.unknown_reason: str | None = None

    async def poll_once(self) -> bool:
        try:
            async with asyncio.timeout(self._timeout_s):
                metrics = await self._engine.metrics()
        except (TimeoutError, EngineUnavailable) as exc:
            self.failures_total += 1
            reason = str(exc) or "metrics scrape timed out"
            if reason != self.unknown_reason:  # loudly, but once per reason
                log.warning(
                    "engine %s: capacity unknown, no replay: %s", self._engine.engine_id, reason
                )
            self.unknown_reason = reason
            return False
        self.unknown_reason = None
        self._controller.observe(metrics)
        return True

    async def run(self) -> None:
        await poll_forever(
            self.poll_once, self._clock, self._rng, self._interval_s, self._backoff_max_s
        )


class CapacityGate:
    """``replay.worker.SpareGate`` over ``replay.capacity.CapacityController``."""

    def __init__(self, controller: CapacityController) -> None:
        self._controller = controller

    def has_spare(self, prompt_tokens: int) -> bool:
        snapshot = self._controller.snapshot()
        return (
            snapshot.spare_tokens_per_s > 0
            and snapshot.in_flight < self._controller.config.max_concurrent_replays
        )

    async def wait_for_spare(self, prompt_tokens: int, tenant_id: str, deadline_s: float) -> None:
        await self._controller.acquire(max(prompt_tokens, 1), tenant_id, deadline_s)

    def release(self, computed_tokens: int | None) -> None:
        self._controller.release(computed_tokens)

    def set_priority_verified(self, verified: bool) -> None:
        self._controller.set_priority_verified(verified)
