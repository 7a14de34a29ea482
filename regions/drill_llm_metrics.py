"""What a drill did to the things a chat platform's users feel: the moved conversations' KV
caches coming back, and live time-to-first-token on the survivors. Pure: the driver hands in
snapshots of the engines' and replay's counters, this module turns them into figures.

* **Cache-recovery curve.** A moved conversation is *warm* once its next live turn would hit a
  cached prefix: replay rebuilt its KV on a survivor (a ``replayed`` result), or a live turn
  arrived first and its own prefill rebuilt it (replay then drops or skips the job). The curve
  is the share of the moved conversations (those replay planned while the fault lasted) warm at
  each second since injection.
* **Target.** At least ``WARM_SHARE_TARGET`` of them warm within the planner's bound plus
  ``BOUND_SLACK`` (``regions.capacity_arithmetic.plan_replay``: moved tokens over the
  survivors' spare prefill), counted from the takeover (the first moved shard led by a
  survivor, as its replay service learned it: no replay starts earlier).
* **Live TTFT.** From the engines' ``vllm:time_to_first_token_seconds`` histograms, summed per
  region: the bucket counts between two snapshots, less replay's own requests (an engine's
  histogram counts every request; replay keeps the same histogram of its prefills), and the
  quantile interpolated inside its bucket as Prometheus' ``histogram_quantile`` does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: the share of moved conversations that must be warm ...
WARM_SHARE_TARGET = 0.9
#: ... within the planner's bound times (1 + this)
BOUND_SLACK = 0.1
#: the most points a drill keeps of its curve (the control shard stays small)
CURVE_POINTS_MAX = 120


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram: ``cumulative[i]`` requests took at most ``bounds_s[i]``; the
    last entry of ``cumulative`` (one more than ``bounds_s``) is every request (``+Inf``)."""

    bounds_s: tuple[float, ...]
    cumulative: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.cumulative) != len(self.bounds_s) + 1:
            raise ValueError("a histogram has one count per bound plus the +Inf count")
        if list(self.bounds_s) != sorted(set(self.bounds_s)):
            raise ValueError("histogram bounds must increase")

    @property
    def count(self) -> float:
        return self.cumulative[-1]

    def at(self, bound_s: float) -> float:
        """Requests that took at most ``bound_s`` as far as this histogram tells (its largest
        bound not above ``bound_s``; 0 below its first)."""
        index = _index_at_or_below(self.bounds_s, bound_s)
        return 0.0 if index < 0 else self.cumulative[index]

    def to_body(self) -> dict[str, Any]:
        return {"le": list(self.bounds_s), "cumulative": list(self.cumulative)}

    @classmethod
    def from_body(cls, body: Mapping[str, Any] | None) -> Histogram | None:
        if body is None:
            return None
        return cls(tuple(float(b) for b in body["le"]), tuple(float(c) for c in body["cumulative"]))


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """One region's engines and replay at one moment of a drill (``ReplayService.drill_view``):
    the engines' TTFT histogram and prefix-cache counters summed, and replay's own share."""

    engine_ttft: Histogram | None = None
    replay_ttft: Histogram | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    replay_prompt_tokens: int = 0
    replay_cached_tokens: int = 0

    def to_body(self) -> dict[str, Any]:
        return {
            "engine_ttft": None if self.engine_ttft is None else self.engine_ttft.to_body(),
            "replay_ttft": None if self.replay_ttft is None else self.replay_ttft.to_body(),
            "prefix_cache_queries_total": self.prefix_cache_queries_total,
            "prefix_cache_hits_total": self.prefix_cache_hits_total,
            "replay_prompt_tokens": self.replay_prompt_tokens,
            "replay_cached_tokens": self.replay_cached_tokens,
        }

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> EngineSnapshot:
        """From a drill record or a region's drill view (data from another node: validated)."""
        return cls(
            engine_ttft=Histogram.from_body(body.get("engine_ttft")),
            replay_ttft=Histogram.from_body(body.get("replay_ttft")),
            prefix_cache_queries_total=_optional_float(body.get("prefix_cache_queries_total")),
            prefix_cache_hits_total=_optional_float(body.get("prefix_cache_hits_total")),
            replay_prompt_tokens=int(body.get("replay_prompt_tokens", 0)),
            replay_cached_tokens=int(body.get("replay_cached_tokens", 0)),
        )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def snapshots_of(views: Mapping[str, Mapping[str, Any]]) -> dict[str, EngineSnapshot]:
    """Region -> its snapshot, from the regions' drill views."""
    return {region: EngineSnapshot.from_body(view) for region, view in sorted(views.items())}


def warm_events_of(views: Mapping[str, Mapping[str, Any]], excluding: str) -> list[tuple[int, int]]:
    """``(wall ms, conversations warmed)`` from every region's view but ``excluding``'s."""
    return [
        (int(ms), int(n))
        for region, view in views.items()
        if region != excluding
        for ms, n in view.get("warmed") or ()
    ]


