"""A plane started again on its data: ``convplane up`` on a state dir that holds a plane, after
``convplane down`` and after SIGKILL of every process (nodes, PostgreSQL, ``up`` itself), and
``convplane restart-region`` on a supervised and on a detached plane. Each time every acked
event is there in order, an old Idempotency-Key still answers its original seq, new appends
are acked. Arguments that would make another plane of the directory change nothing."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from eventlog.http_headers import IDEMPOTENCY_KEY_HEADER, IDEMPOTENT_REPLAYED_HEADER
from services.local.plane_processes import pid_alive
from tests.e2e.conftest import CALL_FAILED
from tests.e2e.plane import (
    Plane,
    plane_info,
    postgres_reachable_dir,
    run_convplane,
    start_plane,
    stop_plane,
    until_answered,
)

CONVERSATIONS = 4
RETRY_PAUSE_S = 0.1

Acks = dict[str, list[tuple[int, str, int]]]  # conversation -> (seq, idempotency key, n)


@pytest.fixture
def state_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    with postgres_reachable_dir("convplane-restart-") as path:
        yield path
        if request.node.stash.get(CALL_FAILED, False):
            # the plane's own account: every log's tail in the report, and the logs kept
            kept = Path(tempfile.mkdtemp(prefix="convplane-restart-failed-"))
            for log in sorted(path.glob("**/*.log")):
                shutil.copy(log, kept / str(log.relative_to(path)).replace("/", "_"))
                print(f"--- {log.relative_to(path)} (its last 6,000 bytes; a copy in {kept})")
                print(log.read_bytes()[-6000:].decode("utf-8", errors="replace"))


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_plane_restarts_on_its_data(state_dir: Path, backend: str) -> None:
    args = ["--postgres"] if backend == "postgres" else []
    acks: Acks = {f"restart-{i}": [] for i in range(CONVERSATIONS)}

    proc, plane = start_plane(state_dir, *args)
    first_info = plane.info
    try:
        _append_round(plane, acks, "a")
        result = run_convplane("down", "--state-dir", str(state_dir))
        assert result.returncode == 0, result.stdout + result.stderr
        proc.wait(timeout=60)
    finally:
        stop_plane(proc)
    assert proc.returncode == 0

    # a clean stop, then the same `up`: the same plane
    proc, plane = start_plane(state_dir, *args)
    try:
        assert plane.info["api_key"] == first_info["api_key"]
        assert plane.urls == {r["name"]: r["url"] for r in first_info["regions"]}
        _check(plane, acks)
        _append_round(plane, acks, "b")

        # a supervised plane: restart-region asks its supervisor, the node is its child again
        victim = _region(plane.info, "ap-south")
        os.kill(victim["node_pid"], signal.SIGKILL)
        result = run_convplane("restart-region", "ap-south", "--state-dir", str(state_dir))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "supervisor" in result.stdout
        restarted = _region(plane_info(state_dir), "ap-south")
        assert restarted["node_pid"] != victim["node_pid"] and pid_alive(restarted["node_pid"])
        _append_round(plane, acks, "c")

        # SIGKILL of every process: up, the nodes and the databases
        pids = [proc.pid] + [
            pid
            for r in plane_info(state_dir)["regions"]
            for pid in (r["node_pid"], r["db_pid"])
            if pid
        ]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
        _wait_dead(pids)
    finally:
        stop_plane(proc)

    result = run_convplane("up", "--regions", "3", "--state-dir", str(state_dir), "--base-port", "0",
                        "--shard-count", "16", *args, "--detach")  # fmt: skip
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        plane = Plane(plane_info(state_dir))
        _check_printed_no_password(result.stdout, state_dir, plane.info)
        _check(plane, acks)
        _append_round(plane, acks, "d")

        # a detached plane: restart-region does it itself (its database too, when killed)
        victim = _region(plane.info, "eu-west")
        killed = [victim["node_pid"]] + ([victim["db_pid"]] if victim["db_pid"] else [])
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        _wait_dead(killed)
        result = run_convplane("restart-region", "eu-west", "--state-dir", str(state_dir))
        assert result.returncode == 0, result.stdout + result.stderr
        plane = Plane(plane_info(state_dir))
        _append_round(plane, acks, "e")
        _check(plane, acks)
    finally:
        down = run_convplane("down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(pid_alive(pid) for _, pid in _plane_pids(plane_info(state_dir)))


def test_arguments_of_another_plane_change_nothing(state_dir: Path) -> None:
    result = run_convplane("up", "--regions", "2", "--state-dir", str(state_dir), "--base-port", "0",
                        "--shard-count", "8", "--detach")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    down = run_convplane("down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    before = _snapshot(state_dir)
    for other, says in [
        (["--regions", "3"], "--regions 3, it has 2"),
        (["--regions", "2", "--postgres"], "PostgreSQL replicas asked, it has SQLite ones"),
        (["--regions", "2", "--shard-count", "16"], "--shard-count 16, it has 8"),
    ]:
        result = run_convplane("up", "--state-dir", str(state_dir), "--base-port", "0",
                            "--shard-count", "8", *other, "--detach")  # fmt: skip
        assert result.returncode == 1, result.stdout + result.stderr
        assert says in " ".join(result.stdout.split()), result.stdout
        assert _snapshot(state_dir) == before


def _append_round(plane: Plane, acks: Acks, tag: str) -> None:
    """One append per conversation through a different region each; every one acked."""
    regions = list(plane.urls)
    for i, (cid, acked) in enumerate(acks.items()):
        with plane.client(regions[i % len(regions)]) as client:
            if not acked:
                until_answered(client, "POST", "/v1/conversations", {"conversation_id": cid})
            key = f"{cid}-{tag}"
            body = {"type": "note", "payload": {"n": len(acked)}}
            response = until_answered(client, "POST", f"/v1/conversations/{cid}/events", body, key)
            acked.append((response.json()["seq"], key, len(acked)))


def _check(plane: Plane, acks: Acks) -> None:
    """Every acked event in order; each conversation's first key answers its original seq."""
    region = list(plane.urls)[-1]
    with plane.client(region) as client:
        for cid, acked in acks.items():
            page = until_answered(client, "GET", f"/v1/conversations/{cid}/events?limit=100")
            events = [(e["seq"], e["payload"]["n"]) for e in page.json()["events"]]
            assert events == [(seq, n) for seq, _, n in acked], (cid, events, acked)
            seq, key, n = acked[0]
            replay = client.post(
                f"/v1/conversations/{cid}/events",
                json={"type": "note", "payload": {"n": n}},
                headers={IDEMPOTENCY_KEY_HEADER: key},
            )
            assert replay.status_code == 200, replay.text
            assert replay.headers[IDEMPOTENT_REPLAYED_HEADER] == "true"
            assert replay.json()["seq"] == seq


