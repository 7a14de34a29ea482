"""A drill's report: the numbers an SRE reads after a drill, from its record alone. Pure.

Every drill has one, aborted and unfinished ones included (``verdict`` is null while it runs).
RTO of a moved shard is the time from injection to its first acknowledged canary write served
by another region (a node kill's: by another node of its region, and ``stayed_in_region`` says
whether the placement kept its version); RPO is the count of acknowledged canary events not found when every canary
conversation is read back after the restore (it must be 0). Where engines are attached it also
has what a chat platform's users feel (``regions.drill_llm_metrics``): the cache-recovery curve
and its target, live TTFT per survivor before, during and after, and replay's throughput
against the planner's rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from regions.drill_llm_metrics import (
    WARM_SHARE_TARGET,
    EngineSnapshot,
    curve,
    time_to_share,
    warm_target,
    window_figures,
)
from regions.drills import Drill, placement_changed

#: the windows of live TTFT: name -> (snapshot at its end, snapshot at its start; None: since
#: the engines started)
TTFT_WINDOWS: dict[str, tuple[str, str | None]] = {
    "before": ("start", None),
    "during": ("restore", "start"),
    "after": ("end", "restore"),
}


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 1]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def report(drill: Drill) -> dict[str, Any]:
    m = drill.measurements
    rtos = list(m.rto_s.values())
    unrecovered = [s for s in m.shards_moved if s not in m.rto_s]
    return {
        "drill_id": drill.drill_id,
        "kind": drill.spec.kind,
        "region": drill.spec.region,
        "node": drill.spec.node,
        "phase": drill.phase,
        "verdict": drill.verdict,
        "verdict_reason": drill.verdict_reason,
        "reason": drill.spec.reason,
        "requested_by": drill.spec.requested_by,
        "hold_s": drill.spec.hold_s,
        "guards": drill.spec.guards.to_body(),
        "started_at": iso(drill.created_at_ms),
        "injected_at": iso(drill.injected_at_ms),
        "ended_at": iso(drill.ended_at_ms),
        "shards_moved": len(m.shards_moved),
        "shards_recovered": len(rtos),
        "shards_unrecovered": unrecovered,
        "rto_p50_s": percentile(rtos, 0.5),
        "rto_p99_s": percentile(rtos, 0.99),
        "rto_max_s": max(rtos) if rtos else None,
        "rto_by_shard_s": {str(s): v for s, v in sorted(m.rto_s.items())},
        "canary_acked": sum(m.canary_acked.values()),
        "canary_errors": m.canary_errors,
        "canary_lost": m.canary_lost,
        "guards_tripped": [g.to_body() for g in drill.guards_tripped],
        "abort_reason": drill.abort_reason,
        "placement_versions": dict(m.placement_versions),
        "placement_shards": {k: dict(v) for k, v in m.placement_shards.items()},
        # a node kill's claim: its region's other nodes took its shards, no other region did
        "stayed_in_region": None if drill.spec.node is None else not placement_changed(m),
        "series": [
            {"t_s": t, "acked": acked, "errors": errors, "ack_p99_ms": p99}
            for t, acked, errors, p99 in m.series
        ],
        "live_appends_per_s": [
            {"t_s": t, "appends_per_s": rate, "errors_per_s": errors, "error_ratio": ratio}
            for t, rate, errors, ratio in m.live_appends
        ],
        "replay": replay_summary(drill),
        "cache_recovery": cache_recovery(drill),
        "live_ttft": live_ttft(drill),
        "timeline": [
            {"phase": phase, "at": iso(at_ms), "at_ms": at_ms, "note": note}
            for phase, at_ms, note in drill.timeline
        ],
    }


def replay_summary(drill: Drill) -> dict[str, Any] | None:
    """What replay did while the fault lasted (None: no engines attached): conversations
    planned and replayed, tokens, and the makespan (injection to the last replayed conversation,
    so detection and takeover included) against the planner's lower bound from preflight (the
    prefill time alone)."""
    m = drill.measurements
    before, latest = m.replay_before, m.replay_latest or m.replay_before
    if before is None or latest is None:
        return None
    replayed = latest.conversations_replayed - before.conversations_replayed
    last_ms = latest.last_replayed_at_ms
    makespan_s = None
    if replayed > 0 and last_ms is not None and drill.injected_at_ms is not None:
        makespan_s = max(0.0, (last_ms - drill.injected_at_ms) / 1000)
    tokens = latest.tokens_replayed - before.tokens_replayed
    takeover_s = takeover_of(drill)
    tokens_per_s = None
    if makespan_s is not None and makespan_s > takeover_s and tokens > 0:
        tokens_per_s = tokens / (makespan_s - takeover_s)
    planner_rate = m.replay_spare_tokens_per_s
    return {
        "conversations_planned": latest.conversations_planned - before.conversations_planned,
        "conversations_replayed": replayed,
        "tokens_replayed": tokens,
        "makespan_s": makespan_s,
        "planner_bound_s": m.replay_time_min_s,
        "takeover_s": takeover_s,
        "tokens_per_s": tokens_per_s,
        "planner_tokens_per_s": planner_rate,
        "throughput_of_planner": None
        if tokens_per_s is None or not planner_rate
        else tokens_per_s / planner_rate,
    }


def takeover_of(drill: Drill) -> float:
    """Seconds from injection until a survivor first led a moved shard, as its replay service
    learned it (no replay starts earlier); without that, the smallest RTO (a canary write
    lands after the takeover, so later), else 0. The planner's bound assumes the whole spare
    prefill from then on: counting from the first takeover, not the last, is the strict
    reading."""
    m = drill.measurements
    if m.takeover_s is not None:
        return m.takeover_s
    return min(m.rto_s.values(), default=0.0)


def cache_recovery(drill: Drill) -> dict[str, Any] | None:
    """The cache-recovery curve and the target check (None: no engines attached)."""
    replay = replay_summary(drill)
    if replay is None:
        return None
    m = drill.measurements
    moved = replay["conversations_planned"]
    observed_s = None
    if drill.injected_at_ms is not None and drill.restore_started_at_ms is not None:
        observed_s = (drill.restore_started_at_ms - drill.injected_at_ms) / 1000
    target = warm_target(
        m.warm_points,
        moved,
        planner_bound_s=m.replay_time_min_s,
        takeover_s=takeover_of(drill),
        observed_s=observed_s,
    )
    warm = m.warm_points[-1][1] if m.warm_points else 0
    return {
        "moved_conversations": moved,
        "warm_conversations": min(warm, moved),
        "observed_s": observed_s,
        "time_to_half_warm_s": time_to_share(m.warm_points, moved, 0.5),
        "time_to_target_share_s": time_to_share(m.warm_points, moved, WARM_SHARE_TARGET),
        "curve": curve(m.warm_points, moved),
        "target": target.to_body(),
    }


def live_ttft(drill: Drill) -> dict[str, dict[str, Any]] | None:
    """Per survivor (every region but the target), live TTFT and prefix-hit ratio before (the
    engines' start to the drill's), during (the drill's start to the fault's end) and after
    (the fault's end to the drill's); None: no engines attached."""
    snapshots = drill.measurements.engine_snapshots
    if not snapshots:
        return None
    regions = sorted({r for moment in snapshots.values() for r in moment} - {drill.spec.region})

    def window(region: str, end: str, start: str | None) -> dict[str, Any]:
        later = snapshots.get(end, {}).get(region)
        earlier: EngineSnapshot | None = None
        if start is not None:
            earlier = snapshots.get(start, {}).get(region)
            if earlier is None:
                later = None  # a window without its start is unknown, not "since start"
        return window_figures(later, earlier)

    return {
        region: {name: window(region, *ends) for name, ends in TTFT_WINDOWS.items()}
        for region in regions
    }


def summary_lines(body: dict[str, Any]) -> list[str]:
    """A few lines for a terminal (``convplane drill report``, ``convplane demo``)."""

    def seconds(value: Any) -> str:
        return "-" if value is None else f"{value:.2f}s"

    node = body.get("node")
    target = body["region"] if node is None else f"{body['region']} node {node}"
    return [
        f"drill {body['drill_id']}: {body['kind']} of {target} -> "
        f"{body['verdict'] or body['phase']} ({body['verdict_reason'] or 'running'})",
        f"  shards moved {body['shards_moved']}, recovered {body['shards_recovered']}; "
        f"RTO p50 {seconds(body['rto_p50_s'])} p99 {seconds(body['rto_p99_s'])} "
        f"max {seconds(body['rto_max_s'])}",
        f"  canary events acked {body['canary_acked']}, errors {body['canary_errors']}, "
        f"lost {'-' if body['canary_lost'] is None else body['canary_lost']}",
        *_stayed_lines(body),
        *(
            f"  guard tripped: {g['guard']} measured {g['measured']:.3g} > {g['limit']:.3g}"
            for g in body["guards_tripped"]
        ),
        *_replay_lines(body.get("replay")),
        *_llm_lines(body.get("cache_recovery"), body.get("live_ttft")),
    ]


def _stayed_lines(body: dict[str, Any]) -> list[str]:
    """A node kill's placement: the same version before, during and after, or not."""
    stayed = body.get("stayed_in_region")
    if stayed is None:
        return []
    versions = ", ".join(f"{k} v{v}" for k, v in body["placement_versions"].items())
    said = "unchanged, no shard left the region" if stayed else "CHANGED"
    return [f"  placement {said} ({versions})"]


