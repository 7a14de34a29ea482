"""Two copies of one repeatable append (an Idempotency-Key, or a tool event without one) at a
leader at once: what a forward sent again after a lost attempt makes
(``services.api.forward_batch``) when the lost one is still under way there. The conversation's
state is not cached (a new leader), so both wait on its load: whichever decides first applies, the
other finds the key (or the attempt) and answers with that result, and the log holds one entry."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.conversations import AppendedEvent
from eventlog.memory_replica import MemoryReplica
from eventlog.model import AppendReply
from eventlog.node import LogNode


def _node(region: str, replicas: dict[str, MemoryReplica]) -> LogNode:
    return LogNode(
        region=region,
        replicas=dict(replicas),
        config=LogConfig(shard_count=1),
        clock=LoopClock(),
        rng=random.Random(1),
    )


_ATTEMPT = {"attempt_id": "a-1", "tool": "search", "argument_digest": "sha256:1"}
_APPENDS: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "keyed note": ("note", {"n": 1}, "k"),
    "keyless tool.attempt": ("tool.attempt", _ATTEMPT, None),
    "keyless tool.effect": ("tool.effect", {"attempt_id": "a-1", "status": "committed"}, None),
}


@pytest.mark.parametrize("append_of", list(_APPENDS))
@pytest.mark.parametrize("first_cancelled", [False, True])
async def test_a_repeat_racing_its_first_attempt_is_applied_once(
    first_cancelled: bool, append_of: str
) -> None:
    """Both copies wait on the conversation's load; the first then runs to its end, or is
    cancelled before it decides (the leader cancels a batch's items when the entry node that
    sent it hangs up)."""
    replicas = {r: MemoryReplica(r) for r in ("a", "b", "c")}
    old = _node("a", replicas)
    await old.lead_shard(0)
    await old.create_conversation("t", "c1", "m", {})
    event_type, payload, key = _APPENDS[append_of]
    if event_type == "tool.effect":  # its attempt, recorded by the old leader
        await old.append_event("t", "c1", "tool.attempt", _ATTEMPT)
    seq = 2 if event_type == "tool.effect" else 1
    await old.close()
    new = _node("b", replicas)  # leads next: the conversation's state is not cached here
    await new.lead_shard(0)

    def append() -> asyncio.Task[AppendedEvent]:
        return asyncio.ensure_future(
            new.append_event("t", "c1", event_type, payload, idempotency_key=key)
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
    assert {a.seq for a in answered} == {seq}
    entries = await replicas["b"].read_conversation(0, "t", "c1", 0, 100, 10**9)
    assert [e.seq for e in entries] == list(range(1, seq + 1))
    await new.close()


class _GatedReplica(MemoryReplica):
    """Holds every append while ``held``: what the leader proposed cannot commit."""

    def __init__(self, region: str) -> None:
        super().__init__(region)
        self.released = asyncio.Event()
        self.released.set()

    async def append(self, *args: Any) -> AppendReply:
        await self.released.wait()
        return await super().append(*args)


@pytest.mark.parametrize("append_of", list(_APPENDS))
async def test_a_repeat_of_an_attempt_cancelled_after_it_proposed_gets_its_result(
    append_of: str,
) -> None:
    """The first copy proposed its entry and waits for the quorum when its caller goes away
    (cancelled: the entry node hung up); the repeat arrives before the entry commits. The entry
    stays proposed, the repeat waits for its commit and answers with it, and the log holds it
    once: a lost attempt's entry is never proposed a second time."""
    replicas = {r: _GatedReplica(r) for r in ("a", "b", "c")}
    node = _node("a", dict(replicas))
    await node.lead_shard(0)
    await node.create_conversation("t", "c1", "m", {})
    event_type, payload, key = _APPENDS[append_of]
    seq = 1
    if event_type == "tool.effect":
        await node.append_event("t", "c1", "tool.attempt", _ATTEMPT)
        seq = 2
    for replica in replicas.values():
        replica.released.clear()

    def append() -> asyncio.Task[AppendedEvent]:
        return asyncio.ensure_future(
            node.append_event("t", "c1", event_type, payload, idempotency_key=key)
        )

    first = append()
    for _ in range(5):  # it loads nothing (the state is cached) and proposes at once
        await asyncio.sleep(0)
    assert not first.done()
    first.cancel()
    repeat = append()
    await asyncio.sleep(0.01)
    assert not repeat.done()  # waiting on the first's commit, not proposing its own
    for replica in replicas.values():
        replica.released.set()
    answered = await asyncio.wait_for(repeat, 5)
    assert (answered.seq, answered.replayed) == (seq, True)
    assert first.cancelled()
    entries = await replicas["a"].read_conversation(0, "t", "c1", 0, 100, 10**9)
    assert [e.seq for e in entries] == list(range(1, seq + 1))
    await node.close()