def _check_printed_no_password(stdout: str, state_dir: Path, info: dict[str, Any]) -> None:
    secrets = [p for r in info["regions"] if (p := urlsplit(r["dsn"]).password)]
    state = json.loads((state_dir / "plane-state.json").read_text())
    secrets += [r["database"]["password"] for r in state["regions"] if r["database"]]
    secrets += [r["db_password"] for r in state["regions"]]
    flat = "".join(stdout.split())
    assert not [s for s in secrets if s in flat], stdout
    assert str(state_dir / "cluster.json") in flat and "mode0600" in flat
    for name in ("cluster.json", "plane-state.json"):
        assert (state_dir / name).stat().st_mode & 0o777 == 0o600


def _region(info: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in info["regions"] if r["name"] == name)


def _plane_pids(info: dict[str, Any]) -> list[tuple[str, int]]:
    return [(f"{r['name']} {k}", r[k]) for r in info["regions"] for k in ("node_pid", "db_pid")
            if isinstance(r.get(k), int)]  # fmt: skip


def _wait_dead(pids: list[int]) -> None:
    for _ in range(300):
        if not any(pid_alive(pid) for pid in pids):
            return
        time.sleep(RETRY_PAUSE_S)
    raise AssertionError(f"still alive after SIGKILL: {[p for p in pids if pid_alive(p)]}")


def _snapshot(directory: Path) -> dict[str, tuple[int, str]]:
    """Each file's mode and content digest."""
    return {
        str(path.relative_to(directory)): (
            path.stat().st_mode,
            hashlib.sha256(path.read_bytes()).hexdigest(),
        )
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }
