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

A round asks ``needed`` replicas first, not all of them (``QuorumChoice``): the ones whose status
reads answered fastest lately, the same ones for every shard of the node. Status reads go many
shards to a query, one query at a time per replica (``eventlog.stores.status_reads``), so a
replica that no round asks runs no status query for reads at all: under read load a node's
status queries fall by a third (3 regions). The others are asked too, at once, when a chosen
one fails or answers without confirming, and after ``HEDGE_FACTOR`` times the chosen ones'
usual answer time when they are slow: a slow or dead replica costs a read that hedge, never a
timeout. Which replicas answer does not matter to the argument above (any ``needed`` of them,
each asked after the read began), only how many.
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

#: a round asks the others too once the chosen replicas took this many times their usual
#: answer time (and at least ``HEDGE_FLOOR_S``)
HEDGE_FACTOR = 2.0
HEDGE_FLOOR_S = 0.002
#: every this many rounds (of all the node's shards) asks every replica, so that the answer
#: times of those not chosen stay known, and a replica that became faster is chosen again
ASK_ALL_EVERY = 64
#: a chosen replica stays chosen until another answers this much faster
SWITCH_BELOW = 0.7
#: the weight of a new answer time in the smoothed one
SMOOTHING = 0.2

#: called with the higher promise a replica named: the leader stops (fenced)
OnFenced = Callable[[int], None]
#: whether a replica's answer may count (False: quarantined, see ``eventlog.identity``)
Counts = Callable[[str], bool]
#: every status a round saw, so the leader can notice a replica that lost data it had accepted
OnStatus = Callable[[str, ShardStatus, float], None]


class QuorumChoice:
    """Which replicas a node's read rounds ask first: ``needed`` of those that count, by their
    status reads' smoothed answer times, kept while they stay close to the fastest (one
    instance per node, shared by every shard's ``ReadIndex``, so that every round asks the
    same replicas and the others run no status query)."""

    def __init__(self) -> None:
        self._answer_s: dict[str, float] = {}
        self._chosen: list[str] = []
        self._rounds = 0

    def observe(self, region: str, seconds: float) -> None:
        """A status read of ``region`` took ``seconds``."""
        old = self._answer_s.get(region)
        self._answer_s[region] = seconds if old is None else old + SMOOTHING * (seconds - old)

    def first(self, regions: list[str], needed: int, counts: Counts) -> tuple[list[str], float]:
        """The regions a round asks first, and after how long it asks the others too; every
        region (and no wait) while an answer time is unknown, or once every ``ASK_ALL_EVERY``
        rounds."""
        self._rounds += 1
        times = self._answer_s
        eligible = [r for r in regions if counts(r)]
        if (
            self._rounds % ASK_ALL_EVERY == 0
            or len(eligible) < needed
            or any(r not in times for r in regions)
        ):
            return regions, 0.0
        ranked = sorted(eligible, key=lambda r: (times[r], r))
        kept = [r for r in self._chosen if r in eligible]
        if len(kept) != needed or any(
            times[r] < SWITCH_BELOW * times[c] for r in ranked if r not in kept for c in kept
        ):
            kept = ranked[:needed]
        self._chosen = kept
        return kept, max(HEDGE_FLOOR_S, HEDGE_FACTOR * max(times[r] for r in kept))


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
        choice: QuorumChoice | None = None,
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
        self._choice = choice or QuorumChoice()
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
        first, hedge_s = self._choice.first(list(self._replicas), self._needed, self._counts)
        hedge_s = min(hedge_s, self._timeout_s / 4)  # a chosen replica that lost its place
        calls: dict[asyncio.Future[ShardStatus], str] = {}

        def ask(regions: list[str]) -> None:
            for region in regions:
                call = asyncio.ensure_future(
                    bounded(self._replicas[region].status(self._shard), self._timeout_s)
                )
                call.add_done_callback(
                    functools.partial(self._answered, region, self._clock.monotonic())
                )
                calls[call] = region

        ask(first)
        hedged = len(first) == len(self._replicas)
        confirmed = 0
        pending = set(calls)
        while pending and confirmed < self._needed:
            wait_s = None if hedged else max(0.0, asked_at + hedge_s - self._clock.monotonic())
            done, pending = await asyncio.wait(
                pending, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
            )
            short = not done  # the chosen ones are slow
            for call in [c for c in calls if c in done]:  # deterministic order
                if call.cancelled() or call.exception() is not None:
                    error = None if call.cancelled() else call.exception()
                    if error is not None and not isinstance(
                        error, ConvplaneError | TimeoutError | OSError
                    ):
                        raise error  # a bug below us
                    short = True
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
                else:  # behind this epoch's promise, or quarantined: no help to this round
                    short = True
            if (short or not pending) and not hedged and confirmed < self._needed:
                hedged = True
                before = set(calls)
                ask([r for r in self._replicas if r not in calls.values()])
                pending |= set(calls) - before
        # The calls still pending are left to end by themselves (each is bounded by timeout_s;
        # the query is at the server either way): their answer times are what the choice of
        # the next rounds learns from, the slow ones' included.
        if confirmed < self._needed:
            raise NoQuorum(
                f"shard {self._shard}: leadership at epoch {self._epoch} confirmed by "
                f"{confirmed} replicas, {self._needed} needed; not answering a read",
                retry_after_s=1.0,
            )

    def _answered(self, region: str, sent_at: float, call: asyncio.Future[ShardStatus]) -> None:
        """Teach the choice how long ``region``'s status read took; one that failed, or that
        confirms nothing (behind the epoch, quarantined), as if it had timed out."""
        took_s = self._clock.monotonic() - sent_at
        useful = (
            not call.cancelled()
            and call.exception() is None
            and call.result().promised_epoch == self._epoch
            and self._counts(region)
        )
        self._choice.observe(region, took_s if useful else max(took_s, self._timeout_s))


def _fail(waiting: asyncio.Future[None], error: Exception) -> None:
    """Fail a round's waiters unless the round already answered them (the error is marked
    retrieved: a round nobody joined any more must not be reported as never awaited)."""
    if not waiting.done():
        waiting.set_exception(error)
        waiting.exception()
