"""``convplane drill plan|run|status|abort|report|list`` and ``convplane halt on|off``.

Drill and halt commands talk to a plane's REST API with an operator key: ``--url`` and
``--key`` (or ``CONVPLANE_URL`` / ``CONVPLANE_API_KEY``), or a local plane's ``cluster.json``
(``--state-dir``: every region's URL and ``operator_api_key``). With a local plane each request
goes to the first region that answers, so a command outlives the node it started on, as the
drill does; with ``--url`` only that node is asked, never the local plane instead.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from eventlog.http_headers import DEADLINE_HEADER
from regions.drill_report import summary_lines
from regions.drills import Guards
from services.cli.output import (
    EXIT_NEGATIVE,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    echo_json,
    fail,
    fail_from_answer,
)

drill_app = typer.Typer(
    help="Regional drills: plan, run, watch, abort, report.", no_args_is_help=True
)
halt_app = typer.Typer(
    help="The halt switch: abort every drill and refuse new ones.", no_args_is_help=True
)

#: the deadline the CLI gives the plane (starting a drill writes a canary to every shard first),
#: and its own timeout a little past it; a drill is polled this often
DEADLINE_MS = 30_000
CALL_TIMEOUT_S = 35.0
POLL_S = 0.5
#: how long a read keeps asking while every region answers 503
READ_RETRY_S = 30.0
#: the longest ``run`` waits past hold_s (the drill's own restore grace plus slack)
RUN_SLACK_S = 90.0

StateDir = Annotated[
    Path, typer.Option(help="A local plane's state dir (its cluster.json); not used with --url.")
]
Url = Annotated[
    str | None,
    typer.Option(
        envvar="CONVPLANE_URL",
        help="A region node's URL; only it is asked (default: the local plane's regions).",
    ),
]
Key = Annotated[
    str | None,
    typer.Option(envvar="CONVPLANE_API_KEY", help="An operator key (default: the local plane's)."),
]
Json = Annotated[bool, typer.Option("--json", help="Print the plane's answer as JSON.")]
DEFAULT_STATE_DIR = Path(".state/plane")


class Api:
    """The plane's REST API over every region URL known, first that answers."""

    def __init__(self, urls: list[str], key: str) -> None:
        import httpx

        self._urls = urls
        self._client = httpx.Client(
            headers={"Authorization": f"Bearer {key}", DEADLINE_HEADER: str(DEADLINE_MS)},
            timeout=CALL_TIMEOUT_S,
            trust_env=False,
        )

    def call(
        self, method: str, path: str, body: Any = None, *, missing_ok: bool = False, **kw: Any
    ) -> Any:
        """The JSON (or text) answer; None for a 404 when ``missing_ok``. A read that every
        region answers 503 (the control shard, which answers drill reads, is between leaders,
        e.g. while a drill moves it) is asked again after its Retry-After, for at most
        ``READ_RETRY_S``."""
        deadline_s = time.monotonic() + READ_RETRY_S
        while True:
            reply = self._first_answer(method, path, body, **kw)
            if reply.status_code != 503 or method != "GET" or time.monotonic() > deadline_s:
                break
            time.sleep(_retry_after_s(reply))
        if reply.status_code == 404 and missing_ok:
            return None
        if reply.status_code >= 400:
            raise fail_from_answer(f"{method} {path}", reply.status_code, reply.text)
        return reply.json() if "json" in reply.headers.get("content-type", "") else reply.text

    def _first_answer(self, method: str, path: str, body: Any, **kw: Any) -> Any:
        import httpx

        last: Exception | None = None
        for url in self._urls:
            try:
                reply = self._client.request(method, url.rstrip("/") + path, json=body, **kw)
            except httpx.HTTPError as exc:
                last = exc
                continue
            if reply.status_code == 503 and method == "GET" and url != self._urls[-1]:
                continue  # a read elsewhere; a write's 503 may be an unknown outcome: shown
            return reply
        raise fail(
            "unreachable",
            f"{method} {path}: no region answered ({last!r})",
            exit_code=EXIT_UNAVAILABLE,
            hint="is the plane up? check --url or --state-dir",
        )


