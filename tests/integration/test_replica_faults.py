"""Storage faults on real PostgreSQL that the simulator cannot model: a replica database dropped
and recreated under a running leader, and a database that stalls under load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
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
    # a sweep that cannot read a store in time (a loaded machine; after the drop below, pooled
    # connections that died with the database) observes it unknown and leaves its verdict to
    # the next sweep, and a store no sweep has named counts toward no ack: sweep until each
    # step's verdict is in, a bounded number of times, as the controller's loop would
    assert await _sweep_until(a, lambda: all(a.identity.expected_store(r) for r in "abc")) == []
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

    # found by a sweep or by the leader's next append to b (refused: another store), whichever
    # comes first; either quarantines it
    await _sweep_until(a, lambda: not a.identity.counts("b"))
    assert a.identity.verdicts["b"].state == "quarantined"
    leader = a.leader(shard)
    assert leader is not None and leader.serving, leader and leader.crash
    during = await append_some(a, "conv", 5, "during-")
    assert all("b" not in e.acked_by for e in during)  # type: ignore[attr-defined]

    stores = {r: await log_cluster.store(r) for r in ("a", "b", "c")}
    report = await rebuild_replica(stores, "b", range(a.config.shard_count + 1), a.config)
    assert report.generation == 1 and report.entries_copied >= 11
    assert await _sweep_until(a, lambda: a.identity.counts("b")) == []
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


async def _sweep_until(node: LogNode, done: Callable[[], bool], sweeps: int = 20) -> list[str]:
    """Sweep until ``done()`` holds, ``sweeps`` times at most; returns the regions newly
    quarantined on the way."""
    quarantined: list[str] = []
    for _ in range(sweeps):
        quarantined += await node.verify_replicas()
        if done():
            break
        await asyncio.sleep(0.2)
    assert done(), node.identity.verdicts
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
