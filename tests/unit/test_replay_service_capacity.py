"""Region spare capacity (one scrape fanned out to per-engine and region controllers) and the
dispatcher's handling of a bus that fails to publish."""

from __future__ import annotations

import random
from collections.abc import Sequence

from eventlog.errors import Unavailable
from replay.bus.memory import InProcessJobBus
from replay.capacity import Grant
from replay.engines.base import EngineUnavailable, InferenceEngine
from replay.model import EngineMetrics, PrefillOutcome, PrefillRequest, ReplayJob
from services.replay.config import ReplayConfig
from services.replay.region_capacity import RegionCapacity
from tests.unit.replay_world import (
    SteppedClock,
    ids_on_shard,
    queue_with_spare,
    world,
)


class MeteredEngine(InferenceEngine):
    """Serves scripted metric snapshots; ``down`` makes a scrape fail."""

    def __init__(self, engine_id: str) -> None:
        self._id = engine_id
        self.prompt_tokens_total = 0.0
        self.waiting = 0.0
        self.down = False

    @property
    def engine_id(self) -> str:
        return self._id

    @property
    def model_revision(self) -> str:
        return "rev"

    async def prefill(self, request: PrefillRequest) -> PrefillOutcome:
        raise AssertionError("not used")

    async def metrics(self) -> EngineMetrics:
        if self.down:
            raise EngineUnavailable(f"{self._id} is down")
        return EngineMetrics(self.prompt_tokens_total, 0.0, 0.0, self.waiting, 0.0, 0.0)

    async def aclose(self) -> None:
        return None


def region(engines: Sequence[MeteredEngine], clock: SteppedClock) -> RegionCapacity:
    config = ReplayConfig(headroom=0.1, worker_concurrency=2)
    return RegionCapacity([(e, 1000.0) for e in engines], config, clock, random.Random(1))


async def test_region_spare_is_the_sum_of_engines_minus_live_demand() -> None:
    clock = SteppedClock()
    e0, e1 = MeteredEngine("e0"), MeteredEngine("e1")
    capacity = region([e0, e1], clock)
    assert capacity.region.snapshot().spare_tokens_per_s == 0.0  # no metrics yet
    assert await capacity.poll_once() == 2
    assert capacity.region.snapshot().spare_tokens_per_s == 1800.0  # 2 x 1000 x (1 - 0.1)
    for _ in range(20):  # e0 computes 500 live prompt tokens/s for 10 s
        clock.now_s += 0.5
        e0.prompt_tokens_total += 250
        await capacity.poll_once()
    e0_live = capacity.engine_controllers["e0"].snapshot().live_tokens_per_s
    assert 490 < e0_live <= 500
    assert capacity.engine_controllers["e1"].snapshot().live_tokens_per_s == 0.0
    assert 1300 <= capacity.region.snapshot().spare_tokens_per_s < 1310


async def test_a_failed_scrape_reuses_the_last_snapshot_and_a_joining_engine_is_no_burst() -> None:
    clock = SteppedClock()
    e0, e1 = MeteredEngine("e0"), MeteredEngine("e1")
    e1.down = True
    e1.prompt_tokens_total = 1e9  # a long-running engine with a large counter
    capacity = region([e0, e1], clock)
    assert await capacity.poll_once() == 1
    clock.now_s += 0.5
    e1.down = False
    assert await capacity.poll_once() == 2
    assert capacity.region.snapshot().live_tokens_per_s == 0.0  # its counter is no demand
    e1.down = True
    clock.now_s += 0.5
    assert await capacity.poll_once() == 1
    assert capacity.scrape_failures_total == 2
    assert capacity.region.snapshot().spare_tokens_per_s == 1800.0


async def test_waiting_live_requests_stop_replay_grants() -> None:
    clock = SteppedClock()
    e0 = MeteredEngine("e0")
    capacity = region([e0], clock)
    await capacity.poll_once()
    clock.now_s += 1.0
    assert capacity.try_acquire(100, "t1") is Grant.GRANTED
    e0.waiting = 3  # live requests queue on the engine
    await capacity.poll_once()
    assert capacity.try_acquire(100, "t1") is Grant.NO_SPARE


class FailingBus(InProcessJobBus):
    def __init__(self) -> None:
        super().__init__()
        self.failures_left = 1

    async def publish_jobs(self, jobs: Sequence[ReplayJob]) -> None:
        if self.failures_left > 0:
            self.failures_left -= 1
            raise Unavailable("bus down")
        await super().publish_jobs(jobs)


async def test_jobs_that_could_not_be_published_are_queued_again_and_grants_returned() -> None:
    clock = SteppedClock()
    async with world(clock=clock) as w:
        bus = FailingBus()
        await bus.start()
        w.service._bus = bus  # the dispatcher's bus (the workers are not started here)
        ids = ids_on_shard("pub", 2)
        await queue_with_spare(w, clock, ids)
        jobs = w.service.dispatch_once()
        assert len(jobs) == 2
        await w.service._publish(jobs)
        status = w.service.status()
        assert status["counts"]["publish_failures"] == 1
        assert status["dispatched_in_flight"] == 0
        assert status["scheduler"]["backlog_sessions"] == 2
        assert w.service.capacity.region.in_flight == 0
        clock.now_s += 1.0
        again = w.service.dispatch_once()
        await w.service._publish(again)
        assert bus.pending_count("b") == 2
        assert w.service.status()["counts"]["jobs_published"] == 2
