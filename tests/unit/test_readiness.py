"""Readiness of each region's loss (regions.readiness), pure: quorum, capacity, the replay
bound, drill age and outcome, and the score and status they make."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from regions.control import Placement
from regions.drill_plan import LiveLoad, MovedLoad
from regions.drills import Drill, DrillSpec, start
from regions.placement import place_shards
from regions.readiness import (
    PlaneFacts,
    ReadinessPolicy,
    drill_score,
    evaluate_plane,
    replay_score,
)

WEIGHTS = {"ap-south": 1.0, "eu-west": 1.0, "us-east": 1.0}
SHARDS = 12
NOW_MS = 1_800_000_000_000
DAY_MS = 86_400_000
POLICY = ReadinessPolicy()
#: the issue's example: 2,000 prompts of 8,192 tokens at 92,800 spare tokens/s
MOVED = MovedLoad(conversations=2_000, tokens=2_000 * 8_192)
SPARE_TOKENS_PER_S = 92_800.0


def load(spare: float = SPARE_TOKENS_PER_S, capacity: float = 200_000.0) -> LiveLoad:
    """A loss's view of the live load: 30 appends/s, 90,000 prefill tokens/s over the plane,
    ``spare`` on the survivors and ``capacity`` on the smallest of them."""
    return LiveLoad(
        append_rate_per_s=30.0,
        region_append_capacity_per_s=2000.0,
        spare_prefill_tokens_per_s=spare,
        live_prefill_tokens_per_s=90_000.0,
        survivor_prefill_capacity_tokens_per_s=capacity,
    )


def passed_drill(region: str, ended_ms: int, verdict: str = "passed", n: int = 1) -> Drill:
    spec = DrillSpec(kind="region-loss", region=region, hold_s=5.0, reason="practice")
    drill = start(f"d-{region}-{n}", spec, ended_ms - 10_000)
    phase = "done" if verdict == "passed" else verdict
    return replace(drill, phase=phase, verdict=verdict, ended_at_ms=ended_ms)  # type: ignore[arg-type]


def facts(**kw: Any) -> PlaneFacts:
    fields: dict[str, Any] = {
        "now_ms": NOW_MS,
        "statuses": dict.fromkeys(WEIGHTS, "up"),
        "weights": WEIGHTS,
        "placement": Placement(3, place_shards(SHARDS, WEIGHTS), frozenset(), frozenset(), "t"),
        "write_quorum": 2,
        "prepare_quorum": 2,
        "loads": dict.fromkeys(WEIGHTS, load()),
        "moved": dict.fromkeys(WEIGHTS, MOVED),
        "drills": [passed_drill(r, NOW_MS - 1000) for r in WEIGHTS],
    }
    fields.update(kw)
    return PlaneFacts(**fields)


def region(plane: Any, name: str) -> Any:
    return next(r for r in plane.regions if r.region == name)


def test_a_healthy_plane_drilled_just_now_is_ready_and_shows_the_issues_replay_bound() -> None:
    plane = evaluate_plane(facts(), POLICY)
    assert (plane.status, plane.score) == ("ready", 100)
    east = region(plane, "us-east")
    assert east.quorum_ok and east.capacity_ok and east.reasons == ()
    assert east.replay_time_min_s == pytest.approx(176.55, abs=0.01)  # at least 176.6 s
    assert east.last_passed_drill is not None and east.last_passed_drill.age_s == 1.0
    body = plane.to_body()
    assert body["regions"][2]["region"] == "us-east" and body["policy"]["ready_score_min"] == 75


def test_readiness_falls_when_a_survivors_capacity_drops() -> None:
    """Less spare prefill on the survivors: the replay bound grows past its target and the
    score falls (at risk); a survivor that cannot serve the moved load: not ready."""
    before = region(evaluate_plane(facts(), POLICY), "us-east")
    slower = {**facts().loads, "us-east": load(spare=23_200.0)}  # a quarter of the spare
    after = region(evaluate_plane(facts(loads=slower), POLICY), "us-east")
    assert after.replay_time_min_s == pytest.approx(4 * before.replay_time_min_s)
    assert after.replay_term == pytest.approx(300 / after.replay_time_min_s)
    assert (before.status, after.status) == ("ready", "at_risk")
    assert after.score == round(100 * (0.5 * after.replay_term + 0.5 * after.drill_term)) < 75
    # the smallest survivor's prefill capacity falls below its share of the load after the loss
    full = {**facts().loads, "us-east": load(capacity=40_000.0)}  # needs 45,000 tokens/s
    lost = region(evaluate_plane(facts(loads=full), POLICY), "us-east")
    assert (lost.status, lost.score, lost.capacity_ok) == ("not_ready", 0, False)
    assert lost.reasons[0].startswith("capacity: prefill: infeasible")
    # the other regions' losses are untouched: the plane is as ready as its weakest loss
    plane = evaluate_plane(facts(loads=full), POLICY)
    assert (plane.status, plane.score) == ("not_ready", 0)
    assert region(plane, "eu-west").status == "ready"


def test_a_loss_that_leaves_no_quorum_is_not_ready() -> None:
    """ap-south is down already: losing eu-west leaves one region up of the two needed."""
    statuses = {"ap-south": "down", "eu-west": "up", "us-east": "up"}
    plane = evaluate_plane(facts(statuses=statuses), POLICY)
    west = region(plane, "eu-west")
    assert (west.quorum_ok, west.survivors_up, west.quorum_needed) == (False, 1, 2)
    assert west.status == "not_ready" and west.reasons[0].startswith("quorum:")
    south = region(plane, "ap-south")  # losing the region that is down already leaves two
    assert south.quorum_ok


def test_the_drill_term_halves_every_half_life_and_a_later_failure_clears_it() -> None:
    week = 7 * DAY_MS
    aged = facts(drills=[passed_drill(r, NOW_MS - week) for r in WEIGHTS])
    at_half_life = region(evaluate_plane(aged, POLICY), "us-east")
    assert at_half_life.drill_term == pytest.approx(0.5)
    assert (at_half_life.score, at_half_life.status) == (75, "ready")
    older = facts(drills=[passed_drill(r, NOW_MS - 2 * week) for r in WEIGHTS])
    two_half_lives = region(evaluate_plane(older, POLICY), "us-east")
    assert (two_half_lives.score, two_half_lives.status) == (62, "at_risk")
    never = region(evaluate_plane(facts(drills=[]), POLICY), "us-east")
    assert (never.score, never.status, never.last_passed_drill) == (50, "at_risk", None)
    failed = passed_drill("us-east", NOW_MS - 500, verdict="failed", n=2)
    aborted = passed_drill("eu-west", NOW_MS - 500, verdict="aborted", n=2)
    drills = [*facts().drills, failed, aborted]
    plane = evaluate_plane(facts(drills=drills), POLICY)
    east = region(plane, "us-east")
    assert (east.failed_since, east.drill_term, east.status) == (failed.drill_id, 0.0, "at_risk")
    assert region(plane, "eu-west").status == "ready"  # an abort proves nothing either way


def test_the_terms_stated_in_the_module_docstring() -> None:
    assert replay_score(None, POLICY) == 1.0
    assert replay_score(300.0, POLICY) == 1.0
    assert replay_score(600.0, POLICY) == 0.5
    assert drill_score(None, POLICY) == 0.0
    with pytest.raises(ValueError):
        ReadinessPolicy(drill_half_life_s=0.0)
    with pytest.raises(ValueError):
        ReadinessPolicy(ready_score_min=101)
