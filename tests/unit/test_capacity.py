"""Spare-capacity controller: reaction to live demand, waiting => 0, buckets and operator caps."""

from __future__ import annotations

import random

import pytest

from eventlog.errors import InvariantViolation
from replay.capacity import (
    CapacityConfig,
    CapacityController,
    Grant,
    OperatorConfig,
    ReplayCapacityTimeout,
    TokenBucket,
)
from replay.model import EngineMetrics
from tests.unit.clocks import ManualClock

CAPACITY = 10_000.0  # tokens/s; usable with 10% headroom: 9_000


class FakeEngineCounters:
    def __init__(self) -> None:
        self.prompt = 0.0
        self.hits = 0.0
        self.running = 0.0
        self.waiting = 0.0

    def run(self, computed_tokens: float, cached_tokens: float = 0.0) -> None:
        self.prompt += computed_tokens + cached_tokens
        self.hits += cached_tokens

    def metrics(self) -> EngineMetrics:
        return EngineMetrics(self.prompt, 0.0, self.running, self.waiting, self.prompt, self.hits)


def _controller(clock: ManualClock, **kwargs: float) -> CapacityController:
    config = CapacityConfig(capacity_tokens_per_s=CAPACITY, headroom=0.1, **kwargs)  # type: ignore[arg-type]
    return CapacityController(config, clock)


def _feed(
    clock: ManualClock,
    controller: CapacityController,
    engine: FakeEngineCounters,
    live_tokens_per_s: float,
    seconds: float,
    step_s: float = 0.25,
) -> None:
    for _ in range(round(seconds / step_s)):
        clock.now_s += step_s
        engine.run(live_tokens_per_s * step_s)
        controller.observe(engine.metrics())


def test_spare_reacts_to_a_surge_within_two_seconds_and_recovers_slower() -> None:
    clock, engine = ManualClock(100.0), FakeEngineCounters()
    controller = _controller(clock)
    estimator = controller.estimator
    _feed(clock, controller, engine, 2_000, seconds=10)
    assert controller.snapshot().spare_tokens_per_s == pytest.approx(7_000, rel=0.02)
    engine.waiting = 3  # live demand surges and queues
    _feed(clock, controller, engine, 9_500, seconds=2.0)
    assert estimator.rate_spare_tokens_per_s(clock.now_s) < 1_000  # the surge is seen at once
    engine.waiting = 0
    _feed(clock, controller, engine, 2_000, seconds=2.0)  # and falls back
    assert controller.snapshot().spare_tokens_per_s < 3_500  # the fall is trusted slowly
    _feed(clock, controller, engine, 2_000, seconds=20)
    assert controller.snapshot().spare_tokens_per_s == pytest.approx(7_000, rel=0.02)


def test_small_rises_are_inside_the_deadband_and_tracked_by_the_window() -> None:
    clock, engine = ManualClock(100.0), FakeEngineCounters()
    controller = _controller(clock)
    _feed(clock, controller, engine, 2_000, seconds=10)
    engine.waiting = 1
    _feed(clock, controller, engine, 4_000, seconds=1.0)  # +20% of capacity: no surge
    live = controller.estimator.live_tokens_per_s
    assert 2_000 < live < 3_000  # the 5 s mean moves a fifth of the way
    engine.waiting = 0
    _feed(clock, controller, engine, 4_000, seconds=5.0)
    assert controller.estimator.live_tokens_per_s == pytest.approx(4_000, rel=0.02)


def test_lumpy_completion_counts_do_not_bias_the_live_rate() -> None:
    """vLLM V1 counts a prompt when its prefill completes: at 60% load the counter jumps by
    whole prompts. The estimate must average to the true rate (bias = lost replay)."""
    rng = random.Random(7)
    clock, engine = ManualClock(100.0), FakeEngineCounters()
    controller = _controller(clock)
    true_rate = 6_000.0  # tokens/s of 1_000..5_000-token prompts completing at Poisson times
    mean_prompt = 3_000.0
    next_done_s = clock.now_s + rng.expovariate(true_rate / mean_prompt)
    estimates = []
    for step in range(4 * 600):
        clock.now_s += 0.25
        while next_done_s <= clock.now_s:
            engine.run(rng.uniform(1_000, 5_000))
            next_done_s += rng.expovariate(true_rate / mean_prompt)
        controller.observe(engine.metrics())
        if step == 40:
            start_s, start_tokens = clock.now_s, engine.prompt
        if step > 40:
            estimates.append(controller.estimator.live_tokens_per_s)
    realized_rate = (engine.prompt - start_tokens) / (clock.now_s - start_s)
    assert sum(estimates) / len(estimates) == pytest.approx(realized_rate, rel=0.02)


