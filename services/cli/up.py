"""``convplane up`` (a local plane), ``convplane down``, ``convplane restart-region``,
``convplane stop-region``, ``convplane upgrade-region`` and ``convplane demo``."""

from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from convplane_client import Client
    from services.local.attached_engines import AttachedEngines
    from services.local.plane import LocalPlane
    from services.local.plane_state import PlaneState, SavedEngines

SUPERVISE_POLL_S = 0.5
DEMO_DRILL_HOLD_S = 5.0
#: the demo's plane: few shards, so its drill's failover is quick on a small machine
DEMO_SHARD_COUNT = 16
#: the demo drill's error-ratio guard, looser than the default (0.2): three nodes sharing SQLite
#: files on one laptop lose some writes on shards that do not move while a failover runs
DEMO_MAX_ERROR_RATIO = 0.5
#: the demo's drill is asked again while its preflight finds a shard not yet writable: a plane
#: just started on a loaded machine may still be electing some shards' leaders
DEMO_DRILL_START_TRIES = 20
DEMO_DRILL_RETRY_S = 1.0


def up(
    regions: Annotated[int, typer.Option(help="Number of regions (2..7).")] = 3,
    postgres: Annotated[bool, typer.Option(help="One local PostgreSQL per region.")] = False,
    state_dir: Annotated[Path, typer.Option(help="Databases, logs, cluster.json.")] = Path(
        ".state/plane"
    ),
    base_port: Annotated[int, typer.Option(help="First region's port (0: any free).")] = 8700,
    shard_count: Annotated[int, typer.Option(help="Shards of the log.")] = 64,
    detach: Annotated[bool, typer.Option(help="Leave the plane running and exit.")] = False,
    ready_file: Annotated[
        Path | None, typer.Option(help="Write cluster.json's content here once ready.")
    ] = None,
    sim_engines: Annotated[
        int, typer.Option(help="Simulated inference engines per region (no GPU), for replay.")
    ] = 0,
    tls: Annotated[
        bool, typer.Option(help="Mutual TLS between the nodes, under a CA made for this plane.")
    ] = True,
    engine: Annotated[
        list[str] | None,
        typer.Option(
            help="REGION=URL: a real OpenAI-compatible engine (vLLM) for that region's replay, "
            "self-checked first (repeatable). Saved with the plane: a plain `up` attaches "
            "the same engines again."
        ),
    ] = None,
    without_engines: Annotated[
        bool,
        typer.Option(
            "--without-engines",
            help="Resume the saved plane without the engines it was started with (and forget "
            "them).",
        ),
    ] = False,
    declare_priority_scheduling: Annotated[
        bool,
        typer.Option(
            "--declare-priority-scheduling",
            help="The --engine servers run --scheduling-policy priority: counts where the "
            "check's queue probe cannot tell (never over an engine seen serving FCFS); "
            "otherwise replay takes a smaller share of their spare there.",
        ),
    ] = False,
    kafka_bootstrap_servers: Annotated[
        str,
        typer.Option(
            help="With --engine: replay jobs go through this Kafka broker to one "
            "`convplane worker` process per engine (default: workers inside the nodes)."
        ),
    ] = "",
    host: Annotated[
        str | None,
        typer.Option(
            help="The IPv4 address of this machine every node, peer listener and database "
            "listens on and advertises; the certificates name it (default: the saved plane's, "
            "else 127.0.0.1)."
        ),
    ] = None,
    nodes_per_region: Annotated[
        int,
        typer.Option(
            help="Node processes per region (1..8): one leads the region, the others stand by "
            "on its database and take over when it dies, without a failover to another region."
        ),
    ] = 1,
) -> None:
    """Start a local plane: per region a database and a node process (or several:
    --nodes-per-region). Ctrl-C stops it. On a state dir that holds a plane, start that plane
    again on its data (same arguments)."""
    from rich.console import Console

    from services.cli.signals import stop_on_signals
    from services.local.host import HarnessError
    from services.local.plane import LocalPlane, PlaneError, write_private_json

    console = Console()
    try:
        saved = _saved_plane(state_dir)
        address = _plane_host(host, saved)
        requested = _engines_requested(
            engine or [], without_engines, declare_priority_scheduling, kafka_bootstrap_servers,
            sim_engines, saved,
        )  # fmt: skip
        plane = LocalPlane(
            regions=regions,
            state_dir=state_dir,
            base_port=base_port,
            postgres=postgres,
            shard_count=shard_count,
            sim_engines=sim_engines,
            tls=tls,
            supervised=not detach,
            host=address,
            nodes_per_region=nodes_per_region,
        )
        plane.check_resumable()  # before any engine is probed
    except (HarnessError, PlaneError) as exc:
        console.print(f"[red]could not start the plane:[/red] {exc}")
        raise typer.Exit(1) from exc
    if requested.resumed:
        console.print(f"attaching the saved plane's engines again: {', '.join(requested.options)}")
    plane.attached = _attached_engines(console, regions, state_dir, requested)
    stop = stop_on_signals()
    try:
        info = plane.start()
    except PlaneError as exc:
        console.print(f"[red]could not start the plane:[/red] {exc}")
        raise typer.Exit(1) from exc
    if ready_file is not None:
        write_private_json(ready_file, info)  # it holds the tenants' API keys
    if detach:
        plane.detach()
        _print_plane(console, info, plane.info_file)
        console.print(f"detached; stop it with: convplane down --state-dir {state_dir}")
        return
    try:
        _print_plane(console, info, plane.info_file)
        _supervise(console, plane, info, stop)
    finally:
        # the terminal may be gone (a parent reading a pipe died, even during startup: rich
        # then exits): the plane is stopped regardless, or its nodes would outlive this one
        try:
            console.print("stopping the plane ...")
        finally:
            plane.stop()


