"""``convplane readiness``: how ready the plane is to lose each region (``GET /v1/readiness``,
any operator or viewer key): its status and 0-100 score, per region and for the plane, and
why a region is not ready. Exits 1 unless every region is ``ready``.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from services.cli.drill import DEFAULT_STATE_DIR, Json, Key, StateDir, Url, api_for
from services.cli.output import EXIT_NEGATIVE, echo_json

Refresh = Annotated[
    bool, typer.Option("--refresh", help="Evaluate now instead of showing the last evaluation.")
]


def readiness(
    refresh: Refresh = False,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    url: Url = None,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """Readiness to lose each region: status, score and reasons; exits 1 unless all ready."""
    answer = api_for(state_dir, url, key).call(
        "GET", "/v1/readiness", params={"refresh": "true" if refresh else "false"}
    )
    if as_json:
        echo_json(answer)
    else:
        typer.echo("\n".join(readiness_lines(answer)))
    if answer["status"] != "ready":
        raise typer.Exit(EXIT_NEGATIVE)


def readiness_lines(answer: dict[str, Any]) -> list[str]:
    lines = [f"plane {answer['status']} (score {answer['score']})"]
    for r in answer["regions"]:
        drill = r["last_passed_drill"]
        proof = "never drilled" if drill is None else f"drilled {drill['age_s'] / 3600:.1f} h ago"
        bound = r["replay_time_min_s"]
        replay = "replay -" if bound is None else f"replay >= {bound:.1f} s"
        lines.append(
            f"  lose {r['region']:<12} {r['status']:<9} score {r['score']:<3}  {replay}, {proof}"
        )
        lines.extend(f"      {reason}" for reason in r["reasons"])
    return lines


def register(app: typer.Typer) -> None:
    app.command("readiness")(readiness)
