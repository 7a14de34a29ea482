"""One shard's leader: prepare/recovery at a new epoch, then pipelined replication to every replica.

The leader of epoch ``e`` is the only one that creates entries ``(e, lsn)``. Protocol:

1. **Prepare.** Send ``prepare(e)`` to every replica; wait for a prepare quorum of promises
   (``LogConfig.prepare_quorum``) and for every replica the failure detector can reach. A
   rejection names a higher promise: retry with a higher epoch. A voter counts only if its
   identity is the one vouched for and its log holds the positions the other stores keep for
   it (``eventlog.identity``: wiped and rolled-back stores).
2. **Recover.** ``C`` = highest commit hint among the promises (entries up to ``C`` are committed).
   Of the promising replicas choose the one whose log is most up to date (highest last epoch,
   then longest): by log matching it holds every committed entry. Its entries after ``C`` are the
   recovered tail; the leader appends a barrier entry of epoch ``e`` after it.
3. **Re-replicate.** Replicate tail + barrier to a write quorum; only then serve. Entries are
   never re-stamped: like Raft, the leader commits by counting only entries of its own epoch, and
   everything before the barrier commits with it. (Re-stamping would give one committed entry
   two stamps on different replicas and break the prev check.)
4. **Serve.** ``propose`` assigns the next lsn synchronously; one replication loop per replica
   sends batches from that replica's ``next_lsn``; an entry is committed once ``W`` replicas
   accepted it, and its waiters are resolved in lsn order.

A ``Rejected`` reply at any point means a higher epoch exists: the leader stops for good
("fenced") and fails every waiter with ``Fenced`` (outcome unknown to the client).

No I/O of its own: replicas are ports, time is the injected clock, backoff jitter the injected rng.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from eventlog.aio import bounded
from eventlog.backoff import Backoff
from eventlog.clock import Clock
from eventlog.config import LogConfig
from eventlog.errors import (
    ConvplaneError,
    Fenced,
    InvariantViolation,
    NoQuorum,
    Overloaded,
    ReplicaUnavailable,
)
from eventlog.identity import IdentityGuard
from eventlog.model import (
    Accepted,
    HeldPosition,
    IdentityMismatch,
    LogEntry,
    Mismatch,
    Rejected,
    ShardStatus,
    entry_size_bytes,
    leader_barrier,
)
from eventlog.read_index import QuorumChoice, ReadIndex
from eventlog.recovery import (
    RecoveredLog,
    drop_rolled_back,
    prepare_round,
    read_range,
    recover_log,
    vouched_promises,
)
from eventlog.replica import ReplicaStore

#: the waiter watch runs at most this many times per quorum_check_s (so a deadline is kept to
#: within quorum_check_s / WATCH_STEPS: 5 ms by default)
WATCH_STEPS = 20
#: called with (shard, epoch, newly committed entries, the replicas counted toward that commit by
#: region with the store identity each was counted under) each time the commit position
#: advances: the simulators' checkers (``eventlog.sim.checker.History``)
CommitObserver = Callable[[int, int, Sequence[LogEntry], Mapping[str, str | None]], None]


@dataclass
class _Follower:
    """The leader's view of one replica."""

    region: str
    store: ReplicaStore
    next_lsn: int
    match_lsn: int = 0
    sent_commit_lsn: int = 0
    #: when the current run of failed calls started (None: the last call succeeded)
    failing_since: float | None = None
    #: when the append now in flight was sent (None: none in flight)
    inflight_since: float | None = None
    last_call_at: float = 0.0
    #: when match_lsn last rose (the accepting reply arrived)
    matched_at: float = 0.0
    mismatch_step: int = 1
    #: the identity its store was sent under with the appends that ``match_lsn`` counts (the
    #: one the node's sweep vouched for then; None: the node does not verify identities)
    store_id: str | None = None
    #: the positions (``HeldPosition``) this replica's store accepted from this leader
    positions_sent: dict[str, HeldPosition] = field(default_factory=dict)
    #: when positions last went out to it (``LogConfig.positions_push_every_s``)
    positions_sent_at: float = float("-inf")
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class _Waiter:
    """One caller waiting for an lsn to commit (``ShardLeader.wait_committed``)."""

    future: asyncio.Future[None]
    started_s: float
    deadline_s: float


