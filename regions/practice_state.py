"""Practice runs as control state: schedules, run requests and approvals, the calendar of what
ran or was skipped and why, operator alerts, the approval policy and the keys' blast radius.
Pure.

One record type, ``control.practice`` (``regions.ops_state.PRACTICE_RECORD``), ``{"op": ...}``:

* ``schedule.put`` ``{schedule}`` / ``schedule.delete`` ``{schedule_id}``;
* ``run.request`` ``{run}``: a run that waits for a second operator (``awaiting_approval``);
* ``run.approve`` ``{run_id, approved_by, at_ms}``: refused by the fold when the approver is
  the requester (the API refuses it first, 403);
* ``decision`` ``{schedule_id, run_id, at_ms, outcome, reason, drill_id}``: one calendar entry,
  ``outcome`` ``ran``, ``skipped`` or ``awaiting_approval``; a ``ran`` or ``skipped`` one also
  closes its run;
* ``alert.set`` ``{name, firing, reason, by, at_ms}``: an operator-set alert (a firing one
  blocks every start);
* ``policy.set`` ``{regions, kinds}``: drills of these need approval;
* ``scope.set`` ``{key_name, regions, kinds}`` (null lists: any) / ``scope.delete``.

A record may carry its audit entry under ``"audit"``; ``regions.ops_state`` folds it into the
audit log. Records come from the log: a malformed one is counted and skipped.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from eventlog.model import LogEntry
from regions.drill_kinds import DrillKind
from regions.drills import Guards
from regions.ops_state import PRACTICE_RECORD
from regions.practice import History, Schedule, Scope, guards_of

RunStatus = Literal["awaiting_approval", "approved", "ran", "skipped"]
Outcome = Literal["ran", "skipped", "awaiting_approval"]
SCHEDULES_MAX = 100
#: calendar entries kept (the newest)
CALENDAR_KEPT_MAX = 1000
RUNS_KEPT_MAX = 200
ALERTS_MAX = 100
SCOPES_MAX = 10_000
log = logging.getLogger("convplane.practice")
_MALFORMED = (ValueError, KeyError, TypeError, AttributeError, OverflowError)


@dataclass(frozen=True, slots=True)
class Run:
    """One practice run: of a schedule or asked for by hand, waiting for approval or closed."""

    run_id: str
    schedule_id: str | None
    kind: DrillKind
    region: str
    hold_s: float
    reason: str
    requested_by: str
    requested_at_ms: int
    status: RunStatus = "awaiting_approval"
    approved_by: str | None = None
    approved_at_ms: int | None = None
    drill_id: str | None = None
    #: its drill's stop conditions (its schedule's, or asked for with it)
    guards: Guards = field(default_factory=Guards)

    def to_body(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "schedule_id": self.schedule_id,
            "kind": self.kind,
            "region": self.region,
            "hold_s": self.hold_s,
            "reason": self.reason,
            "requested_by": self.requested_by,
            "requested_at_ms": self.requested_at_ms,
            "status": self.status,
            "approved_by": self.approved_by,
            "approved_at_ms": self.approved_at_ms,
            "drill_id": self.drill_id,
            "guards": self.guards.to_body(),
        }

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Run:
        schedule_id = body.get("schedule_id")
        return cls(
            run_id=str(body["run_id"]),
            schedule_id=None if schedule_id is None else str(schedule_id),
            kind=cast(DrillKind, str(body["kind"])),
            region=str(body["region"]),
            hold_s=float(body["hold_s"]),
            reason=str(body["reason"]),
            requested_by=str(body["requested_by"]),
            requested_at_ms=int(body["requested_at_ms"]),
            guards=guards_of(body.get("guards")),
        )


@dataclass(frozen=True, slots=True)
class CalendarEntry:
    lsn: int
    schedule_id: str | None
    run_id: str | None
    at_ms: int
    outcome: Outcome
    reason: str
    drill_id: str | None

    def to_body(self) -> dict[str, Any]:
        return {
            "cursor": self.lsn,
            "schedule_id": self.schedule_id,
            "run_id": self.run_id,
            "at_ms": self.at_ms,
            "outcome": self.outcome,
            "reason": self.reason,
            "drill_id": self.drill_id,
        }


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    firing: bool
    reason: str
    by: str
    at_ms: int

    def to_body(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "firing": self.firing,
            "reason": self.reason,
            "by": self.by,
            "at_ms": self.at_ms,
        }


class PracticeState:
    """What the control shard's ``control.practice`` records say, folded in lsn order."""

    def __init__(self) -> None:
        self.schedules: dict[str, Schedule] = {}
        self.runs: OrderedDict[str, Run] = OrderedDict()
        self.calendar: deque[CalendarEntry] = deque(maxlen=CALENDAR_KEPT_MAX)
        self.alerts: dict[str, Alert] = {}
        self.approval_policy = Scope(frozenset(), frozenset())
        self.scopes: dict[str, Scope] = {}
        #: per schedule: the last start and the last skip (ms)
        self._last_start_ms: dict[str, int] = {}
        self._last_skip_ms: dict[str, int] = {}
        self.applied_lsn = 0
        self.malformed_records = 0

    def apply_entry(self, entry: LogEntry, placement_applied: bool) -> None:
        """A ``Controller.record_listeners`` hook."""
        self.apply(entry.lsn, entry.event_type, entry.body)

    def apply(self, lsn: int, record_type: str, body_text: str) -> None:
        if lsn <= self.applied_lsn:
            return
        self.applied_lsn = lsn
        if record_type != PRACTICE_RECORD:
            return
        try:
            body = json.loads(body_text)
            self._apply(lsn, str(body["op"]), body)
        except _MALFORMED as exc:
            self.malformed_records += 1
            log.warning("practice record %d is malformed, skipped: %r", lsn, exc)

    def _apply(self, lsn: int, op: str, body: Mapping[str, Any]) -> None:
        if op == "schedule.put":
            schedule = Schedule.from_body(body["schedule"])
            if schedule.schedule_id in self.schedules or len(self.schedules) < SCHEDULES_MAX:
                self.schedules[schedule.schedule_id] = schedule
        elif op == "schedule.delete":
            self.schedules.pop(str(body["schedule_id"]), None)
        elif op == "run.request":
            run = Run.from_body(body["run"])
            self.runs.setdefault(run.run_id, run)
            self._forget_old_runs()
        elif op == "run.approve":
            self._approve(str(body["run_id"]), str(body["approved_by"]), int(body["at_ms"]))
        elif op == "decision":
            self._decided(lsn, body)
        elif op == "alert.set":
            alert = Alert(
                str(body["name"]),
                bool(body["firing"]),
                str(body["reason"]),
                str(body["by"]),
                int(body["at_ms"]),
            )
            if alert.name in self.alerts or len(self.alerts) < ALERTS_MAX:
                self.alerts[alert.name] = alert
        elif op == "policy.set":
            self.approval_policy = Scope.from_body(body)
        elif op == "scope.set":
            name = str(body["key_name"])
            if name in self.scopes or len(self.scopes) < SCOPES_MAX:
                self.scopes[name] = Scope.from_body(body)
        elif op == "scope.delete":
            self.scopes.pop(str(body["key_name"]), None)
        else:
            raise ValueError(f"unknown practice op {op!r}")

    def _approve(self, run_id: str, approved_by: str, at_ms: int) -> None:
        run = self.runs.get(run_id)
        if run is None or run.status != "awaiting_approval" or approved_by == run.requested_by:
            return  # a race the leader's check lost, or a record from outside: no effect
        self.runs[run_id] = replace(
            run, status="approved", approved_by=approved_by, approved_at_ms=at_ms
        )

    def _decided(self, lsn: int, body: Mapping[str, Any]) -> None:
        schedule_id = body.get("schedule_id")
        run_id = body.get("run_id")
        drill_id = body.get("drill_id")
        outcome = str(body["outcome"])
        if outcome not in ("ran", "skipped", "awaiting_approval"):
            raise ValueError(f"unknown outcome {outcome!r}")
        entry = CalendarEntry(
            lsn=lsn,
            schedule_id=None if schedule_id is None else str(schedule_id),
            run_id=None if run_id is None else str(run_id),
            at_ms=int(body["at_ms"]),
            outcome=cast(Outcome, outcome),
            reason=str(body["reason"]),
            drill_id=None if drill_id is None else str(drill_id),
        )
        self.calendar.append(entry)
        if entry.schedule_id is not None:
            if entry.outcome == "skipped":
                self._last_skip_ms[entry.schedule_id] = entry.at_ms
            else:  # ran, or asked for approval: the interval counts from either
                self._last_start_ms[entry.schedule_id] = entry.at_ms
        run = self.runs.get(entry.run_id or "")
        if run is not None and entry.outcome in ("ran", "skipped"):
            self.runs[run.run_id] = replace(
                run, status=cast(RunStatus, entry.outcome), drill_id=entry.drill_id
            )

    def _forget_old_runs(self) -> None:
        while len(self.runs) > RUNS_KEPT_MAX:
            oldest = next(
                (r for r in self.runs.values() if r.status in ("ran", "skipped")),
                None,
            )
            if oldest is None:
                return
            del self.runs[oldest.run_id]

    # --- views ----------------------------------------------------------------------------

    def needs_approval(self, region: str, kind: str, schedule: Schedule | None = None) -> bool:
        policy = self.approval_policy
        return (schedule is not None and schedule.needs_approval) or (
            region in (policy.regions or ()) or kind in (policy.kinds or ())
        )

    def scope_of(self, key_name: str) -> Scope:
        return self.scopes.get(key_name, Scope())

    def firing_alerts(self) -> list[Alert]:
        return [a for a in self.alerts.values() if a.firing]

    def open_runs(self, schedule_id: str | None = None) -> list[Run]:
        return [
            r
            for r in self.runs.values()
            if r.status in ("awaiting_approval", "approved")
            and (schedule_id is None or r.schedule_id == schedule_id)
        ]

    def unapproved_past(self, now_ms: int, wait_max_s: float) -> list[Run]:
        """Runs that have awaited approval longer than ``wait_max_s``: the runner closes them
        (a forgotten request must not hold its schedule back for good)."""
        return [
            r
            for r in self.runs.values()
            if r.status == "awaiting_approval" and now_ms - r.requested_at_ms > wait_max_s * 1000
        ]

    def history(self, schedule_id: str, busy: bool) -> History:
        return History(
            last_start_ms=self._last_start_ms.get(schedule_id),
            last_skip_ms=self._last_skip_ms.get(schedule_id),
            busy=busy or bool(self.open_runs(schedule_id)),
        )
