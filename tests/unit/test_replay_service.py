"""The replay service over a real LogNode on in-memory replicas and the in-process simulated
engine (a simulator: no GPU, no model): shard moves are planned, live writes cancel, dispatch
waits for spare and grants, results teach affinity, the API exposes it all."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace

import httpx
import pytest

from eventlog.clock import SystemClock
from eventlog.config import LogConfig
from eventlog.memory_replica import MemoryReplica
from eventlog.node import LogNode, estimate_tokens
from eventlog.sharding import shard_of
from replay.bus.memory import InProcessJobBus
from replay.cache_salt import cache_salt_for
from replay.capacity import Grant
from replay.chat import render_prompt
from replay.engines.sim_core import SimEngineConfig
from replay.engines.simulated import SimulatedEngine
from replay.model import PrefillRequest, ReplayResult
from services.api import create_app
from services.bootstrap import NodeRuntime
from services.bootstrap.replay import build_replay_service, install_replay
from services.config import ClusterConfig, NodeSettings, RegionConfig, TenantConfig, api_key_sha256
from services.drill_canary import DRILL_TENANT
from services.replay.affinity import AffinityTable
from services.replay.config import EngineConfig, ReplayConfig
from services.replay.service import ReplayService, ReplayServiceConfig
from services.replay.transcripts import LogTranscriptSource

REGIONS = ("a", "b", "c")
SHARDS = 4
SHARD = 1
REVISION = "sim-rev1"
TENANT_KEY = "tenant-key-0123456789"
SERVICE_KEY = "service-key-0123456789"
WAIT_STEPS_MAX = 2000  # 10 ms each: a hang guard, not a speed assertion


class ShiftedClock(SystemClock):
    def __init__(self, shift_ms: int) -> None:
        self.shift_ms = shift_ms

    def wall_ms(self) -> int:
        return super().wall_ms() + self.shift_ms


class SteppedClock(SystemClock):
    """Real wall time; monotonic time moves only when the test steps it (token buckets)."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def monotonic(self) -> float:
        return self.now_s


def ids_on_shard(prefix: str, count: int, shard: int = SHARD) -> list[str]:
    ids = (f"{prefix}-{i}" for i in range(10_000))
    return [cid for cid in ids if shard_of(cid, SHARDS) == shard][:count]


def replay_config(**overrides: object) -> ReplayConfig:
    engine = EngineConfig(url="http://sim-b0.test", model_revision=REVISION,
                          capacity_tokens_per_s=200_000.0, engine_id="b-e0")  # fmt: skip
    base = ReplayConfig(
        engines={"b": [engine]},
        service_api_key_sha256=api_key_sha256(SERVICE_KEY),
        worker_concurrency=2,
    )
    return base.model_copy(update=overrides)


@dataclass
class World:
    replicas: dict[str, MemoryReplica]
    home: LogNode  # region "a": where the conversations were written
    survivor: LogNode  # region "b": takes the shard over
    engine: SimulatedEngine
    service: ReplayService
    bus: InProcessJobBus


async def write_conversations(node: LogNode, ids: list[str], words: int = 300) -> int:
    """Three user messages each; returns the log's token estimate of them all."""
    tokens = 0
    for cid in ids:
        await node.create_conversation("t1", cid, REVISION, {})
        for turn in range(3):
            text = " ".join(f"{cid}-w{turn}-{i}" for i in range(words))
            await node.append_event("t1", cid, "message.user", {"content": text})
            tokens += estimate_tokens({"content": text})
    return tokens


@asynccontextmanager
async def world(
    config: ReplayConfig | None = None, clock: SystemClock | None = None
) -> AsyncIterator[World]:
    replicas = {r: MemoryReplica(r) for r in REGIONS}
    log_config = LogConfig(shard_count=SHARDS)

    def node(region: str) -> LogNode:
        return LogNode(region=region, replicas=replicas, config=log_config,
                       clock=SystemClock(), rng=random.Random(region))  # fmt: skip

    home, survivor = node("a"), node("b")
    engine = SimulatedEngine(
        "b-e0", REVISION, SimEngineConfig(prefill_tokens_per_s=200_000.0), SystemClock()
    )
    bus = InProcessJobBus()
    service = build_replay_service(
        region="b", shard_count=SHARDS, config=config or replay_config(), node=survivor,
        replicas=replicas, clock=clock or SystemClock(), rng=random.Random(3),
        engines={"b-e0": engine},
        bus=bus, mode="embedded", limits=ReplayServiceConfig(dispatch_interval_s=0.01),
    )  # fmt: skip
    survivor.add_listener(service)
    try:
        await home.lead_shard(SHARD)
        yield World(replicas, home, survivor, engine, service, bus)
    finally:
        await service.close()
        await survivor.close()
        await home.close()
        await engine.aclose()


