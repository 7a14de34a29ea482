"""The control state machine: failover moves only the failed region's shards; failback waits
for the hysteresis and moves a bounded number of shards per step; evacuate/restore."""

from __future__ import annotations

import json

import pytest

from eventlog.errors import Conflict, InvalidRequest, InvariantViolation
from regions.control import (
    PLACEMENT_RECORD,
    ControlConfig,
    ControlState,
    Placement,
    PlacementDecider,
)
from regions.membership import RegionStatus
from regions.placement import place_shards

WEIGHTS = {"ap-south": 1.0, "eu-west": 1.0, "us-east": 1.0}
SHARDS = 48
UP: dict[str, RegionStatus] = dict.fromkeys(WEIGHTS, "up")


def setup(
    hysteresis_s: float = 60.0, per_step: int = 4, interval_s: float = 1.0
) -> tuple[ControlState, PlacementDecider]:
    state = ControlState(shard_count=SHARDS, regions=WEIGHTS)
    planner = PlacementDecider(
        config=ControlConfig(hysteresis_s, per_step, interval_s), weights=WEIGHTS
    )
    return state, planner


def commit(state: ControlState, placement: Placement | None) -> Placement:
    assert placement is not None
    state.apply(state.applied_lsn + 1, PLACEMENT_RECORD, json.dumps(placement.to_body()))
    assert state.placement == placement
    return placement


def with_status(**changes: RegionStatus) -> dict[str, RegionStatus]:
    return {**UP, **{k.replace("_", "-"): v for k, v in changes.items()}}


def test_initial_placement_is_the_full_rendezvous_placement() -> None:
    state, planner = setup()
    p = commit(state, planner.next_placement(state, 0.0, UP))
    assert p.version == 1 and p.down == frozenset()
    assert dict(p.assignment) == place_shards(SHARDS, WEIGHTS)
    assert planner.next_placement(state, 1.0, UP) is None  # nothing to change


def test_only_the_failed_regions_shards_move() -> None:
    state, planner = setup()
    before = commit(state, planner.next_placement(state, 0.0, UP))
    after = commit(state, planner.next_placement(state, 5.0, with_status(ap_south="down")))
    assert after.version == 2 and after.down == {"ap-south"}
    for shard, region in before.assignment.items():
        if region == "ap-south":
            assert after.assignment[shard] != "ap-south"
        else:
            assert after.assignment[shard] == region
    assert after.shards_of("ap-south") == []


def test_a_merely_suspected_region_keeps_its_shards() -> None:
    state, planner = setup()
    commit(state, planner.next_placement(state, 0.0, UP))
    assert planner.next_placement(state, 5.0, with_status(ap_south="suspected")) is None


