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
import asyncio
import json
import math

from bench.replay_engine import EngineParams, EngineReport
from bench.replay_engine import measure as measure_engine
from bench.replay_prefix import measure as measure_prefix
from bench.replay_prefix import report_line as prefix_line
from bench.replay_sim import Params, Region, simulate

#: the simulator's step budget beside a real engine (vLLM's ``max_num_batched_tokens`` on CPU)
SIM_CHUNK_TOKENS = 2048


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
    _add_engine_arguments(parser)
    args = vars(parser.parse_args(argv))
    engine_url, repeats = args.pop("engine"), args.pop("engine_repeats")
    engine_params = EngineParams(
        seed=args["seed"], moved=args.pop("engine_moved"),
        live_turns_per_s=args.pop("engine_live_turns_per_s"),
        piece_tokens=args.pop("engine_piece_tokens"),
        priority_declared=args.pop("declare_priority_scheduling"),
    )  # fmt: skip
    if engine_url:
        main_engine(engine_url, engine_params, repeats)
        return
    params = Params(**args)

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


def _add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--engine", default="", help="a real engine's base URL: run the scenario of "
        "bench/replay_engine.py on it, beside the simulator")  # fmt: skip
    add("--declare-priority-scheduling", action="store_true",
        help="with --engine: declare to the self-check that it runs --scheduling-policy "
        "priority (counts only where the check's queue probe cannot tell)")  # fmt: skip
    add("--engine-repeats", type=int, default=3,
        help="with --engine: pairs of runs (with replay, then without)")  # fmt: skip
    add("--engine-moved", type=int, default=EngineParams.moved)
    add("--engine-live-turns-per-s", type=float, default=EngineParams.live_turns_per_s)
    add("--engine-piece-tokens", type=int, default=EngineParams.piece_tokens,
        help="replay pieces' size in tokens (0: whole)")  # fmt: skip


def main_engine(url: str, p: EngineParams, repeats: int) -> None:
    """The real engine's runs (``bench/replay_engine.py``), then the simulator on the same
    scenario's parameters (one engine, its measured capacity and prompt sizes), one report.
    TTFT p99s pool every pair's live turns that arrived before that pair's makespan."""
    reports = asyncio.run(measure_engine(url, p, repeats))
    first = reports[0]
    print(f"engine {url} serving {first.model!r}: measured capacity "
          f"{first.capacity_tokens_per_s:.0f} prefill tokens/s, {first.tokens_per_word:.2f} "
          f"tokens/word; the self-check's priority_scheduling: {first.priority_verdict}"
          f"{' (declared)' if p.priority_declared else ''}")  # fmt: skip
    if first.priority_verdict == "failed":
        print(f"  a worker would not replay on this engine ({first.priority_reason}); "
              "measured anyway, with the unverified share")  # fmt: skip
    ratios: list[float] = []
    pooled: dict[str, tuple[list[float], list[float]]] = {"all": ([], []), "own": ([], [])}
    for i, report in enumerate(reports):
        real, makespan_s = report.with_replay, report.with_replay.makespan_s
        bound_s = report.bound_s(p.headroom)
        ratios.append(makespan_s / bound_s)
        for k, run in enumerate((real, report.without_replay)):
            own = [ms for arrival, ms in run.own_ttft_ms if arrival <= makespan_s]
            moved = [ms for arrival, ms in run.moved_ttft_ms if arrival <= makespan_s]
            pooled["own"][k].extend(own)
            pooled["all"][k].extend(own + moved)
        print(f"  real run {i + 1}: replayed {real.replayed} of {p.moved} moved conversations "
              f"({real.replayed_computed_tokens} tokens; {real.skipped_live_first} had their "
              f"live turn first), makespan {makespan_s:.1f} s, bound {bound_s:.1f} s (ratio "
              f"{ratios[-1]:.3f}); denials {real.denied}")  # fmt: skip
    real_p99 = {key: [percentile(v, 0.99) for v in runs] for key, runs in pooled.items()}
    sim_ratio, sim_p99 = _simulated_beside(first, p)
    for label, numbers in (("real", real_p99), ("simulator", sim_p99)):
        (w, wo), (ow, owo) = numbers["all"], numbers["own"]
        print(f"  {label}: live TTFT p99 {w:.1f} ms with replay, {wo:.1f} ms without (ratio "
              f"{w / wo:.3f}); own conversations only {ow:.1f} / {owo:.1f} ms (ratio "
              f"{ow / owo:.3f})")  # fmt: skip
    print(f"  simulator: makespan ratio {sim_ratio:.3f}")
    print(json.dumps({
        "engine": url, "model": first.model, "seed": p.seed, "repeats": repeats,
        "capacity_tokens_per_s": round(first.capacity_tokens_per_s),
        "priority_declared": p.priority_declared,
        "priority_scheduling": first.priority_verdict,
        "makespan_ratios": [round(r, 4) for r in ratios],
        "live_ttft_p99_ms": [round(v, 1) for v in real_p99["all"]],
        "own_live_ttft_p99_ms": [round(v, 1) for v in real_p99["own"]],
        "own_live_ttft_p99_ratio": round(real_p99["own"][0] / real_p99["own"][1], 4),
        "own_live_samples": [len(v) for v in pooled["own"]],
        "sim_makespan_ratio": round(sim_ratio, 4),
        "sim_live_ttft_p99_ms": [round(v, 1) for v in sim_p99["all"]],
        "sim_own_live_ttft_p99_ms": [round(v, 1) for v in sim_p99["own"]],
    }))  # fmt: skip


def _p99(samples: list[tuple[float, float]], until_s: float) -> float:
    return percentile([ms for arrival, ms in samples if arrival <= until_s], 0.99)


def _simulated_beside(
    report: EngineReport, p: EngineParams
) -> tuple[float, dict[str, list[float]]]:
    """The simulator on the real run's parameters: its worst makespan ratio and its live TTFT
    p99 (with, without replay) of all and of own conversations."""
    tpw = report.tokens_per_word
    params = Params(
        seed=p.seed, engines_per_region=1, prefill_tokens_per_s=report.capacity_tokens_per_s,
        headroom=p.headroom, moved_sessions=2 * p.moved, own_sessions_per_region=p.own,
        prompt_tokens_min=int(p.history_words[0] * tpw),
        prompt_tokens_max=int(p.history_words[1] * tpw),
        turn_tokens=int((p.turn_words + 8) * tpw), own_turns_per_s=p.live_turns_per_s,
        new_conversations_per_s=0.0, moved_return_mean_s=p.moved_return_mean_s,
        max_concurrent_replays=p.max_concurrent_replays, replay_piece_tokens=p.piece_tokens,
        chunk_tokens=SIM_CHUNK_TOKENS, horizon_max_s=p.horizon_max_s,
    )  # fmt: skip
    with_replay = simulate(params, with_replay=True, horizon_s=None)
    per_region = [bounds(params, r) for r in with_replay]
    makespan_s = max(m for m, _, _ in per_region)
    without = simulate(params, with_replay=False, horizon_s=makespan_s)
    runs = (with_replay, without)
    return max(m / b for m, b, _ in per_region), {
        "all": [percentile(ttfts_ms(r, makespan_s), 0.99) for r in runs],
        "own": [percentile(ttfts_ms(r, makespan_s, own_only=True), 0.99) for r in runs],
    }


if __name__ == "__main__":
    main()
