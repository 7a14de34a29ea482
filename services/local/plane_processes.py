"""A local plane's processes by pid, from its cluster.json: which still run, and stopping them
(``convplane down``). The pids are those of the plane's own machine: a pid reused since the plane
stopped reads as alive, which a local development plane accepts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

STOP_TIMEOUT_S = 10.0
POLL_S = 0.1

#: how a plane's process is asked to stop: PostgreSQL's fast shutdown (SIGINT) closes its
#: sessions instead of waiting for them, as SIGTERM's smart one would
_STOP_SIGNAL = {
    "supervisor_pid": signal.SIGTERM,
    "node_pid": signal.SIGTERM,
    "db_pid": signal.SIGINT,
    "worker_pid": signal.SIGTERM,
}


def plane_processes(info: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(what, pid key, pid) of each process cluster.json names: the supervisor (when ``up``
    supervises), the replay workers of attached engines (``--engine`` with Kafka), then each
    region's node and database."""
    found = []
    if info.get("supervised") and isinstance(info.get("supervisor_pid"), int):
        found.append(("supervisor", "supervisor_pid", info["supervisor_pid"]))
    for engine in info.get("engines", []):
        if isinstance(pid := engine.get("worker_pid"), int):
            found.append((f"{engine['engine_id']} replay worker", "worker_pid", pid))
    for region in info["regions"]:
        for key in ("node_pid", "db_pid"):
            if isinstance(pid := region.get(key), int):
                found.append((f"{region['name']} {key.removesuffix('_pid')}", key, pid))
        for further in region.get("more_nodes", []):
            if isinstance(pid := further.get("node_pid"), int):
                found.append((f"{region['name']} node {further['index']}", "node_pid", pid))
    return found


def running_processes(info_file: Path) -> list[str]:
    """The plane's processes still alive, as ``what pid``; none when it has no cluster.json."""
    try:
        info = json.loads(info_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    return [f"{what} {pid}" for what, _, pid in plane_processes(info) if pid_alive(pid)]


def stop_from_info(info_file: Path) -> list[str]:
    """Stop a plane from its cluster.json (its supervisor, nodes and databases, by pid) and
    wait until they exited."""
    info = json.loads(info_file.read_text(encoding="utf-8"))
    from services.local.engines import stop_engines_from_info

    stopped = stop_engines_from_info(info)
    running = [(what, key, pid) for what, key, pid in plane_processes(info) if pid_alive(pid)]
    stop_pids({pid: _STOP_SIGNAL[key] for _, key, pid in running})
    return stopped + [f"{what} {pid}" for what, _, pid in running]


def stop_pids(signals: Mapping[int, int]) -> None:
    """Send each pid its signal, wait until they exited; SIGKILL those still alive after
    STOP_TIMEOUT_S. The pids need not be this process's children."""
    for pid, signum in signals.items():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    deadline_s = time.monotonic() + STOP_TIMEOUT_S
    while (alive := [p for p in signals if pid_alive(p)]) and time.monotonic() < deadline_s:
        time.sleep(POLL_S)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (exited, not yet reaped by a parent that is gone) does
    not. Local planes only: a pid reused since the plane stopped reads as alive."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