@dataclass(frozen=True)
class _EnginesRequested:
    options: list[str]
    priority_declared: bool
    kafka_bootstrap_servers: str
    resumed: bool  # the saved plane's
    saved: SavedEngines | None  # the saved plane's: its workers' keys, bus secrets, salt key


def _engines_requested(
    options: list[str],
    without: bool,
    priority_declared: bool,
    kafka_bootstrap_servers: str,
    sim_engines: int,
    saved: PlaneState | None,
) -> _EnginesRequested:
    """The ``--engine`` options (replacing the saved plane's), or without any, the saved
    plane's engines (its declaration and broker, or the ones given), or none with
    ``--without-engines``."""
    from services.local.plane import PlaneError

    saved_engines = None if saved is None else saved.engines
    asked = _EnginesRequested(
        options, priority_declared, kafka_bootstrap_servers, False, saved_engines
    )
    if without:
        if options:
            raise PlaneError("--engine and --without-engines: give one or the other")
        return asked
    if options or saved_engines is None:
        return asked
    if sim_engines > 0:
        raise PlaneError(
            f"--sim-engines, and the saved plane has engines ({', '.join(saved_engines.options)})"
            ": a plane takes one or the other; resume it with --without-engines"
        )
    return _EnginesRequested(
        list(saved_engines.options),
        priority_declared or saved_engines.priority_declared,
        kafka_bootstrap_servers or saved_engines.kafka_bootstrap_servers,
        True,
        saved_engines,
    )


def _attached_engines(
    console: Console, regions: int, state_dir: Path, requested: _EnginesRequested
) -> AttachedEngines | None:
    """The ``--engine`` engines, each self-checked; exits 1 (nothing started) on a bad option or
    an engine that is unreachable or unfit, saying why."""
    from services.local.attached_engines import (
        AttachedEngines,
        EngineRefused,
        check_engines,
        parse_engine_options,
    )
    from services.local.plane import REGION_NAMES

    options, priority_declared = requested.options, requested.priority_declared
    kafka_bootstrap_servers = requested.kafka_bootstrap_servers
    if not options:
        if kafka_bootstrap_servers or priority_declared:
            console.print(
                "[red]--kafka-bootstrap-servers and --declare-priority-scheduling "
                "apply to --engine engines: give one[/red]"
            )
            raise typer.Exit(1)
        return None
    try:
        parsed = parse_engine_options(options, REGION_NAMES[:regions])
        console.print(f"checking {len(parsed)} engine(s) for replay ...")
        checked = check_engines(parsed, priority_declared=priority_declared)
    except EngineRefused as exc:
        console.print(f"[red]not starting the plane:[/red] {exc}")
        if requested.resumed:
            console.print(
                "(an engine the saved plane was started with: start it again, or resume "
                "without engines: --without-engines)"
            )
        raise typer.Exit(1) from exc
    attached = AttachedEngines(
        checked,
        state_dir.resolve(),
        priority_declared=priority_declared,
        kafka_bootstrap_servers=kafka_bootstrap_servers or None,
    )
    if requested.saved is not None:  # the same plane: its secrets stay
        attached.keep_secrets(requested.saved)
    return attached