def _retry_after_s(reply: Any) -> float:
    try:
        return min(max(float(reply.headers.get("retry-after", POLL_S)), POLL_S), READ_RETRY_S)
    except ValueError:
        return POLL_S


def api_for(state_dir: Path, url: str | None, key: str | None) -> Api:
    """The API of the plane ``--url`` names, else of the local plane in ``state_dir``.

    ``--url`` never falls back to the local plane's regions or its operator key: a command
    meant for one plane must not reach another (nor hand it this plane's key) because the
    named URL did not answer."""
    if url:
        if not key:
            raise fail("usage", "--url needs --key (or CONVPLANE_API_KEY)", exit_code=EXIT_USAGE)
        return Api([url], key)
    info_file = state_dir / "cluster.json"
    if not info_file.exists():
        raise fail(
            "no_plane",
            f"no local plane at {state_dir}",
            exit_code=EXIT_USAGE,
            hint="give --url and --key, or --state-dir of a plane `convplane up` started",
        )
    info = json.loads(info_file.read_text(encoding="utf-8"))
    key = key or info.get("operator_api_key")
    if not key:
        raise fail("usage", f"{info_file} holds no operator key: give --key", exit_code=EXIT_USAGE)
    return Api([r["url"] for r in info["regions"]], key)


def drill_body(
    kind: str,
    region: str,
    hold_s: float,
    reason: str,
    force: bool,
    max_rto_s: float | None,
    max_error_ratio: float | None,
    max_ack_p99_ms: float | None,
    dry_run: bool,
    node: int | None = None,
) -> dict[str, Any]:
    guards = {
        k: v
        for k, v in (
            ("max_rto_s", max_rto_s),
            ("max_error_ratio", max_error_ratio),
            ("max_ack_p99_ms", max_ack_p99_ms),
        )
        if v is not None
    }
    return {
        "kind": kind,
        "region": region,
        "hold_s": hold_s,
        "reason": reason,
        "force": force,
        "dry_run": dry_run,
        **({"guards": guards} if guards else {}),
        **({} if node is None else {"node": node}),
    }


def watch(api: Api, drill_id: str, hold_s: float, echo: Any = typer.echo) -> dict[str, Any]:
    """Poll a drill until it ends (showing progress, with the time since the command started
    following it), then return its report."""
    started = time.monotonic()
    deadline = started + hold_s + RUN_SLACK_S
    shown = ""
    while time.monotonic() < deadline:
        d = api.call("GET", f"/v1/drills/{drill_id}", missing_ok=True)
        if d is None:
            time.sleep(POLL_S)
            continue
        progress = (
            f"{d['phase']:<10} shards recovered {d['shards_recovered']}/"
            f"{d['shards_moved']}  canary acked {d['canary_acked']} "
            f"errors {d['canary_errors']}"
        )
        if progress != shown:
            echo(f"  {time.monotonic() - started:6.1f}s  {progress}")
            shown = progress
        if d["verdict"] is not None:
            report: dict[str, Any] = api.call("GET", f"/v1/drills/{drill_id}/report")
            return report
        time.sleep(POLL_S)
    raise fail(
        "timeout",
        f"drill {drill_id} did not end within hold_s + {RUN_SLACK_S:g}s",
        exit_code=EXIT_UNAVAILABLE,
        hint=f"follow it with `convplane drill status {drill_id}`",
    )


