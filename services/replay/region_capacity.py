"""Spare prefill capacity of a region's engines, for the replay dispatcher and the workers.

One scrape of each engine's ``/metrics`` per interval feeds two kinds of
``replay.capacity.CapacityController``:

* **per engine** (``engine_controllers``): the spare gate of that engine's worker (embedded
  mode) and the per-engine live demand metric;
* **region** (``region``): capacity = the sum of the engines' capacities, fed with the sum of
  their counters, with the operator's region and tenant limits. The dispatcher takes a grant per
  job from it before publishing, and gives the grant back when the job's result arrives (or its
  deadline passed), so jobs reach the bus only as fast as the region has spare, and at most
  ``engines x worker_concurrency`` are on the bus or running at once.

``CapacityPoller`` polls one engine into one controller; a region needs one scrape fanned out to
two controllers, hence this adapter. A failed scrape reuses the engine's last snapshot in the
region's sum (its counters just do not move); after ``stale_after_s`` without any successful
scrape the controllers read a spare of 0. Scrapes run under ``timeout_s``; when all fail, the
next poll backs off (doubling, jittered from the injected rng, at most ``backoff_max_s``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass

from eventlog.clock import Clock
from replay.capacity import (
    CapacityConfig,
    CapacityController,
    Grant,
    OperatorConfig,
    SpareEstimator,
    poll_forever,
)
from replay.engines.base import EngineUnavailable, InferenceEngine
from replay.model import EngineMetrics
from services.replay.config import ReplayConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PollConfig:
    interval_s: float = 0.25
    timeout_s: float = 1.0
    backoff_max_s: float = 5.0


def _sum_optional(values: Sequence[float | None]) -> float | None:
    """A sum over engines, None when any engine lacks the series (no partial sums)."""
    present = [v for v in values if v is not None]
    return sum(present) if len(present) == len(values) else None


def _sum_buckets(
    histograms: Sequence[tuple[tuple[float, float], ...] | None],
) -> tuple[tuple[float, float], ...] | None:
    """Cumulative histograms summed bucket by bucket; None unless all have the same bounds."""
    if not histograms or any(h is None for h in histograms):
        return None
    bounds = {tuple(b for b, _ in h or ()) for h in histograms}
    if len(bounds) != 1:
        return None
    return tuple(
        (bucket[0][0], sum(count for _, count in bucket))
        for bucket in zip(*(h or () for h in histograms), strict=True)
    )


def _sum(snapshots: Sequence[EngineMetrics]) -> EngineMetrics:
    return EngineMetrics(
        prompt_tokens_total=sum(m.prompt_tokens_total for m in snapshots),
        generation_tokens_total=sum(m.generation_tokens_total for m in snapshots),
        num_requests_running=sum(m.num_requests_running for m in snapshots),
        num_requests_waiting=sum(m.num_requests_waiting for m in snapshots),
        prefix_cache_queries_total=_sum_optional([m.prefix_cache_queries_total for m in snapshots]),
        prefix_cache_hits_total=_sum_optional([m.prefix_cache_hits_total for m in snapshots]),
        computed_prompt_tokens_total=_sum_optional(
            [m.computed_prompt_tokens_total for m in snapshots]
        ),
        ttft_buckets=_sum_buckets([m.ttft_buckets for m in snapshots]),
    )


class RegionCapacity:
    def __init__(
        self,
        engines: Sequence[tuple[InferenceEngine, float]],  # (engine, capacity tokens/s)
        config: ReplayConfig,
        clock: Clock,
        rng: random.Random,
        poll: PollConfig | None = None,
    ) -> None:
        self._engines = [engine for engine, _ in engines]
        self._clock = clock
        self._rng = rng
        self._poll = poll or PollConfig()
        concurrency = config.worker_concurrency
        self.engine_controllers: dict[str, CapacityController] = {
            engine.engine_id: CapacityController(
                CapacityConfig(capacity, config.headroom, max_concurrent_replays=concurrency),
                clock,
            )
            for engine, capacity in engines
        }
        limits = OperatorConfig(
            clock.monotonic(),
            region_tokens_per_s=config.region_tokens_per_s,
            tenant_tokens_per_s=config.tenant_tokens_per_s,
            tenant_default_tokens_per_s=config.tenant_default_tokens_per_s,
        )
        total_tokens_per_s = sum(capacity for _, capacity in engines) or 1.0
        self.region = CapacityController(
            CapacityConfig(
                total_tokens_per_s,
                config.headroom,
                max_concurrent_replays=max(1, len(engines) * concurrency),
            ),
            clock,
            limits,
        )
        self._last: dict[str, EngineMetrics] = {}
        self._members: frozenset[str] = frozenset()
        self.scrape_failures_total = 0
        #: engine id -> why its capacity is unknown (last scrape failed): no replay there
        self.unknown_reasons: dict[str, str] = {}

    def engine_totals(self) -> EngineMetrics | None:
        """The region's engines' counters as last scraped, summed (None: none answered yet)."""
        return _sum(list(self._last.values())) if self._last else None

    def try_acquire(self, tokens: int, tenant: str) -> Grant:
        return self.region.try_acquire(tokens, tenant)

    def release(self, computed_tokens: int | None) -> None:
        self.region.release(computed_tokens)

    async def poll_once(self) -> int:
        """Scrape every engine once; returns how many answered."""
        replies = await asyncio.gather(*(self._scrape(e) for e in self._engines))
        answered = 0
        for engine, metrics in zip(self._engines, replies, strict=True):
            if metrics is None:
                continue
            answered += 1
            self._last[engine.engine_id] = metrics
            self.engine_controllers[engine.engine_id].observe(metrics)
        if answered:
            members = frozenset(self._last)
            if members != self._members:
                # an engine joined the sum: its whole counter would read as one burst of live
                # demand, so the region's estimate starts over from this snapshot
                self._members = members
                self.region.estimator = SpareEstimator(self.region.config)
            # the region's grants include jobs still on the bus, which no engine's waiting gauge
            # holds: only requests the workers sent (their controllers' grants) can be waiting
            # there. (External Kafka workers' requests are not known here: conservative.)
            at_engines = sum(c.in_flight for c in self.engine_controllers.values())
            self.region.observe(_sum(list(self._last.values())), at_engines)
        return answered

    async def _scrape(self, engine: InferenceEngine) -> EngineMetrics | None:
        try:
            async with asyncio.timeout(self._poll.timeout_s):
                metrics = await engine.metrics()
        except (TimeoutError, EngineUnavailable) as exc:
            self.scrape_failures_total += 1
            reason = str(exc) or "metrics scrape timed out"
            if self.unknown_reasons.get(engine.engine_id) != reason:  # loudly, once per reason
                log.warning("engine %s: capacity unknown, no replay: %s", engine.engine_id, reason)
            self.unknown_reasons[engine.engine_id] = reason
            return None
        self.unknown_reasons.pop(engine.engine_id, None)
        return metrics

    async def run(self) -> None:
        await poll_forever(
            self.poll_once,
            self._clock,
            self._rng,
            self._poll.interval_s,
            self._poll.backoff_max_s,
            keep_polling=lambda: bool(self._engines),
        )
