"""What every ``convplane`` command prints and how it exits.

Human-readable text by default; ``--json`` on every command that reads prints the plane's
answer as JSON instead (one document on stdout). A failure is one line on stderr::

    error: <code>: <message> (hint: <what to do>)

Exit codes of the commands that talk to a plane's API (status, regions, drill, halt, keys); the
local plane's own commands (up, down, restart-region, demo, fault, replica) exit 1 on any failure:

====  =========================================================================================
0     done (a drill that passed, a plan that is feasible, a read)
1     done, but the outcome is negative: a drill that failed or was aborted, an infeasible plan
2     the command line itself is wrong (typer's usage errors)
3     the plane refused the request (a 4xx answer: bad input, a key without the role, not found)
4     the plane could not answer (no region reachable, a 5xx answer, a timeout); retry later
====  =========================================================================================
"""

from __future__ import annotations

import json
from typing import Any

import typer

EXIT_OK = 0
EXIT_NEGATIVE = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_UNAVAILABLE = 4

#: what to do about a refusal, by the plane's error code
HINTS: dict[str, str] = {
    "unauthorized": "check --key or CONVPLANE_API_KEY",
    "forbidden": "this needs an operator key (cluster.json's operator_api_key)",
    "preflight_failed": "see what preflight checks with `convplane drill plan`",
    "halted": "the halt switch is on: `convplane halt off` when the incident is over",
    "not_found": "check the name (`convplane regions`, `convplane drill list`)",
    "invalid_request": "see `--help` for the accepted values",
}


def fail(code: str, message: str, *, exit_code: int, hint: str | None = None) -> typer.Exit:
    """Print the one error line and return the ``typer.Exit`` to raise."""
    hint = hint if hint is not None else HINTS.get(code)
    typer.echo(f"error: {code}: {message}" + (f" (hint: {hint})" if hint else ""), err=True)
    return typer.Exit(exit_code)


def fail_from_answer(what: str, status: int, text: str) -> typer.Exit:
    """The one error line for an error answer of the plane (its JSON error body if it has one)."""
    try:
        error = json.loads(text)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = f"http_{status}", text.strip()[:300] or "no body"
    exit_code = EXIT_REFUSED if 400 <= status < 500 else EXIT_UNAVAILABLE
    return fail(code, f"{what}: {message} (HTTP {status})", exit_code=exit_code)


def echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True))
