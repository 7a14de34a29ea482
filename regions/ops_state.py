"""Operator state in the control shard: drills, the halt switch, API keys and the audit log. Pure.

Five record kinds live beside ``control.placement`` in the control shard and are folded here in
lsn order by every node (``services.control.controller`` hands each committed control entry to
``OpsState.apply``):

* ``control.drill``: a whole drill (``regions.drills.Drill``). It applies only on top of the
  revision it names as its predecessor (``rev - 1``; ``rev == 1`` for a new drill), so a stale
  or duplicate record (a deposed control leader's, a retried append's) is a recorded no-op.
* ``control.halt``: ``{"on": bool, "reason", "by", "at_ms"}``; the last one wins.
* ``control.key``: an API key created, rotated or revoked (``regions.keys``), folded into
  ``keys``, which every node's authentication reads.
* ``control.practice``: practice runs' state, folded by ``regions.practice_state``; here only
  the audit entry it carries counts.
* ``control.audit``: ``{"at_ms", "by", "role", "action", "target", "reason", "detail"}``, one per
  operator action that changes no state record (``POST /v1/audit``, an abort of a drill that
  is already restoring); the entry's lsn is its cursor for paging.

An operator action that changes state is audited *inside* the record that makes the change: a
``control.drill``, ``control.halt``, ``control.key`` or ``control.placement`` record may carry the action's audit
entry under ``"audit"``. The change and its audit entry then commit together or not at all (as
two appends, a failure between them left either a change nobody audited or an audit entry for a
change that never happened), and the entry counts only when its record takes effect: a stale
drill revision or a placement record the controller skipped carries no audit entry into the log.

Records come from the log, i.e. from outside this process: a malformed one is counted and
skipped, never trusted to uphold an invariant.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eventlog.model import LogEntry
from regions.control import PLACEMENT_RECORD
from regions.drill_kinds import rules_of
from regions.drills import Drill
from regions.keys import KEY_RECORD, KeyTable

DRILL_RECORD = "control.drill"
HALT_RECORD = "control.halt"
AUDIT_RECORD = "control.audit"
#: practice runs' state (``regions.practice_state``); only its audit entries are folded here
PRACTICE_RECORD = "control.practice"
OPS_RECORDS = frozenset({DRILL_RECORD, HALT_RECORD, KEY_RECORD, AUDIT_RECORD, PRACTICE_RECORD})
#: where a state record carries the audit entry of the operator action that wrote it
AUDIT_KEY = "audit"

#: drills kept in memory (the oldest finished ones are forgotten first)
DRILLS_KEPT_MAX = 200
#: audit entries kept in memory, the newest; GET /v1/audit reads older pages from the control
#: shard (``services.control.audit_log``)
AUDIT_KEPT_MAX = 10_000
AUDIT_FIELD_CHARS_MAX = 500
#: an entry's ``detail`` as JSON, at most (a larger one is kept as ``{"truncated": true}``)
AUDIT_DETAIL_BYTES_MAX = 2_000

log = logging.getLogger("convplane.ops")
#: what parsing a record from outside this process may raise (OverflowError: a number such as
#: 1e999, which JSON reads as infinity, made an int)
_MALFORMED = (ValueError, KeyError, TypeError, AttributeError, OverflowError)


@dataclass(frozen=True, slots=True)
class Halt:
    on: bool
    reason: str
    by: str
    at_ms: int

    def to_body(self) -> dict[str, Any]:
        return {"on": self.on, "reason": self.reason, "by": self.by, "at_ms": self.at_ms}


@dataclass(frozen=True, slots=True)
class AuditEntry:
    lsn: int
    at_ms: int
    by: str
    role: str
    action: str
    target: str
    reason: str
    detail: Mapping[str, Any]

    def to_body(self) -> dict[str, Any]:
        return {
            "cursor": self.lsn,
            "at_ms": self.at_ms,
            "by": self.by,
            "role": self.role,
            "action": self.action,
            "target": self.target,
            "reason": self.reason,
            "detail": dict(self.detail),
        }


def audit_body(
    *,
    at_ms: int,
    by: str,
    role: str,
    action: str,
    target: str,
    reason: str,
    detail: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    cut = AUDIT_FIELD_CHARS_MAX
    detail = dict(detail or {})
    if len(json.dumps(detail, separators=(",", ":"))) > AUDIT_DETAIL_BYTES_MAX:
        detail = {"truncated": True}
    return {
        "at_ms": at_ms,
        "by": by[:cut],
        "role": role[:cut],
        "action": action[:cut],
        "target": target[:cut],
        "reason": reason[:cut],
        "detail": detail,
    }


class OpsState:
    """Drills, halt switch and audit log as committed in the control shard."""

    def __init__(self, *, audit_kept_max: int = AUDIT_KEPT_MAX, audit_after: int = 0) -> None:
        """``audit_after``: keep only the audit entries past this cursor (a page's fold)."""
        self.drills: OrderedDict[str, Drill] = OrderedDict()
        self.halt = Halt(on=False, reason="", by="", at_ms=0)
        self.keys = KeyTable()
        self.audit: deque[AuditEntry] = deque(maxlen=audit_kept_max)
        self._audit_after = audit_after
        #: the cursor of the newest entry pushed out of ``audit`` (0: none was)
        self.audit_evicted_through = 0
        self.applied_lsn = 0
        #: records that applied as no-ops (stale revision) or were malformed
        self.stale_records = 0
        self.malformed_records = 0

    def apply_entry(self, entry: LogEntry, placement_applied: bool) -> None:
        """``apply`` for a committed control entry (a ``Controller.record_listeners`` hook,
        told whether the controller applied the entry as the new placement)."""
        self.apply(entry.lsn, entry.event_type, entry.body, placement_applied=placement_applied)

    def apply(
        self, lsn: int, record_type: str, body_text: str, *, placement_applied: bool = False
    ) -> bool:
        """Fold one committed control entry; returns whether it changed anything.
        ``placement_applied``: a ``control.placement`` entry took effect (only the controller's
        ``ControlState`` can tell), so the audit entry it carries counts."""
        if lsn <= self.applied_lsn:
            return False  # already applied (a concurrent learn, a re-read)
        self.applied_lsn = lsn
        if record_type not in OPS_RECORDS | {PLACEMENT_RECORD}:
            return False
        placement = record_type == PLACEMENT_RECORD
        if placement and not placement_applied:
            return False  # the controller skipped it: its audit entry describes no change
        try:
            body = json.loads(body_text)
            if record_type == AUDIT_RECORD:
                return self._apply_audit(lsn, body)
            changed = self._apply_state(record_type, body)
        except _MALFORMED as exc:
            return self._malformed(lsn, record_type, exc)
        if not (changed or placement) or AUDIT_KEY not in body:
            return changed
        try:
            self._apply_audit(lsn, body[AUDIT_KEY])
        except _MALFORMED as exc:
            self._malformed(lsn, f"{record_type}'s audit entry", exc)
        return True

    def _apply_state(self, record_type: str, body: Mapping[str, Any]) -> bool:
        if record_type == DRILL_RECORD:
            return self._apply_drill(Drill.from_body(body))
        if record_type == KEY_RECORD:
            return self.keys.apply(body)
        if record_type == HALT_RECORD:
            self.halt = Halt(
                bool(body["on"]), str(body["reason"]), str(body["by"]), int(body["at_ms"])
            )
            return True
        # a practice record's state is regions.practice_state's; its audit entry counts here
        return record_type == PRACTICE_RECORD

    def _malformed(self, lsn: int, what: str, exc: Exception) -> bool:
        self.malformed_records += 1
        log.warning("control entry %d (%s) is malformed, skipped: %r", lsn, what, exc)
        return False

    def _apply_audit(self, lsn: int, body: Mapping[str, Any]) -> bool:
        if lsn <= self._audit_after:
            return True
        if len(self.audit) == self.audit.maxlen:
            self.audit_evicted_through = self.audit[0].lsn
        self.audit.append(
            AuditEntry(
                lsn=lsn,
                at_ms=int(body["at_ms"]),
                by=str(body["by"]),
                role=str(body["role"]),
                action=str(body["action"]),
                target=str(body["target"]),
                reason=str(body["reason"]),
                detail=dict(body.get("detail") or {}),
            )
        )
        return True

    def _apply_drill(self, drill: Drill) -> bool:
        current = self.drills.get(drill.drill_id)
        expected_rev = 1 if current is None else current.rev + 1
        if drill.rev != expected_rev:
            self.stale_records += 1
            return False
        self.drills[drill.drill_id] = drill
        self._forget_old()
        return True

    def _forget_old(self) -> None:
        while len(self.drills) > DRILLS_KEPT_MAX:
            oldest = next((d for d in self.drills.values() if not d.active), None)
            if oldest is None:
                return
            del self.drills[oldest.drill_id]

    # --- views ----------------------------------------------------------------------------

    def active_drills(self) -> list[Drill]:
        return [d for d in self.drills.values() if d.active]

    def region_loss_targets(self) -> frozenset[str]:
        """Targets of region-loss drills that have not ended (restoring included)."""
        return frozenset(
            d.spec.region
            for d in self.drills.values()
            if d.active and rules_of(d.spec.kind).fault == "black_hole"
        )

    def black_holed(self, now_ms: int) -> frozenset[str]:
        """Regions every node must treat as black-holed now (active region-loss drills)."""
        return frozenset(d.spec.region for d in self.drills.values() if d.fault_active(now_ms))

    def audit_page(self, after: int, limit: int) -> list[AuditEntry] | None:
        """The page from memory; None when entries past ``after`` were pushed out of it (read
        the control shard, ``services.control.audit_log``)."""
        if after < self.audit_evicted_through:
            return None
        return [e for e in self.audit if e.lsn > after][:limit]
