"""The first two steps of leading a shard, as functions: prepare at a quorum, then find the log
to continue (the most up-to-date log of the prepare quorum, from the commit point on).

``ShardLeader.lead`` calls them; they hold no state of their own. See ``eventlog.leader`` for
the whole protocol and why the recovered tail keeps its stamps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from eventlog.aio import abandon, bounded
from eventlog.config import LogConfig
from eventlog.errors import ConvplaneError, InvariantViolation, NoQuorum
from eventlog.identity import IdentityGuard, IdentityRecord
from eventlog.model import HeldPosition, LogEntry, Promised, Rejected, holds
from eventlog.replica import ReplicaStore


@dataclass(frozen=True, slots=True)
class PrepareRound:
    """The promises of a prepare quorum (None: rejected or too few answered in time) and the
    highest epoch any replica named (the next attempt must go above it)."""

    promises: dict[str, Promised] | None
    highest_seen_epoch: int


@dataclass(frozen=True, slots=True)
class RecoveredLog:
    """Where the new leader's log starts: everything up to ``commit_lsn`` is committed; ``tail``
    holds the entries after it, with their original stamps, as ``source`` holds them."""

    source: str
    commit_lsn: int
    epoch_at_commit: int  # stamp of the entry at commit_lsn (0 when commit_lsn == 0)
    tail: tuple[LogEntry, ...]

    @property
    def last_lsn(self) -> int:
        return self.commit_lsn + len(self.tail)


async def prepare_round(
    shard: int,
    epoch: int,
    replicas: Mapping[str, ReplicaStore],
    config: LogConfig,
    timeout_s: float,
    counts: Callable[[str], bool] = lambda region: True,
    awaited: Collection[str] = (),
) -> PrepareRound:
    """Send ``prepare(epoch)`` to every replica; return once a prepare quorum of replicas
    that ``counts`` promised and every ``awaited`` replica answered (or its call ended), as
    soon as one replica rejected, or when every call ended. Stragglers are abandoned, not
    awaited (a cut-off replica may take long to cancel), and late promises are harmless: a
    promise only makes a replica reject lower epochs.

    ``awaited``: the replicas the node can reach. A leader recovers from every promise it
    gets, not only the first quorum's: the old leader's own store holds what it acked last,
    and a quorum of two others may not (one lagging, one restored from an older copy of
    itself, whose loss the other stores may not have learnt yet)."""
    needed = config.prepare_quorum(len(replicas))
    calls = {
        asyncio.ensure_future(
            bounded(store.prepare(shard, epoch, config.prepare_tail_max), timeout_s)
        ): region
        for region, store in replicas.items()
    }
    promises: dict[str, Promised] = {}
    highest_seen = epoch
    rejected = False
    pending = set(calls)
    try:
        while (
            pending
            and not rejected
            and (len(promises) < needed or any(calls[c] in awaited for c in pending))
        ):
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for call in [c for c in calls if c in done]:  # deterministic order
                reply = _result_or_none(call)
                if isinstance(reply, Promised) and counts(calls[call]):
                    promises[calls[call]] = reply
                elif isinstance(reply, Rejected):
                    highest_seen = max(highest_seen, reply.promised_epoch)
                    rejected = True
    finally:
        for call in pending:
            abandon(call)
    quorum = not rejected and len(promises) >= needed
    return PrepareRound(promises if quorum else None, highest_seen)


async def recover_log(
    shard: int,
    promises: Mapping[str, Promised],
    replicas: Mapping[str, ReplicaStore],
    config: LogConfig,
) -> RecoveredLog:
    """The most up-to-date log of the prepare quorum (highest last epoch, then longest) from the
    highest commit hint on. By log matching it holds every committed entry."""
    commit_lsn = max(p.status.commit_lsn for p in promises.values())
    source = max(
        promises, key=lambda r: (promises[r].status.last_epoch, promises[r].status.last_lsn)
    )
    best = promises[source]
    last_lsn = best.status.last_lsn
    if last_lsn < commit_lsn:
        raise InvariantViolation(
            f"shard {shard}: most up-to-date log ends at {last_lsn} before the commit point "
            f"{commit_lsn}"
        )
    # From the entry at commit_lsn (its stamp is needed for the prev check) to the end.
    tail = [e for e in best.tail if e.lsn >= commit_lsn]
    have_commit_entry = commit_lsn == 0 or (bool(tail) and tail[0].lsn == commit_lsn)
    if not (best.tail_complete and have_commit_entry):
        tail = await read_range(
            shard, source, replicas[source], max(commit_lsn - 1, 0), last_lsn, config
        )
    if [e.lsn for e in tail] != list(range(max(commit_lsn, 1), last_lsn + 1)) or (
        tail and tail[-1].epoch != best.status.last_epoch
    ):
        # The replica changed after its promise: a newer epoch is at work (it truncated or
        # overwrote the log the promise described). An entry read back with the promised
        # stamp at the promised end names the same log (log matching); anything else is not
        # the log this leader was promised, and continuing it would ship a newer epoch's
        # entries under this one. Retry later.
        raise NoQuorum(f"shard {shard}: recovery raced with a newer epoch", retry_after_s=0.5)
    return RecoveredLog(
        source=source,
        commit_lsn=commit_lsn,
        epoch_at_commit=tail[0].epoch if commit_lsn >= 1 else 0,
        tail=tuple(e for e in tail if e.lsn > commit_lsn),
    )


async def read_range(
    shard: int,
    region: str,
    store: ReplicaStore,
    after_lsn: int,
    last_lsn: int,
    config: LogConfig,
) -> list[LogEntry]:
    """Entries (after_lsn, last_lsn] of one replica, in pages; NoQuorum (retryable) when the
    replica does not answer in time or lacks them."""
    found: list[LogEntry] = []
    cursor = after_lsn
    while cursor < last_lsn:
        try:
            page = await bounded(
                store.read_log(shard, cursor, min(config.prepare_tail_max, last_lsn - cursor)),
                config.replica_call_timeout_s,
            )
        except TimeoutError as exc:
            raise NoQuorum(
                f"shard {shard}: reading from {region} timed out", retry_after_s=0.5
            ) from exc
        if not page or page[0].lsn != cursor + 1:
            raise NoQuorum(f"shard {shard}: {region} has no entry {cursor + 1}", retry_after_s=0.5)
        found.extend(page)
        cursor = page[-1].lsn
    return found


def _result_or_none(call: asyncio.Future[Any]) -> object | None:
    """A replica call's reply; a lost call (timeout, unreachable) is None."""
    if call.cancelled():
        return None
    exc = call.exception()
    if exc is None:
        reply: object = call.result()
        return reply
    if isinstance(exc, ConvplaneError | TimeoutError | OSError):
        return None
    raise exc


