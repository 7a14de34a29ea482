"""``convplane regions`` and ``convplane status``: what operators curled ``/v1/regions`` for.

``regions``: every region's status (up / suspected / down, and who suspects it), capacity
weight, shards and unhealthy loops, as one region sees it. ``status``: the plane in a few lines:
regions, the placement's version, the control shard's leader, regions down or evacuated, the
halt switch and the drills under way. Both read with any operator or viewer key.
"""

from __future__ import annotations

from typing import Any

import typer

from services.cli.drill import DEFAULT_STATE_DIR, Json, Key, StateDir, Url, api_for
from services.cli.output import EXIT_NEGATIVE, echo_json

ACTIVE_DRILL_PHASES = frozenset({"planned", "injecting", "holding", "restoring"})


def regions(
    state_dir: StateDir = DEFAULT_STATE_DIR, url: Url = None, key: Key = None, as_json: Json = False
) -> None:
    """Every region's status, capacity, shards and unhealthy loops."""
    answer = api_for(state_dir, url, key).call("GET", "/v1/regions")
    if as_json:
        echo_json(answer)
        return
    typer.echo("\n".join(region_lines(answer)))


def region_lines(answer: dict[str, Any]) -> list[str]:
    lines = [f"as seen from {answer['observer']}:"]
    for r in answer["regions"]:
        notes = []
        if r.get("suspected_by"):
            notes.append("suspected by " + ", ".join(r["suspected_by"]))
        if r.get("evacuated"):
            notes.append("evacuated")
        if r.get("unhealthy_loops"):
            notes.append("unhealthy loops: " + ", ".join(r["unhealthy_loops"]))
        lines.append(
            f"  {r['name']:<12} {r['status']:<10} shards {r['shards_assigned']:<4} "
            f"weight {r['capacity_weight']:g}  {r['url']}"
            + (f"  ({'; '.join(notes)})" if notes else "")
        )
    return lines


def status(
    state_dir: StateDir = DEFAULT_STATE_DIR, url: Url = None, key: Key = None, as_json: Json = False
) -> None:
    """The plane in a few lines; exits 1 when a region is not up or the halt switch is on."""
    api = api_for(state_dir, url, key)
    answer = {
        "regions": api.call("GET", "/v1/regions"),
        "placement": api.call("GET", "/v1/placement"),
        "halt": api.call("GET", "/v1/admin/halt"),
        "drills": [
            d for d in api.call("GET", "/v1/drills")["drills"] if d["phase"] in ACTIVE_DRILL_PHASES
        ],
    }
    if as_json:
        echo_json(answer)
    else:
        typer.echo("\n".join(status_lines(answer)))
    healthy = all(r["status"] == "up" for r in answer["regions"]["regions"])
    if not healthy or answer["halt"].get("on"):
        raise typer.Exit(EXIT_NEGATIVE)


def status_lines(answer: dict[str, Any]) -> list[str]:
    placement, halt = answer["placement"], answer["halt"]
    lines = region_lines(answer["regions"])
    lines.append(
        f"placement v{placement['version']} ({placement['reason']}); control shard led by "
        f"{placement['control_leader'] or 'no region'}"
    )
    if placement["down"] or placement["evacuated"]:
        lines.append(
            f"  down: {', '.join(placement['down']) or '-'}; "
            f"evacuated: {', '.join(placement['evacuated']) or '-'}"
        )
    lines.append(f"halt {'on: ' + str(halt.get('reason')) if halt.get('on') else 'off'}")
    for d in answer["drills"]:
        lines.append(f"drill {d['drill_id']}: {d['kind']} of {d['region']}, {d['phase']}")
    return lines


def register(app: typer.Typer) -> None:
    app.command("regions")(regions)
    app.command("status")(status)
