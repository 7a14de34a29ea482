"""Readiness: could the plane lose each region now, and how recently was that shown? Pure.

Every few minutes the control leader (``services.control.readiness``) evaluates the loss of
each region the way a drill's preflight would (``regions.drill_plan.preflight`` on a
``region-loss`` of that region, with no drill active and the halt switch off, so only the plane
itself can fail it), and folds in the region's drill history:

* **quorum**: the log's shards keep a write quorum and can elect new leaders without the
  region: the regions up besides it number at least ``max(W, P)``, the write and prepare quorums
  of the plane's replicas (one per region; ``eventlog.config.LogConfig``);
* **capacity**: preflight's region-loss arithmetic on the live rates (appends, and the engines'
  prefill where engines are attached) says the survivors serve the moved load, and some
  survivor can take the region's shards;
* **replay**: preflight's bound on rebuilding the moved conversations' caches,
  ``S * T / P`` (``regions.capacity_arithmetic.plan_replay``: S active conversations on the
  region's shards, T their tokens each, P the survivors' spare prefill; 2,000 prompts of 8,192
  tokens at 92,800 spare tokens/s take at least 176.6 s);
* **drill**: the age of the region's last passed drill (any kind), and whether a drill of the
  region failed after it.

Score and status, per region::

    gate   = quorum holds  and  capacity holds                        (1 or 0)
    replay = 1                                  no bound (no engines, or nothing to move)
           = min(1, replay_target_s / bound_s)  otherwise
    drill  = 0.5 ** (age_s / drill_half_life_s)  age of the last passed drill
           = 0                                  none kept, or a drill of the region failed since
    score  = round(100 * gate * (W_REPLAY * replay + W_DRILL * drill)),  W_REPLAY = W_DRILL = 0.5
    status = not_ready   gate is 0
           = ready       score >= ready_score_min
           = at_risk     otherwise

With the defaults (half-life 7 days, replay target 300 s, ready at 75) a region drilled within
the last 7 days whose moved conversations replay within 5 minutes is ready; one whose last
passed drill is older than a week, or was never drilled, is at risk, and so is one whose replay
bound is more than twice the target. The plane's score is its lowest region's score and its
status the worst region's: the plane is as ready as the loss it is least ready for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from regions.control import Placement
from regions.drill_plan import LiveLoad, MovedLoad, preflight
from regions.drills import Drill, DrillSpec
from regions.ops_state import Halt

Status = Literal["ready", "at_risk", "not_ready"]
#: worst first: the plane takes the first status any region has
STATUSES: tuple[Status, ...] = ("not_ready", "at_risk", "ready")
#: the score's weights: the replay bound's term and the drill's term
W_REPLAY = 0.5
W_DRILL = 0.5
SCORE_MAX = 100
_NO_HALT = Halt(on=False, reason="", by="", at_ms=0)


@dataclass(frozen=True, slots=True)
class ReadinessPolicy:
    #: a passed drill's weight halves every this many seconds (7 days: practise weekly)
    drill_half_life_s: float = 7 * 86_400.0
    #: a replay bound up to this many seconds scores full marks; past it, target / bound
    replay_target_s: float = 300.0
    #: the lowest score that is ``ready``
    ready_score_min: int = 75

    def __post_init__(self) -> None:
        if not (self.drill_half_life_s > 0 and self.replay_target_s > 0):
            raise ValueError("drill_half_life_s and replay_target_s must be positive")
        if not 0 <= self.ready_score_min <= SCORE_MAX:
            raise ValueError(f"ready_score_min must be in [0, {SCORE_MAX}]")


@dataclass(frozen=True, slots=True)
class PlaneFacts:
    """What one evaluation reads of the plane: the same inputs a drill's preflight takes."""

    now_ms: int
    statuses: Mapping[str, str]
    weights: Mapping[str, float]
    placement: Placement
    #: the plane's write and prepare quorums (``LogConfig.quorum`` / ``prepare_quorum``)
    write_quorum: int
    prepare_quorum: int
    #: region -> the live load as a loss of that region would see it (its survivors' prefill)
    loads: Mapping[str, LiveLoad]
    #: region -> active conversations on its shards and their tokens (None: unknown)
    moved: Mapping[str, MovedLoad | None]
    drills: Iterable[Drill]


@dataclass(frozen=True, slots=True)
class LastDrill:
    drill_id: str
    kind: str
    ended_at_ms: int
    age_s: float

    def to_body(self) -> dict[str, Any]:
        return {
            "drill_id": self.drill_id,
            "kind": self.kind,
            "ended_at_ms": self.ended_at_ms,
            "age_s": self.age_s,
        }


@dataclass(frozen=True, slots=True)
class RegionReadiness:
    region: str
    status: Status
    score: int
    quorum_ok: bool
    survivors_up: int
    quorum_needed: int
    capacity_ok: bool
    capacity: Mapping[str, Any]
    conversations_moved: int | None
    replay_time_min_s: float | None
    last_passed_drill: LastDrill | None
    #: a drill of the region that failed after the last passed one (its id), if any
    failed_since: str | None
    replay_term: float
    drill_term: float
    reasons: tuple[str, ...]

    def to_body(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "status": self.status,
            "score": self.score,
            "quorum_ok": self.quorum_ok,
            "survivors_up": self.survivors_up,
            "quorum_needed": self.quorum_needed,
            "capacity_ok": self.capacity_ok,
            "capacity": dict(self.capacity),
            "conversations_moved": self.conversations_moved,
            "replay_time_min_s": self.replay_time_min_s,
            "last_passed_drill": (
                None if self.last_passed_drill is None else self.last_passed_drill.to_body()
            ),
            "failed_since": self.failed_since,
            "replay_term": self.replay_term,
            "drill_term": self.drill_term,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True, slots=True)
