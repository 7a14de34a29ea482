"""Replay pauses while live demand holds the engine at capacity and drains when it falls, on a
real broker and a simulated engine over HTTP (``convplane sim-engine serve``: a simulator, no
GPU).

The worker is the production wiring of ``convplane worker`` in-process: ``VllmHttpEngine`` to the
engine, the real ``CapacityController`` fed by the real ``CapacityPoller`` from the engine's own
``/metrics``, behind ``CapacityGate``, and the Kafka job bus. Live traffic is a closed loop of
chat completions (priority 0, unique prompts: no cache hits) sent straight to the engine.

The scheduler (``ReplayScheduler``, pure) builds the backlog: one conversation goes live first
(``mark_live``) and must never be published; one is about to leave the replay window, so its
job expires while it waits on the topic. Dispatch here is not gated, so the whole backlog sits
on the topic and only the worker's gate holds it back: that is the transport's pause under test
(the region-level dispatch gate is ``RegionCapacity``'s, unit-tested). While the engine is at
capacity no replay request reaches it; once the live load stops, the backlog drains, the stale
job gets an ``expired`` result, and every offset is committed.

Needs the session broker (``kafka_bootstrap_servers``): fails loudly without one, never skips.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from eventlog.clock import SystemClock
from replay.bus.kafka import KafkaBusConfig, KafkaJobBus, KafkaJobConsumer
from replay.bus.port import jobs_topic, worker_group
from replay.capacity import CapacityConfig, CapacityController, CapacityGate, CapacityPoller, Grant
from replay.engines.base import InferenceEngine
from replay.engines.vllm_http import VllmHttpEngine
from replay.model import EngineMetrics, PrefillOutcome, PrefillRequest
from replay.scheduler import MovedConversation, ReplayScheduler, SchedulerConfig
from replay.transcripts import TranscriptEvent, TranscriptSource
from replay.worker import ReplayWorker, WorkerConfig
from tests.integration.bus_regions import BUS_SECRET
from tests.integration.kafka_replay import (
    MODEL,
    TENANT,
    children,
    result_log,
    start_sim_engine,
    until,
)

pytestmark = pytest.mark.kafka

PARTITIONS = 2
ENGINE_TOKENS_PER_S = 2_000.0
ENGINE_CHUNK_TOKENS = 512
LIVE_CLIENTS = 8  # closed loop: always more live work queued than one step holds
LIVE_WORDS = 300
REPLAY_CONVERSATIONS = 6
REPLAY_WORDS = 400
REPLAY_WINDOW_S = 3600.0
EXPIRES_IN_MS = 3_000  # the stale conversation's job outlives this only on the topic
LIVE_DONE_WHILE_PAUSED_MIN = 30  # live completions watched while replay must stay paused
REFUSALS_MIN = 20  # ... and times the worker's gate refused it (pull probe or grant)
# Replay may use 75% of the engine: live demand (a closed loop, ~93% of capacity once HTTP
# gaps count) stays clearly above that, so the pause never hinges on a lull in the queue.
HEADROOM = 0.25


class CountingEngine(InferenceEngine):
    """The worker's engine with every replay prefill it sends recorded (monotonic time)."""

    def __init__(self, inner: InferenceEngine) -> None:
        self._inner = inner
        self.sent_at_s: list[float] = []

    @property
    def engine_id(self) -> str:
        return self._inner.engine_id

    @property
    def model_revision(self) -> str:
        return self._inner.model_revision

    async def prefill(self, request: PrefillRequest) -> PrefillOutcome:
        self.sent_at_s.append(time.monotonic())
        return await self._inner.prefill(request)

    async def metrics(self) -> EngineMetrics:
        return await self._inner.metrics()

    async def aclose(self) -> None:
        await self._inner.aclose()


class CountingGate(CapacityGate):
    """``CapacityGate`` that counts the worker's refused pull probes."""

    refusals = 0

    def has_spare(self, prompt_tokens: int) -> bool:
        spare = super().has_spare(prompt_tokens)
        self.refusals += not spare
        return spare


class DictTranscripts(TranscriptSource):
    def __init__(self, words: int) -> None:
        self._words = words

    async def fetch(
        self, tenant_id: str, conversation_id: str, through_seq: int, read_grant: str = ""
    ) -> list[TranscriptEvent]:
        text = " ".join(f"{conversation_id}-w{i}" for i in range(self._words))
        events = [
            TranscriptEvent(1, "message.system", {"content": "You are terse."}),
            TranscriptEvent(2, "message.user", {"content": text}),
        ]
        return [e for e in events if e.seq <= through_seq]


