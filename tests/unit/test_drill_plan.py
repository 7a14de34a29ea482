"""Preflight, dry run and the report of a drill (regions.drill_plan, regions.drill_report,
the HTML page), pure."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from regions.control import Placement
from regions.drill_plan import LiveLoad, MovedLoad, moves_for, preflight
from regions.drill_report import report, summary_lines
from regions.drills import (
    Drill,
    DrillSpec,
    Measurements,
    Observation,
    ReplayTally,
    advance,
    shards_by_region,
    start,
)
from regions.ops_state import Halt
from regions.placement import place_shards
from services.api.drill_report_html import render

WEIGHTS = {"ap-south": 1.0, "eu-west": 1.0, "us-east": 1.0}
UP = dict.fromkeys(WEIGHTS, "up")
SHARDS = 16
HALT_OFF = Halt(False, "", "", 0)
IDLE = LiveLoad(append_rate_per_s=30.0, region_append_capacity_per_s=2000.0)


def placement(**kw: Any) -> Placement:
    fields: dict[str, Any] = {"version": 3, "assignment": place_shards(SHARDS, WEIGHTS),
                              "down": frozenset(), "evacuated": frozenset(), "reason": "t"}  # fmt: skip
    fields.update(kw)
    return Placement(**fields)


def spec(**kw: Any) -> DrillSpec:
    fields: dict[str, Any] = {"kind": "region-loss", "region": "us-east", "hold_s": 5.0,
                              "reason": "drill"}  # fmt: skip
    fields.update(kw)
    return DrillSpec(**fields)


def check(s: DrillSpec, **kw: Any) -> Any:
    args: dict[str, Any] = {"statuses": UP, "weights": WEIGHTS, "placement": placement(),
                            "active": [], "halt": HALT_OFF, "load": IDLE}  # fmt: skip
    args.update(kw)
    return preflight(s, **args)


def test_preflight_passes_on_a_healthy_idle_plane_and_plans_only_the_targets_shards() -> None:
    plan = check(spec(), moved_load=MovedLoad(conversations=40, tokens=80_000))
    assert plan.ok and plan.capacity_ok
    mine = placement().shards_of("us-east")
    assert sorted(plan.moves) == mine and "us-east" not in plan.moves.values()
    body = plan.to_body()
    assert body["shards_moved"] == len(mine) and body["conversations_moved"] == 40
    assert body["replay_time_min_s"] is None  # no engines: no spare prefill rate known
    with_engines = LiveLoad(30.0, 2000.0, spare_prefill_tokens_per_s=4000.0)
    timed = check(spec(), load=with_engines, moved_load=MovedLoad(40, 80_000))
    assert timed.replay_time_min_s == 20.0  # 80,000 tokens at 4,000 tokens/s


def test_preflight_refuses_with_every_reason_named() -> None:
    other = start("d0", spec(region="eu-west"), 0)
    plan = check(
        spec(kind="kill"),
        statuses={**UP, "eu-west": "suspected"},
        placement=placement(down=frozenset({"ap-south"})),
        active=[other],
        halt=Halt(True, "incident 42", "sre", 1),
    )
    text = " | ".join(plan.failures)
    assert not plan.ok
    for expected in ("not up: ['eu-west']", "down or evacuated", "another drill is active",
                     "halt switch is on (incident 42)", "kill drills need"):  # fmt: skip
        assert expected in text


def test_a_kill_drill_without_a_supervisor_says_what_is_missing() -> None:
    """A `convplane up --detach` plane was refused with "needs a plane started by `convplane
    up`", which it was: the reason names the missing supervisor and the alternative."""
    (reason,) = check(spec(kind="kill")).failures
    assert "--detach" in reason and "supervisor" in reason and "region-loss" in reason


def test_capacity_uses_the_region_loss_arithmetic_and_force_overrides_only_it() -> None:
    # 3 regions at 1,500 appends/s each: a survivor would carry 1,500 * 3/2 = 2,250 > 2,000
    busy = LiveLoad(append_rate_per_s=4500.0, region_append_capacity_per_s=2000.0)
    refused = check(spec(), load=busy)
    assert not refused.ok and not refused.capacity_ok
    assert refused.capacity["rate_per_survivor"] == 2250.0
    forced = check(spec(force=True), load=busy)
    assert forced.ok and not forced.capacity_ok
    still_halted = check(spec(force=True), load=busy, halt=Halt(True, "x", "y", 1))
    assert not still_halted.ok


def test_with_engines_the_live_prefill_demand_must_fit_the_smallest_survivor() -> None:
    # 3,000 prefill tokens/s over 3 regions: after a loss a survivor prefills 1,500 tokens/s
    def with_engines(survivor_capacity: float) -> LiveLoad:
        return LiveLoad(30.0, 2000.0, live_prefill_tokens_per_s=3000.0,
                        survivor_prefill_capacity_tokens_per_s=survivor_capacity)  # fmt: skip

    fits = check(spec(), load=with_engines(2000.0))
    assert fits.ok and fits.capacity["prefill"]["demand_per_survivor_tokens_per_s"] == 1500.0
    refused = check(spec(), load=with_engines(1200.0))
    assert not refused.ok and not refused.capacity_ok
    assert any(f.startswith("capacity: prefill:") for f in refused.failures)
    assert check(spec(force=True), load=with_engines(1200.0)).ok
    assert "prefill" not in check(spec()).capacity  # no engines: the append check alone


def test_moves_never_go_to_an_excluded_region() -> None:
    p = placement(evacuated=frozenset({"ap-south"}))
    assert set(moves_for(spec(), p, WEIGHTS).values()) == {"eu-west"}


def finished_drill() -> Drill:
    drill = start("d7", spec(), 1_767_225_600_000)
    t = drill.created_at_ms
    holding = advance(drill, Observation(now_ms=t, injected=True, shards_moved=(1, 2, 3)))
    assert holding is not None
    measured = replace(
        holding.measurements,
        rto_s={1: 1.0, 2: 2.0, 3: 2.5},
        canary_acked={1: 10, 5: 20},
        canary_errors=4,
        series=((0.0, 10, 2, 12.0), (1.0, 12, 0, 9.0)),
        live_appends=((0.0, 120.0, 0.0, 0.0), (2.0, 80.0, 20.0, 0.2), (4.0, 118.5, 0.0, None)),
        placement_versions={"before": 3, "during": 4},
        placement_shards={
            "before": {"ap-south": 2, "us-east": 2},
            "during": {"ap-south": 4},
        },
    )
    restoring = advance(replace(holding, measurements=measured), Observation(now_ms=t + 5_000))
    assert restoring is not None
    done = advance(restoring, Observation(now_ms=t + 6_000, restored=True, canary_lost=0))
    assert done is not None
    return done


def test_the_report_has_the_numbers_an_sre_reads() -> None:
    body = report(finished_drill())
    assert body["verdict"] == "passed" and body["shards_moved"] == 3
    assert (body["rto_p50_s"], body["rto_max_s"]) == (2.0, 2.5)
    assert (body["canary_acked"], body["canary_lost"], body["canary_errors"]) == (30, 0, 4)
    assert [t["phase"] for t in body["timeline"]] == [
        "planned", "preflight", "injecting", "holding", "restoring", "done"
    ]  # fmt: skip
    assert body["started_at"].startswith("2026-01-01T00:00:00")
    assert body["live_appends_per_s"][1] == {
        "t_s": 2.0, "appends_per_s": 80.0, "errors_per_s": 20.0, "error_ratio": 0.2
    }  # fmt: skip
    assert body["placement_shards"]["during"] == {"ap-south": 4}
    assert "RTO p50 2.00s" in "\n".join(summary_lines(body))
    assert body["replay"] is None  # no engines attached


def test_the_report_shows_what_replay_did_since_the_fault() -> None:
    drill = finished_drill()
    assert drill.injected_at_ms is not None
    measured = replace(
        drill.measurements,
        replay_before=ReplayTally(4, 3, 1_000, drill.injected_at_ms - 60_000),
        replay_latest=ReplayTally(44, 41, 81_000, drill.injected_at_ms + 21_500),
        replay_time_min_s=20.0,
        replay_spare_tokens_per_s=4_000.0,
    )
    body = report(replace(drill, measurements=measured))
    # throughput after the takeover (the first RTO, 1 s): 80,000 tokens in 20.5 s
    assert body["replay"] == {"conversations_planned": 40, "conversations_replayed": 38,
                              "tokens_replayed": 80_000, "makespan_s": 21.5,
                              "planner_bound_s": 20.0, "takeover_s": 1.0,
                              "tokens_per_s": 80_000 / 20.5, "planner_tokens_per_s": 4_000.0,
                              "throughput_of_planner": 80_000 / 20.5 / 4_000}  # fmt: skip
    lines = [line.strip() for line in summary_lines(body)]
    assert (
        "replay: 38 of 40 conversations, 80000 tokens; makespan 21.5s (planner's bound 20.0s)"
    ) in lines
    assert (
        "replay throughput 3,902 tokens/s after takeover 1.0s (planner's 4,000 tokens/s)" in lines
    )
    assert "replay makespan / planner&#x27;s bound (s)</th><td>21.5 / 20" in render(body)
    round_trip = Drill.from_body(replace(drill, measurements=measured).to_body())
    assert round_trip.measurements == measured


def test_the_html_report_is_self_contained() -> None:
    page = render(report(finished_drill()))
    assert page.startswith("<!doctype html>") and page.count("<svg") == 3
    assert "<script" not in page and not re.search(r"\b(src|href)=", page)
    assert "<th>shards per region during</th><td>ap-south 4</td>" in page
    urls = set(re.findall(r"https?://[^\s\"'<>]+", page))
    assert urls == {"http://www.w3.org/2000/svg"}  # the SVG namespace, never fetched


def test_the_html_report_escapes_what_operators_typed() -> None:
    drill = finished_drill()
    body = report(drill)
    body["reason"] = "<img src=x onerror=alert(1)>"
    page = render(body)
    assert "<img" not in page and "&lt;img" in page


def test_live_points_round_trip_and_records_from_before_errors_were_counted_still_read() -> None:
    measured = finished_drill().measurements
    assert Measurements.from_body(measured.to_body()) == measured
    old = {**measured.to_body(), "live_appends": [[0.0, 120.0], [2.0, 80.0]]}
    assert Measurements.from_body(old).live_appends == (
        (0.0, 120.0, 0.0, None),
        (2.0, 80.0, 0.0, None),
    )


def test_shards_by_region_counts_a_placement() -> None:
    assert shards_by_region({0: "b", 1: "a", 2: "b"}) == {"a": 1, "b": 2}
