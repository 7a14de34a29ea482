"""How a node that does not lead the control shard learns its records: from its own region's
replica alone between reads of every replica (``LEARN_READ_ALL_EVERY_S``), so each poll costs
one status read on its own host instead of one per region, and a record its own replica has not
heard of yet is still learned, from the others, within that time. (Virtual time: the unit
tier's loop.)"""

from __future__ import annotations

import asyncio
from collections import Counter

from eventlog.memory_replica import MemoryReplica
from eventlog.model import ShardStatus
from regions.ops_state import AUDIT_RECORD, audit_body
from services.control.controller import LEARN_READ_ALL_EVERY_S, Controller
from tests.unit.control_nodes import REGIONS, controller

asked: Counter[str] = Counter()


class CountedReplica(MemoryReplica):
    """Counts its status reads; ``lagging``: it reports a commit hint frozen where it was."""

    def __init__(self, region: str) -> None:
        super().__init__(region)
        self.lagging_at: int | None = None

    async def status(self, shard: int) -> ShardStatus:
        asked[self.region] += 1
        status = await super().status(shard)
        if self.lagging_at is None:
            return status
        return ShardStatus(status.promised_epoch, status.last_lsn, status.last_epoch,
                           min(status.commit_lsn, self.lagging_at))  # fmt: skip


async def committed(leader: Controller, action: str) -> int:
    """Commit an audit record on the control shard and push its commit position to every
    replica's hint (what the leader does before it applies a record)."""
    body = audit_body(at_ms=1, by="sre", role="operator", action=action, target="t", reason="r",
                      detail=None)  # fmt: skip
    lsn = await leader.node.append_record(leader.control_shard, AUDIT_RECORD, body)
    shard_leader = leader.node.leader(leader.control_shard)
    assert shard_leader is not None
    await shard_leader.publish_commit(1.0)
    return lsn


async def test_a_follower_learns_from_its_own_replica_between_reads_of_all() -> None:
    replicas = {r: CountedReplica(r) for r in REGIONS}
    leader, _ = controller("a", dict(replicas))
    await leader.node.lead_shard(leader.control_shard)
    follower, ops = controller("b", dict(replicas))
    first = await committed(leader, "act.0")
    asked.clear()
    await follower._learn()  # its first read asks every replica
    assert set(asked) == set(REGIONS) and follower.state.applied_lsn == first
    second = await committed(leader, "act.1")
    asked.clear()
    await follower._learn()
    assert asked == Counter({"b": 1})
    assert follower.state.applied_lsn == second
    assert [e.action for e in ops.audit] == ["act.0", "act.1"]
    await leader.node.close()
    await follower.node.close()


async def test_a_record_its_own_replica_missed_is_learned_from_the_others_in_time() -> None:
    replicas = {r: CountedReplica(r) for r in REGIONS}
    leader, _ = controller("a", dict(replicas))
    await leader.node.lead_shard(leader.control_shard)
    follower, ops = controller("b", dict(replicas))
    await follower._learn()  # the read of all, with nothing to learn
    replicas["b"].lagging_at = follower.state.applied_lsn  # its hint stops moving
    lsn = await committed(leader, "act")
    await follower._learn()
    assert follower.state.applied_lsn < lsn  # its own replica says nothing new yet
    await asyncio.sleep(LEARN_READ_ALL_EVERY_S)
    asked.clear()
    await follower._learn()
    assert set(asked) == set(REGIONS)
    assert follower.state.applied_lsn == lsn and [e.action for e in ops.audit] == ["act"]
    await leader.node.close()
    await follower.node.close()


async def test_a_follower_whose_own_replica_fails_asks_every_replica_next() -> None:
    class Failing(CountedReplica):
        failing = False

        async def status(self, shard: int) -> ShardStatus:
            if self.failing:
                asked[self.region] += 1
                raise ConnectionError("its database restarts")
            return await super().status(shard)

    replicas: dict[str, CountedReplica] = {r: CountedReplica(r) for r in ("a", "c")}
    replicas["b"] = own = Failing("b")
    leader, _ = controller("a", dict(replicas))
    await leader.node.lead_shard(leader.control_shard)
    follower, _ = controller("b", dict(replicas))
    await follower._learn()
    own.failing = True
    lsn = await committed(leader, "act")
    asked.clear()
    await follower._learn()  # its own replica alone, which failed
    assert asked == Counter({"b": 1}) and follower.state.applied_lsn < lsn
    await follower._learn()  # at once every replica: learned from the others
    assert asked["a"] == asked["c"] == 1 and follower.state.applied_lsn == lsn
    await leader.node.close()
    await follower.node.close()