class LiveLoad:
    """``clients`` loops, each with one live chat completion outstanding at all times."""

    def __init__(self, http: httpx.AsyncClient, url: str, clients: int) -> None:
        self._http = http
        self._url = url
        self._clients = clients
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.completed = 0
        self.errors: list[BaseException] = []  # a live request that failed (none expected)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._client(n)) for n in range(self._clients)]

    async def stop(self) -> None:
        """Let every client finish its request in flight, then stop (nothing is cancelled).
        Idempotent."""
        self._stop.set()
        outcomes = await asyncio.gather(*self._tasks, return_exceptions=True)
        self.errors.extend(e for e in outcomes if isinstance(e, BaseException))
        self._tasks = []

    async def _client(self, n: int) -> None:
        turn = 0
        while not self._stop.is_set():
            turn += 1
            text = " ".join(f"live{n}-{turn}-{i}" for i in range(LIVE_WORDS))
            response = await self._http.post(
                self._url + "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": text}],
                      "max_tokens": 1, "priority": 0, "cache_salt": "live"},
                timeout=60.0,
            )  # fmt: skip
            response.raise_for_status()
            self.completed += 1


def moved(cid: str, last_activity_ms: int) -> MovedConversation:
    return MovedConversation(TENANT, cid, MODEL, last_activity_ms, REPLAY_WORDS + 10, 2)


async def offsets(settings: KafkaBusConfig, region: str) -> tuple[dict[int, int], dict[int, int]]:
    """(committed, end) offset per partition of the region's jobs topic, from the broker."""
    reader = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers,
                              group_id=worker_group(region), enable_auto_commit=False)  # fmt: skip
    await reader.start()
    try:
        tps = [TopicPartition(jobs_topic(region), p) for p in range(PARTITIONS)]
        committed = {tp.partition: (await reader.committed(tp)) or 0 for tp in tps}
        end = {tp.partition: int(offset) for tp, offset in (await reader.end_offsets(tps)).items()}
        return committed, end
    finally:
        await reader.stop()


def granted(tokens: int, tenant: str) -> Grant:
    return Grant.GRANTED  # dispatch ungated: the backlog waits on the topic (module docstring)


