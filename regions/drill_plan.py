"""Preflight and dry run of a drill: may it start, and what would it move. Pure.

Preflight refuses a drill (nothing is committed) unless

* every region is up and none is down or evacuated in the committed placement,
* no other drill is active and the halt switch is off,
* the kind can run here (``kill`` needs the local plane's supervisor),
* a kill of one node (``node``) takes some shard away: the node's slot holds one,
* the survivors have the capacity to take the target's load: the region-loss arithmetic of
  ``regions.capacity_arithmetic.plan_region_loss`` fed with the live append rate (appends are the log's
  unit of work: one "token" per append, no cache), i.e. per survivor ``Q * N/(N-1)`` must not
  exceed ``region_append_capacity_per_s``. ``force`` overrides this check only.

The dry run answers the same questions and what would happen: the shards that move and to which
region (weighted rendezvous over the survivors, as the placement planner would place them; a
node kill's slot stays in its region), the
active conversations on them and their tokens, and the planner's lower bound on replay time
(``plan_replay``) when a spare prefill rate is known.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from regions.capacity_arithmetic import plan_region_loss, plan_replay
from regions.control import Placement
from regions.drill_kinds import rules_of
from regions.drills import Drill, DrillSpec, shards_taken, target_name
from regions.ops_state import Halt
from regions.placement import SlotMap, rank_regions

#: the live append rate below which the capacity check is not meaningful (an idle plane)
APPEND_RATE_FLOOR_PER_S = 1.0


@dataclass(frozen=True, slots=True)
class MovedLoad:
    """Active conversations on the shards that would move, and their prompt tokens."""

    conversations: int
    tokens: int


@dataclass(frozen=True, slots=True)
class LiveLoad:
    #: acknowledged appends per second over the whole plane, measured
    append_rate_per_s: float
    #: what one region sustains (configured), appends per second
    region_append_capacity_per_s: float
    #: spare prefill tokens per second on the survivors (None: no engines attached)
    spare_prefill_tokens_per_s: float | None = None
    #: live prefill demand over the whole plane, tokens per second, measured at the engines
    live_prefill_tokens_per_s: float | None = None
    #: the smallest survivor's prefill capacity (its live demand plus its spare), tokens/s
    survivor_prefill_capacity_tokens_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class DrillPlan:
    failures: tuple[str, ...]
    capacity_ok: bool
    capacity: Mapping[str, Any]
    moves: Mapping[int, str]  # shard -> region it would move to
    moved_load: MovedLoad | None
    replay_time_min_s: float | None

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_body(self) -> dict[str, Any]:
        per_region: dict[str, int] = {}
        for region in self.moves.values():
            per_region[region] = per_region.get(region, 0) + 1
        return {
            "ok": self.ok,
            "failures": list(self.failures),
            "capacity_ok": self.capacity_ok,
            "capacity": dict(self.capacity),
            "shards_moved": len(self.moves),
            "moves": {str(s): r for s, r in sorted(self.moves.items())},
            "shards_to_region": dict(sorted(per_region.items())),
            "conversations_moved": self.moved_load.conversations if self.moved_load else None,
            "replay_tokens": self.moved_load.tokens if self.moved_load else None,
            "replay_time_min_s": self.replay_time_min_s,
        }


def moves_for(
    spec: DrillSpec, placement: Placement, weights: Mapping[str, float], node_count: int = 1
) -> dict[int, str]:
    """Where the target's shards would go: the best survivor by weighted rendezvous; a killed
    node's slot stays in its region (a sibling node leads it meanwhile)."""
    if spec.node is not None:
        slot_map = SlotMap(len(placement.assignment), weights)  # every shard is placed
        taken = shards_taken(spec, placement.shards_of(spec.region), node_count, slot_map)
        return dict.fromkeys(taken, spec.region)
    survivors = {
        r: w
        for r, w in weights.items()
        if r != spec.region and r not in placement.down | placement.evacuated and w > 0
    }
    if not survivors:
        return {}
    return {s: rank_regions(s, survivors)[0] for s in placement.shards_of(spec.region)}