class ShardLeader:
    def __init__(
        self,
        *,
        shard: int,
        region: str,
        replicas: Mapping[str, ReplicaStore],
        config: LogConfig,
        clock: Clock,
        rng: random.Random,
        min_epoch: int = 0,
        observer: CommitObserver | None = None,
        region_unreachable: Callable[[str], bool] | None = None,
        identity: IdentityGuard | None = None,
        commit_push_delay_s: float | None = None,
        read_choice: QuorumChoice | None = None,
    ) -> None:
        self.shard = shard
        self.region = region
        self._replicas = dict(sorted(replicas.items()))
        self._config = config
        self._clock = clock
        self._rng = rng
        self._observer = observer
        #: outside knowledge (the region's failure detector): a region whose node this region
        #: cannot reach is counted as unreachable at once, before its replica calls time out
        self._region_unreachable = region_unreachable
        self._identity = identity or IdentityGuard()
        #: which replicas the read rounds ask first (``eventlog.read_index``): the node's one
        self._read_choice = read_choice or QuorumChoice()
        #: how long an idle follower waits before pushing the commit position (default: the
        #: config's, for conversation shards; LogNode gives the control shard its own)
        self._commit_push_delay_s = (
            config.commit_push_delay_s if commit_push_delay_s is None else commit_push_delay_s
        )
        self._w = config.quorum(len(replicas))
        self.epoch = min_epoch
        self.highest_seen_epoch = min_epoch
        self.last_lsn = 0
        self.commit_lsn = 0
        # entries[lsn - buffer_base - 1]: every entry after buffer_base that the leader holds
        self._buffer_base = 0
        self._buffer: list[LogEntry] = []
        self._epoch_at_base = 0  # epoch of the entry at buffer_base (0 when buffer_base == 0)
        #: estimated bytes of the buffer's entries, and of those not yet committed
        #: (``entry_size_bytes``): the buffer is bounded in bytes, not only in entries
        self._buffer_bytes = 0
        self._inflight_bytes = 0
        self._followers: dict[str, _Follower] = {}
        #: callers waiting for an lsn to commit, and the one timer that fails them when due
        self._waiters: dict[int, list[_Waiter]] = {}
        self._watch: asyncio.TimerHandle | None = None
        self._watch_due_s = 0.0
        self._recovery_source = region
        self._recovery_commit_lsn = 0
        self._barrier_lsn = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._read_index: ReadIndex | None = None
        self._serving = False
        self.fenced_by: int | None = None
        self._stopped = False
        #: set by publish_commit: followers push the commit position without lingering, and
        #: each reply (or stop) sets _commit_pushed for it to look again
        self._publishing = False
        self._commit_pushed = asyncio.Event()
        #: a bug (InvariantViolation) that killed a replication task; the simulator checks it
        self.crash: BaseException | None = None
        #: times a replica answered with less than it had accepted (see note_replica_status)
        self.replicas_gone_backwards = 0
        #: appends a store refused because it is not the one the node vouched for
        self.identity_refusals = 0
        #: region -> the committed prefix its replica is known to hold (``HeldPosition``):
        #: read from the stores at lead, raised as replicas accept, left at every store with
        #: the appends (``eventlog.identity``: how a store rolled back to an older copy of
        #: itself is found)
        self._positions: dict[str, HeldPosition] = {}
        #: voters found rolled back at lead (``rolled_back_voters``)
        self.rolled_back: list[str] = []
        #: when lead() began (a replica's lag is counted from then at the earliest)
        self._lead_started_s = 0.0

    # --- leadership ---------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        return self._serving and not self._stopped

    async def lead(self) -> int:
        """Prepare, recover and re-replicate; returns the epoch once the leader may serve."""
        self._lead_started_s = self._clock.monotonic()
        deadline = self._clock.monotonic() + self._config.lead_timeout_s
        backoff = Backoff(
            self._config.retry_backoff_min_s, self._config.retry_backoff_max_s, self._rng
        )
        while True:
            self.epoch = self.highest_seen_epoch + 1
            timeout_s = max(
                0.0, min(self._config.replica_call_timeout_s, deadline - self._clock.monotonic())
            )
            round_ = await prepare_round(
                self.shard,
                self.epoch,
                self._replicas,
                self._config,
                timeout_s,
                self._identity.counts,
                self._reachable_regions(),
            )
            self.highest_seen_epoch = max(self.highest_seen_epoch, round_.highest_seen_epoch)
            promises = await vouched_promises(
                round_.promises, self._replicas, self._identity, self._config, timeout_s
            )
            if promises is not None:
                found = await drop_rolled_back(
                    self.shard,
                    self.epoch,
                    promises,
                    self._replicas,
                    self._identity,
                    self._config,
                    self._reachable_regions(),
                    timeout_s,
                )
                promises, self._positions = found.promises, found.positions
                self.rolled_back += found.rolled_back
            if promises is not None:
                break
            if self._clock.monotonic() >= deadline:
                raise NoQuorum(
                    f"shard {self.shard}: no prepare quorum for epoch {self.epoch}",
                    retry_after_s=1.0,
                )
            await self._clock.sleep(backoff.next_s())
        try:
            recovered = await recover_log(self.shard, promises, self._replicas, self._config)
            self._install(recovered)
            self._start_replication()
            remaining_s = max(
                deadline - self._clock.monotonic(), self._config.replica_call_timeout_s
            )
            await self._wait_committed(self.last_lsn, remaining_s)
        except BaseException:
            await self.close()
            raise
        self._read_index = ReadIndex(
            shard=self.shard,
            epoch=self.epoch,
            replicas=self._replicas,
            needed=len(self._replicas) - self._config.prepare_quorum(len(self._replicas)) + 1,
            timeout_s=self._config.replica_call_timeout_s,
            on_fenced=lambda promised: self.stop(fenced_by=promised),
            counts=self._counts,
            on_status=self.note_replica_status,
            clock=self._clock,
            choice=self._read_choice,
        )
        self._serving = True
        return self.epoch

    def _reachable_regions(self) -> list[str]:
        """The regions the failure detector does not report unreachable (all without one)."""
        unreachable = self._region_unreachable
        return [r for r in self._replicas if unreachable is None or not unreachable(r)]

    async def confirm_leadership(self) -> None:
        """Before answering a read: confirm at a quorum that no newer leader exists
        (``eventlog.read_index``). Afterwards every write acknowledged before the call began is
        at or below ``commit_lsn``. Fenced or NoQuorum when this leader cannot vouch for that."""
        self._check_serving()
        if self._quorum_suspected():
            raise NoQuorum(
                f"shard {self.shard}: too few replicas answer to confirm leadership",
                retry_after_s=1.0,
            )
        assert self._read_index is not None
        await self._read_index.confirm()
        self._check_serving()

    def note_replica_status(self, region: str, status: ShardStatus, asked_at: float) -> None:
        """What a replica said it holds, asked at ``asked_at`` (this clock). Less than it had
        accepted *before it was asked* means it lost data (a wiped or restored database, before
        the identity sweep quarantines it): stop counting it for commits and reads until this
        leader has filled it again. (A status asked before an acceptance proves nothing.)"""
        follower = self._followers.get(region)
        if (
            follower is not None
            and status.last_lsn < follower.match_lsn
            and asked_at >= follower.matched_at
        ):
            self.replicas_gone_backwards += 1
            follower.match_lsn = status.last_lsn
            follower.next_lsn = min(follower.next_lsn, status.last_lsn + 1)
            follower.wakeup.set()

    def _check_serving(self) -> None:
        if not self.serving:
            raise Fenced(
                f"shard {self.shard}: not serving at epoch {self.epoch}",
                shard=self.shard,
                promised_epoch=self.fenced_by or self.epoch,
            )

    def _install(self, recovered: RecoveredLog) -> None:
        """Continue the recovered log. Raft's rule, not re-stamping: the tail keeps its stamps
        (so every (epoch, lsn) names one entry everywhere) and a barrier entry of this epoch
        follows it. Counting matches commits only entries of this epoch; the tail commits with
        the barrier."""
        self._buffer_base = recovered.commit_lsn
        self._epoch_at_base = recovered.epoch_at_commit
        self._buffer = list(recovered.tail)
        self._barrier_lsn = recovered.last_lsn + 1
        self._buffer.append(
            leader_barrier(self._barrier_lsn, self.epoch, self.region, self._clock.wall_ms())
        )
        self._buffer_bytes = self._inflight_bytes = sum(entry_size_bytes(e) for e in self._buffer)
        self.last_lsn = self._barrier_lsn
        self.commit_lsn = recovered.commit_lsn
        self._recovery_source = recovered.source
        self._recovery_commit_lsn = recovered.commit_lsn
        expected = self._identity.expected_store
        self._followers = {
            region: _Follower(
                region, store, next_lsn=recovered.commit_lsn + 1, store_id=expected(region)
            )
            for region, store in self._replicas.items()
        }

    def stop(self, fenced_by: int | None = None, crash: BaseException | None = None) -> None:
        """Stop leading: replication ends, every waiter fails (outcome unknown). ``crash`` is a
        bug found by a replication task: waiters get it as is, so it surfaces, never swallowed."""
        if self._stopped:
            return
        self._stopped = True
        self._serving = False
        if fenced_by is not None:
            self.fenced_by = fenced_by
            self.highest_seen_epoch = max(self.highest_seen_epoch, fenced_by)
        error = Fenced(
            f"shard {self.shard}: leader at epoch {self.epoch} stopped"
            + (f" (fenced by epoch {fenced_by})" if fenced_by is not None else ""),
            shard=self.shard,
            promised_epoch=fenced_by if fenced_by is not None else self.epoch,
        )
        for waiting in self._waiters.values():
            for waiter in waiting:
                if not waiter.future.done():
                    waiter.future.set_exception(crash or error)
                    waiter.future.exception()  # mark retrieved: nobody may be waiting any more
        self._waiters.clear()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        for task in self._tasks:
            task.cancel()
        if self._read_index is not None:
            self._read_index.close()
        self._commit_pushed.set()
        self._wake_followers()

    async def publish_commit(self, timeout_s: float) -> bool:
        """Before a voluntary resign: push the commit position to every counted replica at
        once (no linger) and return True once each that answers holds it (up to what it
        holds), False at ``timeout_s``. A node that does not lead learns what is committed
        only from replica commit hints: a record this leader committed last, then resigned
        over, would otherwise be committed but known to nobody else until some later leader
        recovers it, and the control shard's next leader is chosen by exactly such records.
        Suspected replicas are not waited for: the W that committed the record answer."""
        self._publishing = True
        try:
            deadline_s = self._clock.monotonic() + timeout_s
            while not self._commit_published():
                remaining_s = deadline_s - self._clock.monotonic()
                if self._stopped or remaining_s <= 0:
                    return False
                self._commit_pushed.clear()
                self._wake_followers()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._commit_pushed.wait(), remaining_s)
            return True
        finally:
            self._publishing = False

    def _commit_published(self) -> bool:
        now = self._clock.monotonic()
        return all(
            f.sent_commit_lsn >= min(self.commit_lsn, f.match_lsn)
            for f in self._counted()
            if not self._suspect(f, now)
        )

    async def close(self) -> None:
        self.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    # --- proposing ---------------------------------------------------------------------

    def check_can_propose(self) -> None:
        """Fail fast (nothing written) when this leader cannot commit right now."""
        self._check_serving()
        if self.last_lsn - self.commit_lsn >= self._config.inflight_entries_max:
            raise Overloaded(
                f"shard {self.shard}: {self.last_lsn - self.commit_lsn} entries in flight",
                retry_after_s=0.1,
            )
        alive = self._reachable_count()
        if alive < self._w:
            raise NoQuorum(
                f"shard {self.shard}: {alive} replicas reachable, {self._w} needed",
                retry_after_s=1.0,
            )

    def set_region_health(self, unreachable: Callable[[str], bool]) -> None:
        self._region_unreachable = unreachable

    def _counts(self, region: str) -> bool:
        """Whether a replica's acks and confirmations count: not while it is quarantined
        (``eventlog.identity``), and only once what it accepted was sent under the identity
        the node vouches for now (a store re-admitted under a new identity starts over)."""
        if not self._identity.counts(region):
            return False
        follower = self._followers.get(region)
        return follower is None or not self._vouched_anew(follower)

    def _vouched_anew(self, follower: _Follower) -> bool:
        """Whether the node now vouches for another identity of this replica's store than the
        one its acks were counted under: it counts again only once an append naming the new
        one is accepted."""
        return follower.store_id != self._identity.expected_store(follower.region)

    def identities_vouched(self) -> None:
        """After an identity sweep: a follower whose store is vouched for anew (first verified,
        re-admitted after a rebuild) sends an append naming that identity now, idle or not.
        Otherwise an idle shard never sent one, and with fewer than W replicas counted every
        proposal that would have woken it was refused: the shard stayed unwritable for good."""
        for follower in self._followers.values():
            if self._vouched_anew(follower):
                follower.wakeup.set()

    def _counted(self) -> list[_Follower]:
        return [f for f in self._followers.values() if self._counts(f.region)]

    def _reachable_count(self) -> int:
        """Counted replicas not suspected now, counted up to W at most (asked on every
        proposal: whether W are reachable, not how many; short of W it is the whole count)."""
        now = self._clock.monotonic()
        counts = self._counts
        found = 0
        for follower in self._followers.values():
            if counts(follower.region) and not self._suspect(follower, now):
                found += 1
                if found == self._w:
                    break
        return found

    def _quorum_suspected(self) -> bool:
        return bool(self._followers) and self._reachable_count() < self._w

    def quorum_reachable(self) -> bool:
        """Whether a write quorum of counted replicas looks reachable now (read for metrics)."""
        return not self._quorum_suspected()

    def replica_lag(self) -> list[tuple[str, int, float]]:
        """``(region, entries, seconds)`` per replica: how many entries it lacks behind the
        leader's last lsn, and for how long it has lacked some (0 when it holds everything)."""
        now = self._clock.monotonic()
        lags = []
        for follower in self._followers.values():
            entries = max(0, self.last_lsn - follower.match_lsn)
            since = max(follower.matched_at, self._lead_started_s)
            seconds = max(0.0, now - since) if entries else 0.0
            lags.append((follower.region, entries, seconds))
        return lags

    def _suspect(self, follower: _Follower, now: float) -> bool:
        """A replica that has failed, or not answered, for ``replica_suspect_after_s``: a
        black-holed link (partition) shows as a call that never returns, not as an error."""
        failing, inflight = follower.failing_since, follower.inflight_since
        if failing is None and inflight is None:
            return False
        limit_s = self._config.replica_suspect_after_s
        if (failing is not None and now - failing >= limit_s) or (
            inflight is not None and now - inflight >= limit_s
        ):
            return True
        # A call is outstanding to a region the failure detector cannot reach: no need to wait
        # for the call to time out. (A region whose node is down but whose database answers
        # has no outstanding call for long, so it still counts.)
        return self._region_unreachable is not None and self._region_unreachable(follower.region)

    def propose(self, make_entry: Callable[[int, int], LogEntry]) -> LogEntry:
        """Append an entry built by ``make_entry(lsn, epoch)`` to the leader's log (no await:
        callers decide and propose atomically). Raise as ``check_can_propose``."""
        self.check_can_propose()
        entry = make_entry(self.last_lsn + 1, self.epoch)
        if entry.lsn != self.last_lsn + 1 or entry.epoch != self.epoch:
            raise InvariantViolation(f"shard {self.shard}: proposed entry out of place")
        size = entry_size_bytes(entry)
        if self._inflight_bytes and self._inflight_bytes + size > self._config.inflight_bytes_max:
            raise Overloaded(
                f"shard {self.shard}: {self._inflight_bytes} bytes in flight",
                retry_after_s=0.1,
            )
        self._buffer.append(entry)
        self._buffer_bytes += size
        self._inflight_bytes += size
        self.last_lsn = entry.lsn
        self._wake_followers()
        return entry

    async def wait_committed(self, lsn: int, timeout_s: float | None = None) -> None:
        """Return once ``lsn`` is committed. NoQuorum after ``timeout_s`` (outcome unknown),
        Fenced if the leader stops first."""
        await self._wait_committed(lsn, timeout_s or self._config.append_timeout_s)

    async def _wait_committed(self, lsn: int, timeout_s: float) -> None:
        if lsn <= self.commit_lsn:
            return
        if self._stopped:
            raise Fenced(
                f"shard {self.shard}: leader stopped",
                shard=self.shard,
                promised_epoch=self.fenced_by or self.epoch,
            )
        # No timer per caller: the leader's one watch (_watch_waiters) fails a waiter at its
        # deadline (to within quorum_check_s / WATCH_STEPS), or once it has waited
        # quorum_check_s while the quorum looks cut off (seen within a quorum_check_s). A
        # caller's future is its own, so a cancelled caller cancels nothing but its wait.
        now = self._clock.monotonic()
        waiter = _Waiter(asyncio.get_running_loop().create_future(), now, now + timeout_s)
        waiting = self._waiters.get(lsn)
        if waiting is None:
            self._waiters[lsn] = [waiter]
        else:
            waiting.append(waiter)
        self._arm_watch(waiter.deadline_s)
        await waiter.future

    def _arm_watch(self, due_s: float) -> None:
        """Have _watch_waiters run by ``due_s``, at most quorum_check_s from now and at least
        ``quorum_check_s / WATCH_STEPS`` from now (a stream of waiters, each due a moment after
        the last, would otherwise run it once per waiter)."""
        now = self._clock.monotonic()
        check_s = self._config.quorum_check_s
        due_s = max(min(due_s, now + check_s), now + check_s / WATCH_STEPS)
        if self._watch is not None:
            if self._watch_due_s <= due_s:
                return
            self._watch.cancel()
        self._watch_due_s = due_s
        self._watch = asyncio.get_running_loop().call_later(due_s - now, self._watch_waiters)

    def _watch_waiters(self) -> None:
        """Fail every waiter past its deadline, and, while too few replicas answer, every one
        that has waited quorum_check_s (NoQuorum: the outcome is unknown); re-arm for the rest:
        at the next deadline, at the next check point while cut off, else a quorum_check_s on."""
        self._watch = None
        if self._stopped:
            return
        now = self._clock.monotonic()
        cut_off = self._quorum_suspected()
        check_s = self._config.quorum_check_s
        next_due_s = now + check_s
        for lsn in list(self._waiters):
            still = []
            for waiter in self._waiters[lsn]:
                if waiter.future.done():
                    continue  # its caller was cancelled
                if now >= waiter.deadline_s or (cut_off and now - waiter.started_s >= check_s):
                    waiter.future.set_exception(self._not_acknowledged(lsn, waiter, cut_off))
                    continue
                still.append(waiter)
                next_due_s = min(next_due_s, waiter.deadline_s)
                if cut_off:
                    next_due_s = min(next_due_s, waiter.started_s + check_s)
            if still:
                self._waiters[lsn] = still
            else:
                del self._waiters[lsn]
        if self._waiters:
            self._arm_watch(next_due_s)

    def _not_acknowledged(self, lsn: int, waiter: _Waiter, cut_off: bool) -> NoQuorum:
        return NoQuorum(
            f"shard {self.shard}: lsn {lsn} not acknowledged by {self._w} replicas "
            + (
                "(they stopped answering)"
                if cut_off
                else f"within {waiter.deadline_s - waiter.started_s:.1f}s"
            )
            + "; the outcome is unknown, retry with the same Idempotency-Key",
            retry_after_s=1.0,
        )

    def holders(self, lsn: int) -> tuple[str, ...]:
        """Regions whose replicas are known to hold the leader's log through ``lsn``."""
        return tuple(f.region for f in self._counted() if f.match_lsn >= lsn)

    def read_sources(self) -> list[str]:
        """Regions whose replicas hold every committed entry, best first: this region's own,
        then replicas whose last call succeeded, then the rest."""
        holders = [f for f in self._counted() if f.match_lsn >= self.commit_lsn]
        if not holders:
            # possible since replicas can lose data (a wiped database): refill first
            raise NoQuorum(
                f"shard {self.shard}: no replica known to hold the commit point right now",
                retry_after_s=0.5,
            )
        holders.sort(key=lambda f: (f.region != self.region, f.failing_since is not None, f.region))
        return [f.region for f in holders]

    def read_source(self) -> str:
        """The best of ``read_sources``."""
        return self.read_sources()[0]

    # --- replication -------------------------------------------------------------------

    def _start_replication(self) -> None:
        for follower in self._followers.values():
            task = asyncio.ensure_future(self._replicate_forever(follower))
            task.add_done_callback(self._on_replication_done)
            self._tasks.append(task)

    def _on_replication_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.crash = task.exception()
            self.stop(crash=self.crash)

    def _wake_followers(self) -> None:
        for follower in self._followers.values():
            follower.wakeup.set()

    async def _replicate_forever(self, follower: _Follower) -> None:
        backoff = Backoff(
            self._config.retry_backoff_min_s, self._config.retry_backoff_max_s, self._rng
        )
        while not self._stopped:
            follower.wakeup.clear()  # before looking, so no wake-up between look and wait is lost
            if follower.next_lsn > self.last_lsn:
                if (
                    follower.sent_commit_lsn >= min(self.commit_lsn, follower.match_lsn)
                    and not self._positions_unsent(follower)
                    and not self._vouched_anew(follower)
                ):
                    await follower.wakeup.wait()
                    continue
                # Idle but the replica's commit hint is stale: push it after a short linger,
                # unless new entries come first (they carry the commit position anyway), or at
                # once while the leader publishes before resigning.
                if not self._publishing:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(follower.wakeup.wait(), self._commit_push_delay_s)
                    if self._stopped or follower.next_lsn <= self.last_lsn:
                        continue
            try:
                await self._send_once(follower)
                backoff.reset()
            except (ConvplaneError, TimeoutError, OSError):
                # Lost message, unreachable replica or catch-up source: retry at a bounded rate.
                if follower.failing_since is None:
                    # failing since the lost call was sent, not since its timeout fired
                    follower.failing_since = follower.last_call_at
                await self._clock.sleep(backoff.next_s())

    async def _send_once(self, follower: _Follower) -> None:
        prev_lsn = follower.next_lsn - 1
        last = min(self.last_lsn, prev_lsn + self._config.batch_events_max)
        prev_epoch, batch = await self._entries_after(follower.region, prev_lsn, last)
        commit_lsn = self.commit_lsn
        expected = self._identity.expected_store(follower.region)
        if expected != follower.store_id:
            # another identity is vouched for now (first sweep, a re-admitted store): nothing
            # the replica accepted before is known to be in the store that now has the name
            follower.store_id = expected
            follower.match_lsn = follower.sent_commit_lsn = 0
        now = self._clock.monotonic()
        positions = self._positions_unsent(follower)
        if batch and now - follower.positions_sent_at < self._config.positions_push_every_s:
            positions = None  # a busy shard leaves them a few times a second, not per append
        follower.inflight_since = follower.last_call_at = now
        try:
            reply = await bounded(
                follower.store.append(
                    self.shard,
                    self.epoch,
                    prev_lsn,
                    prev_epoch,
                    batch,
                    commit_lsn,
                    expected,
                    positions,
                ),
                self._config.replica_call_timeout_s,
            )
        finally:
            follower.inflight_since = None
        if self._stopped:
            return
        follower.failing_since = None
        if isinstance(reply, Accepted):
            if reply.match_lsn != prev_lsn + len(batch):
                raise InvariantViolation(f"shard {self.shard}: bad match from {follower.region}")
            follower.mismatch_step = 1
            if positions:
                follower.positions_sent.update(positions)
                follower.positions_sent_at = follower.last_call_at
            if reply.match_lsn > follower.match_lsn:
                follower.match_lsn = reply.match_lsn
                follower.matched_at = self._clock.monotonic()
                self._note_position(follower)
            follower.next_lsn = max(follower.next_lsn, reply.match_lsn + 1)
            follower.sent_commit_lsn = max(
                follower.sent_commit_lsn, min(commit_lsn, reply.match_lsn)
            )
            self._advance_commit()
            if self._publishing:
                self._commit_pushed.set()
        elif isinstance(reply, Mismatch):
            if reply.last_lsn < follower.match_lsn:  # it lost entries it had accepted
                self.replicas_gone_backwards += 1
                follower.match_lsn = reply.last_lsn
            # Step back, doubling the step while mismatches repeat (re-sending entries the
            # replica already has is harmless: it keeps same-epoch entries).
            follower.next_lsn = max(
                1, min(follower.next_lsn - follower.mismatch_step, reply.last_lsn + 1)
            )
            follower.mismatch_step = min(follower.mismatch_step * 2, self._config.batch_events_max)
        elif isinstance(reply, Rejected):
            self.stop(fenced_by=reply.promised_epoch)
        elif isinstance(reply, IdentityMismatch):
            # Not the store the sweep vouched for (wiped, replaced): it wrote nothing, and it
            # neither votes nor acks on this node until a sweep finds it rebuilt and re-admitted.
            self.identity_refusals += 1
            follower.match_lsn = follower.sent_commit_lsn = 0
            self._identity.refused(follower.region)
            raise ReplicaUnavailable(
                f"shard {self.shard}: replica {follower.region} is not store {expected}"
            )

    async def _entries_after(
        self, target: str, prev_lsn: int, last_lsn: int
    ) -> tuple[int, list[LogEntry]]:
        """(epoch of entry prev_lsn, entries prev_lsn+1..last_lsn) of the leader's log."""
        if prev_lsn >= self._buffer_base:
            start = prev_lsn - self._buffer_base
            prev_epoch = self._buffer[start - 1].epoch if start > 0 else self._epoch_at_base
            return prev_epoch, self._buffer[start : last_lsn - self._buffer_base]
        # Older than the buffer: committed entries, identical on every replica that has them.
        source = self._catch_up_source(target, min(last_lsn, self._buffer_base))
        end = min(last_lsn, self._buffer_base)
        fetched = await read_range(
            self.shard, source, self._replicas[source], max(prev_lsn - 1, 0), end, self._config
        )
        prev_epoch = fetched[0].epoch if prev_lsn > 0 else 0
        batch = fetched[1:] if prev_lsn > 0 else fetched
        return prev_epoch, [e for e in batch if e.lsn <= end]

    def _catch_up_source(self, target: str, through_lsn: int) -> str:
        """A replica known to hold the leader's log through ``through_lsn``: one that accepted
        it at this epoch, or (for the committed base found at recovery) the recovery source."""
        candidates = [
            f for f in self._counted() if f.region != target and f.match_lsn >= through_lsn
        ]
        if candidates:
            return max(
                candidates, key=lambda f: (f.region == self.region, f.failing_since is None)
            ).region
        if through_lsn <= self._recovery_commit_lsn and self._recovery_source != target:
            return self._recovery_source
        raise NoQuorum(
            f"shard {self.shard}: no catch-up source for {target} yet", retry_after_s=0.5
        )

    def _advance_commit(self) -> None:
        matches = sorted((f.match_lsn for f in self._counted()), reverse=True)
        if len(matches) < self._w:
            return  # too few replicas count (some are quarantined): nothing commits
        quorum_lsn = matches[self._w - 1]
        if quorum_lsn <= self.commit_lsn or quorum_lsn < self._barrier_lsn:
            return  # only entries of this epoch are committed by counting (Raft, section 5.4.2)
        newly = self._buffer[self.commit_lsn - self._buffer_base : quorum_lsn - self._buffer_base]
        self._inflight_bytes -= sum(entry_size_bytes(e) for e in newly)
        self.commit_lsn = quorum_lsn
        for follower in self._followers.values():
            self._note_position(follower)
        if self._observer is not None:
            counted = {f.region: f.store_id for f in self._counted() if f.match_lsn >= quorum_lsn}
            self._observer(self.shard, self.epoch, newly, counted)
        for lsn in sorted(lsn for lsn in self._waiters if lsn <= quorum_lsn):
            for waiter in self._waiters.pop(lsn):
                if not waiter.future.done():
                    waiter.future.set_result(None)
        self._trim_buffer()
        self._wake_followers()  # followers may now push the new commit position

    def _note_position(self, follower: _Follower) -> None:
        """Raise the replica's ``HeldPosition`` to the committed prefix it holds, once that
        reaches this leader's barrier (every entry from there on is stamped with this epoch,
        so the position names its entry's stamp)."""
        held = min(follower.match_lsn, self.commit_lsn)
        if held < self._barrier_lsn or not self._counts(follower.region):
            return
        position = HeldPosition(self.epoch, held)
        known = self._positions.get(follower.region)
        if known is None or known < position:
            self._positions[follower.region] = position
            self._wake_followers()  # their stores learn it with a push

    def _positions_unsent(self, follower: _Follower) -> dict[str, HeldPosition] | None:
        """The positions the replica's store does not have from this leader yet (None: it
        has them all)."""
        sent = follower.positions_sent
        unsent = {r: p for r, p in self._positions.items() if sent.get(r) != p}
        return unsent or None

    def _trim_buffer(self) -> None:
        """Drop the oldest committed entries past ``buffer_entries_max`` or
        ``buffer_bytes_max`` (a lagging replica catches up on them from a replica instead)."""
        trimmable = self.commit_lsn - self._buffer_base
        drop = 0
        while drop < trimmable and (
            len(self._buffer) - drop > self._config.buffer_entries_max
            or self._buffer_bytes > self._config.buffer_bytes_max
        ):
            self._buffer_bytes -= entry_size_bytes(self._buffer[drop])
            drop += 1
        if drop > 0:
            self._epoch_at_base = self._buffer[drop - 1].epoch
            self._buffer_base += drop
            del self._buffer[:drop]

    def entry(self, lsn: int) -> LogEntry | None:
        """An entry of the leader's log still held in memory."""
        if self._buffer_base < lsn <= self.last_lsn:
            return self._buffer[lsn - self._buffer_base - 1]
        return None
