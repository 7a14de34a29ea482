"""A real plane for e2e tests: ``convplane up`` as a subprocess (SQLite replicas, one node
process per region), its ready file read into a ``Plane``, and a clean stop."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eventlog.http_headers import IDEMPOTENCY_KEY_HEADER
from eventlog.sharding import shard_of
from regions.placement import place_shards

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_WAIT_S = 90.0
#: tries of one request while the plane elects leaders (a retryable 503, a refused connection)
REQUEST_TRIES = 300
RETRY_PAUSE_S = 0.1
CONVPLANE = [sys.executable, "-c", "from services.cli.main import main; main()"]


def convplane_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


class Plane:
    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self.urls = {r["name"]: r["url"] for r in info["regions"]}
        self.headers = {"Authorization": f"Bearer {info['api_key']}"}
        cluster = json.loads(Path(info["cluster_file"]).read_text())
        self.shard_count = cluster["shard_count"]
        weights = {r["name"]: r["capacity_weight"] for r in cluster["regions"]}
        self.placement = place_shards(self.shard_count, weights)

    def conversation_led_by(self, region: str, prefix: str) -> str:
        for i in range(10_000):
            cid = f"{prefix}-{i}"
            if self.placement[shard_of(cid, self.shard_count)] == region:
                return cid
        raise AssertionError(f"no conversation id placed on {region}")

    def node_pids(self) -> list[int]:
        """The node processes now (a kill drill's restart changes them: cluster.json follows)."""
        current = Path(self.info["cluster_file"]).parent / "cluster.json"
        info = json.loads(current.read_text()) if current.exists() else self.info
        return [r["node_pid"] for r in info["regions"] if isinstance(r.get("node_pid"), int)]

    def log_tails(self, lines: int = 60) -> str:
        """The last ``lines`` of every region's node log, for a failing test's report: a plane
        that went wrong says why only there."""
        for pid in self.node_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)  # each node logs its tasks' stacks
        time.sleep(1.0)
        parts = []
        for region in self.info["regions"]:
            path = Path(region["log"])
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            tail = "\n".join(text.splitlines()[-lines:])
            parts.append(f"--- {region['name']} ({path}), last {lines} lines ---\n{tail}")
        return "\n".join(parts)

    def client(self, region: str) -> httpx.Client:
        return httpx.Client(base_url=self.urls[region], headers=self.headers, timeout=20.0)


@contextlib.contextmanager
def postgres_reachable_dir(prefix: str) -> Iterator[Path]:
    """A new ``<dir>/plane`` for a state dir, under /tmp (0711): the postgres user of a
    ``--postgres`` plane must reach its data directories. Removed at exit."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(base, 0o711)
    try:
        yield base / "plane"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def start_plane(
    state_dir: Path,
    *extra_args: str,
    ready_wait_s: float = READY_WAIT_S,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], Plane]:
    """``convplane up`` with 3 regions and 16 shards (plus ``extra_args``, and ``env`` added to
    the environment: ``CONVPLANE_*`` node settings); fails the test if it exits or is not ready
    within ``ready_wait_s``."""
    ready_file = state_dir / "ready.json"
    ready_file.unlink(missing_ok=True)  # an earlier start's, on a plane started again
    proc = subprocess.Popen(
        [*CONVPLANE, "up", "--regions", "3", "--state-dir", str(state_dir), "--base-port", "0",
         "--shard-count", "16", *extra_args, "--ready-file", str(ready_file)],
        env={**convplane_env(), **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + ready_wait_s
    while not ready_file.exists():
        if proc.poll() is not None:
            pytest.fail(f"convplane up exited with {proc.returncode}:\n{stop_plane(proc)}")
        if time.monotonic() > deadline:
            stop_plane(proc)
            pytest.fail(f"convplane up {' '.join(extra_args)} did not become ready")
        time.sleep(0.1)
    return proc, Plane(json.loads(ready_file.read_text()))


def stop_plane(proc: subprocess.Popen[bytes]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out.decode()


def run_convplane(*args: str) -> subprocess.CompletedProcess[str]:
    """``convplane args...`` to its end, its output captured."""
    return subprocess.run(
        [*CONVPLANE, *args], env={**convplane_env(), "COLUMNS": "200"},
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def plane_info(state_dir: Path) -> dict[str, Any]:
    """The running plane's cluster.json (its pids change with each region's restart)."""
    info: dict[str, Any] = json.loads((state_dir / "cluster.json").read_text())
    return info


def until_answered(
    client: httpx.Client,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    key: str | None = None,
) -> httpx.Response:
    """The request until it is answered 200 or 201 (asserted): a retryable 503 or 504 (leaders
    being elected after a start, a region's shards moving) and a refused connection (a region
    restarting) are tried again."""
    headers = {IDEMPOTENCY_KEY_HEADER: key} if key else {}
    reply = None
    for _ in range(REQUEST_TRIES):
        try:
            reply = client.request(method, path, json=body, headers=headers)
        except httpx.TransportError:
            time.sleep(RETRY_PAUSE_S)
            continue
        if reply.status_code not in (503, 504):
            assert reply.status_code in (200, 201), reply.text
            return reply
        assert reply.json()["error"]["retryable"] is True, reply.text
        time.sleep(RETRY_PAUSE_S)
    raise AssertionError(f"{method} {path} not answered after {REQUEST_TRIES} tries: {reply}")
