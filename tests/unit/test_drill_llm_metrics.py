"""A drill's LLM figures (regions.drill_llm_metrics, replay.drill_tally, the report's sections):
TTFT quantiles from histogram deltas, the cache-recovery curve and its target. Pure."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from regions.capacity_arithmetic import plan_replay
from regions.drill_llm_metrics import (
    CURVE_POINTS_MAX,
    EngineSnapshot,
    Histogram,
    curve,
    delta,
    first_takeover_ms,
    prefix_hit_ratio,
    quantile,
    time_to_share,
    warm_counts,
    warm_events_of,
    warm_target,
    window_figures,
    without,
)
from regions.drill_report import report, summary_lines
from regions.drills import Drill, DrillSpec, Observation, ReplayTally, advance, start
from replay.drill_tally import (
    MOVED_TIMES_MAX,
    WARM_BUCKETS_MAX,
    DrillTally,
    histogram_body,
    ttft_buckets,
)
from replay.model import ReplayResult
from services.api.drill_report_html import render

BOUNDS = (0.1, 0.5, 1.0)


def hist(*cumulative: float) -> Histogram:
    return Histogram(BOUNDS, cumulative)


# --- TTFT ---------------------------------------------------------------------------------------


def test_a_quantile_is_interpolated_inside_its_bucket_as_prometheus_does() -> None:
    h = hist(10, 60, 100, 100)
    assert quantile(h, 0.5) == pytest.approx(0.1 + 0.4 * (50 - 10) / 50)  # 0.42 s
    assert quantile(h, 0.99) == pytest.approx(0.5 + 0.5 * (99 - 60) / 40)
    assert quantile(h, 0.05) == pytest.approx(0.1 * 5 / 10)  # the first bucket starts at 0
    assert quantile(hist(10, 20, 30, 100), 0.99) == 1.0  # in +Inf: the largest finite bound
    assert quantile(hist(0, 0, 0, 0), 0.5) is None and quantile(None, 0.5) is None


def test_a_window_is_the_difference_of_two_snapshots_and_a_restart_voids_it() -> None:
    assert delta(hist(15, 70, 110, 112), hist(10, 60, 100, 100)) == hist(5, 10, 10, 12)
    assert delta(hist(1, 2, 3, 3), hist(10, 60, 100, 100)) is None  # counts went down
    assert delta(Histogram((0.2,), (1, 1)), hist(0, 0, 0, 0)) is None  # other buckets
    assert delta(hist(1, 2, 3, 3), None) == hist(1, 2, 3, 3)  # since the engine started


def test_replays_are_taken_off_the_engines_histogram() -> None:
    # 60 live requests (10 under 0.1 s, 50 under 0.5 s) and 40 replays between 0.5 and 1 s
    assert without(hist(10, 60, 100, 100), hist(0, 0, 40, 40)) == hist(10, 60, 60, 60)
    # the worker timed its replays a bucket above the engine (network time): never negative,
    # never above the live total, never decreasing
    assert without(hist(10, 50, 50, 50), hist(0, 0, 40, 40)) == hist(10, 10, 10, 10)
    assert without(hist(10, 50, 50, 50), None) == hist(10, 50, 50, 50)


def test_the_live_prefix_hit_ratio_leaves_replay_out() -> None:
    earlier = EngineSnapshot(None, None, 1_000.0, 500.0, 0, 0)
    # 11,000 tokens queried, 6,500 hit; replay queried 1,000 of them and hit 500
    later = EngineSnapshot(None, None, 12_000.0, 7_000.0, 1_000, 500)
    assert prefix_hit_ratio(later, earlier) == pytest.approx(6_000 / 10_000)
    assert prefix_hit_ratio(later, replace(earlier, prefix_cache_hits_total=None)) is None
    figures = window_figures(
        replace(later, engine_ttft=hist(10, 60, 100, 100), replay_ttft=hist(0, 0, 40, 40)),
        replace(earlier, engine_ttft=hist(0, 0, 0, 0), replay_ttft=hist(0, 0, 0, 0)),
    )
    assert figures["requests"] == 60 and figures["p50_s"] == pytest.approx(0.1 + 0.4 * 20 / 50)
    # replay's side unknown at the start (a node before these figures) or restarted since:
    # its requests cannot be told from live ones, so the window is unknown, not all live
    with_replay = replace(later, engine_ttft=hist(10, 60, 100, 100), replay_ttft=hist(0, 0, 40, 40))
    for start_replay in (None, hist(0, 0, 50, 50)):
        start = replace(earlier, engine_ttft=hist(0, 0, 0, 0), replay_ttft=start_replay)
        assert window_figures(with_replay, start)["requests"] is None


def test_the_simulators_buckets_read_back_as_vllm_exports_them() -> None:
    buckets = ttft_buckets([1, 0, 2] + [0] * 19, 4)
    assert buckets[:3] == ((0.001, 1.0), (0.005, 1.0), (0.01, 3.0)) and buckets[-1] == (
        math.inf,
        4.0,
    )
    body = histogram_body(buckets)
    assert body is not None
    parsed = Histogram.from_body(body)
    assert parsed is not None and parsed.count == 4 and len(parsed.bounds_s) == 22


# --- the cache-recovery curve and its target --------------------------------------------------


def test_warm_events_become_a_curve_since_injection() -> None:
    injected = 1_000_000
    events = [(injected - 100, 5), (injected + 1_000, 2), (injected + 3_000, 1),
              (injected + 2_000, 1), (injected + 90_000, 4)]  # fmt: skip
    points = warm_counts(events, injected, injected + 60_000)  # before and after are left out
    assert points == ((1.0, 2), (2.0, 3), (3.0, 4))
    assert curve(points, 4) == [
        {"t_s": 1.0, "warm_share": 0.5},
        {"t_s": 2.0, "warm_share": 0.75},
        {"t_s": 3.0, "warm_share": 1.0},
    ]
    assert time_to_share(points, 4, 0.9) == 3.0 and time_to_share(points, 5, 0.9) is None
    assert curve(((1.0, 3),), 2) == [{"t_s": 1.0, "warm_share": 1.0}]  # replayed twice
    views = {"us-east": {"warmed": [[injected, 1]]}, "eu-west": {"warmed": [[injected, 2]]}}
    assert warm_events_of(views, excluding="us-east") == [(injected, 2)]


def test_a_long_curve_is_merged_never_early() -> None:
    events = [(1_000 + i * 10, 1) for i in range(1000)]
    points = warm_counts(events, 1_000, 100_000)
    assert len(points) == CURVE_POINTS_MAX and points[-1] == (9.99, 1000)
    full = warm_counts(events[:CURVE_POINTS_MAX], 1_000, 100_000)
    assert len(full) == CURVE_POINTS_MAX
    # every kept point is a real (time, count) pair: a merged curve never shows warmth early
    assert all(n == round(t * 100) + 1 for t, n in points)


def test_the_target_is_90_percent_warm_within_takeover_plus_the_bound_plus_10_percent() -> None:
    # the example: 2,000 prompts of 8,192 tokens at 92,800 spare tokens/s
    bound_s = plan_replay(2000, 8192, 92_800).replay_time_min_s
    assert bound_s == pytest.approx(176.55, abs=0.01)
    limit_s = 2.0 + bound_s * 1.1
    on_time = ((100.0, 1000), (limit_s - 1, 1800), (limit_s + 5, 2000))
    passed = warm_target(on_time, 2000, planner_bound_s=bound_s, takeover_s=2.0, observed_s=300.0)
    assert passed.passed is True and passed.limit_s == pytest.approx(limit_s)
    assert passed.time_to_share_s == limit_s - 1 and passed.warm_share_at_limit == 0.9
    late = ((100.0, 1000), (limit_s + 1, 1800))
    failed = warm_target(late, 2000, planner_bound_s=bound_s, takeover_s=2.0, observed_s=300.0)
    assert failed.passed is False and failed.warm_share_at_limit == 0.5
    assert "limit 196.21s" in failed.reason
    # the fault ended before the limit with the share not reached: not judged
    short = warm_target(late[:1], 2000, planner_bound_s=bound_s, takeover_s=2.0, observed_s=60.0)
    assert short.passed is None and "before the limit" in short.reason
    assert (
        warm_target(on_time, 0, planner_bound_s=bound_s, takeover_s=0, observed_s=1).passed is None
    )
    no_bound = warm_target(on_time, 2000, planner_bound_s=None, takeover_s=0, observed_s=300.0)
    assert no_bound.passed is None and "planner" in no_bound.reason


def test_replay_keeps_its_prefills_and_when_conversations_warmed() -> None:
    tally = DrillTally()
    # a job in two pieces: two engine requests, the second querying the first's prefix again
    tally.replayed(result(request_ms=(300.0, 5_000_000.0), queried=1_010, hit=16))
    # a worker before engine requests were reported: its whole job counts as one request
    tally.replayed(result(request_ms=(), queried=0, hit=0))
    tally.warmed(1_234)
    tally.warmed(1_299)
    tally.warmed(1_300)
    body = tally.to_body()
    assert body["warmed"] == [[1_200, 2], [1_300, 1]]
    assert (body["replay_prompt_tokens"], body["replay_cached_tokens"]) == (1_010 + 900, 16 + 8)
    replay = Histogram.from_body(body["replay_ttft"])
    # 300 ms and the old worker's 50 ms under 0.5 s; 5,000 s past the last bound (+Inf only)
    assert replay is not None and replay.count == 3 and replay.at(0.5) == 2
    for i in range(WARM_BUCKETS_MAX + 5):
        tally.warmed(10_000 + i * 100)
    kept = tally.to_body()["warmed"]
    assert len(kept) == WARM_BUCKETS_MAX and kept[0][0] == 10_500  # the oldest went first
    for i in range(MOVED_TIMES_MAX + 1):
        tally.moved_here(i)
    assert tally.to_body()["moved_here_ms"][0] == 1  # bounded too


def test_the_takeover_is_the_first_shard_a_survivor_led_after_injection() -> None:
    views = {"us-east": {"moved_here_ms": [5_000]},  # the target: left out
             "eu-west": {"moved_here_ms": [100, 7_000, 6_500]},
             "ap-south": {}}  # fmt: skip
    assert first_takeover_ms(views, excluding="us-east", since_ms=1_000) == 6_500
    assert first_takeover_ms(views, excluding="us-east", since_ms=8_000) is None


def result(request_ms: tuple[float, ...], queried: int, hit: int) -> ReplayResult:
    return ReplayResult(job_id="b/t1/c/1", region="b", tenant_id="t1", conversation_id="c",
                        model_revision="m@1", status="replayed", worker_id="w", engine_id="e",
                        prompt_tokens=900, cached_prompt_tokens=8, duration_ms=50.0,
                        finished_at_ms=1, request_ms=request_ms, queried_tokens=queried,
                        hit_tokens=hit)  # fmt: skip


# --- in the report --------------------------------------------------------------------------


def snapshot(ttft: tuple[float, ...], replay: tuple[float, ...], hits: float) -> EngineSnapshot:
    return EngineSnapshot(hist(*ttft), hist(*replay), hits * 2, hits, 0, 0)


def drill_with_engines() -> Drill:
    spec = DrillSpec(kind="region-loss", region="us-east", hold_s=5.0, reason="drill")
    drill = start("d8", spec, 1_767_225_600_000)
    t = drill.created_at_ms
    holding = advance(drill, Observation(now_ms=t, injected=True, shards_moved=(1, 2)))
    assert holding is not None
    survivors = {
        "start": {"eu-west": snapshot((10, 20, 20, 20), (0, 0, 0, 0), 100.0)},
        "restore": {
            "eu-west": snapshot((12, 40, 60, 60), (0, 10, 30, 30), 300.0),
            "us-east": snapshot((0, 0, 0, 0), (0, 0, 0, 0), 0.0),  # the target: left out
        },
        "end": {"eu-west": snapshot((22, 50, 70, 70), (0, 10, 30, 30), 500.0)},
    }
    measured = replace(
        holding.measurements,
        rto_s={1: 2.0, 2: 1.8},
        takeover_s=1.5,  # replay saw the first move before any canary landed
        replay_before=ReplayTally(0, 0, 0, None),
        replay_latest=ReplayTally(4, 4, 8_000, t + 4_000),
        replay_time_min_s=2.0,
        replay_spare_tokens_per_s=4_000.0,
        engine_snapshots=survivors,
        warm_points=((2.0, 1), (3.0, 2), (3.5, 4)),
    )
    restoring = advance(replace(holding, measurements=measured), Observation(now_ms=t + 5_000))
    assert restoring is not None
    done = advance(restoring, Observation(now_ms=t + 6_000, restored=True, canary_lost=0))
    assert done is not None
    return done


def test_the_report_carries_the_curve_the_target_and_live_ttft_per_survivor() -> None:
    drill = drill_with_engines()
    assert Drill.from_body(drill.to_body()) == drill  # the record round-trips
    body = report(drill)
    recovery = body["cache_recovery"]
    assert recovery["moved_conversations"] == 4 and recovery["warm_conversations"] == 4
    assert recovery["curve"][-1] == {"t_s": 3.5, "warm_share": 1.0}
    # 90 % of 4 warm at 3.5 s; the limit is the first takeover (1.5 s) + 2 s x 1.1 = 3.7 s
    target = recovery["target"]
    assert target["passed"] is True and target["limit_s"] == pytest.approx(3.7)
    assert recovery["observed_s"] == 5.0
    ttft = body["live_ttft"]
    assert list(ttft) == ["eu-west"]
    before, during, after = (ttft["eu-west"][w] for w in ("before", "during", "after"))
    assert before["requests"] == 20 and before["p50_s"] == pytest.approx(0.1 + 0.4 * 0 / 10)
    # during: 40 requests, 30 of them replays: 10 live, 2 under 0.1 s and 8 under 0.5 s
    assert during["requests"] == 10 and during["p50_s"] == pytest.approx(0.1 + 0.4 * 3 / 8)
    assert during["prefix_hit_ratio"] == 0.5
    assert after["requests"] == 10 and after["p99_s"] == pytest.approx(0.1 * 9.9 / 10)
    lines = "\n".join(summary_lines(body))
    assert "cache recovery: 4 of 4 moved conversations warm; target passed" in lines
    assert "live TTFT eu-west: before p50 100ms" in lines
    page = render(body)
    assert "<h2>Cache recovery" in page and "Live time to first token per survivor" in page
    assert page.count("<svg") == 2 and "<script" not in page  # RTO bars and the curve
    assert re.search(r"<td>eu-west</td><td>during</td><td>10</td><td>250</td>", page)


def test_without_engines_the_report_has_no_llm_sections() -> None:
    drill = drill_with_engines()
    bare = replace(drill, measurements=replace(
        drill.measurements, replay_before=None, replay_latest=None, engine_snapshots={},
        warm_points=()))  # fmt: skip
    body = report(bare)
    assert body["cache_recovery"] is None and body["live_ttft"] is None
    assert "Cache recovery" not in render(body)
