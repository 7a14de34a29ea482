"""A moved conversation that no engine of the region can replay (the region has no engine, or
none serves the model revision the conversation is pinned to) is counted and named in
``GET /v1/replays`` and the metrics, never queued to wait forever (where it kept the backlog
alert firing and said nothing of why)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from services.console.routes import _replay_summary
from services.replay.metrics import ReplayCollector
from tests.unit.replay_world import (
    REVISION,
    SHARD,
    ids_on_shard,
    move_shard,
    replay_config,
    world,
    write_conversations,
)


async def test_a_region_without_engines_queues_nothing_and_says_why() -> None:
    async with world() as w:
        # the cluster file gives region b no engine (the world's simulated one is never asked)
        w.service.config = replay_config(engines={})
        ids = ids_on_shard("conv", 3)
        await write_conversations(w.home, ids, words=5)
        await move_shard(w)
        report = await w.service.replay_shard(SHARD)
        assert report.accepted == 0
        assert w.service.scheduler.snapshot().backlog_sessions == 0
        status = w.service.status()
        assert status["served_model_revisions"] == []
        assert status["not_replayed"]["no_engine"] == 3
        outcome = await w.service.replay_conversations("t1", ids[:1])
        assert outcome == {ids[0]: "no_engine"}
        # the console's replay row shows it (GET /v1/console/node)
        assert _replay_summary(w.service)["not_replayed"]["no_engine"] == 4


async def test_a_revision_no_engine_serves_is_named_not_queued() -> None:
    async with world() as w:
        served, pinned = ids_on_shard("served", 2), ids_on_shard("pinned", 2)
        await write_conversations(w.home, served, words=5)
        for cid in pinned:
            await w.home.create_conversation("t1", cid, "llama-old@1", {})
            await w.home.append_event("t1", cid, "message.user", {"content": "hi"})
        await move_shard(w)
        report = await w.service.replay_shard(SHARD)
        assert report.accepted == 2
        status = w.service.status()
        assert status["served_model_revisions"] == [REVISION]
        assert status["not_replayed"]["model_unserved"] == 2
        assert status["not_replayed"]["unserved_model_revisions"] == {"llama-old@1": 2}
        registry = CollectorRegistry()
        registry.register(ReplayCollector(w.service))
        value = registry.get_sample_value(
            "convplane_replay_not_replayed_total", {"reason": "model_unserved"}
        )
        assert value == 2