def _saved_plane(state_dir: Path) -> PlaneState | None:
    """The plane saved in ``state_dir``, if any (``PlaneError`` for a file it cannot read)."""
    from services.local.plane import PlaneError
    from services.local.plane_state import STATE_FILE_NAME, load_state

    try:
        return load_state(state_dir / STATE_FILE_NAME)
    except ValueError as exc:
        raise PlaneError(str(exc)) from exc


def _plane_host(requested: str | None, saved: PlaneState | None) -> str:
    """``--host`` checked, or the saved plane's address (a plane resumes where it was made:
    its certificates name that address), or loopback."""
    from services.local.host import local_address

    if requested is not None:
        return local_address(requested)
    return "127.0.0.1" if saved is None else saved.host


def _supervise(
    console: Console, plane: LocalPlane, info: dict[str, Any], stop: threading.Event
) -> None:
    """Report exited nodes, carry out kill drills and ``restart-region`` requests, start exited
    replay workers again, until stopped. A node that exits stays down until asked: its shards
    fail over meanwhile; a worker holds no state and is started again after a backoff."""
    import httpx

    from services.control.drills.local_kill import KillDrills
    from services.local.plane import PlaneError
    from services.local.region_restart import finish_request, restart_requests

    kill_drills = KillDrills(plane, [r["url"] for r in info["regions"]], info["operator_api_key"])
    with httpx.Client(trust_env=False) as client:
        while not stop.wait(SUPERVISE_POLL_S):
            for line in plane.supervise_workers():
                console.print(f"[yellow]{line}[/yellow]", highlight=False)
            for name, code in plane.exited_nodes():
                console.print(
                    f"[yellow]node {name} exited with code {code}[/yellow]; start it again on "
                    f"its data: convplane restart-region {name} --state-dir {plane.state_dir}"
                )
            for name in restart_requests(plane.state_dir):
                try:
                    plane.restart_region(name)
                    console.print(f"restarted region {name}")
                except (PlaneError, OSError) as exc:
                    console.print(f"[red]restart of {name}: {exc}[/red]")
                finally:
                    finish_request(plane.state_dir, name)
            try:
                for line in kill_drills.poll(client):
                    console.print(line)
            except (PlaneError, OSError, RuntimeError) as exc:  # a restart that failed
                console.print(f"[red]kill drill: {exc}[/red]")


def down(
    state_dir: Annotated[Path, typer.Option(help="The plane's state dir.")] = Path(".state/plane"),
) -> None:
    """Stop a plane (up's supervisor, nodes and databases: the pids in cluster.json) and
    wait until they exited. Its data stays: `convplane up` with the same arguments resumes it."""
    from services.local.plane_processes import stop_from_info

    info_file = state_dir / "cluster.json"
    if not info_file.exists():
        typer.echo(f"no {info_file}")
        raise typer.Exit(1)
    for line in stop_from_info(info_file):
        typer.echo(f"stopped {line}")


RegionName = Annotated[str, typer.Argument(help="The region's name, as cluster.json has it.")]
StateDir = Annotated[Path, typer.Option(help="The plane's state dir.")]


def restart_region(region: RegionName, state_dir: StateDir = Path(".state/plane")) -> None:
    """Start one region's node again on its data (stopping it first if it runs), and its
    database if that is down; wait until the node is healthy."""
    from services.local.region_restart import restart_region as restart

    _region_action("restart", restart, state_dir, region)


def upgrade_region(region: RegionName, state_dir: StateDir = Path(".state/plane")) -> None:
    """Restart one region of a detached plane with this installation's convplane, on its data,
    and wait until every region is healthy: a rolling upgrade, one region at a time."""
    from services.local.region_upgrade import upgrade_region as upgrade

    _region_action("upgrade", upgrade, state_dir, region)


