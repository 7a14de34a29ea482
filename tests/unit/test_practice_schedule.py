"""The practice-run decision (``regions.practice.decide``) and its durable fold
(``regions.practice_state``): windows, blocked dates, the minimum interval, the seeded chance,
blocking conditions, approvals and blast radius."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

import pytest

from eventlog.errors import InvalidRequest
from regions.drills import Guards
from regions.ops_state import AUDIT_KEY, PRACTICE_RECORD, OpsState
from regions.practice import (
    Conditions,
    History,
    Schedule,
    Scope,
    Window,
    decide,
    window_draw,
)
from regions.practice_state import PracticeState

SEED = 7
#: Monday 2026-12-07 10:00 UTC
MONDAY_10 = int(datetime(2026, 12, 7, 10, 0, tzinfo=UTC).timestamp() * 1000)
MINUTE_MS = 60_000


def _schedule(**changes: object) -> Schedule:
    body: dict[str, object] = {
        "schedule_id": "weekly-eu",
        "region": "eu-west",
        "kind": "region-loss",
        "windows": ["mon 09:00-12:00"],
        "hold_s": 5.0,
        "min_interval_s": 3600.0,
        "retry_after_skip_s": 60.0,
        **changes,
    }
    return Schedule.from_body(body)


def test_a_window_reads_and_writes_its_text() -> None:
    window = Window.parse("Tue 22:30-24:00")
    assert (window.weekday, window.start_minute, window.end_minute) == (1, 1350, 1440)
    assert window.text() == "tue 22:30-24:00"
    for bad in ("tue 10:00-09:00", "mon 9:00-10:00", "xyz 01:00-02:00", "mon 10:61-11:00"):
        with pytest.raises(InvalidRequest):
            Window.parse(bad)


def test_a_schedule_starts_inside_its_window_and_waits_outside() -> None:
    schedule = _schedule()
    inside = decide(schedule, MONDAY_10, History(), Conditions(), SEED)
    assert inside.action == "start"
    assert inside.occurrence_ms == MONDAY_10 - 60 * MINUTE_MS
    before = decide(schedule, MONDAY_10 - 61 * MINUTE_MS, History(), Conditions(), SEED)
    assert before.action == "wait"
    after = decide(schedule, MONDAY_10 + 2 * 60 * MINUTE_MS, History(), Conditions(), SEED)
    assert (after.action, after.reason) == ("wait", "outside every window")
    tuesday = decide(schedule, MONDAY_10 + 24 * 60 * MINUTE_MS, History(), Conditions(), SEED)
    assert tuesday.action == "wait"


def test_a_blocked_date_a_disabled_schedule_and_a_busy_one_wait() -> None:
    blocked = _schedule(blocked_dates=["2026-12-07"])
    assert decide(blocked, MONDAY_10, History(), Conditions(), SEED).reason == (
        "blocked date 2026-12-07"
    )
    assert blocked.blocked_dates == frozenset({date(2026, 12, 7)})
    disabled = _schedule(enabled=False)
    assert decide(disabled, MONDAY_10, History(), Conditions(), SEED).action == "wait"
    busy = decide(_schedule(), MONDAY_10, History(busy=True), Conditions(), SEED)
    assert busy.action == "wait"


def test_the_minimum_interval_counts_from_the_last_start() -> None:
    schedule = _schedule(min_interval_s=1800.0)
    recent = History(last_start_ms=MONDAY_10 - 29 * MINUTE_MS)
    assert decide(schedule, MONDAY_10, recent, Conditions(), SEED).reason == (
        "minimum interval since the last run"
    )
    older = History(last_start_ms=MONDAY_10 - 31 * MINUTE_MS)
    assert decide(schedule, MONDAY_10, older, Conditions(), SEED).action == "start"


def test_a_blocking_condition_skips_with_its_reason_then_waits_until_the_retry() -> None:
    schedule = _schedule()
    blocked = Conditions(("alert 'pager' firing: error rate",))
    first = decide(schedule, MONDAY_10, History(), blocked, SEED)
    assert (first.action, first.reason) == ("skip", "blocked: alert 'pager' firing: error rate")
    just_skipped = History(last_skip_ms=MONDAY_10)
    assert decide(schedule, MONDAY_10 + 59_000, just_skipped, blocked, SEED).action == "wait"
    assert decide(schedule, MONDAY_10 + 60_000, just_skipped, blocked, SEED).action == "skip"
    cleared = decide(schedule, MONDAY_10 + 1_000, just_skipped, Conditions(), SEED)
    assert cleared.action == "start"


def test_the_chance_is_drawn_once_per_window_occurrence_and_is_seeded() -> None:
    occurrence = MONDAY_10 - 60 * MINUTE_MS
    draw = window_draw(SEED, "weekly-eu", occurrence)
    assert draw == window_draw(SEED, "weekly-eu", occurrence)
    assert 0 <= draw < 1
    never = _schedule(chance=0.0)
    skipped = decide(never, MONDAY_10, History(), Conditions(), SEED)
    assert skipped.action == "skip" and skipped.reason.startswith("window not drawn")
    # recorded once: later in the same occurrence it waits, the next occurrence skips again
    after_skip = History(last_skip_ms=MONDAY_10)
    assert decide(never, MONDAY_10 + 90 * MINUTE_MS, after_skip, Conditions(), SEED).action == (
        "wait"
    )
    next_week = MONDAY_10 + 7 * 24 * 60 * MINUTE_MS
    assert decide(never, next_week, after_skip, Conditions(), SEED).action == "skip"
    just_above = _schedule(chance=min(1.0, draw + 1e-9))
    assert decide(just_above, MONDAY_10, History(), Conditions(), SEED).action == "start"
    just_below = _schedule(chance=draw)
    assert decide(just_below, MONDAY_10, History(), Conditions(), SEED).action == "skip"


def test_a_schedule_refuses_what_it_cannot_run() -> None:
    bads: list[dict[str, object]] = [
        {"windows": []},
        {"kind": "meteor"},
        {"chance": 1.5},
        {"min_interval_s": 0.5},
        {"hold_s": 0},
        {"schedule_id": "Has Spaces"},
        {"blocked_dates": ["2026-13-01"]},
    ]
    for bad in bads:
        with pytest.raises(InvalidRequest):
            _schedule(**bad)


def test_a_scope_allows_only_its_regions_and_kinds() -> None:
    scope = Scope.from_body({"regions": ["eu-west"], "kinds": None})
    assert scope.allows("eu-west", "kill") and not scope.allows("us-east", "evacuate")
    assert Scope().allows("anything", "kill")
    with pytest.raises(InvalidRequest):
        Scope.from_body({"kinds": ["meteor"]})


def _record(state: PracticeState, ops: OpsState, lsn: int, body: dict[str, object]) -> None:
    text = json.dumps(body)
    state.apply(lsn, PRACTICE_RECORD, text)
    ops.apply(lsn, PRACTICE_RECORD, text)


def test_the_fold_keeps_the_calendar_runs_approvals_and_their_audit_entries() -> None:
    state, ops = PracticeState(), OpsState()
    audit = {"at_ms": 1, "by": "alice", "role": "operator", "action": "practice.request",
             "target": "eu-west", "reason": "r"}  # fmt: skip
    _record(state, ops, 1, {"op": "schedule.put", "schedule": _schedule().to_body()})
    run = {"run_id": "r1", "schedule_id": "weekly-eu", "kind": "region-loss",
           "region": "eu-west", "hold_s": 5.0, "reason": "practice", "requested_by": "alice",
           "requested_at_ms": MONDAY_10}  # fmt: skip
    _record(state, ops, 2, {"op": "run.request", "run": run, AUDIT_KEY: audit})
    _record(state, ops, 3, {"op": "decision", "schedule_id": "weekly-eu", "run_id": "r1",
                            "at_ms": MONDAY_10, "outcome": "awaiting_approval",
                            "reason": "needs approval", "drill_id": None})  # fmt: skip
    assert state.history("weekly-eu", busy=False).busy
    _record(
        state, ops, 4, {"op": "run.approve", "run_id": "r1", "approved_by": "alice", "at_ms": 2}
    )
    assert state.runs["r1"].status == "awaiting_approval"  # the requester cannot approve
    _record(state, ops, 5, {"op": "run.approve", "run_id": "r1", "approved_by": "bob", "at_ms": 3,
                            AUDIT_KEY: {**audit, "by": "bob", "action": "practice.approve"}})  # fmt: skip
    assert (state.runs["r1"].status, state.runs["r1"].approved_by) == ("approved", "bob")
    assert state.unapproved_past(MONDAY_10 + 10**9, 1.0) == []  # approved: not waiting
    _record(state, ops, 6, {"op": "decision", "schedule_id": "weekly-eu", "run_id": "r1",
                            "at_ms": MONDAY_10 + 5, "outcome": "ran", "reason": "approved",
                            "drill_id": "d1"})  # fmt: skip
    ran = state.runs["r1"]
    assert (ran.status, ran.drill_id) == ("ran", "d1")
    history = state.history("weekly-eu", busy=False)
    assert history == History(last_start_ms=MONDAY_10 + 5, last_skip_ms=None, busy=False)
    assert [e.outcome for e in state.calendar] == ["awaiting_approval", "ran"]
    assert [(e.by, e.action) for e in ops.audit] == [
        ("alice", "practice.request"),
        ("bob", "practice.approve"),
    ]
    _record(state, ops, 7, {"op": "nonsense"})
    assert state.malformed_records == 1


def test_a_run_awaiting_approval_too_long_is_found_for_closing() -> None:
    state, ops = PracticeState(), OpsState()
    run = {"run_id": "r2", "schedule_id": None, "kind": "kill", "region": "eu-west",
           "hold_s": 5.0, "reason": "r", "requested_by": "alice",
           "requested_at_ms": MONDAY_10}  # fmt: skip
    _record(state, ops, 1, {"op": "run.request", "run": run})
    assert state.unapproved_past(MONDAY_10 + 60_000, 60.0) == []
    assert [r.run_id for r in state.unapproved_past(MONDAY_10 + 60_001, 60.0)] == ["r2"]
    _record(state, ops, 2, {"op": "decision", "schedule_id": None, "run_id": "r2",
                            "at_ms": MONDAY_10 + 60_001, "outcome": "skipped",
                            "reason": "not approved", "drill_id": None})  # fmt: skip
    assert state.unapproved_past(MONDAY_10 + 60_001, 60.0) == []
    assert state.runs["r2"].status == "skipped"


def test_the_approval_policy_and_scopes_fold() -> None:
    state, ops = PracticeState(), OpsState()
    assert not state.needs_approval("eu-west", "kill")
    _record(state, ops, 1, {"op": "policy.set", "regions": ["eu-west"], "kinds": ["kill"]})
    assert state.needs_approval("eu-west", "evacuate")
    assert state.needs_approval("us-east", "kill")
    assert not state.needs_approval("us-east", "evacuate")
    assert state.needs_approval("us-east", "evacuate", _schedule(needs_approval=True))
    _record(state, ops, 2, {"op": "scope.set", "key_name": "ops-eu", "regions": ["eu-west"],
                            "kinds": None})  # fmt: skip
    assert not state.scope_of("ops-eu").allows("us-east", "kill")
    assert state.scope_of("someone-else").allows("us-east", "kill")
    _record(state, ops, 3, {"op": "scope.delete", "key_name": "ops-eu"})
    assert state.scope_of("ops-eu").allows("us-east", "kill")
    _record(state, ops, 4, {"op": "alert.set", "name": "pager", "firing": True,
                            "reason": "5xx", "by": "alice", "at_ms": 1})  # fmt: skip
    assert [a.name for a in state.firing_alerts()] == ["pager"]


def test_a_schedule_and_its_runs_carry_their_drills_guards_and_old_records_take_the_defaults() -> (
    None
):
    loose = {"max_rto_s": 60.0, "max_error_ratio": 1.0, "max_ack_p99_ms": 60_000.0}
    schedule = _schedule(guards=loose)
    assert Schedule.from_body(schedule.to_body()).guards == Guards.from_body(loose)
    assert _schedule().guards == Guards()  # a record from before schedules carried guards
    with pytest.raises(ValueError, match="max_rto_s"):
        _schedule(guards={"max_rto_s": 0})
    state, ops = PracticeState(), OpsState()
    run = {"run_id": "r1", "schedule_id": "weekly-eu", "kind": "region-loss",
           "region": "eu-west", "hold_s": 5.0, "reason": "practice", "requested_by": "alice",
           "requested_at_ms": MONDAY_10, "guards": loose}  # fmt: skip
    _record(state, ops, 1, {"op": "run.request", "run": run})
    assert state.runs["r1"].guards == Guards.from_body(loose)
    assert state.runs["r1"].to_body()["guards"] == loose
    _record(state, ops, 2, {"op": "run.request", "run": {**run, "run_id": "r2", "guards": None}})
    assert state.runs["r2"].guards == Guards()
