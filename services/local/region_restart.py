"""``convplane restart-region``: one region's node (and its database, if down) back on its data.

A plane that ``convplane up`` still supervises (``supervised`` in cluster.json, the supervisor
alive) owns its processes: the command leaves a request, ``<state-dir>/restart-requests/<region>``,
and the supervisor carries it out at its next poll (``restart_requests``), so the new node
is its child like the others and ``Ctrl-C`` stops it too. A detached plane has no owner: the
command itself stops the region's node if it runs, starts its PostgreSQL if that is down, starts
its node, detached, and writes the new pids to cluster.json for ``convplane down``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from services.local.plane import (
    HEALTH_POLL_S,
    FurtherNode,
    LocalPlane,
    PlaneError,
    write_private_json,
)
from services.local.plane_processes import pid_alive, stop_pids
from services.local.plane_state import STATE_FILE_NAME, load_state

REQUESTS_DIR = "restart-requests"
#: how long the command waits for a supervisor to take its request and the node to be healthy
RESTART_WAIT_S = 90.0


def restart_region(state_dir: Path, region: str) -> str:
    """Restart ``region`` of the plane in ``state_dir``; return how (a line for the user)."""
    state_dir = state_dir.resolve()
    info = read_info(state_dir)
    entry = region_entry(info, state_dir, region)
    supervisor = info.get("supervisor_pid")
    if info.get("supervised") and isinstance(supervisor, int) and pid_alive(supervisor):
        _request(state_dir, region)
        _wait_healthy(entry["url"], lambda: (state_dir / REQUESTS_DIR / region).exists())
        return f"{region} restarted by the plane's supervisor (pid {supervisor})"
    _restart_detached(state_dir, info, region)
    return f"{region} restarted (detached)"


def stop_region(state_dir: Path, region: str) -> str:
    """Stop ``region``'s node (SIGTERM, SIGKILL after ``STOP_TIMEOUT_S``); its database stays.
    Its shards fail over as they would at the region's loss; ``up``'s supervisor reports the
    exit and leaves it stopped until ``restart_region``."""
    info = read_info(state_dir.resolve())
    entry = region_entry(info, state_dir, region)
    pids = [p for p in _node_pids(entry) if pid_alive(p)]
    if not pids:
        return f"{region}'s node is not running"
    stop_pids(dict.fromkeys(pids, signal.SIGTERM))
    return f"{region}'s node stopped (pid {', '.join(map(str, pids))})"


def _node_pids(entry: dict[str, Any]) -> list[int]:
    """The pids of a region's nodes in cluster.json: its first node's, then its further ones'."""
    pids = [entry.get("node_pid"), *(n.get("node_pid") for n in entry.get("more_nodes", []))]
    return [p for p in pids if isinstance(p, int)]


def restart_requests(state_dir: Path) -> list[str]:
    """The regions whose restart is asked (``up``'s supervisor loop polls this)."""
    directory = state_dir / REQUESTS_DIR
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def finish_request(state_dir: Path, region: str) -> None:
    """The request for ``region`` was carried out (or failed: the waiting command then sees
    the region unhealthy and says so)."""
    (state_dir / REQUESTS_DIR / region).unlink(missing_ok=True)


def _request(state_dir: Path, region: str) -> None:
    directory = state_dir / REQUESTS_DIR
    directory.mkdir(mode=0o700, exist_ok=True)
    (directory / region).touch(mode=0o600)


def _restart_detached(state_dir: Path, info: dict[str, Any], region: str) -> None:
    try:
        saved = load_state(state_dir / STATE_FILE_NAME)
    except ValueError as exc:
        raise PlaneError(str(exc)) from exc
    if saved is None:
        raise PlaneError(f"{state_dir} holds no {STATE_FILE_NAME}: nothing to restart from")
    plane = LocalPlane(
        regions=len(saved.regions),
        state_dir=state_dir,
        postgres=saved.postgres,
        tls=saved.tls,
        shard_count=saved.shard_count,
        host=saved.host,
        base_port=0,
        ready_timeout_s=RESTART_WAIT_S,  # the same bound as a supervisor's restart
    )
    plane.adopt(saved)
    entry = next(r for r in info["regions"] if r["name"] == region)
    member = next(m for m in plane.members if m.name == region)
    if running := [p for p in _node_pids(entry) if pid_alive(p)]:
        stop_pids(dict.fromkeys(running, signal.SIGTERM))
    if saved.postgres:
        db_pid = entry.get("db_pid")
        if not (isinstance(db_pid, int) and pid_alive(db_pid)):
            plane.start_saved_database(member)
            assert member.db is not None
            member.db.keep_running()  # a detached plane's: ``convplane down`` stops it
            entry["db_pid"] = member.db.pid
    member.node = plane.spawn_node(member)
    entry["node_pid"] = member.node.pid
    for further_entry in entry.get("more_nodes", []):  # on the ports the cluster file says
        further = FurtherNode(
            index=further_entry["index"],
            port=_port(further_entry["url"]),
            url=further_entry["url"],
            peer_port=_port(further_entry["peer_url"]),
            peer_url=further_entry["peer_url"],
            log_path=Path(further_entry["log"]),
        )
        member.more_nodes.append(further)
        further_entry["node_pid"] = plane.spawn_further_node(member, further).pid
    write_private_json(state_dir / "cluster.json", info)
    plane.wait_healthy([member])


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def _wait_healthy(url: str, request_pending: Any) -> None:
    """Until the supervisor took the request and the region's node answers ``/healthz``."""
    deadline_s = time.monotonic() + RESTART_WAIT_S
    with httpx.Client(timeout=1.0, trust_env=False) as client:
        while time.monotonic() < deadline_s:
            if not request_pending():
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(url + "/healthz").status_code == 200:
                        return
            time.sleep(HEALTH_POLL_S)
    raise PlaneError(f"the region at {url} is not healthy after {RESTART_WAIT_S:g}s")


def region_entry(info: dict[str, Any], state_dir: Path, region: str) -> dict[str, Any]:
    """``region``'s entry in the plane's cluster.json; PlaneError naming the plane's regions."""
    entry: dict[str, Any] | None = next((r for r in info["regions"] if r["name"] == region), None)
    if entry is None:
        names = ", ".join(r["name"] for r in info["regions"])
        raise PlaneError(f"no region {region!r} in the plane in {state_dir} (it has {names})")
    return entry


def read_info(state_dir: Path) -> dict[str, Any]:
    try:
        info: dict[str, Any] = json.loads((state_dir / "cluster.json").read_text("utf-8"))
    except FileNotFoundError as exc:
        raise PlaneError(f"no plane in {state_dir} (no cluster.json)") from exc
    return info
