"""The replay service on a real Kafka broker: a shard moves to the region, its jobs go through the
region's Kafka topic to a worker outside the service (as ``convplane worker`` runs it: own bus,
own spare gate), the worker's results come back through the results topic, and the service
learns the KV affinity. The engine is the in-process simulated engine (a simulator, no GPU).

Needs the session broker (``kafka_bootstrap_servers``): fails loudly without one, never skips.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from contextlib import AsyncExitStack

import pytest

from eventlog.clock import SystemClock
from eventlog.config import LogConfig
from eventlog.memory_replica import MemoryReplica
from eventlog.node import LogNode
from replay.bus.kafka import KafkaBusConfig, KafkaJobBus
from replay.cache_salt import cache_salt_for
from replay.capacity import CapacityConfig, CapacityController, CapacityGate, CapacityPoller
from replay.chat import render_prompt
from replay.engines.sim_core import SimEngineConfig
from replay.engines.simulated import SimulatedEngine
from replay.model import PrefillRequest
from replay.worker import ReplayWorker, WorkerConfig
from services.bootstrap.replay import build_replay_service
from services.replay.config import EngineConfig, ReplayConfig
from services.replay.service import ReplayService, ReplayServiceConfig
from services.replay.transcripts import LogTranscriptSource
from tests.integration.bus_regions import BUS_SECRET
from tests.unit.replay_world import (
    REVISION,
    SHARD,
    SHARDS,
    ids_on_shard,
    write_conversations,
)

pytestmark = pytest.mark.kafka

CONVERSATIONS = 3
SALT_KEY = bytes(range(32))
WAIT_STEPS_MAX = 1200  # 0.1 s each: a hang guard for group joins, not a speed assertion


def kafka_settings(servers: str, client_id: str, region: str) -> KafkaBusConfig:
    return KafkaBusConfig(servers, bus_secrets={region: BUS_SECRET}, client_id=client_id,
                            partitions_per_topic=2,
                            session_timeout_s=6.0, heartbeat_interval_s=1.0)  # fmt: skip


async def wait_for(service: ReplayService, ids: list[str]) -> None:
    for _ in range(WAIT_STEPS_MAX):
        if all(service.affinity_of("t1", cid) is not None for cid in ids):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"affinity not learned: {service.status()}")


async def test_jobs_of_a_moved_shard_go_through_kafka_and_affinity_is_learned(
    kafka_bootstrap_servers: str,
) -> None:
    region = f"k{uuid.uuid4().hex[:10]}"  # fresh topics and groups: no results of earlier runs
    replicas = {r: MemoryReplica(r) for r in ("a", region, "c")}
    log_config = LogConfig(shard_count=SHARDS)
    home = LogNode(region="a", replicas=replicas, config=log_config, clock=SystemClock(),
                   rng=random.Random(1))  # fmt: skip
    survivor = LogNode(region=region, replicas=replicas, config=log_config, clock=SystemClock(),
                       rng=random.Random(2))  # fmt: skip
    engine = SimulatedEngine(
        f"{region}-gpu0", REVISION, SimEngineConfig(prefill_tokens_per_s=200_000.0), SystemClock()
    )
    config = ReplayConfig(
        engines={region: [EngineConfig(url="http://gpu0.test", model_revision=REVISION,
                                       capacity_tokens_per_s=200_000.0,
                                       engine_id=engine.engine_id)]},
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        bus_secrets={region: BUS_SECRET.hex()},
    )  # fmt: skip
    service = build_replay_service(
        region=region, shard_count=SHARDS, config=config, node=survivor,
        clock=SystemClock(), rng=random.Random(3), engines={engine.engine_id: engine},
        bus=KafkaJobBus(kafka_settings(kafka_bootstrap_servers, f"node-{region}", region),
                        regions=[region]),
        mode="kafka", limits=ReplayServiceConfig(dispatch_interval_s=0.02),
    )  # fmt: skip
    assert service.workers == []  # with Kafka, workers run outside the node
    survivor.add_listener(service)

    controller = CapacityController(CapacityConfig(200_000.0), SystemClock())
    poller = CapacityPoller(engine, controller, SystemClock(), random.Random(4), interval_s=0.1)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(engine.aclose)
        stack.push_async_callback(home.close)
        stack.push_async_callback(survivor.close)
        worker_bus = await stack.enter_async_context(
            KafkaJobBus(kafka_settings(kafka_bootstrap_servers, f"worker-{region}", region))
        )
        worker = ReplayWorker(
            f"{region}-worker0", region, worker_bus, engine, LogTranscriptSource(survivor),
            CapacityGate(controller), SystemClock(), random.Random(5),
            WorkerConfig(concurrency=2, idle_poll_s=0.2, drain_timeout_s=5.0),
            cache_salt_key=SALT_KEY,
        )  # fmt: skip
        tasks = [asyncio.create_task(poller.run()), asyncio.create_task(worker.run())]
        try:
            await home.lead_shard(SHARD)
            ids = ids_on_shard("kafka", CONVERSATIONS)
            await write_conversations(home, ids)
            service.start()
            stack.push_async_callback(service.close)
            await home.resign_shard(SHARD)  # region a is gone; this region knew it as leader
            survivor.set_leader_hint(SHARD, "a")
            await survivor.lead_shard(SHARD)
            await wait_for(service, ids)
        finally:
            worker.request_stop()
            await asyncio.wait([tasks[1]], timeout=10.0)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        status = service.status()
        assert status["mode"] == "kafka"
        assert status["counts"]["jobs_published"] >= CONVERSATIONS
        assert status["counts"]["result_replayed"] >= CONVERSATIONS
        assert worker.counts["replayed"] >= CONVERSATIONS
        for cid in ids:
            affinity = service.affinity_of("t1", cid)
            assert affinity is not None
            assert (affinity.worker_id, affinity.engine_id) == (worker.worker_id, engine.engine_id)
            assert affinity.prompt_tokens > 700
        events = await LogTranscriptSource(survivor).fetch("t1", ids[0], 3)
        live = await engine.prefill(PrefillRequest(
            model=REVISION, prompt=render_prompt(events), cache_salt=cache_salt_for(SALT_KEY, "t1"),
            priority=0, request_id="live",
        ))  # fmt: skip
        assert live.cached_prompt_tokens >= 0.9 * live.prompt_tokens