def test_cached_tokens_and_replays_own_tokens_are_not_live_demand() -> None:
    clock, engine = ManualClock(100.0), FakeEngineCounters()
    controller = _controller(clock, max_concurrent_replays=100)
    controller.observe(engine.metrics())
    for _ in range(40):
        clock.now_s += 0.25
        engine.run(1_000 * 0.25, cached_tokens=50_000)  # live: 1_000/s computed, rest cached
        engine.run(4_000 * 0.25)  # replay's computed tokens this interval, reported to us
        controller.estimator.note_replay_computed(4_000 * 0.25)
        controller.observe(engine.metrics())
    assert controller.snapshot().live_tokens_per_s == pytest.approx(1_000, rel=0.02)


def test_waiting_live_requests_mean_no_spare() -> None:
    clock, engine = ManualClock(100.0), FakeEngineCounters()
    controller = _controller(clock, max_concurrent_replays=3)
    _feed(clock, controller, engine, 1_000, seconds=5)
    assert controller.snapshot().spare_tokens_per_s > 0
    engine.waiting = 2
    scrapes = controller.config.waiting_scrapes_to_stop
    _feed(clock, controller, engine, 1_000, seconds=0.25 * (scrapes - 1))
    # requests that arrived during the step in progress; not yet a queue
    assert controller.snapshot().spare_tokens_per_s > 0
    _feed(clock, controller, engine, 1_000, seconds=0.25)
    assert controller.snapshot().spare_tokens_per_s == 0  # waiting in `scrapes` in a row
    assert controller.try_acquire(100, "t") is Grant.NO_SPARE
    # our own replay requests waiting in the engine's queue are not live load
    engine.waiting = 0
    _feed(clock, controller, engine, 1_000, seconds=2)
    assert controller.try_acquire(100, "t") is Grant.GRANTED
    assert controller.try_acquire(100, "t") is Grant.GRANTED
    engine.waiting = 2
    _feed(clock, controller, engine, 1_000, seconds=0.25 * (scrapes + 1))
    assert controller.snapshot().spare_tokens_per_s > 0


def test_waiting_pauses_grants_but_keeps_the_credit_earned_meanwhile() -> None:
    clock, engine = ManualClock(100.0), FakeEngineCounters()
    controller = _controller(clock, max_concurrent_replays=10, burst_s=5)
    _feed(clock, controller, engine, 5_000, seconds=10)  # spare 4_000/s, bucket full (5_000)
    while controller.try_acquire(1_000, "t") is Grant.GRANTED:
        controller.release(0)
    engine.waiting = 1
    _feed(clock, controller, engine, 5_000, seconds=1.0)
    assert controller.try_acquire(1_000, "t") is Grant.NO_SPARE
    engine.waiting = 0
    _feed(clock, controller, engine, 5_000, seconds=0.25)
    granted = 0
    while controller.try_acquire(1_000, "t") is Grant.GRANTED:
        controller.release(0)
        granted += 1_000
    assert granted >= 4_000  # the second of waiting earned its ~4_000 tokens


def test_replay_tokens_counted_before_their_report_are_carried_not_clamped() -> None:
    clock, engine = ManualClock(100.0), FakeEngineCounters()
    controller = _controller(clock, max_concurrent_replays=10)
    controller.observe(engine.metrics())
    estimates = []
    for step in range(400):
        clock.now_s += 0.25
        engine.run(2_000 * 0.25)  # live
        engine.run(3_000 * 0.25)  # replay, counted per chunk by the engine (vLLM V0) ...
        if step % 8 == 7:  # ... and reported when the replay finishes, 2 s later
            controller.estimator.note_replay_computed(3_000 * 2.0)
        controller.observe(engine.metrics())
        estimates.append(controller.estimator.live_tokens_per_s)
    late = estimates[40:]
    assert sum(late) / len(late) == pytest.approx(2_000, rel=0.01)  # no clamping bias


def test_stale_metrics_mean_no_spare() -> None:
    clock, engine = ManualClock(100.0), FakeEngineCounters()
    controller = _controller(clock)
    assert controller.snapshot().spare_tokens_per_s == 0  # never observed
    _feed(clock, controller, engine, 1_000, seconds=3)
    clock.now_s += 10
    assert controller.snapshot().spare_tokens_per_s == 0


def test_bucket_rate_matches_spare_and_concurrency_is_capped() -> None:
    clock, engine = ManualClock(100.0), FakeEngineCounters()
    controller = _controller(clock, max_concurrent_replays=1)
    _feed(clock, controller, engine, 4_000, seconds=10)  # spare 5_000/s
    granted = 0
    for step in range(400):  # 10 s in 25 ms steps, 500-token jobs finishing at once
        if step % 10 == 0:
            engine.run(4_000 * 0.25)
            controller.observe(engine.metrics())
        clock.now_s += 0.025
        if controller.try_acquire(500, "t") is Grant.GRANTED:
            granted += 500
            assert controller.try_acquire(500, "t") is Grant.CONCURRENCY
            controller.release(0)
    assert granted == pytest.approx(50_000, rel=0.1)