_GUARDS = Guards()
KindOpt = Annotated[str, typer.Option(help="One of evacuate, region-loss, kill.")]
RegionOpt = Annotated[str, typer.Option(help="The target region.")]
HoldOpt = Annotated[float, typer.Option(help="Seconds to hold the fault.")]
ReasonOpt = Annotated[str, typer.Option(help="Why (kept in the audit log).")]
ForceOpt = Annotated[bool, typer.Option(help="Override the capacity check (only).")]
NodeOpt = Annotated[
    int | None,
    typer.Option(
        help="Kill drills only: kill this node (0, 1, ...) of a region of several nodes, "
        "not the whole region; its sibling takes its shards, none leaves the region."
    ),
]
MaxRto = Annotated[
    float | None,
    typer.Option(
        help=f"Abort when a moved shard takes no write this many seconds after the fault, "
        f"in (0, 3600]. Default: {_GUARDS.max_rto_s:g}."
    ),
]
MaxErrorRatio = Annotated[
    float | None,
    typer.Option(
        help=f"Abort when this share of canary writes fails, in [0, 1]. "
        f"Default: {_GUARDS.max_error_ratio:g}."
    ),
]
MaxAckP99 = Annotated[
    float | None,
    typer.Option(
        help=f"Abort when the canary writes' p99 ack latency passes this many ms. "
        f"Default: {_GUARDS.max_ack_p99_ms:g}."
    ),
]