async def move_shard(w: World) -> None:
    """Region a stops; b, which knew a as the leader, takes the shard (a move)."""
    await w.home.resign_shard(SHARD)
    w.survivor.set_leader_hint(SHARD, "a")
    await w.survivor.lead_shard(SHARD)


async def queue_with_spare(w: World, clock: SteppedClock, ids: list[str]) -> None:
    """Write ``ids`` at home, move the shard to b, queue their replays and let the spare bucket
    fill for one second of measured engine capacity."""
    await write_conversations(w.home, ids, words=10)
    await move_shard(w)
    await w.service.replay_shard(SHARD)
    await w.service.capacity.poll_once()
    clock.now_s += 1.0


async def wait_until(predicate: object) -> None:
    for _ in range(WAIT_STEPS_MAX):
        if callable(predicate) and predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def result_of(job_id: str, cid: str, status: str = "replayed", tokens: int = 900) -> ReplayResult:
    return ReplayResult(job_id=job_id, region="b", tenant_id="t1", conversation_id=cid,
                        model_revision=REVISION, status=status,  # type: ignore[arg-type]
                        worker_id="b-w-b-e0", engine_id="b-e0", prompt_tokens=tokens,
                        cached_prompt_tokens=0, duration_ms=5.0, finished_at_ms=1)  # fmt: skip


# --- planning ---------------------------------------------------------------------------------


async def test_a_moved_shard_is_planned_with_revision_tokens_and_last_seq() -> None:
    async with world() as w:
        ids = ids_on_shard("conv", 3)
        tokens = await write_conversations(w.home, ids)
        await move_shard(w)
        assert w.service.status()["moved_shards_queued"] == 1
        report = await w.service.replay_shard(SHARD)
        assert report.accepted == 3
        snap = w.service.scheduler.snapshot()
        assert snap.backlog_sessions == 3
        assert snap.backlog_tokens == tokens
        jobs = w.service.scheduler.dispatch(lambda _t, _tenant: _granted(), 10)
        assert {j.conversation_id for j in jobs} == set(ids)
        assert {j.model_revision for j in jobs} == {REVISION}
        assert {j.through_seq for j in jobs} == {3}


def _granted() -> Grant:
    return Grant.GRANTED


async def test_a_drills_canary_conversations_are_not_replayed() -> None:
    async with world() as w:
        chat, canary = ids_on_shard("chat", 1), ids_on_shard("canary", 1)
        await write_conversations(w.home, chat, words=10)
        await w.home.create_conversation(DRILL_TENANT, canary[0], REVISION, {})
        await w.home.append_event(DRILL_TENANT, canary[0], "note", {"n": 1})
        await move_shard(w)
        report = await w.service.replay_shard(SHARD)
        assert report.accepted == 1
        jobs = w.service.scheduler.dispatch(lambda _t, _tenant: _granted(), 10)
        assert [j.conversation_id for j in jobs] == chat


async def test_only_a_move_from_another_region_triggers_planning() -> None:
    async with world() as w:
        w.service.shard_led(SHARD, 3, None)  # unknown history (a node's first leadership)
        w.service.shard_led(SHARD, 3, "b")  # this region already led it
        w.service.shard_led(SHARDS, 3, "a")  # the control shard
        assert w.service.status()["moved_shards_queued"] == 0
        w.service.shard_led(SHARD, 3, "a")
        w.service.shard_led(SHARD, 4, "c")  # queued once
        assert w.service.status()["moved_shards_queued"] == 1
        assert w.service.counts["shards_moved_here"] == 2


async def test_conversations_outside_the_window_are_not_replayed() -> None:
    async with world() as w:
        fresh, old = ids_on_shard("fresh", 1), ids_on_shard("old", 1)
        await write_conversations(w.home, fresh, words=10)
        w.home._clock = ShiftedClock(-2 * 3600 * 1000)  # written two hours ago
        w.home.leader(SHARD)._clock = w.home._clock  # type: ignore[union-attr]
        await write_conversations(w.home, old, words=10)
        await move_shard(w)
        report = await w.service.replay_shard(SHARD)
        assert report.accepted == 1
        jobs = w.service.scheduler.dispatch(lambda _t, _tenant: _granted(), 10)
        assert [j.conversation_id for j in jobs] == fresh


async def test_a_live_write_cancels_the_queued_replay() -> None:
    async with world() as w:
        ids = ids_on_shard("live", 2)
        await write_conversations(w.home, ids, words=10)
        await move_shard(w)
        await w.service.replay_shard(SHARD)
        await w.survivor.append_event("t1", ids[0], "message.user", {"content": "back again"})
        snap = w.service.scheduler.snapshot()
        assert snap.backlog_sessions == 1 and snap.cancelled_live_total == 1


