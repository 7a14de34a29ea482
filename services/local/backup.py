"""``convplane backup`` and ``convplane restore``: one region's replica of a local plane.

A backup is a directory: a consistent copy of the region's replica, made while the plane keeps
running and writing, and ``backup.json`` (the manifest: which plane and region, which backend,
the store's identity, the schema revision, when). The manifest is written last, so a directory
without one is a backup that did not finish. The copy is the backend's own: ``replica.sqlite3``
through SQLite's online backup (here), ``pgdata`` through ``pg_basebackup``
(``services.local.backup_postgres``).

A restore puts an older copy of a replica back, which is exactly the rollback the identity
guard cannot see by itself (``eventlog.identity``: the copy keeps its store id). So it does
what a new leader would do at its next lead, for every shard at once and before the copy goes
in: it compares the backup's log with the positions the *other* stores keep for the region
(``replica_positions``, ``eventlog.recovery.highest_positions``). A backup below any of them
lost events it had acknowledged: the region is quarantined in every other store's registry (the
``rolled-back:`` record a leader writes), the running nodes are waited for until they see it
quarantined, and only then is the copy written into the replica, in place (the same file or
cluster, so the same identity, as a physical restore of the volume would leave it). ``convplane replica
rebuild`` then copies every shard's log from a quorum and re-admits it
(docs/upgrade-backup-restore.md). A backup that is not behind anywhere is simply restored.

Everything is checked before anything changes: the plane and region exist, the region's node
is stopped, the backup is complete, of this plane, of this region and of its backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import httpx

from eventlog.errors import ConvplaneError
from eventlog.identity import ROLLED_BACK_PREFIX, IdentityRecord
from eventlog.model import HeldPosition, ShardStatus, holds
from eventlog.replica import ReplicaStore
from services.local.backup_postgres import PostgresReplica, pg_version
from services.local.backup_region import REPLICA_FILE_NAME, LocalRegion, local_region
from services.local.plane import PlaneError, write_private_json
from services.local.plane_processes import pid_alive

BACKUP_FORMAT = 1
MANIFEST_NAME = "backup.json"
#: how long a restore waits for every running node's identity sweep to see the region
#: quarantined before it writes the copy (a sweep runs every 2 s: services.control.controller)
QUARANTINE_SEEN_WAIT_S = 30.0
QUARANTINE_POLL_S = 0.2
#: each store call of a restore (positions, registries) must answer within this; the stores'
#: own deadline (``OPERATOR_STORE_CALL_TIMEOUT_S``) comes first and says what held it up
STORE_CALL_TIMEOUT_S = 35.0  # above services.bootstrap.operator.OPERATOR_STORE_CALL_TIMEOUT_S
#: tries of the comparison with the other stores (SQLite files the running nodes write too: a
#: write lock held past the store's busy timeout fails one), and the pause between two
COMPARE_TRIES = 3
COMPARE_RETRY_PAUSE_S = 1.0


@dataclass(frozen=True, slots=True)
class Manifest:
    plane_id: str
    region: str
    store_id: str
    schema_revision: str
    created_at: str
    convplane_version: str
    backend: str = "sqlite"  # a manifest without one is from before PostgreSQL backups


@dataclass(frozen=True, slots=True)
class RestoreReport:
    region: str
    behind: dict[int, tuple[HeldPosition, ShardStatus]]  # shard -> (kept elsewhere, backup's)
    quarantined: bool
    #: what ``convplane replica rebuild --cluster-file`` is given to lift the quarantine
    operator_cluster_file: Path


class StagedCopy(Protocol):
    """A backup's copy beside the replica it replaces, not yet in its place."""

    def reading(self) -> AbstractContextManager[str]:
        """A DSN that opens the staged copy as a store (to compare it with the others)."""
        ...

    def put_in(self) -> None:
        """The copy in the replica's place, the same file or cluster: the same identity."""
        ...


