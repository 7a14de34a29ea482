"""Linearizable reads: a leader confirms it still leads before it answers (Raft's read index).

A leader of epoch ``e`` that was cut off, paused or deposed keeps its memory: its conversation
states, its commit position. Answering from them would show a client a transcript without the
events a newer leader has since acknowledged. So before a read is answered the leader asks the
replicas for their promise and needs ``N - P + 1`` of them (``P``: the prepare quorum) to still
promise exactly ``e``. Any newer leader needed ``P`` promises above ``e``; the two sets share a
replica, which promised the newer epoch only after it answered this round. So no newer leader
existed when this round's answers were given, and every write acknowledged before the read began
was acknowledged by this leader (or recovered into its log before its barrier committed): the
leader's committed entries hold all of them. A reply naming a higher promise fences the leader.

Why a read-index round and not a lease: a lease is safe only while clock drift and process pauses
stay under its margin, and a GC pause, a stalled VM or a SIGSTOPped node breaks that without
anyone noticing. A round costs one replica status read per region, and rounds are shared: every
read that arrives while a round is in flight joins the *next* round (a round that was already
sent may have been answered before the read began, so it cannot vouch for it), so the number of
rounds in flight is at most one per shard whatever the read rate.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping

from eventlog.aio import abandon, bounded
from eventlog.clock import Clock
from eventlog.errors import ConvplaneError, Fenced, NoQuorum
from eventlog.model import ShardStatus
from eventlog.replica import ReplicaStore

#: called with the higher promise a replica named: the leader stops (fenced)
OnFenced = Callable[[int], None]
#: whether a replica's answer may count (False: quarantined, see ``eventlog.identity``)
Counts = Callable[[str], bool]
#: every status a round saw, so the leader can notice a replica that lost data it had accepted
OnStatus = Callable[[str, ShardStatus, float], None]


class ReadIndex:
    def __init__(
        self,
        *,
        shard: int,
        epoch: int,
        replicas: Mapping[str, ReplicaStore],
        needed: int,
        timeout_s: float,
        on_fenced: OnFenced,
        counts: Counts,
        on_status: OnStatus,
        clock: Clock,
    ) -> None:
        self._shard = shard
        self._epoch = epoch
        self._replicas = dict(replicas)
        self._needed = needed
        self._timeout_s = timeout_s
        self._on_fenced = on_fenced
        self._counts = counts
        self._on_status = on_status
        self._clock = clock
        self._running: asyncio.Task[None] | None = None
        self._next: asyncio.Future[None] | None = None  # the round that new reads join
        self._closed = False

    async def confirm(self) -> None:
        """Return once a round sent after this call began confirmed the epoch; NoQuorum (or
        Fenced through ``on_fenced``) otherwise."""
        if self._closed:
            raise NoQuorum(f"shard {self._shard}: leader stopped")
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        joined = self._next
        if self._running is None:
            self._start_next()
        await asyncio.shield(joined)

    def close(self) -> None:
        """Fail every read waiting on a round. The running round's own waiters are failed by
        its done callback (``_round_done``), even if it is cancelled before its first step."""
        self._closed = True
        if self._running is not None:
            abandon(self._running)
        if self._next is not None:
            _fail(self._next, NoQuorum(f"shard {self._shard}: leader stopped"))
            self._next = None

    def _start_next(self) -> None:
        batch, self._next = self._next, None
        assert batch is not None
        self._running = asyncio.ensure_future(self._round(batch))
        self._running.add_done_callback(functools.partial(self._round_done, batch))

    def _round_done(self, batch: asyncio.Future[None], _task: asyncio.Task[None]) -> None:
        self._running = None
        # a round cancelled before it ran a step never reached its own except clause
        _fail(batch, NoQuorum(f"shard {self._shard}: read round cancelled"))
        if self._next is not None and not self._closed:
            self._start_next()

    async def _round(self, batch: asyncio.Future[None]) -> None:
        try:
            await self._ask_replicas()
        except Exception as error:  # NoQuorum, Fenced; cancellation: see _round_done
            _fail(batch, error)
            return
        if not batch.done():
            batch.set_result(None)

    async def _ask_replicas(self) -> None:
        asked_at = self._clock.monotonic()
        calls = {
            asyncio.ensure_future(bounded(store.status(self._shard), self._timeout_s)): region
            for region, store in self._replicas.items()
        }
        confirmed = 0
        pending = set(calls)
        try:
            while pending and confirmed < self._needed:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for call in [c for c in calls if c in done]:  # deterministic order
                    if call.cancelled() or call.exception() is not None:
                        error = None if call.cancelled() else call.exception()
                        if error is not None and not isinstance(
                            error, ConvplaneError | TimeoutError | OSError
                        ):
                            raise error  # a bug below us
                        continue
                    status = call.result()
                    self._on_status(calls[call], status, asked_at)
                    promised = status.promised_epoch
                    if promised > self._epoch:
                        self._on_fenced(promised)
                        raise Fenced(
                            f"shard {self._shard}: a newer leader exists (epoch {promised})",
                            shard=self._shard,
                            promised_epoch=promised,
                        )
                    if promised == self._epoch and self._counts(calls[call]):
                        confirmed += 1
        finally:
            for call in pending:
                abandon(call)
        if confirmed < self._needed:
            raise NoQuorum(
                f"shard {self._shard}: leadership at epoch {self._epoch} confirmed by "
                f"{confirmed} replicas, {self._needed} needed; not answering a read",
                retry_after_s=1.0,
            )


def _fail(waiting: asyncio.Future[None], error: Exception) -> None:
    """Fail a round's waiters unless the round already answered them (the error is marked
    retrieved: a round nobody joined any more must not be reported as never awaited)."""
    if not waiting.done():
        waiting.set_exception(error)
        waiting.exception()