@drill_app.command("plan")
def plan(
    region: RegionOpt,
    kind: KindOpt = "region-loss",
    hold_s: HoldOpt = 10.0,
    reason: ReasonOpt = "dry run",
    force: ForceOpt = False,
    node: NodeOpt = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    url: Url = None,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """Dry run: preflight and what would move. Changes nothing; exits 1 when infeasible."""
    api = api_for(state_dir, url, key)
    body = drill_body(kind, region, hold_s, reason, force, None, None, None, True, node)
    result = api.call("POST", "/v1/drills", body)
    plan = result["plan"]
    if as_json:
        echo_json(plan)
    else:
        target = region if node is None else f"{region} node {node}"
        typer.echo("\n".join(plan_lines(kind, target, plan)))
    raise typer.Exit(EXIT_OK if plan["ok"] else EXIT_NEGATIVE)


def plan_lines(kind: str, region: str, plan: dict[str, Any]) -> list[str]:
    """A dry run's verdict, its failures and its numbers, for a terminal."""
    lines = [f"{kind} of {region}: {'feasible' if plan.get('ok') else 'refused'}"]
    lines += [f"  refused: {reason}" for reason in plan.get("failures", [])]
    for name, value in sorted(plan.items()):
        if name not in ("ok", "failures") and not isinstance(value, dict | list):
            lines.append(f"  {name.replace('_', ' ')}: {value}")
    return lines


@drill_app.command("run")
def run(
    region: RegionOpt,
    kind: KindOpt = "region-loss",
    hold_s: HoldOpt = 10.0,
    reason: ReasonOpt = "drill",
    force: ForceOpt = False,
    max_rto_s: MaxRto = None,
    max_error_ratio: MaxErrorRatio = None,
    max_ack_p99_ms: MaxAckP99 = None,
    node: NodeOpt = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    url: Url = None,
    key: Key = None,
) -> None:
    """Start a drill and follow it; exit 0 when it passed, 1 otherwise."""
    api = api_for(state_dir, url, key)
    body = drill_body(
        kind,
        region,
        hold_s,
        reason,
        force,
        max_rto_s,
        max_error_ratio,
        max_ack_p99_ms,
        dry_run=False,
        node=node,
    )
    drill = api.call("POST", "/v1/drills", body)
    target = region if node is None else f"{region} node {node}"
    typer.echo(f"drill {drill['drill_id']}: {kind} of {target}, hold {hold_s:g}s")
    report = watch(api, drill["drill_id"], hold_s)
    typer.echo("\n".join(summary_lines(report)))
    raise typer.Exit(EXIT_OK if report["verdict"] == "passed" else EXIT_NEGATIVE)


DrillId = Annotated[str, typer.Argument(help="The drill's id (`convplane drill list`).")]


@drill_app.command("status")
def status(
    drill_id: DrillId,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    url: Url = None,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """A drill's phase and timeline so far."""
    drill = api_for(state_dir, url, key).call("GET", f"/v1/drills/{drill_id}")
    if as_json:
        echo_json(drill)
        return
    typer.echo(
        f"drill {drill['drill_id']}: {drill['kind']} of {drill['region']}, "
        f"{drill['phase']} ({drill['verdict'] or 'no verdict yet'})"
    )
    typer.echo(
        f"  shards recovered {drill['shards_recovered']}/{drill['shards_moved']}, "
        f"canary acked {drill['canary_acked']} errors {drill['canary_errors']}"
    )
    for step in drill.get("timeline", []):
        typer.echo(f"  {step}")


@drill_app.command("abort")
def abort(
    drill_id: DrillId,
    reason: ReasonOpt = "aborted from the CLI",
    state_dir: StateDir = DEFAULT_STATE_DIR,
    url: Url = None,
    key: Key = None,
) -> None:
    """Abort a drill: restore its target now."""
    api = api_for(state_dir, url, key)
    d = api.call("POST", f"/v1/drills/{drill_id}/abort", {"reason": reason})
    typer.echo(f"drill {drill_id}: {d['phase']}")


@drill_app.command("report")
def report_cmd(
    drill_id: DrillId,
    html: Annotated[
        Path | None, typer.Option(help="Write the self-contained HTML report to this file.")
    ] = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    url: Url = None,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """Print a drill's summary, or write its self-contained HTML report."""
    api = api_for(state_dir, url, key)
    if html is not None:
        page = api.call("GET", f"/v1/drills/{drill_id}/report", headers={"Accept": "text/html"})
        html.write_text(page, encoding="utf-8")
        typer.echo(f"wrote {html}")
        return
    body = api.call("GET", f"/v1/drills/{drill_id}/report")
    if as_json:
        echo_json(body)
    else:
        typer.echo("\n".join(summary_lines(body)))


@drill_app.command("list")
def list_cmd(
    state_dir: StateDir = DEFAULT_STATE_DIR, url: Url = None, key: Key = None, as_json: Json = False
) -> None:
    """Drills, newest first."""
    drills = api_for(state_dir, url, key).call("GET", "/v1/drills")["drills"]
    if as_json:
        echo_json(drills)
        return
    for d in drills:
        typer.echo(
            f"{d['drill_id']}  {d['kind']:<12} {d['region']:<10} {d['phase']:<10} "
            f"{d['verdict'] or '-'}"
        )


@halt_app.command("on")
def halt_on(
    reason: Annotated[str, typer.Option(help="Why (kept in the audit log).")],
    state_dir: StateDir = DEFAULT_STATE_DIR,
    url: Url = None,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """Abort every active drill and refuse new ones."""
    answer = api_for(state_dir, url, key).call("POST", "/v1/admin/halt", {"reason": reason})
    _echo_halt(answer, as_json)


@halt_app.command("off")
def halt_off(
    reason: ReasonOpt = "halt lifted",
    state_dir: StateDir = DEFAULT_STATE_DIR,
    url: Url = None,
    key: Key = None,
    as_json: Json = False,
) -> None:
    """Lift the halt switch."""
    api = api_for(state_dir, url, key)
    _echo_halt(api.call("DELETE", "/v1/admin/halt", params={"reason": reason}), as_json)


@halt_app.command("show")
def halt_show(
    state_dir: StateDir = DEFAULT_STATE_DIR, url: Url = None, key: Key = None, as_json: Json = False
) -> None:
    """Whether the halt switch is on, since when and why."""
    _echo_halt(api_for(state_dir, url, key).call("GET", "/v1/admin/halt"), as_json)


def _echo_halt(answer: dict[str, Any], as_json: bool) -> None:
    if as_json:
        echo_json(answer)
    elif answer.get("on"):
        typer.echo(f"halt on (by {answer.get('by')}: {answer.get('reason')})")
    else:
        typer.echo("halt off")


def register(app: typer.Typer) -> None:
    app.add_typer(drill_app, name="drill")
    app.add_typer(halt_app, name="halt")