def stop_region(region: RegionName, state_dir: StateDir = Path(".state/plane")) -> None:
    """Stop one region's node (its data and database stay): before a restore, or to take a
    region out by hand. `convplane restart-region` starts it again."""
    from services.local.region_restart import stop_region as stop

    _region_action("stop", stop, state_dir, region)


def _region_action(
    verb: str, action: Callable[[Path, str], str], state_dir: Path, region: str
) -> None:
    """Print what ``action`` did to ``region``, or why it could not (exit 1)."""
    from services.local.plane import PlaneError

    try:
        typer.echo(action(state_dir, region))
    except PlaneError as exc:
        typer.echo(f"could not {verb} {region}: {exc}", err=True)
        raise typer.Exit(1) from exc


def demo(
    regions: Annotated[int, typer.Option(help="Number of regions (2..7).")] = 3,
    state_dir: Annotated[
        Path | None, typer.Option(help="Keep the plane's files here (default: a temp dir).")
    ] = None,
) -> None:
    """Start a plane, write a conversation with a tool call, show acks and transcript, run a
    short region-loss drill and show its summary, stop."""
    from rich.console import Console

    from services.local.plane import LocalPlane, PlaneError

    console = Console()
    with tempfile.TemporaryDirectory(prefix="convplane-demo-") as tmp:
        plane = LocalPlane(
            regions=regions,
            state_dir=state_dir or Path(tmp),
            base_port=0,
            shard_count=DEMO_SHARD_COUNT,
        )
        console.print(f"starting {regions} regions (SQLite replicas) ...")
        try:
            info = plane.start()
        except PlaneError as exc:
            console.print(f"[red]could not start the plane:[/red] {exc}")
            raise typer.Exit(1) from exc
        try:
            _print_plane(console, info, plane.info_file)
            _run_demo(console, plane, info)
            _run_demo_drill(console, info)
        finally:
            plane.stop()
    console.print("plane stopped.")


def _print_plane(console: Console, info: dict[str, Any], info_file: Path) -> None:
    from services.local.plane import without_password

    for region in info["regions"]:
        console.print(
            f"  region [bold]{region['name']}[/bold]  {region['url']}  "
            f"db {without_password(region['dsn'])}"
        )
    console.print(f"  API key (tenant {info['tenant_id']}): [bold]{info['api_key']}[/bold]")
    for engine in info.get("engines", []):
        unverified = ", ".join(f"{n} ({r})" for n, r in engine["reasons"].items())
        console.print(
            f"  engine {engine['engine_id']} {engine['url']} serves "
            f"{engine['model_revision']!r}: fit for replay, {engine['worker']} worker"
            + (f"; unverified: {unverified}" if unverified else "")
        )
    for engine in info.get("sim_engines", []):
        console.print(
            f"  simulated engine (a simulator, no GPU) {engine['engine_id']}  {engine['url']}"
        )
    if "service_api_key" in info:
        console.print(f"  replay service key: [bold]{info['service_api_key']}[/bold]")
    console.print(
        f"  plane described in {info_file} (mode 0600: the API keys and database passwords)"
    )


def _run_demo(console: Console, plane: LocalPlane, info: dict[str, Any]) -> None:
    """A conversation with a tool call, written the way a chat application should: through
    ``convplane_client`` (route-following, safe retries, the tool run once)."""
    from rich.table import Table

    from convplane_client import Appended, Client, ConvplaneError

    regions = {r["name"]: r["url"] for r in info["regions"]}
    try:
        with Client(regions, info["api_key"]) as plane_client:
            cid = f"demo-{uuid.uuid4().hex[:12]}"
            created = plane_client.create_conversation(cid)
            console.print(
                f"\nconversation [bold]{cid}[/bold] created; its leader region is "
                f"{created.leader_region}"
            )
            attempt_id = f"att-{uuid.uuid4().hex[:8]}"
            acks = Table(title="appends (each acknowledged by a quorum of regions)")
            for column in ("seq", "type", "acked_by", "served_by", "idempotent replay"):
                acks.add_column(column)

            def row(event_type: str, a: Appended) -> None:
                acks.add_row(
                    str(a.seq),
                    event_type,
                    ", ".join(a.acked_by),
                    a.served_by or "-",
                    "true" if a.replayed else "-",
                )

            user = {"content": "What's the weather in Lisbon?"}
            row("message.user", plane_client.append(cid, "message.user", user))
            arguments = {"city": "Lisbon"}
            first = plane_client.run_tool_once(
                cid, attempt_id, "weather.lookup", arguments, _weather_lookup
            )
            answer = {"content": f"It is {first.result['celsius']} °C in Lisbon."}
            for _ in range(2):  # the second is a retry with the same key: answered, not applied
                row(
                    "message.assistant",
                    plane_client.append(
                        cid, "message.assistant", answer, idempotency_key="demo-answer"
                    ),
                )
            console.print(acks)
            again = plane_client.run_tool_once(
                cid, attempt_id, "weather.lookup", arguments, _tool_must_not_run
            )
            console.print(
                f"tool attempt {attempt_id} (tool.attempt, then tool.effect): the tool ran "
                f"{'once' if first.ran and not again.ran else 'TWICE'}; asked again, "
                f"run_tool_once answered the recorded result {again.result}"
            )
            _print_transcript(console, plane_client, cid, attempt_id)
    except ConvplaneError as exc:
        raise typer.Exit(_fail(str(exc))) from exc


