"""The replay service over a real LogNode on in-memory replicas and the in-process simulated
engine (a simulator: no GPU, no model): shard moves are planned, live writes cancel, dispatch
waits for spare and grants, results teach affinity, the API exposes it all."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from eventlog.clock import LoopClock
from eventlog.sharding import shard_of
from regions.drills import DRILL_TENANT
from replay.affinity import AffinityTable
from replay.cache_salt import cache_salt_for
from replay.capacity import Grant
from replay.chat import render_prompt
from replay.model import PrefillRequest
from services.bootstrap.replay import watch_replay
from services.replay.config import ReplayConfig
from services.replay.transcripts import LogTranscriptSource
from tests.unit.replay_world import (
    OPERATOR_KEY,
    PEER_SECRET,
    REVISION,
    SERVICE_KEY,
    SHARD,
    SHARDS,
    TENANT_KEY,
    VIEWER_KEY,
    SteppedClock,
    api,
    bearer,
    ids_on_shard,
    move_shard,
    queue_with_spare,
    replay_config,
    result_of,
    world,
    write_conversations,
)

WAIT_STEPS_MAX = 2000  # 10 ms each: a hang guard, not a speed assertion


class ShiftedClock(LoopClock):
    def __init__(self, shift_ms: int) -> None:
        super().__init__()
        self.shift_ms = shift_ms

    def wall_ms(self) -> int:
        return super().wall_ms() + self.shift_ms


async def wait_until(predicate: object) -> None:
    for _ in range(WAIT_STEPS_MAX):
        if callable(predicate) and predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


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


async def test_a_drill_sees_when_moved_conversations_warmed_and_the_engines_ttft() -> None:
    """Warm: a replayed result, a skipped_live one, a live write that cancels a queued job;
    never a wrong_model result. The drill view also carries the engines' TTFT histogram and
    replay's own prefills in the same buckets."""
    clock = SteppedClock()
    async with world(clock=clock) as w:
        ids = ids_on_shard("warm", 4)
        await queue_with_spare(w, clock, ids)
        jobs = w.service.dispatch_once()  # two dispatched, two still queued
        queued = [c for c in ids if c not in {j.conversation_id for j in jobs}]
        w.service.on_result(result_of(jobs[0].job_id, jobs[0].conversation_id))
        w.service.on_result(result_of(jobs[1].job_id, jobs[1].conversation_id, "wrong_model"))
        w.service.on_result(result_of(jobs[1].job_id, jobs[1].conversation_id, "skipped_live"))
        await w.survivor.append_event("t1", queued[0], "message.user", {"content": "back"})
        view = w.service.drill_view()
        assert view is not None
        assert sum(n for _, n in view["warmed"]) == 3
        assert len(view["moved_here_ms"]) == 1  # the shard that moved here: replay starts
        assert view["replay_ttft"]["cumulative"][-1] == 1  # the replayed one, 5 ms
        assert view["replay_ttft"]["cumulative"][1] == 1  # at most 5 ms
        assert view["replay_prompt_tokens"] == 900
        assert len(view["engine_ttft"]["le"]) == 22 and view["prefix_cache_hits_total"] == 0


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
            cache_salt=cache_salt_for(w.service.config.salt_key(PEER_SECRET), "t1"),
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


async def test_api_status_operator_affinity_service_reads_and_metrics() -> None:
    clock = SteppedClock()
    async with world(clock=clock) as w, api(w) as client:
        ids = ids_on_shard("api", 1)
        await write_conversations(w.home, ids, words=10)
        await move_shard(w)
        assert (await client.get("/v1/replays")).status_code == 401
        # engine URLs and worker ids are the plane's plumbing: operators and viewers only
        assert (await client.get("/v1/replays", headers=bearer(TENANT_KEY))).status_code == 403
        assert (await client.get("/v1/replays", headers=bearer(VIEWER_KEY))).status_code == 200
        body = {"shard": SHARD}
        r = await client.post("/v1/replays", json=body, headers=bearer(TENANT_KEY))
        assert r.status_code == 403
        r = await client.post("/v1/replays", json=body, headers=bearer(VIEWER_KEY))
        assert r.status_code == 403
        r = await client.post("/v1/replays", json=body, headers=bearer(SERVICE_KEY))
        assert r.status_code == 401  # a worker key queues nothing (it would grant itself reads)
        r = await client.post("/v1/replays", json=body, headers=bearer(OPERATOR_KEY))
        assert r.status_code == 202 and r.json()["accepted"] == 1, r.text
        r = await client.post("/v1/replays", json={"shard": SHARD, "conversation_ids": ids},
                              headers=bearer(OPERATOR_KEY))  # fmt: skip
        assert r.status_code == 400
        status = (await client.get("/v1/replays", headers=bearer(OPERATOR_KEY))).json()
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
        assert r.status_code == 403, r.text  # no read grant: no read
        assert await w.service.capacity.poll_once() == 1
        clock.now_s += 1.0  # the spare bucket fills at the measured spare rate
        jobs = w.service.dispatch_once()
        assert [j.conversation_id for j in jobs] == [ids[0]]
        granted = {**as_t1, "X-Convplane-Replay-Grant": jobs[0].read_grant}
        r = await client.get(events, headers=as_t1)
        assert r.status_code == 403, r.text  # a job is outstanding, but the key alone reads none
        r = await client.get(events, headers=granted)
        assert r.status_code == 200 and len(r.json()["events"]) == 3
        assert (await client.get(events, headers=bearer(SERVICE_KEY))).status_code == 401
        r = await client.get(events, headers={**granted, "X-Convplane-Tenant": "t2"})
        assert r.status_code == 403  # on behalf of another tenant: not the job's conversation
        r = await client.get(f"/v1/conversations/{ids[0]}", headers=granted)
        assert r.status_code == 403  # only transcripts, nothing else
        w.service.on_result(result_of(jobs[0].job_id, ids[0]))

        text = (await client.get("/metrics")).text
        assert "convplane_replay_backlog_sessions 0.0" in text  # dispatched above
        assert 'convplane_replay_results_total{status="replayed"} 2.0' in text
        assert 'convplane_replay_engine_spare_tokens_per_second{engine="b-e0"}' in text


def test_watch_replay_without_a_service_exports_nothing() -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    watch_replay(registry, None)
    assert list(registry.collect()) == []


@pytest.mark.parametrize("bad", [{"tenant_weights": {"t": 0}}, {"tenant_tokens_per_s": {"t": -1}}])
def test_replay_config_rejects_bad_limits(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ReplayConfig.model_validate(bad)
