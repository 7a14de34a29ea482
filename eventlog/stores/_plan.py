"""The append rule of ``eventlog.replica`` as a pure decision over what a store has read.

A SQL store reads the shard row and the epochs of its entries in ``[prev_lsn, prev_lsn + n]``
(one query), asks ``plan_append`` what to do, and then writes the plan. Keeping the decision pure
means the SQLite adapter carries no protocol logic of its own; the PostgreSQL function in
``eventlog/migrations/versions/0001_replica_schema.py`` spells out the same steps in PL/pgSQL, and
the conformance suite holds both to ``MemoryReplica``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eventlog.errors import InvariantViolation
from eventlog.memory_replica import check_append_batch
from eventlog.model import (
    Accepted,
    AppendReply,
    HeldPosition,
    LogEntry,
    Mismatch,
    Rejected,
    ShardStatus,
)


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """One caller's ``append``: a sub-batch of a group commit."""

    shard: int
    epoch: int
    prev_lsn: int
    prev_epoch: int
    entries: tuple[LogEntry, ...]
    leader_commit_lsn: int
    #: the identity the caller expects the store to have (None: not checked)
    expected_store_id: str | None = None
    #: (region, position) pairs to keep for the shard if the append is accepted
    positions: tuple[tuple[str, HeldPosition], ...] = ()


@dataclass(frozen=True, slots=True)
class AppendPlan:
    """What to write for one request, and the reply once it is durable.

    ``truncate_from_lsn`` (when set) deletes every entry at or after it before ``inserts`` are
    written. ``status`` is the shard row after the plan (always written: a Mismatch still raises
    the promise). ``violation`` is set when the request would truncate a committed entry: the
    caller raises ``InvariantViolation`` with it, after writing only the promise.
    """

    reply: AppendReply
    status: ShardStatus
    truncate_from_lsn: int | None
    inserts: tuple[LogEntry, ...]
    violation: str | None = None


def plan_append(
    current: ShardStatus, epochs_by_lsn: Mapping[int, int], request: AppendRequest
) -> AppendPlan:
    """Decide one append. ``epochs_by_lsn`` holds the stored epochs of (at least) the lsns
    ``prev_lsn .. prev_lsn + len(entries)`` that exist."""
    if request.epoch < current.promised_epoch:
        return AppendPlan(Rejected(current.promised_epoch), current, None, ())
    promised = _with(current, promised_epoch=request.epoch)
    prev_lsn = request.prev_lsn
    if prev_lsn > 0 and (
        prev_lsn > current.last_lsn or epochs_by_lsn.get(prev_lsn) != request.prev_epoch
    ):
        return AppendPlan(Mismatch(current.last_lsn), promised, None, ())
    conflict_lsn = first_conflict_lsn(epochs_by_lsn, request.entries)
    if conflict_lsn is not None and conflict_lsn <= current.commit_lsn:
        violation = f"shard {request.shard} would truncate committed lsn {conflict_lsn}"
        return AppendPlan(Rejected(request.epoch), promised, None, (), violation)
    first_new_lsn = conflict_lsn if conflict_lsn is not None else current.last_lsn + 1
    inserts = tuple(e for e in request.entries if e.lsn >= first_new_lsn)
    match_lsn = prev_lsn + len(request.entries)
    last_lsn, last_epoch = current.last_lsn, current.last_epoch
    if conflict_lsn is not None or match_lsn > last_lsn:  # then the batch is not empty
        last_lsn, last_epoch = match_lsn, request.entries[-1].epoch
    commit_lsn = max(current.commit_lsn, min(request.leader_commit_lsn, match_lsn))
    status = ShardStatus(request.epoch, last_lsn, last_epoch, commit_lsn)
    return AppendPlan(Accepted(match_lsn), status, conflict_lsn, inserts)


def first_conflict_lsn(epochs_by_lsn: Mapping[int, int], entries: Sequence[LogEntry]) -> int | None:
    """The lowest lsn of the batch where the store holds an entry of another epoch."""
    for entry in entries:
        stored = epochs_by_lsn.get(entry.lsn)
        if stored is not None and stored != entry.epoch:
            return entry.lsn
    return None


def check_append_request(request: AppendRequest) -> None:
    """The caller's side of the contract (the reference's own check); a violation is a bug in
    the leader."""
    if request.prev_lsn < 0:
        raise InvariantViolation(f"append with negative prev_lsn {request.prev_lsn}")
    check_append_batch(request.epoch, request.prev_lsn, request.entries)


def check_storable(request: AppendRequest, *, nul_in_columns: bool) -> None:
    """Every text a store writes must be storable (``eventlog.wire_values``): the log core admits
    nothing else, so a failure here is a bug in the caller, caught before the entry can join a
    group commit and fail other shards' appends with it."""
    for entry in request.entries:
        for name in ("tenant_id", "conversation_id", "event_type", "idempotency_key", "attempt_id"):
            text = getattr(entry, name)
            if text is None:
                continue
            if not _encodable(text) or (not nul_in_columns and "\x00" in text):
                raise InvariantViolation(f"shard {request.shard} lsn {entry.lsn}: bad {name}")
        if not _encodable(entry.body):
            raise InvariantViolation(f"shard {request.shard} lsn {entry.lsn}: bad body text")


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _with(status: ShardStatus, *, promised_epoch: int) -> ShardStatus:
    return ShardStatus(promised_epoch, status.last_lsn, status.last_epoch, status.commit_lsn)