class PlaneReadiness:
    evaluated_at_ms: int
    status: Status
    score: int
    regions: tuple[RegionReadiness, ...]
    policy: ReadinessPolicy

    def to_body(self) -> dict[str, Any]:
        return {
            "evaluated_at_ms": self.evaluated_at_ms,
            "status": self.status,
            "score": self.score,
            "regions": [r.to_body() for r in self.regions],
            "policy": {
                "drill_half_life_s": self.policy.drill_half_life_s,
                "replay_target_s": self.policy.replay_target_s,
                "ready_score_min": self.policy.ready_score_min,
                "weights": {"replay": W_REPLAY, "drill": W_DRILL},
            },
        }


def evaluate_plane(facts: PlaneFacts, policy: ReadinessPolicy) -> PlaneReadiness:
    """Every region's readiness, and the plane's (its weakest region's)."""
    drills = list(facts.drills)
    regions = tuple(
        evaluate_region(region, facts, drills, policy) for region in sorted(facts.weights)
    )
    worst = min((STATUSES.index(r.status) for r in regions), default=0)
    return PlaneReadiness(
        evaluated_at_ms=facts.now_ms,
        status=STATUSES[worst],
        score=min((r.score for r in regions), default=0),
        regions=regions,
        policy=policy,
    )


def evaluate_region(
    region: str, facts: PlaneFacts, drills: Iterable[Drill], policy: ReadinessPolicy
) -> RegionReadiness:
    reasons: list[str] = []
    survivors_up = sum(1 for r in facts.weights if r != region and facts.statuses.get(r) == "up")
    needed = max(facts.write_quorum, facts.prepare_quorum)
    quorum_ok = survivors_up >= needed
    if not quorum_ok:
        reasons.append(f"quorum: {survivors_up} region(s) up without it, {needed} needed")
    plan = preflight(
        DrillSpec(kind="region-loss", region=region, hold_s=1.0, reason="readiness"),
        statuses=facts.statuses,
        weights=facts.weights,
        placement=facts.placement,
        active=(),
        halt=_NO_HALT,
        load=facts.loads[region],
        moved_load=facts.moved.get(region),
    )
    capacity_ok = plan.capacity_ok
    if not capacity_ok:
        reasons.append(f"capacity: {plan.capacity['verdict']}")
    if not plan.moves and facts.placement.shards_of(region):
        capacity_ok = False
        reasons.append(f"no region could take the shards of {region}")
    replay_term = replay_score(plan.replay_time_min_s, policy)
    if replay_term < 1:
        reasons.append(
            f"replay: the moved conversations take at least {plan.replay_time_min_s:.1f} s, "
            f"target {policy.replay_target_s:g} s"
        )
    last_passed, failed_since = drill_history(region, drills, facts.now_ms)
    drill_term = 0.0 if failed_since else drill_score(last_passed, policy)
    if last_passed is None:
        reasons.append("drill: no passed drill of this region on record")
    elif failed_since:
        reasons.append(f"drill: {failed_since} failed after the last passed drill")
    elif drill_term < 0.5:
        reasons.append(f"drill: the last passed drill is {last_passed.age_s / 86_400:.1f} days old")
    gate = quorum_ok and capacity_ok
    score = round(SCORE_MAX * gate * (W_REPLAY * replay_term + W_DRILL * drill_term))
    status: Status = (
        "not_ready" if not gate else "ready" if score >= policy.ready_score_min else "at_risk"
    )
    moved = facts.moved.get(region)
    return RegionReadiness(
        region=region,
        status=status,
        score=score,
        quorum_ok=quorum_ok,
        survivors_up=survivors_up,
        quorum_needed=needed,
        capacity_ok=capacity_ok,
        capacity=plan.capacity,
        conversations_moved=None if moved is None else moved.conversations,
        replay_time_min_s=plan.replay_time_min_s,
        last_passed_drill=last_passed,
        failed_since=failed_since,
        replay_term=replay_term,
        drill_term=drill_term,
        reasons=tuple(reasons),
    )


def replay_score(replay_time_min_s: float | None, policy: ReadinessPolicy) -> float:
    """1 within the target (or with no bound: no engines, nothing to move), else target/bound."""
    if replay_time_min_s is None or replay_time_min_s <= policy.replay_target_s:
        return 1.0
    return policy.replay_target_s / replay_time_min_s


def drill_score(last_passed: LastDrill | None, policy: ReadinessPolicy) -> float:
    """``0.5 ** (age / half-life)`` of the last passed drill; 0 without one."""
    if last_passed is None:
        return 0.0
    return float(0.5 ** (max(last_passed.age_s, 0.0) / policy.drill_half_life_s))


def drill_history(
    region: str, drills: Iterable[Drill], now_ms: int
) -> tuple[LastDrill | None, str | None]:
    """The region's last passed drill, and the newest drill of the region that failed after
    it (aborted drills prove nothing either way)."""
    ended = sorted(
        (d for d in drills if d.spec.region == region and d.ended_at_ms is not None),
        key=lambda d: (d.ended_at_ms or 0, d.drill_id),
    )
    passed = [d for d in ended if d.verdict == "passed"]
    last = passed[-1] if passed else None
    after_ms = -1 if last is None or last.ended_at_ms is None else last.ended_at_ms
    failed = [d for d in ended if d.verdict == "failed" and (d.ended_at_ms or 0) > after_ms]
    if last is None or last.ended_at_ms is None:
        return None, failed[-1].drill_id if failed else None
    return (
        LastDrill(
            drill_id=last.drill_id,
            kind=last.spec.kind,
            ended_at_ms=last.ended_at_ms,
            age_s=(now_ms - last.ended_at_ms) / 1000,
        ),
        failed[-1].drill_id if failed else None,
    )
