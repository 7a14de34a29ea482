"""Practice runs: drills on a schedule, behind blocking conditions. Pure: no I/O, no clock.

A ``Schedule`` names one region and drill kind, the UTC windows a run may start in (weekday and
minutes of the day), dates it must not run on, the least time between two runs, and the chance
that a window is used at all (drawn once per window occurrence from a seeded hash of the
schedule and the occurrence, so every control leader draws the same and a test can pick it).

``decide`` is the whole decision, asked every practice tick by the control leader::

    (schedule, now, last start, last skip, blocking conditions, busy) -> start | skip | wait

* **wait**: nothing to record: disabled, a blocked date, outside every window, the minimum
  interval not yet passed since the last start, a run of this schedule still in progress or
  awaiting approval, or a skip already recorded a short while ago (``retry_after_skip_s``).
* **skip**: recorded in the calendar with its reason: the window was not drawn (once per
  occurrence), or a blocking condition holds (a firing alert, a recent failover, preflight).
* **start**: the runner starts the drill through the operator's path (or asks for approval).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal, cast

from eventlog.errors import InvalidRequest
from regions.drill_kinds import DrillKind
from regions.drills import HOLD_S_MAX, KINDS, Guards

Action = Literal["start", "skip", "wait"]
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
MINUTES_PER_DAY = 24 * 60
#: a schedule's windows and blocked dates, at most (the record stays small)
WINDOWS_MAX = 28
BLOCKED_DATES_MAX = 366
#: the least and most time between two runs of one schedule
MIN_INTERVAL_S_MIN = 1.0
MIN_INTERVAL_S_MAX = 366 * 86_400.0
#: a blocked schedule records its next skip no sooner than this (default; the schedule's own)
RETRY_AFTER_SKIP_S_DEFAULT = 300.0
_WINDOW = re.compile(r"^(mon|tue|wed|thu|fri|sat|sun) (\d\d):(\d\d)-(\d\d):(\d\d)$")
_SCHEDULE_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


@dataclass(frozen=True, slots=True)
class Window:
    """One weekly window, UTC: ``weekday`` 0 = Monday, minutes of the day ``[start, end)``."""

    weekday: int
    start_minute: int
    end_minute: int

    @classmethod
    def parse(cls, text: str) -> Window:
        """``"mon 09:00-17:00"`` (``24:00`` ends a window at midnight)."""
        match = _WINDOW.fullmatch(text.strip().lower())
        if match is None:
            raise InvalidRequest(f"window {text!r} must read like 'mon 09:00-17:00' (UTC)")
        day, h1, m1, h2, m2 = match.groups()
        start, end = int(h1) * 60 + int(m1), int(h2) * 60 + int(m2)
        if int(m1) > 59 or int(m2) > 59 or not 0 <= start < end <= MINUTES_PER_DAY:
            raise InvalidRequest(f"window {text!r}: times in 00:00-24:00, start before end")
        return cls(WEEKDAYS.index(day), start, end)

    def text(self) -> str:
        def hhmm(minute: int) -> str:
            return f"{minute // 60:02d}:{minute % 60:02d}"

        return f"{WEEKDAYS[self.weekday]} {hhmm(self.start_minute)}-{hhmm(self.end_minute)}"

    def occurrence_start_ms(self, now_ms: int) -> int | None:
        """When this window's occurrence that contains ``now_ms`` began; None outside it."""
        now = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
        minute = now.hour * 60 + now.minute
        if now.weekday() != self.weekday or not self.start_minute <= minute < self.end_minute:
            return None
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return int((midnight + timedelta(minutes=self.start_minute)).timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Schedule:
    schedule_id: str
    region: str
    kind: DrillKind
    windows: tuple[Window, ...]
    hold_s: float
    min_interval_s: float
    #: the chance that a window occurrence is used, in [0, 1]
    chance: float = 1.0
    blocked_dates: frozenset[date] = frozenset()
    retry_after_skip_s: float = RETRY_AFTER_SKIP_S_DEFAULT
    #: its runs wait for a second operator's approval
    needs_approval: bool = False
    enabled: bool = True
    #: the key that wrote it
    by: str = ""
    #: its drills' stop conditions (``regions.drills.Guards``: RTO, canary errors, ack p99)
    guards: Guards = field(default_factory=Guards)

    def __post_init__(self) -> None:
        if not _SCHEDULE_ID.fullmatch(self.schedule_id):
            raise InvalidRequest("schedule id: lower-case letters, digits and '-', at most 63")
        if self.kind not in KINDS:
            raise InvalidRequest(f"kind must be one of {list(KINDS)}")
        if not 1 <= len(self.windows) <= WINDOWS_MAX:
            raise InvalidRequest(f"a schedule has 1 to {WINDOWS_MAX} windows")
        if len(self.blocked_dates) > BLOCKED_DATES_MAX:
            raise InvalidRequest(f"at most {BLOCKED_DATES_MAX} blocked dates")
        if not 0 < self.hold_s <= HOLD_S_MAX:
            raise InvalidRequest(f"hold_s must be in (0, {HOLD_S_MAX:g}]")
        if not MIN_INTERVAL_S_MIN <= self.min_interval_s <= MIN_INTERVAL_S_MAX:
            raise InvalidRequest(
                f"min_interval_s must be in [{MIN_INTERVAL_S_MIN:g}, {MIN_INTERVAL_S_MAX:g}]"
            )
        if not 0 <= self.chance <= 1:
            raise InvalidRequest("chance must be in [0, 1]")
        if not MIN_INTERVAL_S_MIN <= self.retry_after_skip_s <= MIN_INTERVAL_S_MAX:
            raise InvalidRequest("retry_after_skip_s must be in [1, 31622400]")

    def to_body(self) -> dict[str, Any]:
        return {
            "schedule_id": self.schedule_id,
            "region": self.region,
            "kind": self.kind,
            "windows": [w.text() for w in self.windows],
            "hold_s": self.hold_s,
            "min_interval_s": self.min_interval_s,
            "chance": self.chance,
            "blocked_dates": sorted(d.isoformat() for d in self.blocked_dates),
            "retry_after_skip_s": self.retry_after_skip_s,
            "needs_approval": self.needs_approval,
            "enabled": self.enabled,
            "guards": self.guards.to_body(),
            "by": self.by,
        }

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Schedule:
        try:
            blocked = frozenset(date.fromisoformat(str(d)) for d in body.get("blocked_dates", ()))
        except ValueError as exc:
            raise InvalidRequest(f"blocked_dates: {exc}") from exc
        return cls(
            schedule_id=str(body["schedule_id"]),
            region=str(body["region"]),
            kind=cast(DrillKind, str(body["kind"])),
            windows=tuple(Window.parse(str(w)) for w in body["windows"]),
            hold_s=float(body["hold_s"]),
            min_interval_s=float(body["min_interval_s"]),
            chance=float(body.get("chance", 1.0)),
            blocked_dates=blocked,
            retry_after_skip_s=float(body.get("retry_after_skip_s", RETRY_AFTER_SKIP_S_DEFAULT)),
            needs_approval=bool(body.get("needs_approval", False)),
            enabled=bool(body.get("enabled", True)),
            by=str(body.get("by", "")),
            guards=guards_of(body.get("guards")),
        )

    def occurrence_start_ms(self, now_ms: int) -> int | None:
        """The start of the window occurrence ``now_ms`` falls in (the earliest, where windows
        overlap); None outside every window."""
        starts = [s for w in self.windows if (s := w.occurrence_start_ms(now_ms)) is not None]
        return min(starts) if starts else None


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: str
    #: the window occurrence the decision was made in (None outside every window)
    occurrence_ms: int | None = None


@dataclass(frozen=True, slots=True)
class History:
    """What the calendar knows of one schedule."""

    last_start_ms: int | None = None
    last_skip_ms: int | None = None
    #: a run of the schedule is active or awaiting approval
    busy: bool = False


@dataclass(frozen=True, slots=True)
class Conditions:
    """Blocking conditions that hold now, each a reason (empty: nothing blocks)."""

    blocking: Sequence[str] = field(default_factory=tuple)


def window_draw(seed: int, schedule_id: str, occurrence_ms: int) -> float:
    """A number in [0, 1) fixed by the seed, the schedule and the window occurrence: every
    control leader draws the same, so a new leader neither re-rolls nor skips a drawn window."""
    digest = hashlib.sha256(f"{seed}:{schedule_id}:{occurrence_ms}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def decide(
    schedule: Schedule, now_ms: int, history: History, conditions: Conditions, seed: int
) -> Decision:
    """Start, skip (recorded with its reason) or wait (nothing to record) now."""
    if not schedule.enabled:
        return Decision("wait", "disabled")
    today = datetime.fromtimestamp(now_ms / 1000, tz=UTC).date()
    if today in schedule.blocked_dates:
        return Decision("wait", f"blocked date {today.isoformat()}")
    occurrence_ms = schedule.occurrence_start_ms(now_ms)
    if occurrence_ms is None:
        return Decision("wait", "outside every window")
    if history.busy:
        return Decision("wait", "a run is in progress or awaiting approval", occurrence_ms)
    if (
        history.last_start_ms is not None
        and now_ms - history.last_start_ms < schedule.min_interval_s * 1000
    ):
        return Decision("wait", "minimum interval since the last run", occurrence_ms)
    skipped_lately = history.last_skip_ms is not None and (
        now_ms - history.last_skip_ms < schedule.retry_after_skip_s * 1000
    )
    draw = window_draw(seed, schedule.schedule_id, occurrence_ms)
    if draw >= schedule.chance:
        if history.last_skip_ms is not None and history.last_skip_ms >= occurrence_ms:
            return Decision("wait", "this window was not drawn", occurrence_ms)
        return Decision(
            "skip", f"window not drawn (draw {draw:.3f}, chance {schedule.chance:g})", occurrence_ms
        )
    if conditions.blocking:
        if skipped_lately:
            return Decision("wait", "blocked; skip recorded lately", occurrence_ms)
        return Decision("skip", "blocked: " + "; ".join(conditions.blocking), occurrence_ms)
    return Decision("start", "in window", occurrence_ms)


@dataclass(frozen=True, slots=True)
class Scope:
    """A key's blast radius: the regions and kinds it may drill (None: any)."""

    regions: frozenset[str] | None = None
    kinds: frozenset[str] | None = None

    def allows(self, region: str, kind: str) -> bool:
        return (self.regions is None or region in self.regions) and (
            self.kinds is None or kind in self.kinds
        )

    def to_body(self) -> dict[str, Any]:
        return {
            "regions": None if self.regions is None else sorted(self.regions),
            "kinds": None if self.kinds is None else sorted(self.kinds),
        }

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Scope:
        regions, kinds = body.get("regions"), body.get("kinds")
        scope = cls(
            None if regions is None else frozenset(str(r) for r in regions),
            None if kinds is None else frozenset(str(k) for k in kinds),
        )
        if scope.kinds is not None and not scope.kinds <= set(KINDS):
            raise InvalidRequest(f"kinds must be among {list(KINDS)}")
        return scope


def guards_of(body: Mapping[str, Any] | None) -> Guards:
    """A schedule's or run's guards from its body (absent: the defaults, as in records written
    before schedules carried guards); ValueError when they are not guards."""
    try:
        return Guards.from_body(body)
    except InvalidRequest as exc:
        raise ValueError(exc.message) from exc
