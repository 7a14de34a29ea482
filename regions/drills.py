"""Regional drills: what a drill is, and how it moves from phase to phase. Pure: no I/O, no clock.

A drill is a record in the control shard (``regions.ops_state``), rewritten whole at every step,
so whichever node leads the control shard can pick it up where the last one left it::

    planned -> preflight -> injecting -> holding -> restoring -> done | aborted | failed

* **planned, preflight** happen inside the request that starts the drill: ``preflight`` must
  pass (every region up, no other drill, halt off, capacity for the loss) before the drill is
  committed at all, so a refused drill changes nothing. The first record is ``injecting``, with
  the two earlier phases in its timeline.
* **injecting**: the driver puts the fault in place (``evacuate``: an evacuate record;
  ``region-loss``: the record itself is the fault, every node black-holes the target while the
  drill is injecting or holding) and stamps ``injected_at_ms``.
* **holding** until ``injected_at_ms + hold_s``. Guards are checked on every step while
  injecting and holding; a tripped guard, an operator abort or the halt switch go straight to
  restoring with the verdict ``aborted``.
* **restoring**: the target is given back (restore record, black-hole lifted by the phase
  change); once the placement no longer excludes it, every moved shard took a canary write
  again and the canaries were read back, the drill ends: ``done`` (verdict ``passed``, or
  ``failed`` when a canary was lost or the restore overran ``hold_s + RESTORE_GRACE_S``) or
  ``aborted``. At that deadline it ends whatever the target's state: a target that does not
  answer again, or a read-back that cannot finish, fails the drill instead of holding it open.

``advance`` is the whole state machine: the driver (``services.control.drills.driver``) observes the world,
calls it, commits what it returns and carries out the phase's action.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast, get_args

from eventlog.errors import InvalidRequest
from regions.drill_kinds import DrillKind, rules_of
from regions.drill_llm_metrics import EngineSnapshot, snapshots_of
from regions.placement import SlotMap

Phase = Literal[
    "planned", "preflight", "injecting", "holding", "restoring", "done", "aborted", "failed"
]
Verdict = Literal["passed", "failed", "aborted"]
KINDS: tuple[DrillKind, ...] = get_args(DrillKind)
TERMINAL: frozenset[Phase] = frozenset({"done", "aborted", "failed"})
#: the reserved tenant of canary conversations
DRILL_TENANT = "_drill"
#: phases during which a region-loss drill black-holes its target at every node
FAULT_PHASES: frozenset[Phase] = frozenset({"injecting", "holding"})

HOLD_S_MAX = 3600.0
REASON_CHARS_MAX = 500
#: the most timeline entries and series points one drill record keeps
TIMELINE_MAX = 64
SERIES_POINTS_MAX = 600
#: a drill must have restored its target this long after its hold ended, or it fails
RESTORE_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class Guards:
    """Stop conditions, checked while injecting and holding."""

    #: a moved shard not writable (no acknowledged canary) this long after injection
    max_rto_s: float = 10.0
    #: failed canary writes over all canary writes to shards that should be serving, in the
    #: sliding window (a moved shard counts only once it recovered)
    max_error_ratio: float = 0.2
    #: p99 acknowledgment latency of canary writes in the sliding window
    max_ack_p99_ms: float = 2000.0

    @classmethod
    def from_body(cls, body: Mapping[str, Any] | None) -> Guards:
        body = dict(body or {})
        unknown = set(body) - {"max_rto_s", "max_error_ratio", "max_ack_p99_ms"}
        if unknown:
            raise InvalidRequest(f"unknown guards {sorted(unknown)}")
        guards = cls(**{k: float(v) for k, v in body.items()})
        if not (0 < guards.max_rto_s <= HOLD_S_MAX and 0 <= guards.max_error_ratio <= 1):
            raise InvalidRequest("guards: max_rto_s in (0, 3600], max_error_ratio in [0, 1]")
        if not 0 < guards.max_ack_p99_ms <= 600_000:
            raise InvalidRequest("guards: max_ack_p99_ms in (0, 600000]")
        return guards

    def to_body(self) -> dict[str, float]:
        return {
            "max_rto_s": self.max_rto_s,
            "max_error_ratio": self.max_error_ratio,
            "max_ack_p99_ms": self.max_ack_p99_ms,
        }


@dataclass(frozen=True, slots=True)
class DrillSpec:
    kind: DrillKind
    region: str
    hold_s: float
    reason: str
    guards: Guards = field(default_factory=Guards)
    force: bool = False
    #: who asked: the key's tenant and role
    requested_by: str = ""
    #: a kill drill of one node of a region of several (``check_node``): only that node is
    #: killed, its sibling takes its slot's shards, and no shard leaves the region. None: the
    #: whole region (every other kind)
    node: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidRequest(f"kind must be one of {list(KINDS)}")
        if self.node is not None and rules_of(self.kind).fault != "process":
            raise InvalidRequest(f"node applies to kill drills only, not to {self.kind}")
        if self.node is not None and self.node < 0:
            raise InvalidRequest("node must be 0 or more")
        if not 0 < self.hold_s <= HOLD_S_MAX:
            raise InvalidRequest(f"hold_s must be in (0, {HOLD_S_MAX:g}]")
        if not self.reason.strip() or len(self.reason) > REASON_CHARS_MAX:
            raise InvalidRequest(f"reason is required, at most {REASON_CHARS_MAX} characters")

    def to_body(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "region": self.region,
            "hold_s": self.hold_s,
            "reason": self.reason,
            "guards": self.guards.to_body(),
            "force": self.force,
            "requested_by": self.requested_by,
            # only where set: a region's drill reads as before nodes could be drilled
            **({} if self.node is None else {"node": self.node}),
        }

    def check_node(self, node_count: int) -> None:
        """Refuse a node that the target region does not have: a node kill needs a region of
        several nodes (one node's region goes down whole: a plain kill drill) and an index
        below ``node_count``."""
        if self.node is None:
            return
        if node_count < 2:
            raise InvalidRequest(
                f"{self.region} runs one node: kill the region (leave out node) instead"
            )
        if self.node >= node_count:
            raise InvalidRequest(
                f"{self.region} runs nodes 0 to {node_count - 1}: no node {self.node}"
            )

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> DrillSpec:
        node = body.get("node")
        return cls(
            kind=cast(DrillKind, str(body["kind"])),
            region=str(body["region"]),
            hold_s=float(body["hold_s"]),
            reason=str(body["reason"]),
            guards=Guards.from_body(body.get("guards")),
            force=bool(body.get("force", False)),
            requested_by=str(body.get("requested_by", "")),
            node=None if node is None else int(node),
        )


@dataclass(frozen=True, slots=True)
class GuardTrip:
    guard: str
    measured: float
    limit: float

    def to_body(self) -> dict[str, Any]:
        return {"guard": self.guard, "measured": self.measured, "limit": self.limit}


@dataclass(frozen=True, slots=True)
class ReplayTally:
    """The plane's replay counters at one moment, summed over the regions with engines: a drill
    keeps one from before the fault and the latest since, and reports the difference."""

    conversations_planned: int = 0
    conversations_replayed: int = 0
    tokens_replayed: int = 0
    #: wall-clock ms of the last replayed conversation anywhere (None: none yet)
    last_replayed_at_ms: int | None = None

    def to_body(self) -> dict[str, Any]:
        return {
            "conversations_planned": self.conversations_planned,
            "conversations_replayed": self.conversations_replayed,
            "tokens_replayed": self.tokens_replayed,
            "last_replayed_at_ms": self.last_replayed_at_ms,
        }

    @classmethod
    def from_body(cls, body: Mapping[str, Any] | None) -> ReplayTally | None:
        if body is None:
            return None
        last = body.get("last_replayed_at_ms")
        return cls(
            conversations_planned=int(body.get("conversations_planned", 0)),
            conversations_replayed=int(body.get("conversations_replayed", 0)),
            tokens_replayed=int(body.get("tokens_replayed", 0)),
            last_replayed_at_ms=None if last is None else int(last),
        )


@dataclass(frozen=True, slots=True)
class Measurements:
    """What the canaries measured so far (persisted in the drill record, so a new control
    leader continues from it)."""

    #: shards the fault moved away from the target
    shards_moved: tuple[int, ...] = ()
    #: moved shard -> seconds from injection to its first acknowledged canary elsewhere
    rto_s: Mapping[int, float] = field(default_factory=dict)
    #: shard -> how many canary events of this drill were acknowledged on it
    canary_acked: Mapping[int, int] = field(default_factory=dict)
    canary_errors: int = 0
    #: acknowledged canary events not found when read back after restore (None: not yet read)
    canary_lost: int | None = None
    #: (seconds since the drill started, acked, errors, ack p99 ms) per sample interval
    series: tuple[tuple[float, int, int, float], ...] = ()
    #: (seconds since the drill started, live acknowledged appends per second over the plane,
    #: live appends answered 5xx per second, their error ratio or None when none ended), from
    #: the nodes' own counters, one per progress record
    live_appends: tuple[tuple[float, float, float, float | None], ...] = ()
    #: placement versions: before the fault, during it (highest seen), after restore
    placement_versions: Mapping[str, int] = field(default_factory=dict)
    #: the same three placements as shards led per region ("before" -> region -> shards)
    placement_shards: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: replay counters before the fault and the latest while it lasted, up to the start of
    #: restoring (None: no engines attached); a failback's own replays are not the drill's
    replay_before: ReplayTally | None = None
    replay_latest: ReplayTally | None = None
    #: the planner's lower bound on replaying the moved conversations, from preflight
    replay_time_min_s: float | None = None
    #: the survivors' spare prefill at preflight, tokens/s: the rate that bound assumes
    replay_spare_tokens_per_s: float | None = None
    #: the regions' engines and replay at the drill's start, the fault's end and the drill's
    #: end ("start" | "restore" | "end" -> region -> snapshot), for live TTFT per phase
    engine_snapshots: Mapping[str, Mapping[str, EngineSnapshot]] = field(default_factory=dict)
    #: (seconds since injection, moved conversations warm by then) on the survivors while the
    #: fault lasted (``regions.drill_llm_metrics.warm_counts``): the cache-recovery curve
    warm_points: tuple[tuple[float, int], ...] = ()
    #: seconds from injection until a survivor first led a moved shard (replay's view; None:
    #: not seen, no engines)
    takeover_s: float | None = None

    def to_body(self) -> dict[str, Any]:
        return {
            "shards_moved": list(self.shards_moved),
            "rto_s": {str(s): v for s, v in sorted(self.rto_s.items())},
            "canary_acked": {str(s): n for s, n in sorted(self.canary_acked.items())},
            "canary_errors": self.canary_errors,
            "canary_lost": self.canary_lost,
            "series": [list(p) for p in self.series[-SERIES_POINTS_MAX:]],
            "live_appends": [list(p) for p in self.live_appends[-SERIES_POINTS_MAX:]],
            "placement_versions": dict(self.placement_versions),
            "placement_shards": {k: dict(v) for k, v in self.placement_shards.items()},
            "replay_before": None if self.replay_before is None else self.replay_before.to_body(),
            "replay_latest": None if self.replay_latest is None else self.replay_latest.to_body(),
            "replay_time_min_s": self.replay_time_min_s,
            "replay_spare_tokens_per_s": self.replay_spare_tokens_per_s,
            "engine_snapshots": {
                moment: {region: snap.to_body() for region, snap in regions.items()}
                for moment, regions in self.engine_snapshots.items()
            },
            "warm_points": [list(p) for p in self.warm_points],
            "takeover_s": self.takeover_s,
        }

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Measurements:
        lost = body.get("canary_lost")
        return cls(
            shards_moved=tuple(int(s) for s in body.get("shards_moved", ())),
            rto_s={int(s): float(v) for s, v in body.get("rto_s", {}).items()},
            canary_acked={int(s): int(n) for s, n in body.get("canary_acked", {}).items()},
            canary_errors=int(body.get("canary_errors", 0)),
            canary_lost=None if lost is None else int(lost),
            series=tuple(
                (float(p[0]), int(p[1]), int(p[2]), float(p[3])) for p in body.get("series", ())
            ),
            live_appends=tuple(_live_point(p) for p in body.get("live_appends", ())),
            placement_versions={
                str(k): int(v) for k, v in body.get("placement_versions", {}).items()
            },
            placement_shards={
                str(k): {str(r): int(n) for r, n in v.items()}
                for k, v in body.get("placement_shards", {}).items()
            },
            replay_before=ReplayTally.from_body(body.get("replay_before")),
            replay_latest=ReplayTally.from_body(body.get("replay_latest")),
            replay_time_min_s=_optional_float(body.get("replay_time_min_s")),
            replay_spare_tokens_per_s=_optional_float(body.get("replay_spare_tokens_per_s")),
            engine_snapshots={
                str(moment): snapshots_of(regions)
                for moment, regions in body.get("engine_snapshots", {}).items()
            },
            warm_points=tuple((float(p[0]), int(p[1])) for p in body.get("warm_points", ())),
            takeover_s=_optional_float(body.get("takeover_s")),
        )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class Drill:
    drill_id: str
    #: revision: a drill record applies only on top of revision ``rev - 1`` (a stale or
    #: duplicate record from a deposed control leader is a recorded no-op)
    rev: int
    spec: DrillSpec
    phase: Phase
    #: (phase, wall ms, note)
    timeline: tuple[tuple[str, int, str], ...]
    created_at_ms: int
    injected_at_ms: int | None = None
    restore_started_at_ms: int | None = None
    ended_at_ms: int | None = None
    #: why the drill is being aborted (operator abort, halt, guard), None while it is not
    abort_reason: str | None = None
    guards_tripped: tuple[GuardTrip, ...] = ()
    verdict: Verdict | None = None
    verdict_reason: str = ""
    measurements: Measurements = field(default_factory=Measurements)

    @property
    def active(self) -> bool:
        return self.phase not in TERMINAL

    def fault_active(self, now_ms: int) -> bool:
        """Whether a region-loss drill black-holes its target now. Bounded by the drill's own
        deadline too: a target cut off from the control shard still lets go in time."""
        if rules_of(self.spec.kind).fault != "black_hole" or self.phase not in FAULT_PHASES:
            return False
        return now_ms < self.created_at_ms + int(deadline_s(self.spec) * 1000)

    def to_body(self) -> dict[str, Any]:
        return {
            "drill_id": self.drill_id,
            "rev": self.rev,
            "spec": self.spec.to_body(),
            "phase": self.phase,
            "timeline": [list(t) for t in self.timeline],
            "created_at_ms": self.created_at_ms,
            "injected_at_ms": self.injected_at_ms,
            "restore_started_at_ms": self.restore_started_at_ms,
            "ended_at_ms": self.ended_at_ms,
            "abort_reason": self.abort_reason,
            "guards_tripped": [g.to_body() for g in self.guards_tripped],
            "verdict": self.verdict,
            "verdict_reason": self.verdict_reason,
            "measurements": self.measurements.to_body(),
        }

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Drill:
        phase = str(body["phase"])
        if phase not in get_args(Phase):
            raise ValueError(f"unknown phase {phase!r}")
        verdict = body.get("verdict")
        if verdict is not None and verdict not in get_args(Verdict):
            raise ValueError(f"unknown verdict {verdict!r}")

        def optional_int(key: str) -> int | None:
            value = body.get(key)
            return None if value is None else int(value)

        return cls(
            drill_id=str(body["drill_id"]),
            rev=int(body["rev"]),
            spec=DrillSpec.from_body(body["spec"]),
            phase=cast(Phase, phase),
            timeline=tuple((str(t[0]), int(t[1]), str(t[2])) for t in body.get("timeline", ())),
            created_at_ms=int(body["created_at_ms"]),
            injected_at_ms=optional_int("injected_at_ms"),
            restore_started_at_ms=optional_int("restore_started_at_ms"),
            ended_at_ms=optional_int("ended_at_ms"),
            abort_reason=body.get("abort_reason"),
            guards_tripped=tuple(
                GuardTrip(str(g["guard"]), float(g["measured"]), float(g["limit"]))
                for g in body.get("guards_tripped", ())
            ),
            verdict=cast(Verdict | None, verdict),
            verdict_reason=str(body.get("verdict_reason", "")),
            measurements=Measurements.from_body(body.get("measurements", {})),
        )


def deadline_s(spec: DrillSpec) -> float:
    """From creation, the longest a drill may take before its target must be back: the hold
    plus the stated grace for injecting and restoring."""
    return spec.hold_s + RESTORE_GRACE_S


# --- the state machine -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Observation:
    """What the driver saw this step."""

    now_ms: int
    halt_on: bool = False
    #: the fault is in place (evacuate committed; for region-loss: the injecting record is)
    injected: bool = False
    #: when the fault took effect, when known better than "now" (region-loss: the injecting
    #: record's commit, which every node acts on)
    injected_at_ms: int | None = None
    #: shards the fault moved (known once injected)
    shards_moved: tuple[int, ...] = ()
    #: sliding-window canary numbers (None: too few samples to judge)
    error_ratio: float | None = None
    ack_p99_ms: float | None = None
    #: the placement no longer excludes the target and the target is up
    restored: bool = False
    #: canary events lost after the read-back (None: not read back yet)
    canary_lost: int | None = None
    #: why the read-back could not finish, once the deadline made the driver stop waiting
    read_back_failed: str | None = None


def start(drill_id: str, spec: DrillSpec, now_ms: int) -> Drill:
    """The first record of a drill that passed preflight."""
    return Drill(
        drill_id=drill_id,
        rev=1,
        spec=spec,
        phase="injecting",
        timeline=(
            ("planned", now_ms, spec.reason[:100]),
            ("preflight", now_ms, "passed" + (" (capacity check forced)" if spec.force else "")),
            ("injecting", now_ms, ""),
        ),
        created_at_ms=now_ms,
    )


def request_abort(drill: Drill, reason: str, now_ms: int) -> Drill | None:
    """An operator abort or the halt switch: go to restoring at once (None: nothing to do)."""
    if drill.phase in TERMINAL or drill.phase == "restoring":
        return None
    return _to_restoring(drill, now_ms, abort_reason=reason)


def advance(drill: Drill, obs: Observation) -> Drill | None:
    """The drill's next record given what the driver observed, or None when nothing changes."""
    if drill.phase in TERMINAL:
        return None
    now_ms = obs.now_ms
    if drill.phase in FAULT_PHASES:
        if obs.halt_on:
            return _to_restoring(drill, now_ms, abort_reason="halt switch on")
        trips = check_guards(drill, obs)
        if trips:
            tripped = replace(drill, guards_tripped=drill.guards_tripped + tuple(trips))
            names = ", ".join(t.guard for t in trips)
            return _to_restoring(tripped, now_ms, abort_reason=f"guard tripped: {names}")
        if out_of_time(drill, now_ms):
            return _to_restoring(
                drill, now_ms, abort_reason="deadline passed before the hold ended"
            )
    if drill.phase == "injecting":
        if not obs.injected:
            return None
        moved = obs.shards_moved or drill.measurements.shards_moved
        measured = replace(drill.measurements, shards_moved=tuple(sorted(moved)))
        return _bump(
            replace(drill, injected_at_ms=obs.injected_at_ms or now_ms, measurements=measured),
            "holding",
            now_ms,
            f"{len(obs.shards_moved)} shards moved",
        )
    if drill.phase == "holding":
        assert drill.injected_at_ms is not None
        if now_ms >= drill.injected_at_ms + int(drill.spec.hold_s * 1000):
            return _to_restoring(drill, now_ms, abort_reason=None)
        return None
    # restoring: it ends once the canaries are read back, and at the deadline at the latest
    # (a target that never answers again, or a read-back that cannot finish, fails the drill
    # rather than keeping it, and the next drill, waiting)
    if obs.canary_lost is None and obs.read_back_failed is None:
        return None
    if not obs.restored and not out_of_time(drill, now_ms):
        return None
    return _finish(drill, obs, now_ms)


def out_of_time(drill: Drill, now_ms: int) -> bool:
    """Past ``hold_s + RESTORE_GRACE_S`` from creation: the drill must end now."""
    return now_ms >= drill.created_at_ms + int(deadline_s(drill.spec) * 1000)


def check_guards(drill: Drill, obs: Observation) -> list[GuardTrip]:
    guards = drill.spec.guards
    trips: list[GuardTrip] = []
    if drill.injected_at_ms is not None:
        waited_s = (obs.now_ms - drill.injected_at_ms) / 1000
        pending = [s for s in drill.measurements.shards_moved if s not in drill.measurements.rto_s]
        if pending and waited_s > guards.max_rto_s:
            trips.append(GuardTrip("max_rto_s", waited_s, guards.max_rto_s))
    if obs.error_ratio is not None and obs.error_ratio > guards.max_error_ratio:
        trips.append(GuardTrip("max_error_ratio", obs.error_ratio, guards.max_error_ratio))
    if obs.ack_p99_ms is not None and obs.ack_p99_ms > guards.max_ack_p99_ms:
        trips.append(GuardTrip("max_ack_p99_ms", obs.ack_p99_ms, guards.max_ack_p99_ms))
    return trips


def with_measurements(drill: Drill, measurements: Measurements) -> Drill:
    """A progress record: the same phase with newer canary numbers."""
    return replace(drill, rev=drill.rev + 1, measurements=measurements)


def _bump(drill: Drill, phase: Phase, now_ms: int, note: str) -> Drill:
    timeline = (*drill.timeline, (phase, now_ms, note))[-TIMELINE_MAX:]
    return replace(drill, rev=drill.rev + 1, phase=phase, timeline=timeline)


def _to_restoring(drill: Drill, now_ms: int, *, abort_reason: str | None) -> Drill:
    restoring = replace(drill, restore_started_at_ms=now_ms, abort_reason=abort_reason)
    return _bump(restoring, "restoring", now_ms, abort_reason or "hold over")


def _finish(drill: Drill, obs: Observation, now_ms: int) -> Drill:
    canary_lost = obs.canary_lost
    measured = replace(drill.measurements, canary_lost=canary_lost)
    overran_ms = now_ms - (drill.created_at_ms + int(deadline_s(drill.spec) * 1000))
    phase: Phase
    verdict: Verdict
    # a placement fault moves shards in steps: one restored before its step never moved at all
    in_steps = rules_of(drill.spec.kind).fault == "placement"
    unrecovered = [s for s in measured.shards_moved if s not in measured.rto_s and not in_steps]
    slow = sorted(s for s, rto_s in measured.rto_s.items() if rto_s > drill.spec.guards.max_rto_s)
    not_back = "" if obs.restored else f"{target_name(drill.spec)} was not back by the deadline"
    if drill.abort_reason is not None:
        phase, verdict = "aborted", "aborted"
        why = "; ".join(filter(None, (drill.abort_reason, not_back, obs.read_back_failed)))
    elif not_back:
        phase, verdict = "failed", "failed"
        why = f"{not_back} (hold_s + {RESTORE_GRACE_S:g}s); it rejoins once it answers again"
    elif obs.read_back_failed is not None or canary_lost is None:
        phase, verdict = "failed", "failed"
        why = f"canary read-back did not finish by the deadline: {obs.read_back_failed}"
    elif drill.spec.node is not None and placement_changed(measured):
        phase, verdict = "failed", "failed"
        why = (
            f"the placement changed while one node was down ({dict(measured.placement_versions)}):"
            f" the node's death did not stay inside {drill.spec.region}"
        )
    elif unrecovered:
        phase, verdict = "failed", "failed"
        why = f"moved shards {unrecovered} never took a canary write again"
    elif slow:
        phase, verdict = "failed", "failed"
        why = f"moved shards {slow} took longer than max_rto_s to take a canary write"
    elif canary_lost > 0:
        phase, verdict, why = "failed", "failed", f"{canary_lost} acknowledged canary events lost"
    elif overran_ms > 0:
        phase, verdict = "failed", "failed"
        why = f"restore finished {overran_ms / 1000:.1f}s past hold_s + {RESTORE_GRACE_S:g}s"
    else:
        phase, verdict, why = "done", "passed", "restored, no acknowledged canary lost"
    ended = replace(
        drill, measurements=measured, ended_at_ms=now_ms, verdict=verdict, verdict_reason=why
    )
    return _bump(ended, phase, now_ms, why)


def target_name(spec: DrillSpec) -> str:
    """What a drill takes away, for people: the region, or one node of it."""
    return spec.region if spec.node is None else f"{spec.region} node {spec.node}"


def shards_taken(
    spec: DrillSpec, region_shards: Sequence[int], node_count: int, slot_map: SlotMap
) -> list[int]:
    """The shards a drill takes from its target (``region_shards``: those placed on its
    region): all of them, or for a node kill those of the node's slot, which its sibling leads
    meanwhile (``regions.placement.SlotMap``)."""
    if spec.node is None:
        return sorted(region_shards)
    return sorted(s for s in region_shards if slot_map.slot(s, node_count) == spec.node)


def placement_changed(m: Measurements) -> bool:
    """Whether the placement's version during or after the fault differs from the one before
    it (a node kill must leave it as it was: no shard placed on another region)."""
    before = m.placement_versions.get("before")
    return any(m.placement_versions.get(k, before) != before for k in ("during", "after"))


def _live_point(p: Any) -> tuple[float, float, float, float | None]:
    """A live-appends point as recorded; a record written before errors were counted has only
    (t, rate)."""
    errors = float(p[2]) if len(p) > 2 else 0.0
    return float(p[0]), float(p[1]), errors, _optional_float(p[3]) if len(p) > 3 else None


def shards_by_region(assignment: Mapping[int, str]) -> dict[str, int]:
    """How many shards each region leads in a placement's assignment."""
    counts: dict[str, int] = {}
    for region in assignment.values():
        counts[region] = counts.get(region, 0) + 1
    return dict(sorted(counts.items()))