class ReplicaBackend(Protocol):
    """How one kind of replica is copied into a backup and out of one."""

    @property
    def name(self) -> str: ...  # in the manifest: "sqlite", "postgres"

    @property
    def copy_name(self) -> str: ...  # the copy's name in a backup directory

    def back_up(self, local: LocalRegion, copy: Path) -> tuple[str, str]:
        """Copy ``local``'s replica to the new path ``copy``; its (store id, schema revision)."""
        ...

    def staged(self, local: LocalRegion, copy: Path) -> AbstractContextManager[StagedCopy]:
        """The backup's ``copy`` staged beside ``local``'s replica; removed at exit."""
        ...

    def operator_cluster_file(self, local: LocalRegion) -> Path:
        """A cluster file whose DSNs open every region's store from this machine."""
        ...


def replica_backend(local: LocalRegion) -> ReplicaBackend:
    return PostgresReplica() if local.database is not None else SqliteReplica()


def backup_region(state_dir: Path, region: str, target: Path) -> Manifest:
    """Copy ``region``'s replica into the new directory ``target`` (the plane may be running)."""
    local = local_region(state_dir, region)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise PlaneError(
            f"{target} exists and is not an empty directory: a backup never overwrites anything"
        )
    backend = replica_backend(local)
    created = not target.exists()
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        store_id, schema_revision = backend.back_up(local, target / backend.copy_name)
        manifest = Manifest(
            plane_id=local.plane_id,
            region=region,
            store_id=store_id,
            schema_revision=schema_revision,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            convplane_version=_installed_version(),
            backend=backend.name,
        )
        write_private_json(target / MANIFEST_NAME, {"format": BACKUP_FORMAT, **asdict(manifest)})
    except BaseException:
        if created:
            shutil.rmtree(target, ignore_errors=True)
        else:
            for path in target.iterdir():
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        raise
    return manifest


def read_manifest(source: Path) -> Manifest:
    """The manifest of the backup in ``source``; PlaneError when it is not a whole backup."""
    if not source.is_dir():
        raise PlaneError(f"no backup at {source} (not a directory)")
    try:
        raw = json.loads((source / MANIFEST_NAME).read_text("utf-8"))
    except FileNotFoundError as exc:
        raise PlaneError(
            f"{source} holds no {MANIFEST_NAME}: not a backup, or one that did not finish"
        ) from exc
    except (OSError, ValueError) as exc:
        raise PlaneError(f"{source / MANIFEST_NAME} cannot be read: {exc}") from exc
    if not isinstance(raw, dict) or raw.pop("format", None) != BACKUP_FORMAT:
        raise PlaneError(f"{source / MANIFEST_NAME} is not a backup of format {BACKUP_FORMAT}")
    try:
        manifest = Manifest(**raw)
    except TypeError as exc:
        raise PlaneError(f"{source / MANIFEST_NAME} is not a backup manifest: {exc}") from exc
    copy_name = COPY_NAMES.get(manifest.backend)
    if copy_name is None:
        raise PlaneError(f"{source / MANIFEST_NAME} names no known backend ({manifest.backend!r})")
    if not (source / copy_name).exists():
        raise PlaneError(f"{source} holds no {copy_name}")
    return manifest


def check_restore(state_dir: Path, region: str, source: Path) -> LocalRegion:
    """Every reason not to restore ``source`` into ``region``, as a PlaneError; nothing changes."""
    local = local_region(state_dir, region)
    manifest = read_manifest(source)
    if manifest.plane_id != local.plane_id:
        raise PlaneError(
            f"{source} is a backup of another plane (plane {manifest.plane_id}; "
            f"this one is {local.plane_id})"
        )
    if manifest.region != region:
        raise PlaneError(f"{source} is a backup of region {manifest.region}, not of {region}")
    backend = replica_backend(local)
    if manifest.backend != backend.name:
        raise PlaneError(
            f"{source} is a backup of a {BACKEND_WORDS[manifest.backend]} replica; {region}'s "
            f"replica is a {BACKEND_WORDS[backend.name]} one"
        )
    if local.database is not None:
        ours = pg_version(local.state_dir / "postgres" / local.database.name)
        theirs = pg_version(source / backend.copy_name)
        if theirs != ours:
            raise PlaneError(f"{source} is a PostgreSQL {theirs} cluster; {region}'s is {ours}")
    if local.node_pid is not None and pid_alive(local.node_pid):
        raise PlaneError(
            f"{region}'s node is running (pid {local.node_pid}): stop it first "
            f"(convplane stop-region {region} --state-dir {local.state_dir})"
        )
    return local


