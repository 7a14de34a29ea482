"""A region brought back from its backup on a real plane: ``convplane backup`` while the plane
writes, more acked events, ``convplane stop-region``, ``convplane restore`` (the backup is
behind: the region is quarantined before the copy goes in), ``convplane restart-region`` (the
region's own node also holds it quarantined), ``convplane replica rebuild`` (re-admitted at
every node), then every acked event is read back from every region and is in the restored
replica itself, and new appends are acked. Once with SQLite replicas, once with a PostgreSQL
cluster per region (``pg_basebackup`` and a physical restore of the cluster)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.local.plane_state import STATE_FILE_NAME, load_state
from services.local.postgres import DATABASE, saved_instance
from tests.e2e.plane import (
    Plane,
    plane_info,
    postgres_reachable_dir,
    run_convplane,
    until_answered,
)

REGION = "eu-west"
CONVERSATIONS = 8
RETRY_PAUSE_S = 0.1
#: how long every node may take to see a quarantine or a re-admission (a sweep every 2 s)
VERDICT_WAIT_S = 30.0

Acks = dict[str, list[tuple[int, str]]]  # conversation -> (seq, idempotency key)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    with postgres_reachable_dir("convplane-backup-") as path:
        yield path


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_region_restored_from_its_backup_is_quarantined_rebuilt_and_readmitted(
    state_dir: Path, backend: str
) -> None:
    backup_dir = state_dir.parent / "backup"
    acks: Acks = {f"bk-{i}": [] for i in range(CONVERSATIONS)}
    postgres = ["--postgres"] if backend == "postgres" else []
    _ok("up", "--regions", "3", "--state-dir", str(state_dir), "--base-port", "0",
        "--shard-count", "16", "--detach", *postgres)  # fmt: skip
    try:
        plane = Plane(plane_info(state_dir))
        for round_ in ("a", "b"):
            _append_round(plane, acks, round_)
        backed_up = _ok("backup", REGION, "--to", str(backup_dir), "--state-dir", str(state_dir))
        assert f"backed up {REGION}" in backed_up
        manifest = json.loads((backup_dir / "backup.json").read_text())
        assert (manifest["region"], manifest["backend"]) == (REGION, backend)
        for round_ in ("c", "d", "e"):  # acked after the backup: the copy does not hold them
            _append_round(plane, acks, round_)

        _ok("stop-region", REGION, "--state-dir", str(state_dir))
        restored = _ok("restore", REGION, "--from", str(backup_dir), "--state-dir", str(state_dir))
        assert f"{REGION} is quarantined" in " ".join(restored.split()), restored
        others = [name for name in plane.urls if name != REGION]
        for name in others:  # the restore waited for it
            assert _replica_state(plane, name, REGION) == "quarantined"

        _ok("restart-region", REGION, "--state-dir", str(state_dir))
        plane = Plane(plane_info(state_dir))
        _wait_verdict(plane, "quarantined")  # its own node, too, from the others' registries
        cluster_file = restored.split("--cluster-file", 1)[1].split()[0]  # as the restore says
        _ok("replica", "rebuild", "--cluster-file", cluster_file, "--region", REGION)
        _wait_verdict(plane, "admitted")

        for name in plane.urls:
            _check_readable(plane, name, acks)
        _check_in_replica(_replica_rows(state_dir, backend), acks)
        _append_round(plane, acks, "f")
        _check_readable(plane, REGION, acks)
    finally:
        down = run_convplane("down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stdout + down.stderr


def _append_round(plane: Plane, acks: Acks, tag: str) -> None:
    """One append per conversation, each through another region; every one acked."""
    regions = list(plane.urls)
    for i, (cid, acked) in enumerate(acks.items()):
        with plane.client(regions[i % len(regions)]) as client:
            if not acked:
                until_answered(client, "POST", "/v1/conversations", {"conversation_id": cid})
            key = f"{cid}-{tag}"
            body = {"type": "note", "payload": {"key": key}}
            reply = until_answered(client, "POST", f"/v1/conversations/{cid}/events", body, key)
            acked.append((reply.json()["seq"], key))


def _check_readable(plane: Plane, region: str, acks: Acks) -> None:
    with plane.client(region) as client:
        for cid, acked in acks.items():
            page = until_answered(client, "GET", f"/v1/conversations/{cid}/events?limit=100")
            events = [(e["seq"], e["payload"]["key"]) for e in page.json()["events"]]
            assert events == acked, (region, cid, events, acked)


ROWS_QUERY = "SELECT conversation_id, seq, idempotency_key FROM entries WHERE tenant_id = 'demo'"


def _replica_rows(state_dir: Path, backend: str) -> set[tuple[str, int, str]]:
    """The restored region's own replica's events, read from its file or its cluster."""
    if backend == "sqlite":
        path = state_dir / REGION / "replica.sqlite3"
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            return {(cid, seq, key) for cid, seq, key in conn.execute(ROWS_QUERY)}
    saved = load_state(state_dir / STATE_FILE_NAME)
    assert saved is not None
    database = next(r.database for r in saved.regions if r.name == REGION)
    assert database is not None
    server = saved_instance(database, state_dir / "postgres")
    out = server.run_client("psql", "-X", "-A", "-t", "-F", "\t", "-d", DATABASE, "-c", ROWS_QUERY)
    return {
        (cid, int(seq), key) for cid, seq, key in (line.split("\t") for line in out.splitlines())
    }


def _check_in_replica(held: set[tuple[str, int, str]], acks: Acks) -> None:
    """Every acked event is in the restored region's own replica (rebuilt from a quorum)."""
    missing = [(cid, seq, key) for cid, acked in acks.items() for seq, key in acked
               if (cid, seq, key) not in held]  # fmt: skip
    assert not missing, missing


def _replica_state(plane: Plane, observer: str, region: str) -> str | None:
    headers = {"Authorization": f"Bearer {plane.info['viewer_api_key']}"}
    with contextlib.suppress(httpx.HTTPError):
        reply = httpx.get(plane.urls[observer] + "/v1/regions", headers=headers, timeout=5.0)
        if reply.status_code == 200:
            return str(next(r["replica"] for r in reply.json()["regions"] if r["name"] == region))
    return None


def _wait_verdict(plane: Plane, state: str) -> None:
    deadline = time.monotonic() + VERDICT_WAIT_S
    seen: dict[str, str | None] = {}
    while time.monotonic() < deadline:
        seen = {name: _replica_state(plane, name, REGION) for name in plane.urls}
        if all(v == state for v in seen.values()):
            return
        time.sleep(RETRY_PAUSE_S)
    raise AssertionError(f"{REGION}'s replica is not {state} everywhere: {seen}")


def _ok(*args: str) -> str:
    result = run_convplane(*args)
    assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    return result.stdout