async def test_operator_replay_of_conversations() -> None:
    async with world() as w:
        ids = ids_on_shard("op", 1)
        tokens = await write_conversations(w.home, ids, words=10)
        await move_shard(w)
        other_shard = ids_on_shard("x", 1, shard=0)[0]
        outcome = await w.service.replay_conversations("t1", [ids[0], "op-missing-1", other_shard])
        assert outcome[ids[0]] == "queued"
        missing = "op-missing-1"
        assert outcome[missing] == ("not_found" if shard_of(missing, SHARDS) == SHARD
                                    else outcome[missing])  # fmt: skip
        assert outcome[other_shard].startswith("not_led_here")
        assert w.service.scheduler.snapshot().backlog_tokens == tokens


# --- dispatch and results ---------------------------------------------------------------------


async def test_dispatch_waits_for_engine_metrics_and_holds_grants_until_results() -> None:
    clock = SteppedClock()
    async with world(clock=clock) as w:
        ids = ids_on_shard("cap", 4)
        await write_conversations(w.home, ids, words=10)
        await move_shard(w)
        await w.service.replay_shard(SHARD)
        assert w.service.dispatch_once() == []  # no metrics yet: the spare reads 0
        assert await w.service.capacity.poll_once() == 1
        clock.now_s += 1.0  # the spare bucket fills at the measured spare rate
        first = w.service.dispatch_once()
        assert len(first) == 2  # one engine x worker_concurrency 2
        assert w.service.dispatch_once() == []
        w.service.on_result(result_of(first[0].job_id, first[0].conversation_id))
        assert len(w.service.dispatch_once()) == 1
        affinity = w.service.affinity_of("t1", first[0].conversation_id)
        assert affinity is not None and affinity.engine_id == "b-e0"
        assert w.service.scheduler.snapshot().replayed_total == 1


async def test_wrong_model_keeps_the_grant_and_other_regions_are_ignored() -> None:
    clock = SteppedClock()
    async with world(clock=clock) as w:
        ids = ids_on_shard("wm", 2)
        await queue_with_spare(w, clock, ids)
        jobs = w.service.dispatch_once()
        w.service.on_result(result_of(jobs[0].job_id, jobs[0].conversation_id, "wrong_model"))
        w.service.on_result(replace(result_of(jobs[1].job_id, jobs[1].conversation_id),
                                    region="c"))  # fmt: skip
        assert w.service.status()["dispatched_in_flight"] == 2
        assert w.service.affinity_of("t1", jobs[1].conversation_id) is None


async def test_operator_region_limit_paces_dispatch() -> None:
    clock = SteppedClock()
    async with world(replay_config(region_tokens_per_s=1.0), clock) as w:
        ids = ids_on_shard("lim", 3)
        await queue_with_spare(w, clock, ids)
        assert len(w.service.dispatch_once()) == 1  # the bucket starts with a burst
        assert w.service.dispatch_once() == []
        assert w.service.status()["denied"].get("region_limit", 0) >= 1


# --- the whole loop ---------------------------------------------------------------------------


async def test_moved_conversations_are_rebuilt_and_a_later_prompt_hits_the_cache() -> None:
    async with world() as w:
        ids = ids_on_shard("e2e", 3)
        await write_conversations(w.home, ids)
        w.service.start()
        await move_shard(w)
        await wait_until(lambda: all(w.service.affinity_of("t1", c) for c in ids))
        status = w.service.status()
        assert status["counts"]["result_replayed"] == 3
        assert status["scheduler"]["replayed_tokens_total"] > 3 * 900
        # the live path sends the same chat prompt to the engine affinity names
        events = await LogTranscriptSource(w.survivor).fetch("t1", ids[0], 3)
        live = await w.engine.prefill(PrefillRequest(
            model=REVISION, prompt=render_prompt(events),
            cache_salt=cache_salt_for(w.service.config.salt_key(None), "t1"),
            priority=0, request_id="live-1",
        ))  # fmt: skip
        assert live.cached_prompt_tokens >= 0.9 * live.prompt_tokens


# --- affinity table ---------------------------------------------------------------------------


def test_affinity_table_is_bounded_and_keeps_the_newest() -> None:
    table = AffinityTable(2)
    for i, cid in enumerate(("x", "y", "z")):
        table.learn(replace(result_of("j", cid), finished_at_ms=10 + i))
    assert table.get("t1", "x") is None and len(table) == 2 and table.evicted_total == 1
    table.learn(replace(result_of("j", "y"), finished_at_ms=5, engine_id="old"))
    assert table.get("t1", "y").engine_id == "b-e0"  # type: ignore[union-attr]
    assert table.learn(result_of("j", "y", status="failed")) is None


# --- API --------------------------------------------------------------------------------------