def restore_region(state_dir: Path, region: str, source: Path) -> RestoreReport:
    """Restore ``region``'s replica from the backup in ``source`` (module docstring)."""
    local = check_restore(state_dir, region, source)
    backend = replica_backend(local)
    operator_file = backend.operator_cluster_file(local)
    with backend.staged(local, source / backend.copy_name) as staged:
        with staged.reading() as staged_dsn:
            behind = _compare_with_others(local, staged_dsn, operator_file)
        if behind:
            _wait_quarantine_seen(local, operator_file)
        staged.put_in()
    return RestoreReport(region, behind, bool(behind), operator_file)


def _compare_with_others(
    local: LocalRegion, staged_dsn: str, operator_file: Path
) -> dict[int, tuple[HeldPosition, ShardStatus]]:
    """``_quarantine_if_behind``, tried ``COMPARE_TRIES`` times (it may be run again: the
    quarantine record it writes is the same each time)."""
    for attempt in range(1, COMPARE_TRIES + 1):
        try:
            return asyncio.run(_quarantine_if_behind(local, staged_dsn, operator_file))
        except (ConvplaneError, TimeoutError, OSError) as exc:
            if attempt == COMPARE_TRIES:
                raise PlaneError(
                    f"the other regions' stores could not be compared with the backup "
                    f"({exc!r}); nothing was restored. Run it again when they answer (a "
                    f"quarantine it wrote stays until: convplane replica rebuild "
                    f"--cluster-file {operator_file} --region {local.name})"
                ) from exc
            time.sleep(COMPARE_RETRY_PAUSE_S)
    raise AssertionError("unreachable")


async def _quarantine_if_behind(
    local: LocalRegion, staged_dsn: str, operator_file: Path
) -> dict[int, tuple[HeldPosition, ShardStatus]]:
    """The shards where the backup ends below what the other stores keep for the region; when
    there are any, the region quarantined in every other store's registry."""
    from eventlog.recovery import highest_positions, known_positions
    from eventlog.stores import open_replica_store
    from services.bootstrap.operator import open_operator_stores

    shards = range(local.saved.shard_count + 1)  # the control shard too
    copy = await open_replica_store(staged_dsn, local.name)
    try:
        statuses = {shard: await copy.status(shard) for shard in shards}
    finally:
        await copy.close()
    async with open_operator_stores(operator_file) as opened:
        others = {r: s for r, s in opened.stores.items() if r != local.name}
        behind = {}
        for shard in shards:
            kept = await known_positions(shard, others, list(others), STORE_CALL_TIMEOUT_S)
            held = highest_positions(kept, about_others_only=True).get(local.name)
            if held is not None and not holds(statuses[shard], held):
                behind[shard] = (held, statuses[shard])
        if behind:
            await _record_rolled_back(others, local.name)
    return behind


async def _record_rolled_back(others: Mapping[str, ReplicaStore], region: str) -> None:
    """The record a leader writes for a rolled-back replica (``IdentityGuard.rolled_back``), at
    a generation above every record the other stores hold for ``region``."""
    registries = [
        await asyncio.wait_for(store.registry(), STORE_CALL_TIMEOUT_S) for store in others.values()
    ]
    records = [registry.get(region) for registry in registries]
    best = max((r for r in records if r is not None), key=lambda r: r.generation, default=None)
    if best is None:
        raise PlaneError(f"no other store knows {region}'s replica: nothing vouches for it")
    record = best  # a quarantine already recorded (by an earlier try): spread as it is
    if not best.store_id.startswith(ROLLED_BACK_PREFIX):
        record = IdentityRecord(ROLLED_BACK_PREFIX + best.store_id, best.generation + 1)
    for store in others.values():
        await asyncio.wait_for(store.record_identity(region, record), STORE_CALL_TIMEOUT_S)