def first_takeover_ms(
    views: Mapping[str, Mapping[str, Any]], excluding: str, since_ms: int
) -> int | None:
    """When a region but ``excluding`` first led a moved shard at or after ``since_ms`` (its
    replay service learned of the move: replay of it starts then); None: none did."""
    times = [
        int(ms)
        for region, view in views.items()
        if region != excluding
        for ms in view.get("moved_here_ms") or ()
        if int(ms) >= since_ms
    ]
    return min(times, default=None)


def prefix_hit_ratio(later: EngineSnapshot, earlier: EngineSnapshot) -> float | None:
    """Live prefix-cache hits over live prefix-cache queries (tokens) between two snapshots:
    the engines' counters less replay's own prompt and cached tokens. None: not exported, a
    restart in between, or no live query."""
    if None in (
        later.prefix_cache_queries_total,
        later.prefix_cache_hits_total,
        earlier.prefix_cache_queries_total,
        earlier.prefix_cache_hits_total,
    ):
        return None
    queries = (later.prefix_cache_queries_total or 0.0) - (
        earlier.prefix_cache_queries_total or 0.0
    )
    hits = (later.prefix_cache_hits_total or 0.0) - (earlier.prefix_cache_hits_total or 0.0)
    queries -= later.replay_prompt_tokens - earlier.replay_prompt_tokens
    hits -= later.replay_cached_tokens - earlier.replay_cached_tokens
    if queries <= 0 or hits < 0:
        return None
    return min(1.0, hits / queries)


def window_figures(later: EngineSnapshot | None, earlier: EngineSnapshot | None) -> dict[str, Any]:
    """Live TTFT (requests, p50, p99) and the live prefix-hit ratio between two snapshots of one
    region; ``earlier`` None: since the engines started. The TTFT figures are null unless both
    the engines' and replay's histograms are known at both ends (a restart of either voids the
    window: replay's requests counted as live would be a lie)."""
    if later is None:
        return {**ttft_figures(None, None), "prefix_hit_ratio": None}

    def between(newer: Histogram | None, older: Histogram | None) -> Histogram | None:
        if newer is None or earlier is None:
            return newer
        return None if older is None else delta(newer, older)

    engine = between(later.engine_ttft, None if earlier is None else earlier.engine_ttft)
    replay = between(later.replay_ttft, None if earlier is None else earlier.replay_ttft)
    known = engine is not None and replay is not None
    return {
        **(ttft_figures(engine, replay) if known else ttft_figures(None, None)),
        "prefix_hit_ratio": prefix_hit_ratio(
            later, earlier or EngineSnapshot(None, None, 0.0, 0.0)
        ),
    }


def _index_at_or_below(bounds: Sequence[float], value: float) -> int:
    index = -1
    for i, bound in enumerate(bounds):
        if bound <= value:
            index = i
    return index


def delta(later: Histogram, earlier: Histogram | None) -> Histogram | None:
    """The requests between two snapshots; None when the engine restarted in between (a count
    went down) or the bounds changed."""
    if earlier is None:
        return later
    if earlier.bounds_s != later.bounds_s:
        return None
    counts = tuple(b - a for a, b in zip(earlier.cumulative, later.cumulative, strict=True))
    if any(c < 0 for c in counts):
        return None
    return Histogram(later.bounds_s, counts)


def without(engine: Histogram, replay: Histogram | None) -> Histogram:
    """The engine's requests less replay's (the live ones). Replay times its prefills at the
    worker, so a replay can land a bucket above the one the engine put it in: the difference is
    kept cumulative (non-decreasing, never negative, never above the live total)."""
    if replay is None:
        return engine
    total = max(0.0, engine.count - replay.count)
    counts: list[float] = []
    floor = 0.0
    for bound_s, cumulative in zip(engine.bounds_s, engine.cumulative, strict=False):
        floor = min(total, max(floor, cumulative - replay.at(bound_s)))
        counts.append(floor)
    return Histogram(engine.bounds_s, (*counts, total))


def quantile(histogram: Histogram | None, q: float) -> float | None:
    """Prometheus' ``histogram_quantile``: the bucket holding rank ``q x count``, interpolated
    linearly inside it (from 0 for the first); the largest finite bound when the rank falls in
    ``+Inf``. None for no requests."""
    if histogram is None or histogram.count <= 0:
        return None
    rank = q * histogram.count
    lower_bound, lower_count = 0.0, 0.0
    for bound_s, cumulative in zip(histogram.bounds_s, histogram.cumulative, strict=False):
        if cumulative >= rank:
            if cumulative == lower_count:
                return bound_s
            return lower_bound + (bound_s - lower_bound) * (rank - lower_count) / (
                cumulative - lower_count
            )
        lower_bound, lower_count = bound_s, cumulative
    return histogram.bounds_s[-1] if histogram.bounds_s else None


