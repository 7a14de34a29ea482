"""In-memory replica: the reference semantics of ``ReplicaStore`` (see eventlog.replica).

Used by the deterministic simulator and unit tests. Every call is "durable" when it returns; a
crash in the simulator makes the replica unreachable, it never loses what it acknowledged.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from eventlog.errors import InvariantViolation
from eventlog.identity import IdentityRecord
from eventlog.model import (
    Accepted,
    AppendReply,
    ConversationSummary,
    HeldPosition,
    IdentityMismatch,
    LogEntry,
    Mismatch,
    PageSnapshot,
    PrepareReply,
    Promised,
    Rejected,
    ShardStatus,
)
from eventlog.replica import ReplicaStore


@dataclass
class _ShardLog:
    promised_epoch: int = 0
    commit_lsn: int = 0
    entries: list[LogEntry] = field(default_factory=list)  # entries[i].lsn == i + 1
    positions: dict[str, HeldPosition] = field(default_factory=dict)

    @property
    def last_lsn(self) -> int:
        return len(self.entries)

    @property
    def last_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else 0

    def status(self) -> ShardStatus:
        return ShardStatus(self.promised_epoch, self.last_lsn, self.last_epoch, self.commit_lsn)


@dataclass(frozen=True)
class PhysicalCopy:
    shards: dict[int, _ShardLog]
    registry: dict[str, IdentityRecord]


def check_append_batch(epoch: int, prev_lsn: int, entries: Sequence[LogEntry]) -> None:
    """The caller's side of the append contract; a violation is a bug in the leader."""
    previous_epoch = 0
    for offset, entry in enumerate(entries, start=1):
        if entry.lsn != prev_lsn + offset or not previous_epoch <= entry.epoch <= epoch:
            raise InvariantViolation(
                f"append batch at epoch {epoch} out of order: entry {entry.lsn}@{entry.epoch} "
                f"after prev_lsn {prev_lsn}"
            )
        previous_epoch = entry.epoch


