"""PostgreSQL for the test sessions and the benchmarks, on top of ``services.local.postgres``.

``pg_instances_for_tests`` picks what a test session uses: the DSNs in ``CONVPLANE_TEST_PG_DSNS``
(comma separated) when set; else the binaries under /usr/lib/postgresql/*/bin (highest version);
else testcontainers' ``PostgresContainer`` when a Docker daemon exists; else ``PgHarnessError``.
It never skips. ``start_sync_replication_cluster`` builds the peer a user would pick instead of
convplane: a primary with streaming standbys and ``synchronous_standby_names = 'ANY 1 (...)'``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from services.local.host import free_port
from services.local.postgres import (
    DATABASE,
    READY_TIMEOUT_S,
    PgHarnessError,
    PgInstance,
    _give_to_postgres,
    _init_instance,
    _prepare_base_dir,
    _remember,
    _run_as_postgres,
    find_bindir,
    start_instances,
)
from tests.harness.docker import docker_available

TEST_DSNS_ENV = "CONVPLANE_TEST_PG_DSNS"


def pg_instances_for_tests(
    n: int, base_dir: Path | str, *, tls_dir: Path | None = None
) -> list[PgInstance]:
    """The servers a test session uses (see the module docstring); never skips. With
    ``tls_dir``, servers this harness starts serve TCP over TLS only, as ``convplane up``'s do,
    under a CA made there (``tls_dir/ca.pem``: the clients' ``PGSSLROOTCERT``), and their DSNs
    ask for ``ssl=verify-full``."""
    if configured := os.environ.get(TEST_DSNS_ENV):
        dsns = [d.strip() for d in configured.split(",") if d.strip()]
        if len(dsns) < n:
            raise PgHarnessError(f"{TEST_DSNS_ENV} names {len(dsns)} servers, tests need {n}")
        return [_external(f"env{i}", dsn) for i, dsn in enumerate(dsns[:n])]
    if find_bindir() is not None:
        server_tls = None
        if tls_dir is not None:
            from services.cluster_tls import issue_certificate, issue_cluster_tls

            issue_cluster_tls(tls_dir, [], [])
            issued = issue_certificate(tls_dir, "database", ["127.0.0.1", "localhost"])
            server_tls = (issued.cert_file, issued.key_file)
        return start_instances(n, base_dir, server_tls=server_tls)
    if docker_available():
        return [_container_instance(f"container{i}") for i in range(n)]
    raise PgHarnessError(
        "tests need PostgreSQL: install the server binaries (/usr/lib/postgresql/*/bin), run a "
        f"Docker daemon, or set {TEST_DSNS_ENV}=postgresql+asyncpg://...,..."
    )


@dataclass
class SyncReplicationCluster:
    """PostgreSQL's own quorum replication: a commit waits for ANY 1 of the standbys."""

    primary: PgInstance
    standbys: list[PgInstance]

    @property
    def dsn(self) -> str:
        return self.primary.dsn

    def stop(self) -> None:
        for server in [self.primary, *self.standbys]:
            server.stop("fast")


#: where a server of the cluster runs: given one made on this machine's loopback, the one to
#: start (``tests.harness.lab_plane``: the same data directory, on a lab host's address)
Placement = Callable[[PgInstance], PgInstance]


def start_sync_replication_cluster(
    base_dir: Path | str,
    standbys: int = 2,
    *,
    bindir: Path | None = None,
    place: Placement | None = None,
) -> SyncReplicationCluster:
    """A primary plus ``standbys`` streaming standbys (pg_basebackup -R), application names
    s1..sN, ``synchronous_standby_names = 'ANY 1 (s1, ..., sN)'``, synchronous_commit on;
    each server where ``place`` puts it (default: this machine's loopback)."""
    bindir = bindir or find_bindir()
    if bindir is None:
        raise PgHarnessError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin")
    place = place or (lambda instance: instance)
    base = _prepare_base_dir(Path(base_dir))
    primary = place(_init_instance("primary", base, bindir))
    started = [primary]
    try:
        primary.start()
        primary.psql(f"CREATE DATABASE {DATABASE}")  # before sync names: nothing to wait for
        names = [f"s{i}" for i in range(1, standbys + 1)]
        for name in names:
            standby = place(_clone_standby(primary, name, base, bindir))
            started.append(standby)
            standby.start()
        primary.psql(f"ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 ({', '.join(names)})'")
        primary.psql("SELECT pg_reload_conf()")
        _wait_for_quorum_standbys(primary, len(names))
    except BaseException:
        for server in started:
            if server.running:
                server.stop("immediate")
        raise
    return SyncReplicationCluster(primary, started[1:])


def _clone_standby(primary: PgInstance, name: str, base: Path, bindir: Path) -> PgInstance:
    data_dir = base / name
    data_dir.mkdir(mode=0o700)
    _give_to_postgres(data_dir)
    conninfo = (
        f"host={primary.host} port={primary.port} user=postgres password={primary.password} "
        f"application_name={name}"
    )
    _run_as_postgres(
        [str(bindir / "pg_basebackup"), "-D", str(data_dir), "-d", conninfo, "-R",
         "-X", "stream", "-c", "fast", "--no-sync"],
        what=f"pg_basebackup {name}",
    )  # fmt: skip
    with (data_dir / "postgresql.auto.conf").open("a") as conf:
        conf.write(f"primary_conninfo = '{conninfo}'\n")
    return PgInstance(
        name=name, port=free_port(), data_dir=data_dir, bindir=bindir, password=primary.password
    )


def _wait_for_quorum_standbys(primary: PgInstance, count: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    query = "SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('quorum', 'sync')"
    while time.monotonic() < deadline:
        if int(primary.psql(query)) >= count:
            return
        time.sleep(0.1)
    raise PgHarnessError(f"standbys did not reach quorum state: {primary._log_tail()}")


def dsn_via(dsn: str, host: str, port: int) -> str:
    """``dsn`` pointed at ``host:port`` (a proxy), with its user and password kept."""
    parts = urlsplit(dsn)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return parts._replace(netloc=netloc).geturl()


def _external(name: str, dsn: str) -> PgInstance:
    parts = urlsplit(dsn)
    return PgInstance(
        name=name,
        port=parts.port or 5432,
        data_dir=Path("/nonexistent"),
        host=parts.hostname or "127.0.0.1",
        database=parts.path.lstrip("/") or DATABASE,
        external_dsn=dsn,
    )


def _container_instance(name: str) -> PgInstance:
    from testcontainers.postgres import PostgresContainer  # only when Docker is the way

    container = PostgresContainer("postgres:15", dbname=DATABASE, driver="asyncpg")
    container.start()
    dsn = container.get_connection_url()
    instance = _external(name, dsn)
    instance._container = container
    _remember(instance)
    return instance
