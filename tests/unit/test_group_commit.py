"""When a group commit stops waiting for more appends (``eventlog.stores.group_commit``).

The database is a fake whose groups run until the test lets them finish; the clock is a manual
one that each group moves by ``GROUP_S``, so the linger after a busy group is ``GROUP_S`` of
loop time: far longer than any of these tests runs. A group that closes here closed because
of the rule under test, not because a timer fired.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from eventlog.model import Accepted
from eventlog.stores._plan import AppendRequest
from eventlog.stores.group_commit import AppendOutcome, GroupCommitter
from tests.unit.clocks import ManualClock

GROUP_S = 600.0  # what each group "takes" on the manual clock, and so the next one's linger


class GatedDatabase:
    """Runs each group once the test opens its gate; records the shards of each group."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.groups: list[list[int]] = []
        self.gates: list[asyncio.Event] = []

    async def execute(self, requests: Sequence[AppendRequest]) -> list[AppendOutcome]:
        gate = asyncio.Event()
        self.groups.append([r.shard for r in requests])
        self.gates.append(gate)
        await gate.wait()
        self.clock.now_s += GROUP_S
        return [Accepted(1) for _ in requests]

    def finish_group(self, number: int) -> None:
        self.gates[number].set()


def request(shard: int) -> AppendRequest:
    return AppendRequest(
        shard=shard, epoch=1, prev_lsn=0, prev_epoch=0, entries=(), leader_commit_lsn=0
    )


async def settle() -> None:
    """Let every task that can run do so (the writer takes, closes and starts a group)."""
    for _ in range(20):
        await asyncio.sleep(0)


def committer(database: GatedDatabase, events_max: int = 512) -> GroupCommitter:
    return GroupCommitter(
        database.execute,
        region="r",
        clock=database.clock,
        linger_s=GROUP_S,
        events_max=events_max,
        queue_max=64,
    )


async def test_a_group_closes_once_the_last_groups_callers_are_back() -> None:
    database = GatedDatabase(ManualClock())
    commits = committer(database)
    first = [asyncio.create_task(commits.submit(request(s))) for s in (1, 2, 3)]
    await settle()
    assert database.groups == [[1, 2, 3]]  # a first group never waits

    back = [asyncio.create_task(commits.submit(request(s))) for s in (1, 2)]
    database.finish_group(0)
    await settle()
    assert await asyncio.gather(*first) == [Accepted(1)] * 3
    # two of the last group's three are back: the group waits for more (the linger)
    assert database.groups == [[1, 2, 3]]

    back.append(asyncio.create_task(commits.submit(request(3))))
    await settle()
    # the third is back: nobody else is due, the group runs without waiting out the linger
    assert database.groups == [[1, 2, 3], [1, 2, 3]]

    later = [asyncio.create_task(commits.submit(request(s))) for s in (4, 5, 6)]
    await settle()
    assert database.groups == [[1, 2, 3], [1, 2, 3]]  # one group at a time
    database.finish_group(1)
    await settle()
    assert database.groups == [[1, 2, 3], [1, 2, 3], [4, 5, 6]]
    database.finish_group(2)
    assert await asyncio.gather(*back, *later) == [Accepted(1)] * 6
    await commits.close()


async def test_a_group_larger_than_the_last_takes_everything_already_waiting() -> None:
    database = GatedDatabase(ManualClock())
    commits = committer(database)
    first = [asyncio.create_task(commits.submit(request(s))) for s in (1, 2)]
    await settle()
    waiting = [asyncio.create_task(commits.submit(request(s))) for s in (1, 2, 3, 4)]
    await settle()
    database.finish_group(0)
    await settle()
    assert database.groups == [[1, 2], [1, 2, 3, 4]]  # drained, not cut at the last size
    database.finish_group(1)
    assert await asyncio.gather(*first, *waiting) == [Accepted(1)] * 6
    await commits.close()


async def test_after_a_lone_append_the_next_one_never_waits() -> None:
    database = GatedDatabase(ManualClock())
    commits = committer(database)
    lone = asyncio.create_task(commits.submit(request(1)))
    await settle()
    database.finish_group(0)
    await settle()
    assert await lone == Accepted(1)
    following = asyncio.create_task(commits.submit(request(2)))
    await settle()
    assert database.groups == [[1], [2]]
    database.finish_group(1)
    assert await following == Accepted(1)
    await commits.close()


async def test_a_request_carried_over_a_full_group_counts_toward_the_next() -> None:
    database = GatedDatabase(ManualClock())
    commits = committer(database, events_max=2)
    first = [asyncio.create_task(commits.submit(request(s))) for s in (1, 2, 3)]
    await settle()
    assert database.groups == [[1, 2]]  # full: the third is carried to the next group
    database.finish_group(0)
    await settle()
    assert database.groups == [[1, 2]]  # the carried one alone, one short of the last group
    back = asyncio.create_task(commits.submit(request(1)))
    await settle()
    assert database.groups == [[1, 2], [3, 1]]  # carried first, in arrival order
    database.finish_group(1)
    assert await asyncio.gather(*first, back) == [Accepted(1)] * 4
    await commits.close()
