"""Replay workers on a real broker: a consumer group of two, a crash, expiry, no spare."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from eventlog.aio import cancel_quietly
from eventlog.clock import LoopClock
from replay.bus.kafka import KafkaBusConfig, KafkaJobBus, KafkaJobConsumer
from replay.model import ReplayJob, ReplayResult
from replay.worker import ReplayWorker, WorkerConfig
from tests.integration.bus_regions import FreshRegions
from tests.unit.fakes_replay import FakeEngine, FakeGate, FakeTranscripts

pytestmark = pytest.mark.kafka

PARTITIONS = 4
FAST = WorkerConfig(concurrency=2, idle_poll_s=0.2, reroute_pause_s=0.0, drain_timeout_s=10.0)


REGIONS = FreshRegions()
fresh_region = REGIONS.fresh


def job(n: int, region: str, clock: LoopClock, ttl_ms: int = 120_000) -> ReplayJob:
    return ReplayJob(
        f"{region}-j{n}", region, "t1", f"c{n}", "rev-a", 100, 0, clock.wall_ms() + ttl_ms, 3
    )


@pytest.fixture
async def bus(kafka_bootstrap_servers: str) -> AsyncIterator[KafkaJobBus]:
    settings = KafkaBusConfig(
        kafka_bootstrap_servers,
        bus_secrets=REGIONS.secrets,
        partitions_per_topic=PARTITIONS,
        session_timeout_s=6.0,
        heartbeat_interval_s=1.0,
    )
    async with KafkaJobBus(settings) as b:
        yield b


def worker(
    bus: KafkaJobBus,
    region: str,
    name: str,
    engine: FakeEngine | None = None,
    gate: FakeGate | None = None,
) -> ReplayWorker:
    return ReplayWorker(
        name,
        region,
        bus,
        engine or FakeEngine(f"e-{name}"),
        FakeTranscripts(),
        gate or FakeGate(),
        LoopClock(),
        random.Random(1),
        FAST,
        cache_salt_key=bytes(range(32)),
    )


async def results_for(
    bus: KafkaJobBus, region: str, count: int, polls_max: int = 120
) -> list[ReplayResult]:
    """Read the results topic from the start until ``count`` results of ``region`` arrived."""
    found: list[ReplayResult] = []
    async with bus.result_stream() as stream:
        for _ in range(polls_max):
            result = await stream.next_result(timeout_s=0.5)
            if result is not None and result.region == region:
                found.append(result)
                if len(found) >= count:
                    return found
    raise AssertionError(f"{len(found)} of {count} results of {region} arrived: {found}")


async def until(condition_name: str, check: object, polls_max: int = 150) -> None:
    assert callable(check)
    for _ in range(polls_max):
        if check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never: {condition_name}")


def kafka_consumer(w: ReplayWorker) -> KafkaJobConsumer:
    assert isinstance(w.consumer, KafkaJobConsumer)
    return w.consumer


async def test_two_workers_in_one_group_share_the_jobs(bus: KafkaJobBus) -> None:
    region, clock = fresh_region(), LoopClock()
    a, b = worker(bus, region, "a"), worker(bus, region, "b")
    tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
    await until(
        "both workers hold partitions",
        lambda: (
            a.consumer
            and b.consumer
            and kafka_consumer(a).assigned_partitions()
            and kafka_consumer(b).assigned_partitions()
            and len(
                kafka_consumer(a).assigned_partitions() | kafka_consumer(b).assigned_partitions()
            )
            == PARTITIONS
        ),
    )
    await bus.publish_jobs([job(n, region, clock) for n in range(40)])
    results = await results_for(bus, region, 40)
    a.request_stop()
    b.request_stop()
    await asyncio.gather(*tasks)

    assert {r.job_id for r in results} == {f"{region}-j{n}" for n in range(40)}
    assert {r.status for r in results} == {"replayed"}
    assert {r.worker_id for r in results} == {"a", "b"}


async def test_a_worker_killed_mid_job_leaves_the_job_to_the_other(bus: KafkaJobBus) -> None:
    region, clock = fresh_region(), LoopClock()
    stuck = FakeEngine("e-victim")
    stuck.hold = asyncio.Event()  # never released: the victim dies mid-prefill
    victim = worker(bus, region, "victim", engine=stuck)
    victim_task = asyncio.create_task(victim.run())
    await bus.publish_jobs([job(1, region, clock)])
    await asyncio.wait_for(stuck.entered.wait(), 30)

    survivor = worker(bus, region, "survivor")
    survivor_task = asyncio.create_task(survivor.run())
    await cancel_quietly(victim_task)  # crash: the job is neither finished nor committed
    [result] = await results_for(bus, region, 1)
    survivor.request_stop()
    await survivor_task
    assert (result.job_id, result.status, result.worker_id) == (
        f"{region}-j1",
        "replayed",
        "survivor",
    )
    assert victim.counts["replayed"] == 0


async def test_expired_jobs_are_dropped_with_an_expired_result(bus: KafkaJobBus) -> None:
    region, clock = fresh_region(), LoopClock()
    engine = FakeEngine()
    w = worker(bus, region, "w", engine=engine)
    task = asyncio.create_task(w.run())
    await bus.publish_jobs([job(1, region, clock, ttl_ms=-1), job(2, region, clock)])
    results = await results_for(bus, region, 2)
    w.request_stop()
    await task
    assert sorted((r.job_id, r.status) for r in results) == [
        (f"{region}-j1", "expired"),
        (f"{region}-j2", "replayed"),
    ]
    assert [r.request_id.split("-")[1] for r in engine.requests] == [region]
    assert len(engine.requests) == 1


async def test_a_worker_without_spare_does_not_pull(bus: KafkaJobBus) -> None:
    region, clock = fresh_region(), LoopClock()
    gate = FakeGate(spare=False, asked_signal_at=10)
    w = worker(bus, region, "w", gate=gate)
    task = asyncio.create_task(w.run())
    await bus.publish_jobs([job(1, region, clock)])
    await asyncio.wait_for(gate.asked_often.wait(), 30)
    assert w.counts["pulled"] == 0
    gate.open.set()
    [result] = await results_for(bus, region, 1)
    w.request_stop()
    await task
    assert result.status == "replayed" and w.counts["pulled"] == 1
