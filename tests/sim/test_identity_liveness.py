"""A shard stays writable when its node's identity sweep vouches for a replica anew, as a named
scenario on virtual time.

Found by the whole-plane simulator (seed 1002205 on PLANE_SIM_VERSION 6, 3 regions). A leader
counts a replica's acks only when they were made under the identity its node's sweep vouches
for now (issue 32, bug 1); a follower took the new identity only when it next sent an append.
Node b had restarted and its first sweeps could not reach c's database, so it led shards 0-2
with c unverified (c refilled under no identity). The shards went idle; b's sweep then vouched
for c, and b's own wiped database was rebuilt and re-admitted under a new identity. Neither
idle follower sent again, so only a's store counted: every proposal was refused ("1 replicas
reachable, 2 needed") before it could wake a follower, and the shards stayed unwritable for
good after healing.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.errors import ConvplaneError
from eventlog.memory_replica import MemoryReplica
from eventlog.node import LogNode
from eventlog.rebuild import rebuild_replica
from eventlog.sim.loop import run_on_virtual_time
from eventlog.sim.network import SimNetwork

SWEEP_EVERY_S = 2.0  # the Controller's verify-replicas period (NodeSettings default)


async def sweep_forever(node: LogNode) -> None:
    while True:
        await node.verify_replicas()
        await asyncio.sleep(SWEEP_EVERY_S)


async def idle_shard_whose_replicas_are_vouched_for_anew() -> dict[str, Any]:
    replicas = {r: MemoryReplica(r) for r in "abc"}
    net = SimNetwork(random.Random(1), replicas)
    config = LogConfig(shard_count=4)
    b = LogNode(
        region="b",
        replicas={r: net.link("b", r) for r in "abc"},
        config=config,
        clock=LoopClock(),
        rng=random.Random(2),
    )
    net.crashed.add("c")  # c's database is down at b's first sweep: c is not verified
    sweeps = asyncio.ensure_future(sweep_forever(b))
    await asyncio.sleep(0.1)
    shard = b.shard_of("X")
    await b.lead_shard(shard)  # through the promises of a and b
    await b.create_conversation("t", "X", "m@1", {})
    net.crashed.discard("c")
    await asyncio.sleep(SWEEP_EVERY_S)  # c refilled (under no identity), then vouched for
    leader = b.leader(shard)
    assert leader is not None
    outcome: dict[str, Any] = {"c_verified": b.identity.expected_store("c") == "c#1"}
    replicas["b"].wipe()  # b's database loses its disk; the operator rebuilds it from a
    await rebuild_replica(
        {r: net.link("a", r) for r in "abc"}, "b", range(config.shard_count + 1), config
    )
    await asyncio.sleep(2 * SWEEP_EVERY_S)  # the next sweeps re-admit b under its new identity
    outcome["b_readmitted"] = b.identity.expected_store("b") == "b#2"
    outcome["still_leads"] = b.leads(shard)
    try:
        await b.append_event("t", "X", "message.user", {"content": "after the rebuild"})
        outcome["append"] = "acked"
    except ConvplaneError as exc:
        outcome["append"] = str(exc)
    outcome["quorum_reachable"] = leader.quorum_reachable()
    sweeps.cancel()
    await b.close()
    await net.close()
    return outcome


def test_an_idle_shard_takes_writes_again_once_its_replicas_are_vouched_for_anew() -> None:
    """Before the fix: "shard N: 1 replicas reachable, 2 needed", for as long as it ran."""
    outcome = run_on_virtual_time(idle_shard_whose_replicas_are_vouched_for_anew())
    assert outcome["c_verified"] and outcome["b_readmitted"] and outcome["still_leads"]
    assert outcome["append"] == "acked"
    assert outcome["quorum_reachable"]
