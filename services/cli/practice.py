"""``convplane practice calendar|request|approve|alert``: practice runs over the REST API
(``services.api.practice_routes``), with the same ``--url``/``--key``/``--state-dir`` as
``convplane drill``. Schedules, the approval policy and scopes are JSON bodies: PUT them with
the API (docs/practice-runs.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from services.cli.drill import DEFAULT_STATE_DIR, Json, Key, StateDir, Url, api_for
from services.cli.output import echo_json

practice_app = typer.Typer(
    help="Practice runs: the calendar, runs by hand, approvals, alerts.", no_args_is_help=True
)
RunId = Annotated[str, typer.Argument(help="A practice run's id (from `practice request`).")]


@practice_app.command("calendar")
def calendar(
    limit: Annotated[int, typer.Option(min=1, max=1000, help="The most entries shown.")] = 50,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    url: Url = None,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """What practice ran, skipped or holds for approval, and why, newest first."""
    entries = api_for(state_dir, url, key).call(
        "GET", "/v1/practice/calendar", params={"limit": limit}
    )["entries"]
    if as_json:
        echo_json(entries)
        return
    for e in entries:
        who = e["schedule_id"] or e["run_id"]
        typer.echo(f"{e['at_ms']}  {who:<24} {e['outcome']:<18} {e['drill_id'] or '-':<20} "
                   f"{e['reason']}")  # fmt: skip


@practice_app.command("request")
def request(
    region: Annotated[str, typer.Option(help="The region to drill.")],
    kind: Annotated[
        str, typer.Option(help="The drill's kind: evacuate, region-loss or kill.")
    ] = "region-loss",
    hold_s: Annotated[float, typer.Option(help="How long the fault holds.")] = 10.0,
    reason: Annotated[str, typer.Option(help="Why (in the audit log).")] = "practice run",
    state_dir: StateDir = DEFAULT_STATE_DIR,
    url: Url = None,
    key: Key = None,
) -> None:
    """Ask for a practice run: it starts at once, or waits for a second operator's approval."""
    body = {"kind": kind, "region": region, "hold_s": hold_s, "reason": reason}
    run = api_for(state_dir, url, key).call("POST", "/v1/practice/runs", body)
    typer.echo(f"run {run['run_id']}: {run['status']} {run['drill_id'] or ''}".rstrip())


@practice_app.command("approve")
def approve(
    run_id: RunId, state_dir: StateDir = DEFAULT_STATE_DIR, url: Url = None, key: Key = None
) -> None:
    """Approve a run that awaits approval (with a key other than the one that asked)."""
    run = api_for(state_dir, url, key).call("POST", f"/v1/practice/runs/{run_id}/approve")
    typer.echo(f"run {run_id}: {run['status']} by {run['approved_by']}")


@practice_app.command("alert")
def alert(
    name: Annotated[str, typer.Argument(help="The alert's name.")],
    firing: Annotated[bool, typer.Option("--firing/--clear", help="Fire the alert, or clear it.")],
    reason: Annotated[str, typer.Option(help="Why (in the audit log).")],
    state_dir: StateDir = DEFAULT_STATE_DIR,
    url: Url = None,
    key: Key = None,
) -> None:
    """Fire or clear an operator alert: while one fires, no practice run starts."""
    body = {"firing": firing, "reason": reason}
    answer = api_for(state_dir, url, key).call("PUT", f"/v1/practice/alerts/{name}", body)
    typer.echo(f"alert {name}: {'firing' if answer['firing'] else 'clear'}")


def register(app: typer.Typer) -> None:
    app.add_typer(practice_app, name="practice")