def _wait_quarantine_seen(local: LocalRegion, operator_file: Path) -> None:
    """Until every running node's sweep holds the region quarantined (``GET /v1/regions``)."""
    headers = {"Authorization": f"Bearer {local.saved.viewer_api_key}"}
    urls = [
        r["url"]
        for r in local.info["regions"]
        if isinstance(r.get("node_pid"), int) and pid_alive(r["node_pid"])
    ]
    deadline_s = time.monotonic() + QUARANTINE_SEEN_WAIT_S
    with httpx.Client(headers=headers, timeout=2.0, trust_env=False) as client:
        for url in urls:
            while not _sees_quarantined(client, url, local.name):
                if time.monotonic() > deadline_s:
                    raise PlaneError(
                        f"the node at {url} does not hold {local.name} quarantined after "
                        f"{QUARANTINE_SEEN_WAIT_S:g}s; nothing was restored (the quarantine "
                        f"stays until: convplane replica rebuild --cluster-file "
                        f"{operator_file} --region {local.name})"
                    )
                time.sleep(QUARANTINE_POLL_S)


def _sees_quarantined(client: httpx.Client, url: str, region: str) -> bool:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        reply = client.get(url + "/v1/regions")
        if reply.status_code == 200:
            regions = reply.json()["regions"]
            return any(r["name"] == region and r["replica"] == "quarantined" for r in regions)
    return False


class SqliteReplica:
    """A region's replica that is a SQLite file in its directory."""

    name = "sqlite"
    copy_name = REPLICA_FILE_NAME

    def back_up(self, local: LocalRegion, copy: Path) -> tuple[str, str]:
        if not local.replica.is_file():
            raise PlaneError(f"{local.replica} is missing: {local.name} has no replica to back up")
        _private_new_file(copy)
        _sqlite_copy(local.replica, copy)
        return (
            _sqlite_value(copy, "SELECT store_id FROM replica_identity"),
            _sqlite_value(copy, "SELECT version_num FROM alembic_version"),
        )

    @contextlib.contextmanager
    def staged(self, local: LocalRegion, copy: Path) -> Iterator[StagedSqlite]:
        staged = StagedSqlite(local.replica.with_name(REPLICA_FILE_NAME + ".restoring"), local)
        staged.path.unlink(missing_ok=True)
        _private_new_file(staged.path)
        try:
            _sqlite_copy(copy, staged.path)
            yield staged
        finally:
            staged.path.unlink(missing_ok=True)

    def operator_cluster_file(self, local: LocalRegion) -> Path:
        return local.cluster_file  # every DSN is a path on this machine


@dataclass(frozen=True, slots=True)
class StagedSqlite:
    path: Path
    local: LocalRegion

    @contextlib.contextmanager
    def reading(self) -> Iterator[str]:
        yield f"sqlite+aiosqlite:///{self.path}"

    def put_in(self) -> None:
        _private_new_file(self.local.replica)
        _sqlite_copy(self.path, self.local.replica)  # in place: the same file, the same identity


COPY_NAMES = {SqliteReplica.name: SqliteReplica.copy_name,
              PostgresReplica.name: PostgresReplica.copy_name}  # fmt: skip
BACKEND_WORDS = {SqliteReplica.name: "SQLite", PostgresReplica.name: "PostgreSQL"}


def _sqlite_copy(source: Path, target: Path) -> None:
    """``source``'s content into ``target`` through SQLite's online backup: a consistent copy
    while others write ``source``, written into ``target`` under its lock while others have it
    open."""
    with contextlib.closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True)) as src:
        with contextlib.closing(sqlite3.connect(target, timeout=STORE_CALL_TIMEOUT_S)) as dst:
            src.backup(dst)


def _sqlite_value(path: Path, query: str) -> str:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        row = conn.execute(query).fetchone()
    if row is None:
        raise PlaneError(f"{path} is not a replica ({query} found nothing)")
    return str(row[0])


def _installed_version() -> str:
    from importlib.metadata import version

    return version("convplane")


def _private_new_file(path: Path) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
