"""Mutations the simulators' checkers must catch: each takes one defence out of the product."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from eventlog import recovery
from eventlog.leader import ShardLeader
from eventlog.memory_replica import MemoryReplica
from eventlog.model import AppendReply, HeldPosition, LogEntry
from regions.control_succession import ControlSuccession
from services.control.controller import CONTROL_READ_MAX, Controller

#: takes one defence out of the product for the rest of a test
Mutation = Callable[[pytest.MonkeyPatch], None]


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


def control_handoffs_resign_unpublished(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32's bug 3, its handoff rule out (rule 2 of docs/control-shard.md): the control
    leader resigns in favour of its successor after pushing its commit position, whether or not
    the push landed (``publish_commit`` returns at its bound, or at once when every follower is
    suspected), as before the fix."""

    async def resign_anyway(self: Controller, successor: str) -> None:
        await self.node.resign_shard(self.control_shard, publish_commit=True)

    monkeypatch.setattr(Controller, "_hand_over_control", resign_anyway)


def control_fold_applies_unpublished(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 1 of docs/control-shard.md out (issue 32's bug 2): the control leader's fold
    applies every record it has committed, whether or not any replica's commit hint holds it."""

    original = Controller._read_control

    async def unpublished(self: Controller) -> list[LogEntry]:
        shard = self.control_shard
        if not self.node.leads(shard):
            return await original(self)
        return await self.node.read_committed(shard, self.state.applied_lsn, CONTROL_READ_MAX)

    monkeypatch.setattr(Controller, "_read_control", unpublished)


def control_successors_awaited_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 3 of docs/control-shard.md out (the backstop of issue 32's bug 3): a node defers
    the control shard to the region its rule names however long that region does not lead."""
    monkeypatch.setattr(ControlSuccession, "observe", lambda self, *args: None)


def commits_wake_no_followers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32 bug 4's wake out: a leader that raises a replica's held position at a commit no
    longer wakes the followers, so the commit hint reaches the replicas after the push linger
    (``LogConfig.records_commit_push_delay_s``) instead of at once. The wake publishes every
    control record before its leader can act on it, which masks rules 1 and 2."""

    def note_position_quietly(self: ShardLeader, follower: Any) -> None:
        held = min(follower.match_lsn, self.commit_lsn)
        if held < self._barrier_lsn or not self._counts(follower.region):
            return
        position = HeldPosition(self.epoch, held)
        known = self._positions.get(follower.region)
        if known is None or known < position:
            self._positions[follower.region] = position

    monkeypatch.setattr(ShardLeader, "_note_position", note_position_quietly)


def rolled_back_stores_vote(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32's bug 4 back: a new leader no longer drops the voters whose logs end below a
    position the other stores keep for them (``eventlog.recovery.rolled_back_voters``), so a
    store rolled back to an older copy of itself votes with its old identity."""
    monkeypatch.setattr(recovery, "rolled_back_voters", lambda promises, known: [])
