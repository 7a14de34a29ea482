"""A drill report as one self-contained HTML page: inline CSS and SVG charts, no script, no
CDN, readable offline and printable. Every value shown comes from the report JSON
(``regions.drill_report.report``) and is escaped."""

from __future__ import annotations

from html import escape
from typing import Any

CHART_W = 640
CHART_H = 180
PAD = 30

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:760px;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
.passed{color:#1a7f37}.failed,.aborted{color:#b42318}svg{border:1px solid #ddd}
@media print{body{margin:0}}
"""


def render(body: dict[str, Any]) -> str:
    verdict = body["verdict"] or body["phase"]
    rows = [
        ("kind", body["kind"]),
        ("region", body["region"]),
        ("reason", body["reason"]),
        ("requested by", body["requested_by"]),
        ("started", body["started_at"]),
        ("injected", body["injected_at"]),
        ("ended", body["ended_at"]),
        ("shards moved / recovered", f"{body['shards_moved']} / {body['shards_recovered']}"),
        (
            "RTO p50 / p99 / max (s)",
            "/".join(_num(body[k]) for k in ("rto_p50_s", "rto_p99_s", "rto_max_s")),
        ),
        (
            "canary acked / errors / lost",
            f"{body['canary_acked']} / {body['canary_errors']} / {_num(body['canary_lost'])}",
        ),
        (
            "placement versions",
            ", ".join(f"{k} v{v}" for k, v in body["placement_versions"].items()),
        ),
        *(
            (f"shards per region {k}", ", ".join(f"{r} {n}" for r, n in v.items()))
            for k, v in body["placement_shards"].items()
        ),
    ]
    replay = body.get("replay")
    if replay is not None:
        rows += [
            (
                "replayed / planned conversations",
                f"{replay['conversations_replayed']} / {replay['conversations_planned']}",
            ),
            ("replay tokens", str(replay["tokens_replayed"])),
            (
                "replay makespan / planner's bound (s)",
                f"{_num(replay['makespan_s'])} / {_num(replay['planner_bound_s'])}",
            ),
            (
                "replay throughput after takeover / planner's rate (tokens/s)",
                f"{_num(replay['tokens_per_s'])} / {_num(replay['planner_tokens_per_s'])} "
                f"(takeover {_num(replay['takeover_s'])}s)",
            ),
        ]
    guards = (
        "".join(
            f"<tr><td>{escape(g['guard'])}</td><td>{g['measured']:.3g}</td><td>{g['limit']:.3g}</td></tr>"
            for g in body["guards_tripped"]
        )
        or "<tr><td colspan=3>none</td></tr>"
    )
    timeline = "".join(
        f"<tr><td>{escape(t['phase'])}</td><td>{escape(str(t['at']))}</td><td>{escape(t['note'])}</td></tr>"
        for t in body["timeline"]
    )
    facts = _facts(rows)
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>drill {escape(body['drill_id'])}</title><style>{STYLE}</style></head><body>"
        f"<h1>Drill {escape(body['drill_id'])}: "
        f"<span class={escape(str(verdict))}>{escape(str(verdict))}</span></h1>"
        f"<p>{escape(body['verdict_reason'])}</p><table>{facts}</table>"
        f"<h2>RTO per moved shard (s)</h2>{_bars(body['rto_by_shard_s'])}"
        f"<h2>Canary writes per second</h2>"
        f"{_series(body['series'], [('acked', '#1a7f37'), ('errors', '#b42318')])}"
        f"<h2>Live appends per second (the plane's own counters)</h2>"
        f"{_series(body['live_appends_per_s'], [('appends_per_s', '#4c78a8'), ('errors_per_s', '#b42318')])}"
        f"{_recovery(body.get('cache_recovery'))}{_ttft(body.get('live_ttft'))}"
        f"<h2>Guards tripped</h2><table><tr><th>guard</th><th>measured</th><th>limit</th></tr>"
        f"{guards}</table>"
        f"<h2>Timeline</h2><table><tr><th>phase</th><th>at</th><th>note</th></tr>{timeline}</table>"
        "</body></html>"
    )


def _facts(rows: list[tuple[str, Any]]) -> str:
    return "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def _svg(inner: str, title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_W}" height="{CHART_H}" '
        f'role="img" aria-label="{escape(title)}">{inner}</svg>'
    )


def _bars(values: dict[str, float]) -> str:
    if not values:
        return "<p>no moved shard recovered</p>"
    top = max(values.values()) or 1.0
    width = (CHART_W - 2 * PAD) / len(values)
    parts = [f'<text x="4" y="14" font-size="11">max {top:.2f}s</text>']
    for i, (shard, seconds) in enumerate(sorted(values.items(), key=lambda kv: int(kv[0]))):
        h = (CHART_H - 2 * PAD) * seconds / top
        x = PAD + i * width
        parts.append(
            f'<rect x="{x:.1f}" y="{CHART_H - PAD - h:.1f}" width="{max(width - 2, 1):.1f}" '
            f'height="{h:.1f}" fill="#4c78a8"><title>shard {escape(shard)}: {seconds:.2f}s</title></rect>'
            f'<text x="{x + width / 2:.1f}" y="{CHART_H - PAD + 12}" font-size="9" '
            f'text-anchor="middle">{escape(shard)}</text>'
        )
    return _svg("".join(parts), "RTO per moved shard")


def _series(points: list[dict[str, Any]], lines: list[tuple[str, str]]) -> str:
    """One polyline per ``(key, colour)`` over ``points`` (dicts with ``t_s`` and the keys)."""
    if len(points) < 2:
        return "<p>too few samples</p>"
    t0, t1 = points[0]["t_s"], points[-1]["t_s"]
    span = (t1 - t0) or 1.0
    top = max(max(p[key] for key, _ in lines) for p in points) or 1

    def line(key: str, color: str) -> str:
        coords = " ".join(
            f"{PAD + (CHART_W - 2 * PAD) * (p['t_s'] - t0) / span:.1f},"
            f"{CHART_H - PAD - (CHART_H - 2 * PAD) * p[key] / top:.1f}"
            for p in points
        )
        return f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}"/>'

    legend = "".join(
        f'<text x="{4 + 110 * i}" y="14" font-size="11" fill="{color}">{escape(key)}</text>'
        for i, (key, color) in enumerate(lines)
    ) + (
        f'<text x="{CHART_W - 4}" y="{CHART_H - 8}" font-size="10" text-anchor="end">'
        f"{t0:.0f}s to {t1:.0f}s since start; top {top:.4g}</text>"
    )
    return _svg(legend + "".join(line(k, c) for k, c in lines), ", ".join(k for k, _ in lines))


def _recovery(recovery: dict[str, Any] | None) -> str:
    """The cache-recovery curve (warm share over seconds since injection, the target share and
    time limit drawn in) and the target check."""
    if recovery is None:
        return ""
    target = recovery["target"]
    verdict = {True: "passed", False: "failed", None: "not judged"}[target["passed"]]
    facts = [
        ("target", f"{target['share_target']:.0%} of moved conversations warm within the "
                   "takeover plus the planner's bound + 10 %"),
        ("why", target["reason"]),
        ("moved / warm conversations",
         f"{recovery['moved_conversations']} / {recovery['warm_conversations']}"),
        ("takeover / limit (s since injection)",
         f"{_num(target['takeover_s'])} / {_num(target['limit_s'])}"),
        ("50 % / target share warm at (s)",
         f"{_num(recovery['time_to_half_warm_s'])} / {_num(recovery['time_to_target_share_s'])}"),
        ("warm share at the limit", _num(target["warm_share_at_limit"])),
        ("measured until (s, the fault's end)", _num(recovery["observed_s"])),
    ]  # fmt: skip
    rows = _facts(facts)
    return (
        "<h2>Cache recovery: moved conversations warm since injection</h2>"
        f"{_curve(recovery['curve'], target['limit_s'], target['share_target'])}"
        f"<table><tr><th>verdict</th><td class={escape(verdict.replace(' ', '-'))}>"
        f"{escape(verdict)}</td></tr>{rows}</table>"
    )


def _curve(points: list[dict[str, float]], limit_s: float | None, share: float) -> str:
    if not points:
        return "<p>no moved conversation warmed while the fault lasted</p>"
    right_s = max([points[-1]["t_s"], limit_s or 0.0]) or 1.0
    inner_w, inner_h = CHART_W - 2 * PAD, CHART_H - 2 * PAD

    def x(t_s: float) -> float:
        return PAD + inner_w * t_s / right_s

    def y(fraction: float) -> float:
        return CHART_H - PAD - inner_h * fraction

    steps = [f"{x(0):.1f},{y(0):.1f}"]
    previous = 0.0
    for p in points:  # a step curve: the share holds until the next conversation warms
        steps += [
            f"{x(p['t_s']):.1f},{y(previous):.1f}",
            f"{x(p['t_s']):.1f},{y(p['warm_share']):.1f}",
        ]
        previous = p["warm_share"]
    parts = [
        f'<line x1="{PAD}" x2="{CHART_W - PAD}" y1="{y(share):.1f}" y2="{y(share):.1f}" '
        f'stroke="#999" stroke-dasharray="4 3"/>',
        f'<polyline fill="none" stroke="#1a7f37" stroke-width="1.5" points="{" ".join(steps)}"/>',
        f'<text x="4" y="14" font-size="11">warm share (dashed: {share:.0%}'
        f"{'' if limit_s is None else f'; red: the limit {limit_s:.2f}s'})</text>",
        f'<text x="{CHART_W - 4}" y="{CHART_H - 8}" font-size="10" text-anchor="end">'
        f"0s to {right_s:.2f}s since injection</text>",
    ]
    if limit_s is not None:
        parts.append(
            f'<line x1="{x(limit_s):.1f}" x2="{x(limit_s):.1f}" y1="{PAD}" y2="{CHART_H - PAD}" '
            f'stroke="#b42318" stroke-dasharray="4 3"/>'
        )
    return _svg("".join(parts), "moved conversations warm over time since injection")


def _ttft(ttft: dict[str, dict[str, Any]] | None) -> str:
    """Live TTFT p50/p99 (ms) and prefix-hit ratio per survivor, before, during and after."""
    if ttft is None:
        return ""

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.0f}"

    rows = (
        "".join(
            f"<tr><td>{escape(region)}</td><td>{escape(name)}</td><td>{_num(w['requests'])}</td>"
            f"<td>{ms(w['p50_s'])}</td><td>{ms(w['p99_s'])}</td><td>{_num(w['prefix_hit_ratio'])}</td></tr>"
            for region, windows in ttft.items()
            for name, w in windows.items()
        )
        or "<tr><td colspan=6>no survivor reported its engines</td></tr>"
    )
    return (
        "<h2>Live time to first token per survivor</h2>"
        "<p>From the engines' <code>vllm:time_to_first_token_seconds</code> histograms, less "
        "replay's own prefills; before: the engines' start to the drill's, during: to the "
        "fault's end, after: to the drill's end.</p>"
        "<table><tr><th>region</th><th>window</th><th>live requests</th><th>p50 ms</th>"
        f"<th>p99 ms</th><th>prefix-hit ratio</th></tr>{rows}</table>"
    )
