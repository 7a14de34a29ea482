"""Mutations the simulators' checkers must catch: each takes one defence out of the product."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from eventlog.memory_replica import MemoryReplica
from eventlog.model import AppendReply, HeldPosition, LogEntry


def stores_ignore_the_identity_appends_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32's bug 1 back, alone: a store accepts an append that names another store (a wiped
    one adopts the deposed leader's epoch and is refilled under the old name). Every other
    defence against wiped stores (the identity sweep, the prepare's vouching, the leader
    noticing lost entries) stays."""
    original = MemoryReplica.append

    async def ignoring_identity(
        self: MemoryReplica,
        shard: int,
        epoch: int,
        prev_lsn: int,
        prev_epoch: int,
        entries: Sequence[LogEntry],
        leader_commit_lsn: int,
        expected_store_id: str | None = None,
        positions: Mapping[str, HeldPosition] | None = None,
    ) -> AppendReply:
        return await original(
            self, shard, epoch, prev_lsn, prev_epoch, entries, leader_commit_lsn, None, positions
        )

    monkeypatch.setattr(MemoryReplica, "append", ignoring_identity)


def counted_ack_violations(violations: list[str]) -> list[str]:
    return [v for v in violations if v.startswith("ack from another store")]