async def vouched_promises(
    promises: dict[str, Promised] | None,
    replicas: Mapping[str, ReplicaStore],
    identity: IdentityGuard,
    config: LogConfig,
    timeout_s: float,
) -> dict[str, Promised] | None:
    """The promises that may count: each voter's identity is read again *after* it promised
    and must be the one the cluster knows it by (``eventlog.identity``); None when fewer than
    a prepare quorum remain. Ids are never reused, so a store wiped at any moment before the
    re-read cannot pass. A node that does not verify identities (never swept) counts all."""
    if promises is None or not identity.swept:
        return promises
    regions = list(promises)
    found = await asyncio.gather(
        *(bounded(replicas[r].identity(), timeout_s) for r in regions), return_exceptions=True
    )
    vouched = {
        r: promises[r]
        for r, store_id in zip(regions, found, strict=True)
        if isinstance(store_id, str) and identity.vouches_for(r, store_id)
    }
    if len(vouched) < config.prepare_quorum(len(replicas)):
        return None
    return vouched


async def known_positions(
    shard: int,
    replicas: Mapping[str, ReplicaStore],
    asked: list[str],
    timeout_s: float,
) -> dict[str, dict[str, HeldPosition]]:
    """Store region -> the positions it keeps for ``shard`` (``ReplicaStore.positions``), from
    the ``asked`` stores that answer within ``timeout_s``."""
    found = await asyncio.gather(
        *(bounded(replicas[r].positions(shard), timeout_s) for r in asked),
        return_exceptions=True,
    )
    kept: dict[str, dict[str, HeldPosition]] = {}
    for region, reply in zip(asked, found, strict=True):
        if isinstance(reply, BaseException):
            if not isinstance(reply, ConvplaneError | TimeoutError | OSError):
                raise reply  # a bug below us
            continue
        kept[region] = reply
    return kept