def ttft_figures(engine: Histogram | None, replay: Histogram | None) -> dict[str, Any]:
    """Live requests, p50 and p99 of one window (``engine`` and ``replay`` already deltas)."""
    live = None if engine is None else without(engine, replay)
    return {
        "requests": None if live is None else live.count,
        "p50_s": quantile(live, 0.5),
        "p99_s": quantile(live, 0.99),
    }


# --- the cache-recovery curve ------------------------------------------------------------------


def warm_counts(
    warmed: Sequence[tuple[int, int]], injected_at_ms: int, until_ms: int
) -> tuple[tuple[float, int], ...]:
    """``(wall ms, conversations warmed)`` events -> ``(seconds since injection, warmed so
    far)`` at every event inside ``[injected_at_ms, until_ms]``, merged to at most
    ``CURVE_POINTS_MAX`` points (a merged point keeps its latest time: never early)."""
    inside = sorted((ms, n) for ms, n in warmed if injected_at_ms <= ms <= until_ms and n > 0)
    points: list[tuple[float, int]] = []
    total = 0
    for ms, n in inside:
        total += n
        points.append(((ms - injected_at_ms) / 1000, total))
    if len(points) <= CURVE_POINTS_MAX:
        return tuple(points)
    step = len(points) / CURVE_POINTS_MAX
    kept = {min(len(points) - 1, math.ceil((i + 1) * step) - 1) for i in range(CURVE_POINTS_MAX)}
    return tuple(points[i] for i in sorted(kept))


def curve(points: Sequence[tuple[float, int]], moved: int) -> list[dict[str, float]]:
    """The warm share at each point (at most 1: a conversation replayed twice counts once)."""
    if moved <= 0:
        return []
    return [{"t_s": t, "warm_share": min(1.0, n / moved)} for t, n in points]


def time_to_share(points: Sequence[tuple[float, int]], moved: int, share: float) -> float | None:
    """Seconds since injection at which ``share`` of ``moved`` were warm (None: never)."""
    if moved <= 0:
        return None
    needed = share * moved
    return next((t for t, n in points if n >= needed - 1e-9), None)


@dataclass(frozen=True, slots=True)
class WarmTarget:
    """The target check: ``passed`` None when it cannot be judged (``reason`` says why)."""

    passed: bool | None
    reason: str
    share_target: float
    limit_s: float | None
    takeover_s: float
    time_to_share_s: float | None
    warm_share_at_limit: float | None

    def to_body(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reason": self.reason,
            "share_target": self.share_target,
            "limit_s": self.limit_s,
            "takeover_s": self.takeover_s,
            "time_to_share_s": self.time_to_share_s,
            "warm_share_at_limit": self.warm_share_at_limit,
        }


def warm_target(
    points: Sequence[tuple[float, int]],
    moved: int,
    *,
    planner_bound_s: float | None,
    takeover_s: float,
    observed_s: float | None,
) -> WarmTarget:
    """Whether ``WARM_SHARE_TARGET`` of ``moved`` were warm by ``takeover_s`` + the planner's
    bound x (1 + ``BOUND_SLACK``) since injection. ``observed_s``: how long after injection the
    curve was measured (the fault's end); a limit past it with the share not reached is not
    judged."""
    t_share = time_to_share(points, moved, WARM_SHARE_TARGET)

    def judged(passed: bool | None, reason: str, limit_s: float | None = None) -> WarmTarget:
        at_limit = None
        if limit_s is not None and moved > 0:
            warm = max((n for t, n in points if t <= limit_s), default=0)
            at_limit = min(1.0, warm / moved)
        return WarmTarget(passed, reason, WARM_SHARE_TARGET, limit_s, takeover_s, t_share, at_limit)

    if moved <= 0:
        return judged(None, "no moved conversation to replay")
    if planner_bound_s is None:
        return judged(None, "no planner's bound (no engines, or no spare prefill at preflight)")
    limit_s = takeover_s + planner_bound_s * (1 + BOUND_SLACK)
    share = f"{WARM_SHARE_TARGET:.0%}"
    if t_share is not None and t_share <= limit_s:
        return judged(
            True, f"{share} warm {t_share:.2f}s after injection, limit {limit_s:.2f}s", limit_s
        )
    if observed_s is not None and observed_s < limit_s and t_share is None:
        return judged(
            None,
            f"the fault ended {observed_s:.2f}s after injection, before the limit "
            f"{limit_s:.2f}s, with {share} not yet warm",
            limit_s,
        )
    when = "never" if t_share is None else f"{t_share:.2f}s after injection"
    return judged(False, f"{share} warm {when}, limit {limit_s:.2f}s", limit_s)


__all__ = [
    "BOUND_SLACK",
    "CURVE_POINTS_MAX",
    "WARM_SHARE_TARGET",
    "EngineSnapshot",
    "Histogram",
    "WarmTarget",
    "curve",
    "delta",
    "first_takeover_ms",
    "prefix_hit_ratio",
    "quantile",
    "snapshots_of",
    "time_to_share",
    "ttft_figures",
    "warm_counts",
    "warm_events_of",
    "warm_target",
    "window_figures",
    "without",
]
