"""The PostgreSQL side of ``convplane backup`` and ``convplane restore`` (``services.local.backup``
holds what both backends share).

A backup is a physical copy of the region's whole cluster, ``pgdata``, made by ``pg_basebackup``
(``-X stream``: the write-ahead log written while it copies comes with it, so the copy is
consistent although the plane keeps writing). It connects as the ``postgres`` superuser over the
server's local socket, so it needs no TCP, no TLS and no replication entry for the machine's
address. A physical copy, not ``pg_dump``: the restore must put back exactly what a volume
restore would, the same store identity included (the gap the restore exists to close).

A restore stages the copy beside the region's data directory, starts a throwaway server on it (on
a free port: the plane's nodes never reach it) for ``pg_basebackup``'s recovery and for the
comparison with the other stores, stops it, and only then stops the region's own server and puts
the staged directory in the place of its data directory. The region's server stays stopped:
``convplane restart-region`` starts it with the node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

from services.config import load_cluster, write_cluster
from services.local.backup_region import LocalRegion
from services.local.host import free_port
from services.local.plane import PlaneError
from services.local.plane_processes import stop_pids
from services.local.postgres import (
    DATABASE,
    PgHarnessError,
    PgInstance,
    give_tree_to_postgres,
    saved_instance,
)

COPY_NAME = "pgdata"
OPERATOR_CLUSTER_FILE = "operator-cluster.json"
#: how long ``pg_basebackup`` may copy a region's cluster
BASE_BACKUP_TIMEOUT_S = 600.0


class PostgresReplica:
    """A region's replica that is its own local PostgreSQL cluster."""

    name = "postgres"
    copy_name = COPY_NAME

    def back_up(self, local: LocalRegion, copy: Path) -> tuple[str, str]:
        server = _server(local)
        try:
            server.run_client(
                "pg_basebackup", "-D", str(copy), "-X", "stream", "-c", "fast",
                timeout_s=BASE_BACKUP_TIMEOUT_S,
            )  # fmt: skip
            return (
                _value(server, "SELECT store_id FROM replica_identity"),
                _value(server, "SELECT version_num FROM alembic_version"),
            )
        except PgHarnessError as exc:
            raise PlaneError(f"{local.name}'s PostgreSQL could not be copied: {exc}") from exc

    def operator_cluster_file(self, local: LocalRegion) -> Path:
        return write_operator_cluster(local)

    @contextlib.contextmanager
    def staged(self, local: LocalRegion, copy: Path) -> Iterator[StagedCluster]:
        live = _server(local)
        staged = StagedCluster(live, live.data_dir.with_name(live.data_dir.name + ".restoring"))
        staged.discard()  # a restore that was cut short
        try:
            shutil.copytree(copy, staged.data_dir, symlinks=True)
            give_tree_to_postgres(staged.data_dir)
            yield staged
        finally:
            staged.discard()


class StagedCluster:
    """A backup's cluster beside the region's data directory, not yet in its place."""

    def __init__(self, live: PgInstance, data_dir: Path) -> None:
        self.live = live
        self.data_dir = data_dir

    @contextlib.contextmanager
    def reading(self) -> Iterator[str]:
        """A DSN of the staged cluster, served by a throwaway server on a free port."""
        server = PgInstance(
            name=self.data_dir.name,
            port=free_port(),
            data_dir=self.data_dir,
            bindir=self.live.bindir,
            password=self.live.password,
        )
        try:
            server.start()
        except PgHarnessError as exc:
            raise PlaneError(f"the backup's cluster does not start: {exc}") from exc
        try:
            yield server.socket_dsn
        finally:
            server.stop("fast")

    def put_in(self) -> None:
        """Stop the region's server, and the staged cluster in the place of its data directory
        (the old one removed)."""
        target = self.live.data_dir
        _stop_server(target)
        replaced = target.with_name(target.name + ".replaced")
        shutil.rmtree(replaced, ignore_errors=True)
        target.rename(replaced)
        self.data_dir.rename(target)
        shutil.rmtree(replaced)

    def discard(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)
        shutil.rmtree(self.data_dir.with_name(self.data_dir.name + ".sock"), ignore_errors=True)
        self.data_dir.with_name(self.data_dir.name + ".log").unlink(missing_ok=True)


def write_operator_cluster(local: LocalRegion) -> Path:
    """The plane's cluster file with every region's database as its owner over its local socket,
    password included (``<state-dir>/operator-cluster.json``, 0600 like ``plane-state.json``,
    which holds the same passwords): what the operator commands (``convplane replica rebuild``)
    open, where the nodes' cluster file names each database without a password."""
    cluster = load_cluster(local.cluster_file)
    databases = {r.name: r.database for r in local.saved.regions}
    regions = []
    for region in cluster.regions:
        database = databases[region.name]
        assert database is not None
        dsn = saved_instance(database, local.state_dir / "postgres").socket_dsn
        regions.append(region.model_copy(update={"dsn": dsn, "dsn_from": {}}))
    path = local.state_dir / OPERATOR_CLUSTER_FILE
    write_cluster(path, cluster.model_copy(update={"regions": regions}))
    return path


def pg_version(data_dir: Path) -> str:
    """The major version of the cluster in ``data_dir`` (its ``PG_VERSION``)."""
    try:
        return (data_dir / "PG_VERSION").read_text().strip()
    except OSError as exc:
        raise PlaneError(f"{data_dir} holds no PostgreSQL cluster ({exc})") from exc


def _server(local: LocalRegion) -> PgInstance:
    assert local.database is not None
    try:
        return saved_instance(local.database, local.state_dir / "postgres", host=local.saved.host)
    except PgHarnessError as exc:
        raise PlaneError(str(exc)) from exc


def _value(server: PgInstance, query: str) -> str:
    return server.run_client("psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", DATABASE,
                             "-c", query)  # fmt: skip


def _stop_server(data_dir: Path) -> None:
    """The server on ``data_dir``, if one runs, shut down (fast: SIGINT; SIGKILL after
    ``STOP_TIMEOUT_S``, harmless: its data directory is about to be replaced)."""
    with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if os.fsencode(data_dir) in command:  # not a stale file's pid, reused since
            stop_pids({pid: signal.SIGINT})
