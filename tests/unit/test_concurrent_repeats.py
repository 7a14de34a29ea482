"""Two copies of one keyed append at a leader at once: what a forward sent again after a lost
attempt makes (``services.api.forward_batch``) when the lost one is still under way there. The
conversation's state is not cached (a new leader), so both wait on its load: whichever decides
first applies, the other finds the key and answers with that result, and the log holds one
entry."""

from __future__ import annotations

import asyncio
import random

import pytest

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.conversations import AppendedEvent
from eventlog.memory_replica import MemoryReplica
from eventlog.node import LogNode


def _node(region: str, replicas: dict[str, MemoryReplica]) -> LogNode:
    return LogNode(
        region=region,
        replicas=dict(replicas),
        config=LogConfig(shard_count=1),
        clock=LoopClock(),
        rng=random.Random(1),
    )


@pytest.mark.parametrize("first_cancelled", [False, True])
async def test_a_repeat_racing_its_first_attempt_is_applied_once(first_cancelled: bool) -> None:
    """Both copies wait on the conversation's load; the first then runs to its end, or is
    cancelled before it decides (the leader cancels a batch's items when the entry node that
    sent it hangs up)."""
    replicas = {r: MemoryReplica(r) for r in ("a", "b", "c")}
    old = _node("a", replicas)
    await old.lead_shard(0)
    await old.create_conversation("t", "c1", "m", {})
    await old.close()
    new = _node("b", replicas)  # leads next: the conversation's state is not cached here
    await new.lead_shard(0)

    def append() -> asyncio.Task[AppendedEvent]:
        return asyncio.ensure_future(
            new.append_event("t", "c1", "note", {"n": 1}, idempotency_key="k")
        )

    first = append()
    await asyncio.sleep(0)  # the first is waiting on the load
    repeat = append()
    if first_cancelled:
        first.cancel()
        answered = [await repeat]
        assert answered[0].replayed is False  # nothing of the first was applied
    else:
        answered = list(await asyncio.gather(first, repeat))
        assert sorted(a.replayed for a in answered) == [False, True]
    assert {a.seq for a in answered} == {1}
    entries = await replicas["b"].read_conversation(0, "t", "c1", 0, 100, 10**9)
    assert [e.seq for e in entries] == [1]
    await new.close()