def _llm_lines(
    recovery: dict[str, Any] | None, ttft: dict[str, dict[str, Any]] | None
) -> list[str]:
    lines: list[str] = []
    if recovery is not None:
        target = recovery["target"]
        verdict = {True: "passed", False: "FAILED", None: "not judged"}[target["passed"]]
        lines.append(
            f"  cache recovery: {recovery['warm_conversations']} of "
            f"{recovery['moved_conversations']} moved conversations warm; target {verdict}: "
            f"{target['reason']}"
        )
    for region, windows in (ttft or {}).items():
        figures = ", ".join(
            f"{name} p50 {_ms(w['p50_s'])} p99 {_ms(w['p99_s'])}" for name, w in windows.items()
        )
        lines.append(f"  live TTFT {region}: {figures}")
    return lines


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}ms"


def _replay_lines(replay: dict[str, Any] | None) -> list[str]:
    if replay is None:
        return []
    makespan, bound = replay["makespan_s"], replay["planner_bound_s"]
    return [
        f"  replay: {replay['conversations_replayed']} of {replay['conversations_planned']} "
        f"conversations, {replay['tokens_replayed']} tokens; makespan "
        f"{'-' if makespan is None else f'{makespan:.1f}s'} (planner's bound "
        f"{'-' if bound is None else f'{bound:.1f}s'})",
        f"  replay throughput {_rate(replay['tokens_per_s'])} after takeover "
        f"{replay['takeover_s']:.1f}s (planner's {_rate(replay['planner_tokens_per_s'])})",
    ]


def _rate(tokens_per_s: float | None) -> str:
    return "-" if tokens_per_s is None else f"{tokens_per_s:,.0f} tokens/s"
