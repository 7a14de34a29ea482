"""Storage faults on real PostgreSQL that the simulator cannot model: a replica database dropped
and recreated under a running leader, and a database that stalls under load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from urllib.parse import urlsplit

from eventlog.node import LogNode
from eventlog.rebuild import rebuild_replica
from eventlog.stores import open_replica_store
from tests.conftest import LogCluster, _pg_admin

TENANT = "t"


async def append_some(node: LogNode, conversation: str, count: int, prefix: str) -> list[object]:
    return [
        await node.append_event(
            TENANT,
            conversation,
            "message.user",
            {"content": f"{prefix}{i}"},
            idempotency_key=f"{prefix}{i}",
        )
        for i in range(count)
    ]


async def test_a_recreated_database_is_quarantined_until_rebuilt_and_readmitted(
    log_cluster: LogCluster,
) -> None:
    a = await log_cluster.node("a")
    assert await a.verify_replicas() == []
    shard = a.shard_of("conv")
    await a.lead_shard(shard)
    await a.create_conversation(TENANT, "conv", "m@1", {})
    before = await append_some(a, "conv", 5, "before-")

    # b's database is dropped and created again (re-provisioned) while a leads
    instance, name = log_cluster.instances["b"], urlsplit(log_cluster.dsns["b"]).path.lstrip("/")
    await _pg_admin(instance, f"DROP DATABASE {name} WITH (FORCE)")
    await _pg_admin(instance, f"CREATE DATABASE {name}")
    # before anyone migrates it, the leader's appends reach an empty database: an outage of
    # that replica, not a bug that may stop the leader
    unmigrated = await append_some(a, "conv", 3, "unmigrated-")
    assert all(set(e.acked_by) == {"a", "c"} for e in unmigrated)  # type: ignore[attr-defined]
    fresh = await open_replica_store(log_cluster.dsns["b"], "b")  # migrates: a new identity
    await fresh.close()

    # a sweep that cannot read b (its pooled connections died with the database) observes it
    # unknown and leaves the verdict to the next sweep: sweep a bounded number of times
    assert await _sweep_until_quarantined(a, "b") == ["b"]
    assert not a.identity.counts("b")
    leader = a.leader(shard)
    assert leader is not None and leader.serving, leader and leader.crash
    during = await append_some(a, "conv", 5, "during-")
    assert all("b" not in e.acked_by for e in during)  # type: ignore[attr-defined]

    stores = {r: await log_cluster.store(r) for r in ("a", "b", "c")}
    report = await rebuild_replica(stores, "b", range(a.config.shard_count + 1), a.config)
    assert report.generation == 1 and report.entries_copied >= 11
    assert await a.verify_replicas() == []
    assert a.identity.counts("b")
    held = {json.loads(e.body).get("event_id") for e in await stores["b"].read_log(shard, 0, 100)}
    assert {e.event_id for e in [*before, *unmigrated, *during]} <= held  # type: ignore[attr-defined]
    # b counts again: once the leader has caught it up, its acks are part of the quorum (how
    # long that takes depends on the machine, so keep appending, a bounded number of times)
    for attempt in range(100):
        (appended,) = await append_some(a, "conv", 1, f"after-{attempt}-")
        if "b" in appended.acked_by:  # type: ignore[attr-defined]
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the re-admitted replica never counted toward an ack again")


async def _sweep_until_quarantined(node: LogNode, region: str, sweeps: int = 20) -> list[str]:
    """The regions newly quarantined over up to ``sweeps`` sweeps, stopping at ``region``."""
    quarantined: list[str] = []
    for _ in range(sweeps):
        quarantined += await node.verify_replicas()
        if region in quarantined:
            break
        await asyncio.sleep(0.2)
    return quarantined


async def test_a_stalled_database_under_load_neither_loses_nor_blocks_acks(
    log_cluster: LogCluster,
) -> None:
    a = await log_cluster.node("a", proxied=("c",), replica_call_timeout_s=1.0)
    for shard in range(a.config.shard_count):
        await a.lead_shard(shard)
    conversations = [f"conv-{i}" for i in range(8)]
    for conversation in conversations:
        await a.create_conversation(TENANT, conversation, "m@1", {})
    proxy = log_cluster.proxies["a->c"]
    proxy.set_rules(
        dataclasses.replace(proxy.rules, up_delay_ms=2500.0, down_delay_ms=2500.0)
    )  # c's database stalls

    async def writer(conversation: str) -> list[object]:
        return await append_some(a, conversation, 10, f"{conversation}-")

    acked = [e for batch in await asyncio.gather(*map(writer, conversations)) for e in batch]
    assert len(acked) == 80
    assert all(set(e.acked_by) >= {"a", "b"} for e in acked)  # type: ignore[attr-defined]
    proxy.set_rules(dataclasses.replace(proxy.rules, up_delay_ms=0.0, down_delay_ms=0.0))
    for conversation in conversations:
        events = await a.list_events(TENANT, conversation, 0, 100)
        assert [e.seq for e in events] == list(range(1, 11))
    c = await log_cluster.store("c")
    async with asyncio.timeout(30):  # c catches up once it answers again
        while True:
            logs = [await c.read_log(s, 0, 1000) for s in range(a.config.shard_count)]
            held = sum(len(log) for log in logs)
            if held >= 80 + 8 + a.config.shard_count:
                break
            await asyncio.sleep(0.2)
