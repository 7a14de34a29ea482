"""The drill state machine (regions.drills) and its records (regions.ops_state), pure.

Time is the test's: every observation names its wall-clock millisecond."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from eventlog.errors import InvalidRequest
from regions.drill_report import percentile, report
from regions.drills import (
    RESTORE_GRACE_S,
    Drill,
    DrillSpec,
    Guards,
    Observation,
    advance,
    request_abort,
    start,
    with_measurements,
)
from regions.ops_state import (
    AUDIT_RECORD,
    DRILL_RECORD,
    HALT_RECORD,
    OpsState,
    audit_body,
)

T0 = 1_767_225_600_000
MOVED = (1, 4, 7)


def spec(**kw: object) -> DrillSpec:
    fields: dict[str, object] = {"kind": "region-loss", "region": "us-east", "hold_s": 10.0,
                                 "reason": "quarterly drill"}  # fmt: skip
    fields.update(kw)
    return DrillSpec(**fields)  # type: ignore[arg-type]


def injected(drill: Drill, at_ms: int) -> Drill:
    following = advance(drill, Observation(now_ms=at_ms, injected=True, shards_moved=MOVED))
    assert following is not None and following.phase == "holding"
    return following


def recovered(drill: Drill, rto_s: float = 1.5) -> Drill:
    m = replace(drill.measurements, rto_s=dict.fromkeys(MOVED, rto_s))
    return replace(drill, measurements=m)


def test_a_drill_runs_through_every_phase_and_passes() -> None:
    drill = start("d1", spec(), T0)
    assert [t[0] for t in drill.timeline] == ["planned", "preflight", "injecting"]
    assert advance(drill, Observation(now_ms=T0 + 100, injected=False)) is None
    drill = recovered(injected(drill, T0 + 200))
    assert drill.injected_at_ms == T0 + 200 and drill.measurements.shards_moved == MOVED
    assert advance(drill, Observation(now_ms=T0 + 200 + 9_999)) is None  # still holding
    drill_ = advance(drill, Observation(now_ms=T0 + 200 + 10_000))
    assert drill_ is not None and drill_.phase == "restoring" and drill_.abort_reason is None
    assert advance(drill_, Observation(now_ms=T0 + 11_000, restored=False)) is None
    assert advance(drill_, Observation(now_ms=T0 + 11_000, restored=True)) is None  # no read-back
    done = advance(drill_, Observation(now_ms=T0 + 12_000, restored=True, canary_lost=0))
    assert done is not None
    assert (done.phase, done.verdict, done.ended_at_ms) == ("done", "passed", T0 + 12_000)
    assert [t[0] for t in done.timeline][-3:] == ["holding", "restoring", "done"]
    assert done.rev == drill.rev + 2  # every record names the revision it follows
    assert advance(done, Observation(now_ms=T0 + 13_000, halt_on=True)) is None


def test_region_loss_counts_rto_from_the_injecting_record() -> None:
    drill = start("d1", spec(), T0)
    obs = Observation(now_ms=T0 + 300, injected=True, injected_at_ms=T0, shards_moved=MOVED)
    following = advance(drill, obs)
    assert following is not None and following.injected_at_ms == T0


def test_a_moved_shard_not_writable_within_max_rto_aborts() -> None:
    drill = injected(start("d1", spec(guards=Guards(max_rto_s=3.0)), T0), T0)
    partly = replace(drill, measurements=replace(drill.measurements, rto_s={1: 1.0, 4: 2.0}))
    assert advance(partly, Observation(now_ms=T0 + 3_000)) is None
    tripped = advance(partly, Observation(now_ms=T0 + 3_001))
    assert tripped is not None and tripped.phase == "restoring"
    assert tripped.abort_reason == "guard tripped: max_rto_s"
    assert [(g.guard, g.limit) for g in tripped.guards_tripped] == [("max_rto_s", 3.0)]
    ended = advance(tripped, Observation(now_ms=T0 + 5_000, restored=True, canary_lost=0))
    assert ended is not None and (ended.phase, ended.verdict) == ("aborted", "aborted")
    assert report(ended)["guards_tripped"][0]["measured"] == pytest.approx(3.001)


@pytest.mark.parametrize(
    ("obs", "guard"),
    [
        ({"error_ratio": 0.3}, "max_error_ratio"),
        ({"ack_p99_ms": 2500.0}, "max_ack_p99_ms"),
    ],
)
def test_error_ratio_and_ack_p99_guards_abort(obs: dict[str, float], guard: str) -> None:
    drill = recovered(injected(start("d1", spec(), T0), T0))
    assert (
        advance(drill, Observation(now_ms=T0 + 1_000, error_ratio=0.2, ack_p99_ms=2000.0)) is None
    )
    tripped = advance(drill, Observation(now_ms=T0 + 1_000, **obs))  # type: ignore[arg-type]
    assert tripped is not None and tripped.guards_tripped[0].guard == guard


def test_the_halt_switch_and_an_operator_abort_go_straight_to_restoring() -> None:
    holding = recovered(injected(start("d1", spec(), T0), T0))
    halted = advance(holding, Observation(now_ms=T0 + 500, halt_on=True))
    assert halted is not None and halted.abort_reason == "halt switch on"
    injecting = start("d2", spec(), T0)
    aborted = request_abort(injecting, "sre: stop", T0 + 10)
    assert aborted is not None and aborted.phase == "restoring" and aborted.rev == 2
    assert request_abort(aborted, "again", T0 + 20) is None  # already restoring
    ended = advance(aborted, Observation(now_ms=T0 + 30, restored=True, canary_lost=0))
    assert ended is not None and ended.verdict == "aborted" and ended.verdict_reason == "sre: stop"


def test_a_lost_canary_or_an_overrun_restore_fails_the_drill() -> None:
    restoring = advance(
        recovered(injected(start("d1", spec(), T0), T0)), Observation(now_ms=T0 + 10_000)
    )
    assert restoring is not None
    lost = advance(restoring, Observation(now_ms=T0 + 11_000, restored=True, canary_lost=2))
    assert lost is not None and (lost.phase, lost.verdict) == ("failed", "failed")
    assert "2 acknowledged canary events lost" in lost.verdict_reason
    late_ms = T0 + int((10.0 + RESTORE_GRACE_S) * 1000) + 1
    late = advance(restoring, Observation(now_ms=late_ms, restored=True, canary_lost=0))
    assert late is not None and late.verdict == "failed" and "past hold_s" in late.verdict_reason


def test_a_moved_shard_that_never_recovered_fails_the_drill() -> None:
    holding = injected(start("d1", spec(), T0), T0)
    partly = replace(holding, measurements=replace(holding.measurements, rto_s={1: 1.0}))
    restoring = advance(partly, Observation(now_ms=T0 + 10_000))
    assert restoring is not None
    ended = advance(restoring, Observation(now_ms=T0 + 11_000, restored=True, canary_lost=0))
    assert ended is not None and ended.verdict == "failed"
    assert ended.verdict_reason == "moved shards [4, 7] never took a canary write again"


def test_an_evacuate_restored_before_every_step_is_not_failed_for_shards_that_never_moved() -> None:
    holding = injected(start("d1", spec(kind="evacuate"), T0), T0)
    partly = replace(holding, measurements=replace(holding.measurements, rto_s={1: 0.4}))
    restoring = advance(partly, Observation(now_ms=T0 + 10_000))
    assert restoring is not None
    ended = advance(restoring, Observation(now_ms=T0 + 11_000, restored=True, canary_lost=0))
    assert ended is not None and ended.verdict == "passed"


def test_a_moved_shard_slower_than_max_rto_after_the_hold_fails_the_drill() -> None:
    holding = injected(start("d1", spec(hold_s=2.0, guards=Guards(max_rto_s=5.0)), T0), T0)
    restoring = advance(holding, Observation(now_ms=T0 + 2_000))  # hold over before recovery
    assert restoring is not None and restoring.abort_reason is None
    late = replace(restoring.measurements, rto_s={1: 1.0, 4: 6.5, 7: 2.0})
    ended = advance(
        replace(restoring, measurements=late),
        Observation(now_ms=T0 + 8_000, restored=True, canary_lost=0),
    )
    assert ended is not None and ended.verdict == "failed"
    assert (
        ended.verdict_reason == "moved shards [4] took longer than max_rto_s to take a canary write"
    )


def test_a_fault_that_cannot_be_injected_in_time_is_restored() -> None:
    drill = start("d1", spec(kind="evacuate"), T0)
    late_ms = T0 + int((10.0 + RESTORE_GRACE_S) * 1000)
    following = advance(drill, Observation(now_ms=late_ms, injected=False))
    assert following is not None and following.phase == "restoring"


def test_the_black_hole_covers_only_region_loss_while_injecting_or_holding() -> None:
    drill = start("d1", spec(), T0)
    assert drill.fault_active(T0) and not drill.fault_active(
        T0 + int((10 + RESTORE_GRACE_S) * 1000)
    )
    assert not start("d2", spec(kind="evacuate"), T0).fault_active(T0)
    restoring = request_abort(drill, "stop", T0 + 1)
    assert restoring is not None and not restoring.fault_active(T0 + 2)


@pytest.mark.parametrize(
    "bad",
    [{"hold_s": 0.0}, {"hold_s": 4000.0}, {"reason": " "}, {"kind": "meteor"}],
)
def test_a_bad_spec_is_an_invalid_request(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        spec(**bad)


def test_guards_reject_unknown_names_and_out_of_range_values() -> None:
    assert Guards.from_body({"max_rto_s": 2}).max_rto_s == 2.0
    for body in ({"max_rtt": 1}, {"max_error_ratio": 1.5}, {"max_rto_s": 0}):
        with pytest.raises(InvalidRequest):
            Guards.from_body(body)


# --- records in the control shard --------------------------------------------------------------


def apply(ops: OpsState, record_type: str, body: dict[str, object]) -> bool:
    return ops.apply(ops.applied_lsn + 1, record_type, json.dumps(body))


def test_drill_records_apply_only_on_the_revision_they_follow() -> None:
    ops = OpsState()
    first = start("d1", spec(), T0)
    assert apply(ops, DRILL_RECORD, first.to_body())
    assert not apply(ops, DRILL_RECORD, first.to_body())  # a duplicate: recorded no-op
    progress = with_measurements(first, replace(first.measurements, canary_errors=3))
    stale = with_measurements(first, replace(first.measurements, canary_errors=9))
    assert apply(ops, DRILL_RECORD, progress.to_body())
    assert not apply(ops, DRILL_RECORD, stale.to_body())  # a deposed leader's record
    assert ops.drills["d1"].measurements.canary_errors == 3
    assert ops.stale_records == 2
    assert [d.drill_id for d in ops.active_drills()] == ["d1"]
    assert ops.black_holed(T0 + 1) == frozenset({"us-east"})


def test_a_drill_round_trips_through_its_record_body() -> None:
    drill = recovered(
        injected(start("d1", spec(force=True, requested_by="sre (operator)"), T0), T0)
    )
    assert Drill.from_body(json.loads(json.dumps(drill.to_body()))) == drill


def test_malformed_records_are_skipped_and_counted() -> None:
    ops = OpsState()
    assert not ops.apply(1, DRILL_RECORD, "{not json")
    assert not apply(ops, DRILL_RECORD, {"drill_id": "x", "phase": "exploded"})
    assert not apply(ops, HALT_RECORD, {"on": True})
    assert ops.malformed_records == 3 and not ops.drills and not ops.halt.on
    assert not ops.apply(2, DRILL_RECORD, "{}")  # an lsn already applied: ignored


def test_halt_last_record_wins_and_audit_pages_by_lsn() -> None:
    ops = OpsState()
    apply(ops, HALT_RECORD, {"on": True, "reason": "incident", "by": "sre", "at_ms": T0})
    assert ops.halt.on and ops.halt.reason == "incident"
    apply(ops, HALT_RECORD, {"on": False, "reason": "over", "by": "sre", "at_ms": T0 + 1})
    assert not ops.halt.on
    for i in range(5):
        body = audit_body(at_ms=T0 + i, by="sre", role="operator", action=f"a{i}", target="r",
                          reason="x" * 900)  # fmt: skip
        apply(ops, AUDIT_RECORD, body)
    page = ops.audit_page(after=0, limit=2)
    assert [e.action for e in page] == ["a0", "a1"] and len(page[0].reason) == 500
    assert [e.action for e in ops.audit_page(after=page[-1].lsn, limit=10)] == ["a2", "a3", "a4"]


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def test_a_target_that_never_comes_back_fails_the_drill_at_the_deadline() -> None:
    restoring = advance(
        recovered(injected(start("d1", spec(), T0), T0)), Observation(now_ms=T0 + 10_000)
    )
    assert restoring is not None
    deadline_ms = T0 + int((10.0 + RESTORE_GRACE_S) * 1000)
    before = Observation(now_ms=deadline_ms - 1, restored=False, canary_lost=0)
    assert advance(restoring, before) is None  # still waiting for the target
    at = advance(restoring, Observation(now_ms=deadline_ms, restored=False, canary_lost=0))
    assert at is not None and (at.phase, at.verdict) == ("failed", "failed")
    assert at.verdict_reason.startswith("us-east was not back by the deadline")


def test_a_read_back_that_cannot_finish_fails_the_drill_and_an_abort_says_why() -> None:
    holding = recovered(injected(start("d1", spec(), T0), T0))
    deadline_ms = T0 + int((10.0 + RESTORE_GRACE_S) * 1000)
    restoring = advance(holding, Observation(now_ms=T0 + 10_000))
    assert restoring is not None
    failed = advance(restoring, Observation(now_ms=deadline_ms, restored=True,
                                            read_back_failed="TimeoutError()"))  # fmt: skip
    assert failed is not None and failed.verdict == "failed"
    assert failed.measurements.canary_lost is None
    assert "read-back did not finish" in failed.verdict_reason
    aborted = request_abort(holding, "sre: stop", T0 + 20)
    assert aborted is not None
    ended = advance(aborted, Observation(now_ms=deadline_ms, read_back_failed="TimeoutError()"))
    assert ended is not None and ended.verdict == "aborted"
    assert ended.verdict_reason == (
        "sre: stop; us-east was not back by the deadline; TimeoutError()"
    )
