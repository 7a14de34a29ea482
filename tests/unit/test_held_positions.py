"""Rolled-back stores and refused appends in the identity guard, and the held positions a new
leader compares its voters with (``eventlog.identity``, ``eventlog.recovery``; issue 32)."""

from __future__ import annotations

from eventlog.identity import (
    ROLLED_BACK_PREFIX,
    IdentityGuard,
    IdentityRecord,
    Observation,
    plan_sweep,
)
from eventlog.model import HeldPosition, Promised, ShardStatus, holds
from eventlog.recovery import highest_positions, rolled_back_voters


def swept_guard() -> IdentityGuard:
    guard = IdentityGuard()
    registry = {r: IdentityRecord(f"{r}#1", 2) for r in "abc"}
    guard.apply(plan_sweep({r: Observation(f"{r}#1", registry) for r in "abc"}))
    return guard


def promise(last_epoch: int, last_lsn: int) -> Promised:
    return Promised(ShardStatus(9, last_lsn, last_epoch, 0), (), True)


def test_a_log_holds_a_position_at_or_after_its_stamp() -> None:
    position = HeldPosition(epoch=3, lsn=10)
    assert holds(ShardStatus(4, 10, 3, 0), position)
    assert holds(ShardStatus(4, 12, 3, 0), position)
    assert holds(ShardStatus(5, 8, 4, 0), position)  # a newer leader's entries after it
    assert not holds(ShardStatus(3, 9, 3, 0), position)  # shorter: lost entries
    assert not holds(ShardStatus(3, 30, 2, 0), position)  # longer but an older epoch's log


def test_a_voter_below_what_the_others_keep_for_it_is_rolled_back() -> None:
    kept = {
        "a": {"b": HeldPosition(1, 7), "a": HeldPosition(1, 7)},
        "b": {"b": HeldPosition(1, 2), "c": HeldPosition(1, 2)},  # restored with b
        "c": {"b": HeldPosition(1, 4), "c": HeldPosition(1, 4)},
    }
    others = highest_positions(kept, about_others_only=True)
    # what a store keeps about its own region proves nothing (it is restored with it)
    assert others == {"b": HeldPosition(1, 7), "c": HeldPosition(1, 2)}
    assert highest_positions(kept, about_others_only=False)["c"] == HeldPosition(1, 4)
    promises = {"b": promise(1, 2), "c": promise(1, 7)}
    assert rolled_back_voters(promises, others) == ["b"]
    assert rolled_back_voters({"b": promise(2, 3), "c": promise(1, 7)}, others) == []


def test_a_refused_append_quarantines_until_a_sweep_readmits() -> None:
    guard = swept_guard()
    assert guard.expected_store("c") == "c#1"
    assert guard.refused("c") is True
    assert guard.refused("c") is False  # already quarantined
    assert not guard.counts("c") and not guard.vouches_for("c", "c#1")
    registry = {"a": IdentityRecord("a#1", 2), "b": IdentityRecord("b#1", 2)}
    registry["c"] = IdentityRecord("c#2", 3)  # rebuilt and re-admitted as c#2
    guard.apply(plan_sweep({r: Observation(f"{r}#{1 + (r == 'c')}", registry) for r in "abc"}))
    assert guard.counts("c") and guard.expected_store("c") == "c#2"


def test_a_rolled_back_store_is_quarantined_by_every_later_sweep_until_rebuilt() -> None:
    guard = swept_guard()
    record = guard.rolled_back("b")
    assert record == IdentityRecord(ROLLED_BACK_PREFIX + "b#1", 3)
    assert not guard.counts("b")
    registry = {r: IdentityRecord(f"{r}#1", 2) for r in "ac"} | {"b": record}
    plan = plan_sweep({r: Observation(f"{r}#1", registry) for r in "abc"})
    assert plan.verdicts["b"].state == "quarantined"  # the same identity, still found out
    readmitted = registry | {"b": IdentityRecord("b#1", 4)}  # eventlog.rebuild's record
    plan = plan_sweep({r: Observation(f"{r}#1", readmitted) for r in "abc"})
    assert plan.verdicts["b"].state == "admitted"


def test_a_node_that_never_swept_writes_no_record_for_a_rolled_back_store() -> None:
    guard = IdentityGuard()
    assert guard.rolled_back("b") is None
    assert not guard.counts("b") and not guard.vouches_for("b", "b#1")