def highest_positions(
    kept: Mapping[str, Mapping[str, HeldPosition]], *, about_others_only: bool
) -> dict[str, HeldPosition]:
    """Region -> the highest position any store keeps for it; ``about_others_only``: not
    counting what a store keeps about its own region (restored with it, it proves nothing)."""
    best: dict[str, HeldPosition] = {}
    for store, positions in kept.items():
        for region, position in positions.items():
            if about_others_only and region == store:
                continue
            if region not in best or best[region] < position:
                best[region] = position
    return best


def rolled_back_voters(
    promises: Mapping[str, Promised], known: Mapping[str, HeldPosition]
) -> list[str]:
    """The voters whose logs end below a position other stores keep for them: each lost
    entries it had acknowledged (a store restored from an older copy of itself)."""
    return sorted(
        region
        for region, promise in promises.items()
        if region in known and not holds(promise.status, known[region])
    )


@dataclass(frozen=True, slots=True)
class RolledBackCheck:
    """The promises that may count (None: fewer than a prepare quorum), the highest
    positions known per region (the new leader's to keep raising), the voters dropped."""

    promises: dict[str, Promised] | None
    positions: dict[str, HeldPosition]
    rolled_back: list[str]


async def drop_rolled_back(
    shard: int,
    epoch: int,
    promises: dict[str, Promised],
    replicas: Mapping[str, ReplicaStore],
    identity: IdentityGuard,
    config: LogConfig,
    reachable: list[str],
    timeout_s: float,
) -> RolledBackCheck:
    """Drop the voters whose logs end below a position the other stores keep for them
    (``eventlog.identity``: a store rolled back to an older copy of itself), quarantine each
    on this node and in the other stores' registries. Every ``reachable`` store is asked, not
    only the voters: in the lagging case the only store that knows what the rolled-back voter
    had acknowledged is the old leader's, outside the quorum. Positions of ``epoch`` or later
    are left out: a newer leader's are about acceptances made after these promises."""
    kept = await known_positions(shard, replicas, reachable, timeout_s)
    older = {
        store: {r: p for r, p in positions.items() if p.epoch < epoch}
        for store, positions in kept.items()
    }
    rolled_back = rolled_back_voters(promises, highest_positions(older, about_others_only=True))
    for region in rolled_back:
        record = identity.rolled_back(region)
        if record is not None:
            await _record_identity_elsewhere(replicas, region, record, timeout_s)
    vouched = {r: p for r, p in promises.items() if r not in rolled_back}
    enough = len(vouched) >= config.prepare_quorum(len(replicas))
    return RolledBackCheck(
        vouched if enough else None,
        highest_positions(older, about_others_only=False),
        rolled_back,
    )


async def _record_identity_elsewhere(
    replicas: Mapping[str, ReplicaStore], region: str, record: IdentityRecord, timeout_s: float
) -> None:
    """Write ``region``'s ``record`` to every other store that answers in time (the sweeps
    spread it to the rest)."""
    others = [store for other, store in replicas.items() if other != region]
    found = await asyncio.gather(
        *(bounded(store.record_identity(region, record), timeout_s) for store in others),
        return_exceptions=True,
    )
    for reply in found:
        if isinstance(reply, BaseException) and not isinstance(
            reply, ConvplaneError | TimeoutError | OSError
        ):
            raise reply  # a bug below us