async def test_replay_pauses_at_live_capacity_and_drains_after(
    kafka_bootstrap_servers: str, tmp_path: Path
) -> None:
    region = f"p{uuid.uuid4().hex[:10]}"
    clock, rng = SystemClock(), random.Random(7)
    settings = KafkaBusConfig(kafka_bootstrap_servers, bus_secrets={region: BUS_SECRET},
                                client_id=f"flow-{region}",
                                partitions_per_topic=PARTITIONS, session_timeout_s=6.0,
                                heartbeat_interval_s=1.0)  # fmt: skip
    async with (
        KafkaJobBus(settings, regions=[region]) as bus,
        children() as started,
        httpx.AsyncClient() as http,
        result_log(bus, region) as results,
    ):
        sim = await start_sim_engine("flow-engine", started, tmp_path,
                                     prefill_tokens_per_s=ENGINE_TOKENS_PER_S,
                                     chunk_tokens=ENGINE_CHUNK_TOKENS)  # fmt: skip
        engine = CountingEngine(VllmHttpEngine("flow-engine", sim.url, MODEL))
        controller = CapacityController(
            CapacityConfig(ENGINE_TOKENS_PER_S, headroom=HEADROOM), clock
        )
        poller = CapacityPoller(engine, controller, clock, rng, interval_s=0.1)
        gate = CountingGate(controller)
        worker = ReplayWorker(
            "flow-worker", region, bus, engine, DictTranscripts(REPLAY_WORDS), gate, clock, rng,
            WorkerConfig(concurrency=2, idle_poll_s=0.1, drain_timeout_s=10.0),
            cache_salt_key=bytes(range(32)),
        )  # fmt: skip
        tasks = [asyncio.create_task(poller.run()), asyncio.create_task(worker.run())]
        live = LiveLoad(http, sim.url, LIVE_CLIENTS)
        try:
            await until("the worker holds every partition", lambda: worker_owns_all(worker))
            await until("the gate sees spare", lambda: gate.has_spare(1))

            live.start()
            await until("live demand at capacity", lambda: saturated(controller), started)

            scheduler = ReplayScheduler(SchedulerConfig(region, REPLAY_WINDOW_S), clock)
            now_ms = clock.wall_ms()
            window_ms = int(REPLAY_WINDOW_S * 1000)
            cids = [f"{region}-c{n}" for n in range(REPLAY_CONVERSATIONS)]
            went_live, stale = f"{region}-live", f"{region}-stale"
            report = scheduler.add_moved(
                [moved(cid, now_ms - n) for n, cid in enumerate([*cids, went_live])]
                + [moved(stale, now_ms - window_ms + EXPIRES_IN_MS)]
            )
            assert report.accepted == REPLAY_CONVERSATIONS + 2
            assert scheduler.mark_live(TENANT, went_live)  # a live request came first
            jobs = scheduler.dispatch(granted, max_jobs=100)
            assert {j.conversation_id for j in jobs} == {*cids, stale}
            [stale_job] = [j for j in jobs if j.conversation_id == stale]
            await bus.publish_jobs(jobs)

            live_before, refusals_before = live.completed, refusals(gate, controller)
            await until("the stale job's deadline", lambda: clock.wall_ms() > stale_job.deadline_ms)
            await until(
                "live completions while paused",
                lambda: live.completed - live_before >= LIVE_DONE_WHILE_PAUSED_MIN,
                started,
            )
            await until("the worker refused again and again while paused",
                        lambda: refusals(gate, controller) - refusals_before >= REFUSALS_MIN,
                        started)  # fmt: skip
            assert engine.sent_at_s == [], "replay reached the engine at live capacity"
            # a slot may have pulled a job in a lull and wait at the gate: it may expire there
            assert {r.status for r in results.results} <= {"expired"}
            paused = (live.completed - live_before, refusals(gate, controller) - refusals_before)
            stopped_at_s = time.monotonic()
            await live.stop()
            assert live.errors == []
            await until("the backlog drained", lambda: len(results.results) >= len(jobs), started)
            drained_s = time.monotonic() - stopped_at_s
            status = {r.conversation_id: r.status for r in results.results}
            assert status == {**dict.fromkeys(cids, "replayed"), stale: "expired"}
            assert len(engine.sent_at_s) == REPLAY_CONVERSATIONS  # the expired one never ran
            assert min(engine.sent_at_s) >= stopped_at_s
            assert all(r.prompt_tokens > REPLAY_WORDS for r in results.results if r.prompt_tokens)

            async def all_committed() -> bool:
                committed, end = await offsets(settings, region)
                return committed == end and sum(end.values()) == len(jobs)

            await until("every job's offset committed", all_committed, started)
            totals = await sim.metrics(http)
            assert totals.generation_tokens_total == live.completed + REPLAY_CONVERSATIONS
            assert totals.num_requests_running == totals.num_requests_waiting == 0
            print(f"paused through {paused[0]} live completions and {paused[1]} refused pulls; "
                  f"{len(jobs)} jobs drained {drained_s:.1f}s after live stopped")  # fmt: skip
        finally:
            await live.stop()
            worker.request_stop()
            await asyncio.wait([tasks[1]], timeout=30.0)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await engine.aclose()
        assert worker.counts["replayed"] == REPLAY_CONVERSATIONS
        assert worker.counts["expired"] == 1


def worker_owns_all(worker: ReplayWorker) -> bool:
    consumer = worker.consumer
    return isinstance(consumer, KafkaJobConsumer) and len(consumer.assigned_partitions()) == (
        PARTITIONS
    )


def refusals(gate: CountingGate, controller: CapacityController) -> int:
    """Pull probes the gate refused plus grants the controller denied for lack of spare."""
    return gate.refusals + controller.snapshot().denied.get(Grant.NO_SPARE.value, 0)


def saturated(controller: CapacityController) -> bool:
    """The measured live rate alone leaves replay nothing (not just a momentary queue)."""
    snapshot = controller.snapshot()
    usable_tokens_per_s = ENGINE_TOKENS_PER_S * (1 - HEADROOM)
    return snapshot.spare_tokens_per_s == 0 and snapshot.live_tokens_per_s > usable_tokens_per_s
