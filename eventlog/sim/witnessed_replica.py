"""An in-memory replica that tells the checker what each of its incarnations accepted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from eventlog.memory_replica import MemoryReplica
from eventlog.model import Accepted, AppendReply, HeldPosition, LogEntry
from eventlog.sim.checker import History


class WitnessedReplica(MemoryReplica):
    """A ``MemoryReplica`` whose accepted appends are reported to ``History.on_accept`` under
    the store identity it had when it accepted them (a wipe gives it a new one), so that the
    checker can hold every counted ack to the store it was counted as."""

    def __init__(self, region: str, history: History) -> None:
        super().__init__(region)
        self._history = history

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
        reply = await super().append(
            shard,
            epoch,
            prev_lsn,
            prev_epoch,
            entries,
            leader_commit_lsn,
            expected_store_id,
            positions,
        )
        # nothing awaits inside MemoryReplica.append: store_id is still the accepting one's
        if isinstance(reply, Accepted):
            self._history.on_accept(self.store_id, shard, epoch, reply.match_lsn)
        return reply