def test_failback_waits_for_the_hysteresis_then_moves_bounded_steps() -> None:
    state, planner = setup(hysteresis_s=60.0, per_step=4, interval_s=1.0)
    full = commit(state, planner.next_placement(state, 0.0, UP))
    commit(state, planner.next_placement(state, 1.0, with_status(ap_south="down")))
    owed = len(full.shards_of("ap-south"))
    assert owed > 8
    # up again at t=10, then flapping at t=30 restarts the clock
    assert planner.next_placement(state, 10.0, UP) is None
    assert planner.next_placement(state, 30.0, with_status(ap_south="suspected")) is None
    assert planner.next_placement(state, 31.0, UP) is None
    assert planner.next_placement(state, 90.0, UP) is None  # 59 s healthy: not yet
    t = 91.0
    back = commit(state, planner.next_placement(state, t, UP))
    assert back.down == frozenset()
    assert len(back.shards_of("ap-south")) == 4  # the first step only
    steps = 1
    assert planner.next_placement(state, t + 0.5, UP) is None  # step interval
    while state.effective().assignment != full.assignment:
        t += 1.0
        previous = dict(state.effective().assignment)
        p = commit(state, planner.next_placement(state, t, UP))
        steps += 1
        moved = [s for s in previous if previous[s] != p.assignment[s]]
        assert 1 <= len(moved) <= 4
        assert all(p.assignment[s] == "ap-south" for s in moved)  # only back to ap-south
    assert steps == -(-owed // 4)
    assert planner.next_placement(state, t + 10, UP) is None


def test_evacuate_moves_shards_away_a_step_at_a_time_and_restore_brings_them_back() -> None:
    state, planner = setup(per_step=5, interval_s=1.0)
    full = commit(state, planner.next_placement(state, 0.0, UP))
    first = commit(state, planner.operator(state, "evacuate", "us-east", 1.0, UP))
    assert first.evacuated == {"us-east"}
    owned = len(full.shards_of("us-east"))
    assert len(first.shards_of("us-east")) == owned - 5
    t = 1.0
    while state.effective().shards_of("us-east"):
        t += 1.0
        p = commit(state, planner.next_placement(state, t, UP))
        for shard, region in p.assignment.items():  # nothing moves onto the evacuated region
            assert region != "us-east" or full.assignment[shard] == "us-east"
    restored = commit(state, planner.operator(state, "restore", "us-east", t + 1, UP))
    assert restored.evacuated == frozenset()
    t += 1
    while state.effective().assignment != full.assignment:
        t += 1.0
        commit(state, planner.next_placement(state, t, UP))


def test_restore_of_a_down_region_that_is_up_skips_the_hysteresis() -> None:
    state, planner = setup(hysteresis_s=60.0)
    commit(state, planner.next_placement(state, 0.0, UP))
    commit(state, planner.next_placement(state, 1.0, with_status(eu_west="down")))
    p = commit(state, planner.operator(state, "restore", "eu-west", 2.0, UP))
    assert p.down == frozenset() and p.shards_of("eu-west")


def test_evacuating_every_region_is_refused() -> None:
    state, planner = setup()
    commit(state, planner.next_placement(state, 0.0, UP))
    commit(state, planner.operator(state, "evacuate", "us-east", 1.0, UP))
    commit(state, planner.operator(state, "evacuate", "eu-west", 2.0, UP))
    with pytest.raises(Conflict):  # 409: refused for the state it is in, not for its shape
        planner.operator(state, "evacuate", "ap-south", 3.0, UP)
    with pytest.raises(InvalidRequest):
        planner.operator(state, "evacuate", "nowhere", 3.0, UP)


def test_no_placement_when_every_region_is_down() -> None:
    state, planner = setup()
    commit(state, planner.next_placement(state, 0.0, UP))
    all_down: dict[str, RegionStatus] = dict.fromkeys(WEIGHTS, "down")
    assert planner.next_placement(state, 1.0, all_down) is None


def test_stale_duplicate_and_malformed_records_apply_as_recorded_no_ops() -> None:
    """A retried proposal that also committed (same version twice), a record that skips a
    version, and records that are not valid placements never crash a learner: each is a
    recorded no-op, and the next valid record still applies (the control log of bug 1)."""
    state, planner = setup()
    first = planner.next_placement(state, 0.0, UP)
    assert first is not None and first.to_body()["supersedes"] == 0
    assert state.apply(1, "shard.leader_started", "{}") is False
    assert state.apply(2, PLACEMENT_RECORD, json.dumps(first.to_body())) is True
    duplicate = {**first.to_body(), "reason": "the same proposal, retried after NoQuorum"}
    assert state.apply(3, PLACEMENT_RECORD, json.dumps(duplicate)) is False
    gap = {**first.to_body(), "version": 3, "supersedes": 2}
    assert state.apply(4, PLACEMENT_RECORD, json.dumps(gap)) is False
    for lsn, text in enumerate(
        [
            "not json",
            json.dumps({"version": "2"}),
            json.dumps({**first.to_body(), "version": 2, "supersedes": 1, "assignment": {}}),
            json.dumps({**first.to_body(), "version": 2, "supersedes": 1, "down": ["mars"]}),
        ],
        start=5,
    ):
        assert state.apply(lsn, PLACEMENT_RECORD, text) is False
    assert state.version == 1 and state.placement == first
    assert state.skipped_records == 6
    assert "supersedes v0, not v1" in state.last_skipped[0][1]
    following = planner.operator(state, "evacuate", "us-east", 1.0, UP)
    assert following.version == 2
    assert state.apply(9, PLACEMENT_RECORD, json.dumps(following.to_body())) is True
    with pytest.raises(InvariantViolation):  # our own learner applying out of order is a bug
        state.apply(9, PLACEMENT_RECORD, json.dumps(following.to_body()))