class MemoryReplica(ReplicaStore):
    def __init__(self, region: str) -> None:
        self.region = region
        self._shards: dict[int, _ShardLog] = {}
        self._incarnation = 1
        self.store_id = f"{region}#1"
        self._registry: dict[str, IdentityRecord] = {}

    def physical_copy(self) -> PhysicalCopy:
        """A copy of the store's files (for tests and the simulator's rollback fault): every
        shard and the registry, as ``restore_physical_copy`` puts them back."""
        return PhysicalCopy(copy.deepcopy(self._shards), dict(self._registry))

    def restore_physical_copy(self, backup: PhysicalCopy) -> None:
        """Put back an older ``physical_copy``: the same identity (the files carry it), an
        older log, older promises and an older registry (a database restored from its own
        backup files)."""
        self._shards = copy.deepcopy(backup.shards)
        self._registry = dict(backup.registry)

    def wipe(self) -> None:
        """Lose everything, as a re-provisioned database does: a new identity, no promises, no
        log, no registry (for tests and the simulator's disk-loss fault)."""
        self._incarnation += 1
        self.store_id = f"{self.region}#{self._incarnation}"
        self._shards.clear()
        self._registry.clear()

    async def identity(self) -> str:
        return self.store_id

    async def registry(self) -> dict[str, IdentityRecord]:
        return dict(self._registry)

    async def record_identity(self, region: str, record: IdentityRecord) -> None:
        held = self._registry.get(region)
        if held is None or held.generation <= record.generation:
            self._registry[region] = record

    def _shard(self, shard: int) -> _ShardLog:
        return self._shards.setdefault(shard, _ShardLog())

    async def prepare(self, shard: int, epoch: int, tail_max: int) -> PrepareReply:
        log = self._shard(shard)
        if epoch <= log.promised_epoch:
            return Rejected(log.promised_epoch)
        log.promised_epoch = epoch
        tail = log.entries[log.commit_lsn : log.commit_lsn + tail_max]
        return Promised(log.status(), tuple(tail), log.commit_lsn + len(tail) >= log.last_lsn)

    async def append(
        self,
        shard: int,
        epoch: int,
        prev_lsn: int,
        prev_epoch: int,
        entries: Sequence[LogEntry],
        leader_commit_lsn: int,
        expected_store_id: str | None = None,
        positions: Mapping[str, HeldPosition] | None = None,
    ) -> AppendReply:
        check_append_batch(epoch, prev_lsn, entries)
        if expected_store_id is not None and expected_store_id != self.store_id:
            return IdentityMismatch()
        log = self._shard(shard)
        if epoch < log.promised_epoch:
            return Rejected(log.promised_epoch)
        log.promised_epoch = epoch
        if prev_lsn > 0 and (
            prev_lsn > log.last_lsn or log.entries[prev_lsn - 1].epoch != prev_epoch
        ):
            return Mismatch(log.last_lsn)
        for entry in entries:
            index = entry.lsn - 1
            if index < len(log.entries):
                if log.entries[index].epoch == entry.epoch:
                    continue
                if entry.lsn <= log.commit_lsn:
                    raise InvariantViolation(
                        f"{self.region}: shard {shard} would truncate committed lsn {entry.lsn}"
                    )
                del log.entries[index:]
            log.entries.append(entry)
        match_lsn = prev_lsn + len(entries)
        log.commit_lsn = max(log.commit_lsn, min(leader_commit_lsn, match_lsn))
        for region, position in (positions or {}).items():
            held = log.positions.get(region)
            if held is None or held < position:
                log.positions[region] = position
        return Accepted(match_lsn)

    async def positions(self, shard: int) -> dict[str, HeldPosition]:
        return dict(self._shard(shard).positions)

    async def status(self, shard: int) -> ShardStatus:
        return self._shard(shard).status()

    async def read_log(self, shard: int, after_lsn: int, limit: int) -> list[LogEntry]:
        log = self._shard(shard)
        return log.entries[max(after_lsn, 0) : max(after_lsn, 0) + limit]

    async def read_conversation(
        self,
        shard: int,
        tenant_id: str,
        conversation_id: str,
        after_seq: int,
        limit: int,
        max_lsn: int,
    ) -> list[LogEntry]:
        log = self._shard(shard)
        found = [
            e
            for e in log.entries[:max_lsn]
            if e.conversation_id == conversation_id
            and e.tenant_id == tenant_id
            and e.seq > after_seq
        ]
        found.sort(key=lambda e: e.seq)
        return found[:limit]

    async def read_page_snapshot(
        self,
        shard: int,
        tenant_id: str,
        conversation_id: str,
        after_seq: int,
        limit: int,
        max_lsn: int,
    ) -> PageSnapshot:
        # one snapshot: nothing below yields to the event loop, so nothing runs in between
        # (a subclass whose reads wait, a gated test replica, waits before the read)
        entries = await self.read_conversation(
            shard, tenant_id, conversation_id, after_seq, limit, max_lsn
        )
        return PageSnapshot(entries, self.store_id, self._shard(shard).status())

    async def list_conversations(
        self, shard: int, active_since_ms: int, max_lsn: int, limit: int
    ) -> list[ConversationSummary]:
        summaries: dict[tuple[str, str], ConversationSummary] = {}
        for e in self._shard(shard).entries[:max_lsn]:
            if not e.conversation_id:
                continue  # leader barriers belong to no conversation
            key = (e.tenant_id, e.conversation_id)
            old = summaries.get(key)
            summaries[key] = ConversationSummary(
                tenant_id=e.tenant_id,
                conversation_id=e.conversation_id,
                last_activity_ms=max(e.created_at_ms, old.last_activity_ms if old else 0),
                token_count=e.token_count + (old.token_count if old else 0),
                last_seq=max(e.seq, old.last_seq if old else 0),
            )
        active = [s for s in summaries.values() if s.last_activity_ms >= active_since_ms]
        active.sort(key=lambda s: (-s.last_activity_ms, s.conversation_id, s.tenant_id))
        return active[:limit]
