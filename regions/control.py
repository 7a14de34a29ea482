"""Control state (shard placement) as a replicated state machine, and what to commit next. Pure.

The control state lives in the log's control shard (shard id ``shard_count``, one past the
conversation shards), replicated and fenced like any other shard. Each record is
``control.placement`` with the *full* assignment, so replay is "the last record wins":

    {"version": 7, "supersedes": 6, "assignment": {"0": "eu-west", ...},
     "down": ["ap-south"], "evacuated": [], "reason": "down: ap-south"}

Records are conditional, like a compare-and-set: each names the version it ``supersedes`` and
applies only on top of exactly that version. A control leader whose proposal timed out (the
entry may still commit) proposes again; when both commit, the second supersedes a version that
is no longer current and applies as a recorded no-op. Records come from a log that other
processes wrote, so ``apply`` validates them as data: a malformed record, one that does not cover
every shard or names an unknown region is skipped (and counted), never a crash, since every node
that reads the control log would otherwise die at the same record, restarted ones included. ``PlacementDecider.next_placement`` is run by the control leader only and decides the next
record from the committed state and this leader's view of region health:

* **Failover.** A region a majority declares down goes into ``down``; only its shards move, each
  to the best healthy region by weighted rendezvous (so no other shard moves), all at once.
* **Failback.** A region in ``down`` that has been ``up`` for ``failback_hysteresis_s``
  (anti-flapping) leaves ``down``; shards then move towards the full placement at most
  ``failback_shards_per_step`` per ``failback_step_interval_s`` (planned handoffs, a short pause
  per shard instead of one big stall).
* **Evacuate / restore** (operator). ``evacuate R`` excludes R from the target placement and its
  shards move away in the same bounded steps; ``restore R`` lifts that (and, for a region marked
  down that is up again, skips the hysteresis wait: the operator vouches for it).

The hysteresis clock and the step pacing are the planner's own memory, not in the log: a new
control leader starts them afresh, which only ever delays a failback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from eventlog.errors import Conflict, InvalidRequest, InvariantViolation
from regions.membership import RegionStatus
from regions.placement import place_shards, rank_regions

PLACEMENT_RECORD = "control.placement"
#: how many skipped records ``ControlState`` keeps with their reasons (for operators)
SKIPPED_KEPT = 8


#: what an operator may ask of a region (``PlacementDecider.operator``)
OperatorAction = Literal["evacuate", "restore"]


@dataclass(frozen=True, slots=True)
class Placement:
    version: int
    assignment: Mapping[int, str]
    down: frozenset[str]
    evacuated: frozenset[str]
    reason: str

    @property
    def supersedes(self) -> int:
        return self.version - 1

    def to_body(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "supersedes": self.supersedes,
            "assignment": {str(s): r for s, r in sorted(self.assignment.items())},
            "down": sorted(self.down),
            "evacuated": sorted(self.evacuated),
            "reason": self.reason,
        }

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Placement:
        """Parse a record; ValueError (or KeyError/TypeError) when it is not one."""
        version = body["version"]
        supersedes = body.get("supersedes", version - 1 if isinstance(version, int) else None)
        if not isinstance(version, int) or supersedes != version - 1 or version < 1:
            raise ValueError(f"bad version {version!r} / supersedes {supersedes!r}")
        return cls(
            version=version,
            assignment={int(s): str(r) for s, r in body["assignment"].items()},
            down=frozenset(str(r) for r in body.get("down", ())),
            evacuated=frozenset(str(r) for r in body.get("evacuated", ())),
            reason=str(body.get("reason", "")),
        )

    def shards_of(self, region: str) -> list[int]:
        return sorted(s for s, r in self.assignment.items() if r == region)


@dataclass(frozen=True, slots=True)
class ControlConfig:
    #: a region back from down must be up this long before shards move back to it
    failback_hysteresis_s: float = 60.0
    #: at most this many shards move per planned step (failback, evacuate, restore)
    failback_shards_per_step: int = 4
    #: at least this long between two planned steps
    failback_step_interval_s: float = 1.0


class ControlState:
    """The committed control state of one node: the placement records applied so far."""

    def __init__(self, *, shard_count: int, regions: Mapping[str, float]) -> None:
        self.shard_count = shard_count
        self.weights = dict(regions)
        self.placement: Placement | None = None
        self.applied_lsn = 0
        #: records applied as no-ops: stale or duplicate (a retried proposal that also
        #: committed) or not valid records at all; the last few with their reasons
        self.skipped_records = 0
        self.last_skipped: list[tuple[int, str]] = []

    @property
    def version(self) -> int:
        return self.placement.version if self.placement is not None else 0

    def apply(self, lsn: int, record_type: str, body_text: str) -> bool:
        """Apply one committed entry of the control shard (barriers and unknown records are
        skipped). Returns whether the placement changed."""
        if lsn <= self.applied_lsn:
            raise InvariantViolation(f"control entry {lsn} applied after {self.applied_lsn}")
        self.applied_lsn = lsn
        if record_type != PLACEMENT_RECORD:
            return False
        try:
            placement = Placement.from_body(json.loads(body_text))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return self._skip(lsn, f"not a placement record: {exc!r}"[:200])
        if placement.supersedes != self.version:
            return self._skip(
                lsn, f"v{placement.version} supersedes v{placement.supersedes}, not v{self.version}"
            )
        if set(placement.assignment) != set(range(self.shard_count)):
            return self._skip(lsn, f"v{placement.version} does not cover every shard")
        named = set(placement.assignment.values()) | placement.down | placement.evacuated
        unknown = named - set(self.weights)
        if unknown:
            return self._skip(lsn, f"v{placement.version} names unknown regions {sorted(unknown)}")
        self.placement = placement
        return True

    def _skip(self, lsn: int, reason: str) -> bool:
        self.skipped_records += 1
        self.last_skipped = [*self.last_skipped[-(SKIPPED_KEPT - 1) :], (lsn, reason)]
        return False

    def effective(self) -> Placement:
        """The committed placement, or the static one every node starts from (version 0)."""
        if self.placement is not None:
            return self.placement
        assignment = place_shards(self.shard_count, self.weights)
        return Placement(0, assignment, frozenset(), frozenset(), "static")


class PlacementDecider:
    """What the control leader commits next. Keeps the hysteresis clock and step pacing."""

    def __init__(self, *, config: ControlConfig, weights: Mapping[str, float]) -> None:
        if config.failback_shards_per_step < 1:
            raise ValueError("failback_shards_per_step must be >= 1")
        self.config = config
        self.weights = dict(weights)
        self._healthy_since: dict[str, float | None] = {r: None for r in self.weights}
        self._last_step_s: float | None = None

    def observe(self, now_s: float, statuses: Mapping[str, RegionStatus]) -> None:
        """Feed the leader's current view of every region's health."""
        for region in self.weights:
            if statuses.get(region, "up") == "up":
                if self._healthy_since[region] is None:
                    self._healthy_since[region] = now_s
            else:
                self._healthy_since[region] = None

    def healthy_for_s(self, region: str, now_s: float) -> float:
        since = self._healthy_since.get(region)
        return 0.0 if since is None else now_s - since

    def next_placement(
        self, state: ControlState, now_s: float, statuses: Mapping[str, RegionStatus]
    ) -> Placement | None:
        """The next placement to commit, or None when the committed one is what we want."""
        self.observe(now_s, statuses)
        current = state.effective()
        newly_down = {r for r, s in statuses.items() if s == "down" and r in self.weights}
        back = {
            r
            for r in current.down
            if self.healthy_for_s(r, now_s) >= self.config.failback_hysteresis_s
        }
        down = (set(current.down) | newly_down) - (back - newly_down)
        return self._plan(current, frozenset(down), current.evacuated, now_s, state.version)

    def operator(
        self,
        state: ControlState,
        action: OperatorAction,
        region: str,
        now_s: float,
        statuses: Mapping[str, RegionStatus],
    ) -> Placement:
        """The record for an operator's ``evacuate`` or ``restore`` of ``region``."""
        if region not in self.weights:
            raise InvalidRequest(f"no region {region!r}")
        current = state.effective()
        self.observe(now_s, statuses)
        down, evacuated = set(current.down), set(current.evacuated)
        if action == "evacuate":
            evacuated.add(region)
        elif action == "restore":
            evacuated.discard(region)
            if statuses.get(region) == "up":
                down.discard(region)
        else:
            raise InvalidRequest(f"unknown action {action!r}")
        if not self._eligible(frozenset(down), frozenset(evacuated)):
            raise Conflict(f"{action} {region} would leave no region to lead shards")
        planned = self._plan(
            current,
            frozenset(down),
            frozenset(evacuated),
            now_s,
            state.version,
            force_record=f"{action}: {region}",
        )
        assert planned is not None  # force_record always yields a record
        return planned

    # --- the plan -------------------------------------------------------------------------

    def _eligible(self, down: frozenset[str], evacuated: frozenset[str]) -> dict[str, float]:
        return {r: w for r, w in self.weights.items() if r not in down | evacuated and w > 0}

    def _plan(
        self,
        current: Placement,
        down: frozenset[str],
        evacuated: frozenset[str],
        now_s: float,
        version: int,
        force_record: str | None = None,
    ) -> Placement | None:
        eligible = self._eligible(down, evacuated)
        if not eligible:
            return None  # nowhere to put anything: keep the last placement
        assignment = dict(current.assignment)
        reasons: list[str] = [force_record] if force_record else []
        failed_over = [s for s, r in sorted(assignment.items()) if r in down]
        for shard in failed_over:
            assignment[shard] = rank_regions(shard, eligible)[0]
        if failed_over:
            reasons.append(f"failover of {len(failed_over)} shards from {sorted(down)}")
        stepped = self._step(assignment, eligible, now_s)
        if stepped:
            reasons.append(f"planned move of shards {stepped}")
        if down - current.down:
            reasons.insert(0, f"down: {sorted(down - current.down)}")
        if current.down - down:
            reasons.insert(0, f"back: {sorted(current.down - down)}")
        unchanged = (
            assignment == dict(current.assignment)
            and down == current.down
            and evacuated == current.evacuated
        )
        if unchanged and force_record is None and version > 0:
            return None
        return Placement(version + 1, assignment, down, evacuated, "; ".join(reasons) or "initial")

    def _step(
        self, assignment: dict[int, str], eligible: dict[str, float], now_s: float
    ) -> list[int]:
        """Move at most ``failback_shards_per_step`` shards towards the target placement."""
        target = {s: rank_regions(s, eligible)[0] for s in assignment}
        pending = [s for s in sorted(assignment) if assignment[s] != target[s]]
        if not pending:
            return []
        if (
            self._last_step_s is not None
            and now_s - self._last_step_s < self.config.failback_step_interval_s
        ):
            return []
        self._last_step_s = now_s
        moved = pending[: self.config.failback_shards_per_step]
        for shard in moved:
            assignment[shard] = target[shard]
        return moved