def test_operator_region_and_tenant_limits() -> None:
    clock = ManualClock(100.0)
    limits = OperatorConfig(
        clock.monotonic(), region_tokens_per_s=2_000, tenant_tokens_per_s={"small": 500}
    )
    config = CapacityConfig(capacity_tokens_per_s=CAPACITY, max_concurrent_replays=100, burst_s=10)
    controller = CapacityController(config, clock, limits)
    engine = FakeEngineCounters()
    _feed(clock, controller, engine, 0, seconds=5)
    assert controller.try_acquire(500, "small") is Grant.GRANTED
    assert controller.try_acquire(500, "small") is Grant.TENANT_LIMIT
    clock.now_s += 1.0
    assert controller.try_acquire(900, "big") is Grant.GRANTED
    assert controller.try_acquire(900, "big") is Grant.GRANTED
    assert controller.try_acquire(900, "big") is Grant.REGION_LIMIT
    assert controller.snapshot().denied == {"tenant_limit": 1, "region_limit": 1}


async def test_acquire_waits_in_clock_time_and_times_out() -> None:
    clock, engine = ManualClock(100.0), FakeEngineCounters()
    controller = _controller(clock, max_concurrent_replays=10)
    _feed(clock, controller, engine, 8_000, seconds=10)  # spare 1_000/s
    start_s = clock.now_s
    await controller.acquire(900, "t", deadline_s=start_s + 5)
    await controller.acquire(900, "t", deadline_s=start_s + 5)
    assert clock.now_s - start_s >= 0.5  # the second had to wait for the bucket
    controller.release(900)
    controller.release(900)
    engine.waiting = 1  # a live request waits, scrape after scrape
    _feed(
        clock, controller, engine, 8_000, seconds=0.25 * controller.config.waiting_scrapes_to_stop
    )
    with pytest.raises(ReplayCapacityTimeout):
        await controller.acquire(900, "t", deadline_s=clock.now_s + 2)


def test_bucket_debt_lets_large_jobs_through_at_the_exact_rate() -> None:
    bucket = TokenBucket(rate_per_s=100, depth=50, now_s=0.0)
    bucket.refill(0.5)
    assert bucket.can_take(1_000)  # level reached the depth
    bucket.take(1_000)
    assert bucket.seconds_until(1_000) == pytest.approx(10.0)
    with pytest.raises(InvariantViolation):
        TokenBucket(rate_per_s=-1, depth=1, now_s=0.0)


def test_an_engine_with_unverified_priority_gives_replay_a_smaller_share_of_its_spare() -> None:
    """Under FCFS (which vLLM cannot be asked about) a replay queues level with live requests:
    replay takes ``unverified_priority_share`` of the spare, and all of it once verified."""
    clock, engine = ManualClock(100.0), FakeEngineCounters()
    controller = _controller(clock, unverified_priority_share=0.25)
    _feed(clock, controller, engine, 2_000, seconds=10)
    controller.set_priority_verified(False)
    assert controller.snapshot().spare_tokens_per_s == pytest.approx(7_000 * 0.25, rel=0.02)
    controller.set_priority_verified(True)
    assert controller.snapshot().spare_tokens_per_s == pytest.approx(7_000, rel=0.02)
    with pytest.raises(InvariantViolation):
        CapacityConfig(CAPACITY, unverified_priority_share=0.0)


def test_an_engine_with_unverified_priority_takes_replay_only_while_no_live_request_is_in_it() -> (
    None
):
    """Under FCFS a live request that arrives during a replay's prefill queues behind it:
    while a live request runs or waits there, no spare; replay's own requests do not count,
    and an engine whose priority scheduling is verified takes replay beside live ones."""
    clock, engine = ManualClock(100.0), FakeEngineCounters()
    controller = _controller(clock, unverified_priority_share=0.5, max_concurrent_replays=4)
    controller.set_priority_verified(False)
    _feed(clock, controller, engine, 2_000, seconds=10)
    assert controller.snapshot().spare_tokens_per_s == pytest.approx(3_500, rel=0.02)
    assert controller.try_acquire(100, "t") is Grant.GRANTED
    engine.running = 1  # that replay, at the engine: not a live request
    _feed(clock, controller, engine, 2_000, seconds=0.25)
    assert controller.snapshot().spare_tokens_per_s > 0
    engine.running = 2  # a live request beside it
    _feed(clock, controller, engine, 2_000, seconds=0.25)
    assert controller.snapshot().spare_tokens_per_s == 0.0
    assert controller.try_acquire(100, "t") is Grant.NO_SPARE
    engine.running, engine.waiting = 1, 1  # the live one waiting is as much in the engine
    _feed(clock, controller, engine, 2_000, seconds=0.25)
    assert controller.try_acquire(100, "t") is Grant.NO_SPARE
    controller.set_priority_verified(True)  # verified: replay beside live requests
    assert controller.snapshot().spare_tokens_per_s > 0
    controller.set_priority_verified(False)
    engine.running, engine.waiting = 1, 0  # the live one done; the replay still running
    _feed(clock, controller, engine, 2_000, seconds=0.25)
    assert controller.try_acquire(100, "t") is Grant.GRANTED
