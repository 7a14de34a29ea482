"""Values of the log: entries, replica replies, event types. Plain frozen dataclasses, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# Event types a chat application may append.
EVENT_TYPES: Final = (
    "message.user",
    "message.assistant",
    "message.system",
    "message.tool",  # a tool result as the engine sees it (replay.chat)
    "prompt.settings",  # tools, chat template and kwargs of the prompt (replay.chat)
    "tool.attempt",
    "tool.effect",
    "note",
)
# The first entry of every conversation (seq 0); written by POST /v1/conversations.
CONVERSATION_CREATED: Final = "conversation.created"
# Written by every new shard leader after the recovered tail (Raft's no-op); belongs to no
# conversation (conversation_id ""). Readers of conversations never see it.
LEADER_BARRIER: Final = "shard.leader_started"


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One position of a shard's log.

    ``(epoch, lsn)`` is assigned exactly once by the leader of ``epoch``; two replicas that hold an
    entry with the same ``(epoch, lsn)`` hold the same entry and the same log before it (log
    matching). ``body`` is the JSON text of the whole event record; the other fields are copies of
    what stores index.
    """

    lsn: int
    epoch: int
    tenant_id: str
    conversation_id: str
    seq: int  # 0 for conversation.created, then 1, 2, 3, ... gapless per conversation
    event_type: str
    idempotency_key: str | None
    attempt_id: str | None  # set for tool.attempt and tool.effect
    token_count: int
    created_at_ms: int  # leader's wall clock when it assigned the entry
    body: str


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """What a replica knows of one shard."""

    promised_epoch: int
    last_lsn: int
    last_epoch: int
    commit_lsn: int  # highest lsn this replica knows to be committed (a hint, piggybacked)


@dataclass(frozen=True, slots=True)
class PageSnapshot:
    """A page of a conversation's entries with what its store said of itself as of the same
    read (``ReplicaStore.read_page_snapshot``): its identity and the shard's status."""

    entries: list[LogEntry]
    store_id: str
    status: ShardStatus


@dataclass(frozen=True, slots=True, order=True)
class HeldPosition:
    """A region's replica is known to hold a shard's committed log through ``lsn``, whose
    entry is stamped ``epoch`` (a leader of ``epoch`` saw it accept that far, and that far
    was committed). Such a log never shrinks: a later log holds the entry and only entries of
    ``epoch`` or later after it, so an honest replica's ``(last_epoch, last_lsn)`` stays at or
    above the position for good. A store that answers below it lost what it acknowledged:
    restored from an older physical copy (``eventlog.identity``). Ordered by (epoch, lsn)."""

    epoch: int
    lsn: int


def holds(status: ShardStatus, position: HeldPosition) -> bool:
    """Whether a replica whose log ends as ``status`` says can still hold ``position``."""
    return (status.last_epoch, status.last_lsn) >= (position.epoch, position.lsn)


# --- replies of a replica -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Promised:
    """The replica promised ``epoch``: it will reject every write with a lower epoch.

    ``tail`` holds the replica's entries after ``status.commit_lsn`` in lsn order, at most
    ``tail_max`` of them; ``tail_complete`` is False when more exist (read them with read_log).
    """

    status: ShardStatus
    tail: tuple[LogEntry, ...]
    tail_complete: bool


@dataclass(frozen=True, slots=True)
class Rejected:
    """The replica has promised ``promised_epoch``, higher than (or equal to) the caller's."""

    promised_epoch: int


@dataclass(frozen=True, slots=True)
class Accepted:
    """The replica durably holds the leader's log up to ``match_lsn`` (inclusive)."""

    match_lsn: int


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The replica has no entry ``(prev_lsn, prev_epoch)``; its log ends at ``last_lsn``."""

    last_lsn: int


@dataclass(frozen=True, slots=True)
class IdentityMismatch:
    """The store is not the one the caller named (``expected_store_id``): it was wiped,
    re-provisioned or replaced since the caller's identity sweep vouched for it. Nothing was
    written, not even the promise: an empty store must never adopt a deposed leader's epoch."""


PrepareReply = Promised | Rejected
AppendReply = Accepted | Rejected | Mismatch | IdentityMismatch


@dataclass(frozen=True, slots=True)
class ConversationSummary:
    """A conversation's activity, for replay planning (computed over committed entries)."""

    tenant_id: str
    conversation_id: str
    last_activity_ms: int
    token_count: int
    last_seq: int


#: what an entry costs in memory besides its body (the object, its ids, key, ints): an estimate
ENTRY_OVERHEAD_BYTES = 400


def entry_size_bytes(entry: LogEntry) -> int:
    """An entry's estimated memory, the unit the leader's byte bounds count in."""
    return ENTRY_OVERHEAD_BYTES + len(entry.body)


def record_entry(lsn: int, epoch: int, event_type: str, body: str, wall_ms: int) -> LogEntry:
    """An entry that belongs to no conversation: a leader barrier or a control record."""
    return LogEntry(
        lsn=lsn,
        epoch=epoch,
        tenant_id="",
        conversation_id="",
        seq=0,
        event_type=event_type,
        idempotency_key=None,
        attempt_id=None,
        token_count=0,
        created_at_ms=wall_ms,
        body=body,
    )


def leader_barrier(lsn: int, epoch: int, region: str, wall_ms: int) -> LogEntry:
    body = f'{{"region": "{region}", "epoch": {epoch}}}'
    return record_entry(lsn, epoch, LEADER_BARRIER, body, wall_ms)
