"""KV replay after a region failure, on simulated engines, in virtual time.

A program, not a test:  ``.venv/bin/python -m bench.replay [--seed N] [--sessions N] ...``

Scenario: 3 regions, r1 fails at t=0; its conversations move to r2 and r3 (half each). Each
survivor has K simulated engines (``replay.engines.sim_core``: chunked priority prefill, block
prefix cache). Live traffic per survivor (Poisson, one seeded stream per region, identical in
both runs): turns of the survivor's own conversations (warm: their prefix is in their engine's
cache, each turn adds new tokens) and turns of moved conversations (cold unless replay warmed
them first). The run is done twice with the same seed:

- without replay: moved conversations rebuild their KV on their first live turn;
- with replay: per region one ``ReplayScheduler``; per engine one ``CapacityController`` fed
  from that engine's own metrics every ``poll_s`` (the engine counts a request's prompt tokens
  when its prefill completes, like vLLM V1); every ``tick_s`` each engine's controller is asked for grants and the scheduler hands
  out jobs; a replay is a prefill at priority 100 (live: 0), and up to
  ``max_concurrent_replays`` of them sit in an engine, so it never idles between replays. A live turn of a
  queued conversation calls ``mark_live``. The job bus is skipped (transport is not measured);
  KV affinity is learnt from replay results, as the router would.

Reported (per region, and the worst region in the JSON):

- ``makespan_s``: failover (t=0) to the last replay completion.
- ``bound_s`` = replayed tokens / measured average spare rate, where the spare rate is
  ``(K x capacity x (1 - headroom) x makespan - live computed tokens during [0, makespan]) /
  makespan``: the DESIGN's spare, measured during the with-replay run (live computed tokens are
  what the engines actually prefilled for live requests; cached tokens cost nothing).
  ``bound_no_headroom_s`` uses the whole idle capacity instead (a physical lower bound).
- live TTFT p50/p99 (all live requests arriving in [0, makespan]) with and without replay, and
  for the survivors' own conversations only (the traffic replay could slow down, unaffected by
  replay's warming of moved conversations).

- the prefix a replay rebuilds for agent conversations with tool calls (``bench/replay_prefix.py``):
  the live turn's cached share of its prompt after replay, against the whole-transcript bound.

Diagnostics per region: denials by reason, the share of polls that saw live requests waiting
or a spare of 0, the controllers' mean live estimate, and a timeline (per tenth of the run) of
the controllers' rate-based spare estimate vs the spare measured afterwards vs the replay rate.

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math

from bench.replay_prefix import measure as measure_prefix
from bench.replay_prefix import report_line as prefix_line
from bench.replay_sim import Params, Region, simulate


def print_diagnostics(params: Params, region: Region) -> None:
    """Why replay ran at the rate it did: denials, how often the spare read 0, and the
    controllers' spare estimate against the spare measured afterwards, per 10% of the run."""
    diag = region.diag
    denied: dict[str, int] = {}
    for controller in region.controllers:
        for reason, count in controller.snapshot().denied.items():
            denied[reason] = denied.get(reason, 0) + count
    polls = max(diag.polls, 1)
    print(
        f"      diagnostics: denials {dict(sorted(denied.items()))}; polls {diag.polls}: "
        f"live waiting {diag.polls_live_waiting / polls:.0%}, spare read 0 "
        f"{diag.polls_zero_spare / polls:.0%}; mean estimated spare/engine "
        f"{diag.spare_sum / polls:.0f}, live/engine {diag.live_sum / polls:.0f} tokens/s"
    )
    usable = params.engines_per_region * params.prefill_tokens_per_s * (1 - params.headroom)
    timeline = [row for row in diag.timeline if row[0] <= region.replay_done_s]
    step = max(1, len(timeline) // 10)
    cells = []
    for before, after in zip(timeline[::step], timeline[step::step], strict=False):
        elapsed_s = after[0] - before[0]
        replayed = (after[3] - before[3]) / elapsed_s
        live = (after[2] - before[2]) / elapsed_s - replayed
        estimated = sum(row[1] for row in timeline if before[0] <= row[0] < after[0]) / step
        cells.append(
            f"{before[0]:.0f}s {estimated / 1000:.1f}/{(usable - live) / 1000:.1f}/"
            f"{replayed / 1000:.1f}"
        )
    print(
        "      timeline (estimated spare / measured spare / replayed, k tokens/s): "
        + ", ".join(cells)
    )


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def ttfts_ms(regions: list[Region], until_s: float, own_only: bool = False) -> list[float]:
    out = []
    for region in regions:
        samples = region.ttft_own_s if own_only else region.ttft_own_s + region.ttft_moved_s
        out += [ttft * 1000 for arrival, ttft in samples if arrival <= until_s]
    return out


def bounds(params: Params, region: Region) -> tuple[float, float, float]:
    """(makespan_s, bound_s, bound_no_headroom_s) of one region of the with-replay run."""
    makespan_s = region.replay_done_s
    live_computed = region.computed_at_done - region.replayed_computed_tokens
    capacity = params.engines_per_region * params.prefill_tokens_per_s * makespan_s
    spare_rate = (capacity * (1 - params.headroom) - live_computed) / makespan_s
    idle_rate = (capacity - live_computed) / makespan_s
    replayed = region.replayed_computed_tokens
    return makespan_s, replayed / spare_rate, replayed / idle_rate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Params()
    for name, value in vars(defaults).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    params = Params(**vars(parser.parse_args(argv)))

    with_replay = simulate(params, with_replay=True, horizon_s=None)
    per_region = [bounds(params, r) for r in with_replay]
    makespan_s = max(m for m, _, _ in per_region)
    horizon_s = makespan_s
    without = simulate(params, with_replay=False, horizon_s=horizon_s)

    print(
        f"regions r2, r3 (r1 failed): {params.engines_per_region} simulated engines each, "
        f"{params.prefill_tokens_per_s:.0f} prefill tokens/s per engine, headroom {params.headroom}"
    )
    for region, (m, b, b0) in zip(with_replay, per_region, strict=True):
        snap = region.scheduler.snapshot() if region.scheduler else None
        assert snap is not None
        live = region.computed_at_done - region.replayed_computed_tokens
        print(
            f"  {region.name}: replayed {region.replayed_jobs} conversations, "
            f"{region.replayed_computed_tokens} tokens; cancelled by a live turn "
            f"{snap.cancelled_live_total}, expired {snap.expired_total}"
        )
        print(
            f"      live computed tokens/s during replay {live / m:.0f}; "
            f"makespan {m:.1f} s, bound {b:.1f} s (ratio {m / b:.3f}), "
            f"no-headroom bound {b0:.1f} s"
        )
        print_diagnostics(params, region)
    rows = []
    for label, regions in (("with replay", with_replay), ("without replay", without)):
        all_ms = ttfts_ms(regions, horizon_s)
        own_ms = ttfts_ms(regions, horizon_s, own_only=True)
        rows.append((all_ms, own_ms))
        print(
            f"  live TTFT {label:15s} all: n={len(all_ms)} p50 {percentile(all_ms, 0.5):.1f} ms "
            f"p99 {percentile(all_ms, 0.99):.1f} ms | own conversations: "
            f"p50 {percentile(own_ms, 0.5):.1f} ms p99 {percentile(own_ms, 0.99):.1f} ms"
        )
    prefix = measure_prefix(conversations=200, seed=params.seed)
    print(prefix_line(prefix))
    worst = max(per_region, key=lambda mb: mb[0] / mb[1])
    result = {
        "makespan_s": round(makespan_s, 2),
        "bound_s": round(max(b for _, b, _ in per_region), 2),
        "makespan_ratio": round(worst[0] / worst[1], 4),
        "bound_no_headroom_s": round(max(b0 for _, _, b0 in per_region), 2),
        "live_ttft_p99_ms_with_replay": round(percentile(rows[0][0], 0.99), 2),
        "live_ttft_p99_ms_without_replay": round(percentile(rows[1][0], 0.99), 2),
        "own_live_ttft_p99_ms_with_replay": round(percentile(rows[0][1], 0.99), 2),
        "own_live_ttft_p99_ms_without_replay": round(percentile(rows[1][1], 0.99), 2),
        "prefix_cached_share": prefix["cached_share"],
        "prefix_cached_share_bound": prefix["cached_share_bound"],
        "seed": params.seed,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
