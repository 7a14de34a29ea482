"""A leader that hands its shard over publishes its commit position first.

Nodes that do not lead learn what is committed only from the replicas' commit hints; the hints
trail the leader by a push that lingers ``commit_push_delay_s``. ``publish_commit`` pushes at once
and waits, under a bound, until every replica holds the position. Virtual time: deterministic.
"""

from __future__ import annotations

import asyncio
import random

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.memory_replica import MemoryReplica
from eventlog.node import LogNode
from tests.unit.test_leader_fail_fast import BlackHole, run

#: so long that no hint moves by lingering within a test
LINGER_S = 3600.0


async def leading_node(replicas: dict[str, MemoryReplica]) -> LogNode:
    config = LogConfig(shard_count=1, commit_push_delay_s=LINGER_S, replica_call_timeout_s=1.0)
    node = LogNode(region="a", replicas=replicas, config=config, clock=LoopClock(),
                   rng=random.Random(1))  # fmt: skip
    await node.lead_shard(0)
    await node.append_record(0, "control.note", {})
    return node


async def hints(replicas: dict[str, MemoryReplica]) -> dict[str, int]:
    return {r: (await store.status(0)).commit_lsn for r, store in replicas.items()}


def test_publish_pushes_the_commit_position_to_every_replica_without_lingering() -> None:
    async def scenario() -> None:
        replicas = {r: MemoryReplica(r) for r in ("a", "b", "c")}
        node = await leading_node(replicas)
        leader = node.leader(0)
        assert leader is not None
        committed = leader.commit_lsn
        assert min((await hints(replicas)).values()) < committed  # the last record's hint lags
        started_s = asyncio.get_running_loop().time()
        assert await leader.publish_commit(5.0)
        # one round of in-memory replica calls: no linger, and well before the timeout
        assert asyncio.get_running_loop().time() - started_s < 0.1
        assert await hints(replicas) == {"a": committed, "b": committed, "c": committed}
        await node.close()

    run(scenario)


def test_publish_gives_up_at_its_bound_and_the_resign_still_happens() -> None:
    async def scenario() -> None:
        hole = BlackHole("c")
        replicas: dict[str, MemoryReplica] = {"a": MemoryReplica("a"), "b": MemoryReplica("b"),
                                              "c": hole}  # fmt: skip
        node = await leading_node(replicas)
        leader = node.leader(0)
        assert leader is not None
        committed = leader.commit_lsn
        hole.cut = True
        started_s = asyncio.get_running_loop().time()
        await node.resign_shard(0, publish_commit=True)
        waited_s = asyncio.get_running_loop().time() - started_s
        assert not node.leads(0)
        assert 1.0 <= waited_s < LINGER_S  # the replica call's timeout bounds the wait
        found = await hints({"a": replicas["a"], "b": replicas["b"]})
        assert found == {"a": committed, "b": committed}
        await node.close()

    run(scenario)
