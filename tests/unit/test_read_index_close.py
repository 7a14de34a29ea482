"""A leader that stops fails every read waiting on its leadership check, whenever it stops.

The drill e2e tests caught a hang: a read-index round was cancelled (the leader stopped, fenced
by a newer leader) before its task had run a single step, so its own error handling never ran
and the round's waiters waited forever. One of them was the control-shard fold of the node
that had just lost the shard: it held the fold's lock, and that node never learned another
control record (its drill stayed active in its eyes; the plane's control shard had no leader).
Deterministic: the tests step the event loop, they time nothing.
"""

from __future__ import annotations

import asyncio

import pytest

from eventlog.clock import LoopClock
from eventlog.errors import NoQuorum
from eventlog.memory_replica import MemoryReplica
from eventlog.read_index import ReadIndex

#: loop iterations that are plenty for a round on in-memory replicas to finish
STEPS = 20


def read_index() -> ReadIndex:
    return ReadIndex(
        shard=0,
        epoch=1,
        replicas={r: MemoryReplica(r) for r in ("a", "b", "c")},
        needed=2,
        timeout_s=1.0,
        on_fenced=lambda promised: None,
        counts=lambda region: True,
        on_status=lambda region, status, asked_at: None,
        clock=LoopClock(),
    )


async def steps() -> None:
    for _ in range(STEPS):
        await asyncio.sleep(0)


async def test_closing_before_the_round_ran_a_step_fails_its_waiter() -> None:
    index = read_index()
    waiter = asyncio.ensure_future(index.confirm())
    # runs right after confirm's first step, before the round task's first step
    asyncio.get_running_loop().call_soon(index.close)
    await steps()
    assert waiter.done()
    with pytest.raises(NoQuorum):
        waiter.result()


async def promised_index() -> ReadIndex:
    """An index whose rounds would confirm: every replica promised its epoch."""
    index = read_index()
    for replica in index._replicas.values():
        await replica.prepare(0, 1, 0)
    return index


async def test_closing_mid_round_fails_its_waiter_and_later_confirms_fail_at_once() -> None:
    index = await promised_index()
    waiter = asyncio.ensure_future(index.confirm())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    index.close()
    await steps()
    with pytest.raises(NoQuorum, match="read round cancelled"):
        waiter.result()
    with pytest.raises(NoQuorum, match="leader stopped"):
        await index.confirm()


async def test_a_round_that_is_not_closed_answers() -> None:
    index = await promised_index()
    waiter = asyncio.ensure_future(index.confirm())
    await steps()
    assert waiter.done() and waiter.exception() is None