def _weather_lookup(idempotency_key: str) -> dict[str, Any]:
    """The demo's tool: an external call that takes the attempt id as its idempotency key."""
    return {"celsius": 21, "idempotency_key": idempotency_key}


def _tool_must_not_run(idempotency_key: str) -> Any:
    raise AssertionError(f"the demo's tool ran twice ({idempotency_key})")


def _run_demo_drill(console: Console, info: dict[str, Any]) -> None:
    """A short region-loss drill of the last region: a failover in the first minute."""
    from regions.drill_report import summary_lines
    from services.cli.drill import Api, drill_body, watch

    region = info["regions"][-1]["name"]
    api = Api([r["url"] for r in info["regions"]], info["operator_api_key"])
    body = drill_body(
        "region-loss",
        region,
        DEMO_DRILL_HOLD_S,
        "demo",
        False,
        None,
        DEMO_MAX_ERROR_RATIO,
        None,
        dry_run=False,
    )
    drill = _start_demo_drill(info, body)
    console.print(
        f"\n[bold]region-loss drill[/bold] {drill['drill_id']}: {region} black-holed at every "
        f"node for {DEMO_DRILL_HOLD_S:g}s; its {drill['shards_moved']} shards fail over"
    )
    report = watch(api, drill["drill_id"], DEMO_DRILL_HOLD_S, echo=console.print)
    for line in summary_lines(report):
        console.print(line)


def _start_demo_drill(info: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    import httpx

    from services.cli.drill import CALL_TIMEOUT_S

    headers = {"Authorization": f"Bearer {info['operator_api_key']}"}
    url = info["regions"][0]["url"] + "/v1/drills"
    with httpx.Client(headers=headers, timeout=CALL_TIMEOUT_S, trust_env=False) as client:
        for _ in range(DEMO_DRILL_START_TRIES):
            reply = client.post(url, json=body)
            if reply.status_code != 409 or "not writable" not in reply.text:
                break
            time.sleep(DEMO_DRILL_RETRY_S)
    if reply.status_code >= 300:
        raise typer.Exit(_fail(f"POST /v1/drills -> {reply.status_code} {reply.text[:500]}"))
    started: dict[str, Any] = reply.json()
    return started


def _print_transcript(console: Console, plane_client: Client, cid: str, attempt_id: str) -> None:
    from rich.table import Table

    transcript = Table(title=f"transcript of {cid}")
    for column in ("seq", "type", "payload", "created_at"):
        transcript.add_column(column)
    for e in plane_client.transcript(cid):
        transcript.add_row(
            str(e.seq), e.type, json.dumps(e.payload, ensure_ascii=False), e.created_at.isoformat()
        )
    console.print(transcript)
    status = plane_client.tool_attempt(cid, attempt_id)
    console.print(f"tool attempt {attempt_id}: [bold]{status.state}[/bold]")


def _fail(message: str) -> int:
    typer.echo(f"demo failed: {message}", err=True)
    return 1


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("down")(down)
    app.command("restart-region")(restart_region)
    app.command("stop-region")(stop_region)
    app.command("upgrade-region")(upgrade_region)
    app.command("demo")(demo)