def preflight(
    spec: DrillSpec,
    *,
    statuses: Mapping[str, str],
    weights: Mapping[str, float],
    placement: Placement,
    active: Sequence[Drill],
    halt: Halt,
    load: LiveLoad,
    moved_load: MovedLoad | None = None,
    kill_supported: bool = False,
    node_count: int = 1,
) -> DrillPlan:
    """``node_count``: how many nodes the target region runs (a node kill's slot)."""
    failures: list[str] = []
    if spec.region not in weights:
        failures.append(f"no region {spec.region!r}")
    not_up = sorted(r for r in weights if statuses.get(r) != "up")
    if not_up:
        failures.append(f"regions not up: {not_up}")
    excluded = sorted(placement.down | placement.evacuated)
    if excluded:
        failures.append(f"regions down or evacuated in the placement: {excluded}")
    if active:
        failures.append(f"another drill is active: {[d.drill_id for d in active]}")
    if halt.on:
        failures.append(f"the halt switch is on ({halt.reason})")
    if rules_of(spec.kind).needs_supervisor and not kill_supported:
        failures.append(
            "kill drills need a supervisor that restarts the killed region's processes: a "
            "plane run by `convplane up` in the foreground (`--detach` and other deployments "
            "have none); a region-loss drill takes a region away without killing it"
        )
    capacity, capacity_ok = _capacity(len(weights), load)
    if not capacity_ok and not spec.force:
        failures.append(f"capacity: {capacity['verdict']} (force overrides this check)")
    moves = moves_for(spec, placement, weights, node_count) if spec.region in weights else {}
    if spec.node is not None and not moves:
        failures.append(f"{target_name(spec)} leads no shard: a kill of it measures nothing")
    elif spec.region in weights and not moves and placement.shards_of(spec.region):
        failures.append(f"no region could take the shards of {spec.region}")
    replay_time_min_s = None
    if moved_load and moved_load.conversations > 0 and load.spare_prefill_tokens_per_s:
        replay_time_min_s = plan_replay(
            moved_load.conversations,
            moved_load.tokens / moved_load.conversations or 1.0,
            load.spare_prefill_tokens_per_s,
        ).replay_time_min_s
    return DrillPlan(
        failures=tuple(failures),
        capacity_ok=capacity_ok,
        capacity=capacity,
        moves=moves,
        moved_load=moved_load,
        replay_time_min_s=replay_time_min_s,
    )


def _capacity(regions: int, load: LiveLoad) -> tuple[dict[str, Any], bool]:
    rate_per_region = load.append_rate_per_s / max(regions, 1)
    body: dict[str, Any] = {
        "append_rate_per_s": load.append_rate_per_s,
        "rate_per_region": rate_per_region,
        "region_append_capacity_per_s": load.region_append_capacity_per_s,
    }
    if regions < 2:
        return {**body, "verdict": "a single region cannot lose a region"}, False
    plan = plan_region_loss(
        regions=regions,
        rate_per_region=max(rate_per_region, APPEND_RATE_FLOOR_PER_S),
        input_tokens=1.0,
        cache_hit=0.0,
        prefill_capacity=load.region_append_capacity_per_s,
    )
    body.update(
        rate_per_survivor=plan.rate_per_survivor,
        spare_per_survivor=plan.spare_after_worst,
        verdict=plan.verdict,
    )
    prefill, prefill_ok = _prefill_capacity(regions, load)
    if prefill is not None:
        body["prefill"] = prefill
        if not prefill_ok:
            body["verdict"] = f"prefill: {prefill['verdict']}"
    return body, plan.feasible_worst and prefill_ok


def _prefill_capacity(regions: int, load: LiveLoad) -> tuple[dict[str, Any] | None, bool]:
    """The same region-loss arithmetic on the engines' live prefill demand (tokens/s), worst
    case (the moved conversations' caches are cold): None where no engines are attached."""
    live, capacity = load.live_prefill_tokens_per_s, load.survivor_prefill_capacity_tokens_per_s
    if live is None or not capacity:
        return None, True
    plan = plan_region_loss(
        regions=regions,
        rate_per_region=max(live / regions, APPEND_RATE_FLOOR_PER_S),
        input_tokens=1.0,
        cache_hit=0.0,
        prefill_capacity=capacity,
    )
    return {
        "live_prefill_tokens_per_s": live,
        "survivor_prefill_capacity_tokens_per_s": capacity,
        "demand_per_survivor_tokens_per_s": plan.demand_after_worst,
        "verdict": plan.verdict,
    }, plan.feasible_worst