@asynccontextmanager
async def api(w: World) -> AsyncIterator[httpx.AsyncClient]:
    cluster = ClusterConfig(
        regions=[RegionConfig(name=r, url=f"http://{r}.test", dsn="memory") for r in REGIONS],
        shard_count=SHARDS,
        tenants=[TenantConfig(tenant_id="t1", api_key_sha256=api_key_sha256(TENANT_KEY)),
                 TenantConfig(tenant_id="t2", api_key_sha256=api_key_sha256("other-key-0000"))],
        replay=replay_config(),
    )  # fmt: skip
    async with AsyncExitStack() as stack:
        peers = await stack.enter_async_context(httpx.AsyncClient())

        @asynccontextmanager
        async def runtime(s: NodeSettings) -> AsyncIterator[NodeRuntime]:
            yield NodeRuntime("b", cluster, w.survivor, peers, SystemClock(), random.Random(1),
                              lambda: (1, 1), None, w.service)  # fmt: skip

        app = create_app(NodeSettings(region="b", cluster=cluster), runtime_factory=runtime)
        await stack.enter_async_context(app.router.lifespan_context(app))
        transport = httpx.ASGITransport(app=app)
        yield await stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://b.test")
        )


def bearer(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **extra}


async def test_api_status_operator_affinity_service_reads_and_metrics() -> None:
    clock = SteppedClock()
    async with world(clock=clock) as w, api(w) as client:
        ids = ids_on_shard("api", 1)
        await write_conversations(w.home, ids, words=10)
        await move_shard(w)
        assert (await client.get("/v1/replays")).status_code == 401
        assert (await client.get("/v1/replays", headers=bearer(TENANT_KEY))).status_code == 200
        body = {"shard": SHARD}
        r = await client.post("/v1/replays", json=body, headers=bearer(TENANT_KEY))
        assert r.status_code == 401
        r = await client.post("/v1/replays", json=body, headers=bearer(SERVICE_KEY))
        assert r.status_code == 202 and r.json()["accepted"] == 1, r.text
        r = await client.post("/v1/replays", json={"shard": SHARD, "conversation_ids": ids},
                              headers=bearer(SERVICE_KEY))  # fmt: skip
        assert r.status_code == 400
        status = (await client.get("/v1/replays", headers=bearer(SERVICE_KEY))).json()
        assert status["scheduler"]["backlog_sessions"] == 1

        url = f"/v1/conversations/{ids[0]}/affinity"
        assert (await client.get(url, headers=bearer(TENANT_KEY))).json()["worker"] is None
        w.service.on_result(result_of("j1", ids[0]))
        worker = (await client.get(url, headers=bearer(TENANT_KEY))).json()["worker"]
        assert worker["engine_id"] == "b-e0" and worker["engine_url"] == "http://sim-b0.test"
        assert (await client.get(url, headers=bearer("other-key-0000"))).status_code == 404

        events = f"/v1/conversations/{ids[0]}/events"
        as_t1 = bearer(SERVICE_KEY, **{"X-Convplane-Tenant": "t1"})
        r = await client.get(events, headers=as_t1)
        assert r.status_code == 403, r.text  # no replay job for it is outstanding: no read
        assert await w.service.capacity.poll_once() == 1
        clock.now_s += 1.0  # the spare bucket fills at the measured spare rate
        jobs = w.service.dispatch_once()
        assert [j.conversation_id for j in jobs] == [ids[0]]
        r = await client.get(events, headers=as_t1)
        assert r.status_code == 200 and len(r.json()["events"]) == 3
        assert (await client.get(events, headers=bearer(SERVICE_KEY))).status_code == 401
        r = await client.get(events, headers=bearer(SERVICE_KEY, **{"X-Convplane-Tenant": "t2"}))
        assert r.status_code == 403  # on behalf of another tenant: not the job's conversation
        r = await client.get(f"/v1/conversations/{ids[0]}", headers=as_t1)
        assert r.status_code == 403  # only transcripts, nothing else
        w.service.on_result(result_of(jobs[0].job_id, ids[0]))
        assert (await client.get(events, headers=as_t1)).status_code == 403  # job ended

        text = (await client.get("/metrics")).text
        assert "convplane_replay_backlog_sessions 0.0" in text  # dispatched above
        assert 'convplane_replay_results_total{status="replayed"} 2.0' in text
        assert 'convplane_replay_engine_spare_tokens_per_second{engine="b-e0"}' in text


def test_install_replay_without_a_service_sets_none() -> None:
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry

    app = FastAPI()
    install_replay(app, CollectorRegistry(), None)
    assert app.state.replay is None


@pytest.mark.parametrize("bad", [{"tenant_weights": {"t": 0}}, {"tenant_tokens_per_s": {"t": -1}}])
def test_replay_config_rejects_bad_limits(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ReplayConfig.model_validate(bad)
