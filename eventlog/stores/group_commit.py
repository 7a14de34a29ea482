"""Group commit: concurrent ``append`` calls on one store become one transaction.

Callers put requests on a bounded queue and wait for their own reply. One writer task takes the
first waiting request, then keeps taking more until the group holds ``events_max`` entries or,
when there is nothing more waiting, for at most ``linger_s`` if the node is busy, hands the whole
group, in arrival order, to ``execute`` (one transaction / one database call), and resolves each
caller with its own outcome. Only one group is in flight at a time, so requests are applied in the
order they were submitted: a leader that pipelines appends of one shard sees them applied in its
order. While a group runs, the next one fills up, which is what makes the batching adaptive.

"Busy" is: the previous group carried more than one request (several shards, or callers, are
appending at once). Then waiting a few milliseconds for more is cheaper than a transaction per
trickle: under ``bench/rest.py`` a group (each shard's append is one request) costs the database
~300 us and the node a round trip whatever its size, and 8 ms of linger took the plane from 0.45
to 0.63 x the peer's throughput, with a lower p99. The wait is also never longer than the
previous group took to execute, so it at most doubles a cycle: on a quiet local database (a
group in ~1 ms) a couple of concurrent writers wait ~1 ms, not ``linger_s``; a saturated node,
where a group takes tens of milliseconds, waits the whole ``linger_s``. A lone caller (the
previous group held one request) never waits: an idle replica adds no latency to an ack.

The wait also ends as soon as the group holds as many requests as the previous one. A leader keeps
one sub-batch per shard in flight to each replica, so a store's callers form a closed loop: once
the shards that filled the last group are back, nobody else is coming before this group commits,
and waiting on is pure latency. Under ``bench/append.py`` (one node, 64 shards, 256 writers: ack
latency, not CPU, bounds it) this took the library path from 7,600 to 10,300 events/s; under
``bench/rest.py`` (CPU-bound) the nodes' CPU over their databases' fell from 2.40-2.45 to 2.26-2.27.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from eventlog.clock import Clock
from eventlog.errors import InvariantViolation, ReplicaUnavailable
from eventlog.model import AppendReply
from eventlog.stores._plan import AppendRequest

#: an outcome is the reply, or the bug the request revealed (raised in the caller)
AppendOutcome = AppendReply | InvariantViolation
ExecuteGroup = Callable[[Sequence[AppendRequest]], Awaitable[list[AppendOutcome]]]


@dataclass(slots=True)
class _Waiting:
    request: AppendRequest
    reply: asyncio.Future[AppendReply]

    @property
    def weight(self) -> int:
        return max(1, len(self.request.entries))


class GroupCommitter:
    def __init__(
        self,
        execute: ExecuteGroup,
        *,
        region: str,
        clock: Clock,
        linger_s: float,
        events_max: int,
        queue_max: int,
    ) -> None:
        self._execute = execute
        self._region = region
        self._clock = clock
        self._linger_s = linger_s
        self._events_max = events_max
        self._queue: asyncio.Queue[_Waiting] = asyncio.Queue(maxsize=queue_max)
        self._carried: _Waiting | None = None  # did not fit into the previous group
        self._previous_group_requests = 0  # the linger applies only after a group of several
        self._previous_group_s = 0.0  # ... and lasts at most what that group took
        self._writer: asyncio.Task[None] | None = None
        self._closed = False
        self.groups_committed = 0  # for benchmarks and tests: how many groups ran

    async def submit(self, request: AppendRequest) -> AppendReply:
        if self._closed:
            raise ReplicaUnavailable(f"replica {self._region} is closed")
        waiting = _Waiting(request, asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(waiting)
        except asyncio.QueueFull:
            raise ReplicaUnavailable(
                f"replica {self._region}: {self._queue.maxsize} appends already queued"
            ) from None
        if self._writer is None:
            self._writer = asyncio.create_task(self._run(), name=f"group-commit-{self._region}")
        return await waiting.reply

    async def close(self) -> None:
        """Stop taking appends; the running group and every waiting append fail with
        ``ReplicaUnavailable`` (their outcome is unknown to the caller, as after a crash)."""
        self._closed = True
        if self._writer is not None:
            self._writer.cancel()
            try:
                await self._writer
            except asyncio.CancelledError:
                pass
            self._writer = None
        leftovers = [self._carried] if self._carried else []
        while not self._queue.empty():
            leftovers.append(self._queue.get_nowait())
        for waiting in leftovers:
            if not waiting.reply.done():
                waiting.reply.set_exception(ReplicaUnavailable(f"replica {self._region} closed"))
        self._carried = None

    async def _run(self) -> None:
        while True:
            group = [w for w in await self._next_group() if not w.reply.done()]
            if not group:
                continue
            started_s = self._clock.monotonic()
            try:
                outcomes = await self._execute_isolating([w.request for w in group])
            except asyncio.CancelledError:
                _fail(group, ReplicaUnavailable(f"replica {self._region} closed mid-commit"))
                raise
            except ReplicaUnavailable as error:
                _fail(group, error)
                continue
            finally:
                self._previous_group_s = self._clock.monotonic() - started_s
            for waiting, outcome in zip(group, outcomes, strict=True):
                if waiting.reply.done():
                    continue  # the caller gave up; the outcome stays unknown to it
                if isinstance(outcome, InvariantViolation):
                    waiting.reply.set_exception(outcome)
                else:
                    waiting.reply.set_result(outcome)

    async def _execute_isolating(self, requests: Sequence[AppendRequest]) -> list[AppendOutcome]:
        """Run a group; if it fails for a reason other than an unreachable database, run each
        half on its own, down to the request that fails. A failed group wrote nothing (one
        transaction), and halves keep arrival order, so per-shard order holds. The culprit gets
        the error as its own outcome (a bug: its leader crashes); the others are unharmed.
        Costs at most 2 log2(n) extra calls, and only on a group that failed anyway."""
        try:
            outcomes = await self._execute(requests)
        except (asyncio.CancelledError, ReplicaUnavailable):
            raise
        except Exception as error:
            if len(requests) > 1:
                middle = len(requests) // 2
                head = await self._execute_isolating(requests[:middle])
                return [*head, *await self._execute_isolating(requests[middle:])]
            if isinstance(error, InvariantViolation):
                return [error]
            bug = InvariantViolation(
                f"append of shard {requests[0].shard} to {self._region} failed: {error!r}"
            )
            bug.__cause__ = error
            return [bug]
        if len(outcomes) != len(requests):
            raise InvariantViolation(f"{len(outcomes)} outcomes for a group of {len(requests)}")
        self.groups_committed += 1
        return outcomes

    async def _next_group(self) -> list[_Waiting]:
        first = self._carried or await self._queue.get()
        self._carried = None
        group, weight = [first], first.weight
        linger_s = 0.0
        if self._previous_group_requests > 1:
            linger_s = min(self._linger_s, self._previous_group_s)
        deadline = self._clock.monotonic() + linger_s
        as_many_as_last = self._previous_group_requests
        while weight < self._events_max:
            if len(group) >= as_many_as_last and self._queue.empty():
                break  # the last group's callers are back: nobody else is due (docstring)
            waiting = await self._take(deadline)
            if waiting is None:
                break
            if weight + waiting.weight > self._events_max:
                self._carried = waiting
                break
            group.append(waiting)
            weight += waiting.weight
        self._previous_group_requests = len(group)
        return group

    async def _take(self, deadline: float) -> _Waiting | None:
        if not self._queue.empty():
            return self._queue.get_nowait()
        remaining_s = deadline - self._clock.monotonic()
        if remaining_s <= 0:
            return None
        try:
            async with asyncio.timeout(remaining_s):
                return await self._queue.get()
        except TimeoutError:
            return None


def _fail(group: Sequence[_Waiting], error: BaseException) -> None:
    for waiting in group:
        if not waiting.reply.done():
            waiting.reply.set_exception(error)
