"""Real PostgreSQL servers as child processes, for tests, benchmarks and local stacks.

``start_instances(n, base_dir)`` creates ``n`` independent clusters (``initdb`` as the
``postgres`` user when we run as root, fsync and synchronous_commit on, small shared_buffers,
a free 127.0.0.1 port each), starts each ``postgres`` binary as our own child (so its pid is the
postmaster's, for kill -9 tests), waits until it accepts connections and creates the database
``convplane``. ``start_sync_replication_cluster`` builds the peer a user would pick instead of
convplane: a primary with streaming standbys and ``synchronous_standby_names = 'ANY 1 (...)'``.

``pg_instances_for_tests`` picks what a test session uses: the DSNs in ``CONVPLANE_TEST_PG_DSNS``
(comma separated) when set; else the binaries under /usr/lib/postgresql/*/bin (highest version);
else testcontainers' ``PostgresContainer`` when a Docker daemon exists; else ``PgHarnessError``.
It never skips. Every server started here is stopped at interpreter exit at the latest.

Nothing here runs at import time.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from eventlog.errors import ConvplaneError

TEST_DSNS_ENV = "CONVPLANE_TEST_PG_DSNS"
BINDIR_ENV = "CONVPLANE_PG_BINDIR"
DATABASE = "convplane"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
_POSTGRES_USER = "postgres"

_SERVER_CONF = """
# convplane test harness: durable like production, small like a laptop
fsync = on
synchronous_commit = on
full_page_writes = on
shared_buffers = 32MB
max_connections = 100
wal_level = replica
max_wal_senders = 10
hot_standby = on
logging_collector = off
log_min_messages = warning
"""

_running: dict[int, PgInstance] = {}  # id(instance) -> instance; stopped at exit
_atexit_registered = False


class PgHarnessError(ConvplaneError):
    code = "pg_harness"


StopMode = Literal["smart", "fast", "immediate"]
_STOP_SIGNALS: dict[str, signal.Signals] = {
    "smart": signal.SIGTERM,
    "fast": signal.SIGINT,
    "immediate": signal.SIGQUIT,
}


@dataclass
class PgInstance:
    """One PostgreSQL server. Local ones can be stopped, killed and restarted; external ones
    (from ``CONVPLANE_TEST_PG_DSNS`` or a container) only give their ``dsn``."""

    name: str
    port: int
    data_dir: Path
    bindir: Path | None = None
    host: str = "127.0.0.1"
    database: str = DATABASE
    external_dsn: str | None = None
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _container: Any = field(default=None, repr=False)

    @property
    def dsn(self) -> str:
        if self.external_dsn is not None:
            return self.external_dsn
        return f"postgresql+asyncpg://postgres@{self.host}:{self.port}/{self.database}"

    def dsn_for(self, database: str) -> str:
        """The same server, another database."""
        parts = urlsplit(self.dsn)
        return parts._replace(path=f"/{database}").geturl()

    @property
    def pid(self) -> int:
        if self._process is None or self._process.poll() is not None:
            raise PgHarnessError(f"{self.name} is not running here (no postmaster pid)")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start (or restart) the server on the same port and data directory, and wait until it
        accepts connections. Retries while a killed predecessor's processes are still exiting."""
        self._require_local("start")
        if self.running:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            self._process = self._spawn()
            _remember(self)
            if self._wait_ready(deadline):
                return
            if time.monotonic() > deadline:
                self.kill()
                raise PgHarnessError(f"{self.name} did not start: {self._log_tail()}")
            time.sleep(0.2)  # the postmaster exited early (e.g. old shared memory): retry

    def stop(self, mode: StopMode = "fast") -> None:
        if self._container is not None:
            self._container.stop()
            self._container = None
            _forget(self)
            return
        self._require_local("stop")
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(_STOP_SIGNALS[mode])
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
        _forget(self)

    def kill(self) -> None:
        """SIGKILL the postmaster and its children at once, like a machine losing power (the
        kernel's page cache survives: what was fsynced, and only that, is durable anyway)."""
        self._require_local("kill")
        process = self._process
        if process is None or process.poll() is not None:
            return
        children = _children_of(process.pid)
        process.kill()
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        process.wait()
        _forget(self)

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run one SQL command through ``psql`` (harness chores, not the data path)."""
        self._require_local("psql")
        assert self.bindir is not None
        result = subprocess.run(
            [str(self.bindir / "psql"), "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
             "-h", self.host, "-p", str(self.port), "-U", "postgres", "-d", database, "-c", sql],
            capture_output=True, text=True, timeout=READY_TIMEOUT_S, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise PgHarnessError(f"{self.name}: psql {sql!r} failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def _require_local(self, what: str) -> None:
        if self.external_dsn is not None or self.bindir is None:
            raise PgHarnessError(
                f"{self.name} is an external server ({self.dsn}); it cannot {what} here. "
                f"Unset {TEST_DSNS_ENV} to let the harness start local servers."
            )

    def _spawn(self) -> subprocess.Popen[bytes]:
        assert self.bindir is not None
        socket_dir = self.data_dir.parent / f"{self.data_dir.name}.sock"
        socket_dir.mkdir(exist_ok=True)
        _give_to_postgres(socket_dir)
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                [str(self.bindir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                 "-k", str(socket_dir), "-c", f"listen_addresses={self.host}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=_server_env(), **_as_postgres(),
            )  # fmt: skip

    def _wait_ready(self, deadline: float) -> bool:
        assert self.bindir is not None and self._process is not None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            ready = subprocess.run(
                [str(self.bindir / "pg_isready"), "-q", "-h", self.host, "-p", str(self.port),
                 "-t", "1"],
                check=False, timeout=10,
            )  # fmt: skip
            if ready.returncode == 0:
                return True
            time.sleep(0.05)
        return False

    def _log_tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return "(no log)"


# --- starting servers ------------------------------------------------------------------------


def find_bindir() -> Path | None:
    """``CONVPLANE_PG_BINDIR``, else the highest /usr/lib/postgresql/<version>/bin."""
    if configured := os.environ.get(BINDIR_ENV):
        return Path(configured)
    candidates = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "postgres").exists()]
    candidates.sort(key=lambda p: _version_key(p.parent.name))
    return candidates[-1] if candidates else None


def start_instances(
    n: int, base_dir: Path | str, *, bindir: Path | None = None
) -> list[PgInstance]:
    """Create and start ``n`` independent local clusters under ``base_dir``."""
    bindir = bindir or find_bindir()
    if bindir is None:
        raise PgHarnessError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin")
    base = _prepare_base_dir(Path(base_dir))
    instances: list[PgInstance] = []
    try:
        for index in range(n):
            instance = _init_instance(f"pg{index}", base, bindir)
            instance.start()
            instance.psql(f"CREATE DATABASE {DATABASE}")
            instances.append(instance)
    except BaseException:
        for instance in instances:
            instance.stop("immediate")
        raise
    return instances


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


def start_sync_replication_cluster(
    base_dir: Path | str, standbys: int = 2, *, bindir: Path | None = None
) -> SyncReplicationCluster:
    """A primary plus ``standbys`` streaming standbys (pg_basebackup -R), application names
    s1..sN, ``synchronous_standby_names = 'ANY 1 (s1, ..., sN)'``, synchronous_commit on."""
    bindir = bindir or find_bindir()
    if bindir is None:
        raise PgHarnessError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin")
    base = _prepare_base_dir(Path(base_dir))
    primary = _init_instance("primary", base, bindir)
    started = [primary]
    try:
        primary.start()
        primary.psql(f"CREATE DATABASE {DATABASE}")  # before sync names: nothing to wait for
        names = [f"s{i}" for i in range(1, standbys + 1)]
        for name in names:
            standby = _clone_standby(primary, name, base, bindir)
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


def pg_instances_for_tests(n: int, base_dir: Path | str) -> list[PgInstance]:
    """The servers a test session uses (see the module docstring); never skips."""
    if configured := os.environ.get(TEST_DSNS_ENV):
        dsns = [d.strip() for d in configured.split(",") if d.strip()]
        if len(dsns) < n:
            raise PgHarnessError(f"{TEST_DSNS_ENV} names {len(dsns)} servers, tests need {n}")
        return [_external(f"env{i}", dsn) for i, dsn in enumerate(dsns[:n])]
    if find_bindir() is not None:
        return start_instances(n, base_dir)
    if _docker_available():
        return [_container_instance(f"container{i}") for i in range(n)]
    raise PgHarnessError(
        "tests need PostgreSQL: install the server binaries (/usr/lib/postgresql/*/bin), run a "
        f"Docker daemon, or set {TEST_DSNS_ENV}=postgresql+asyncpg://...,..."
    )


def stop_all() -> None:
    """Stop every server this process started (also runs at interpreter exit)."""
    for instance in list(_running.values()):
        with contextlib.suppress(Exception):
            instance.stop("immediate")


# --- helpers ---------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _init_instance(name: str, base: Path, bindir: Path) -> PgInstance:
    data_dir = base / name
    data_dir.mkdir(mode=0o700)
    _give_to_postgres(data_dir)
    _run_as_postgres(
        [str(bindir / "initdb"), "-D", str(data_dir), "-U", "postgres", "--auth=trust",
         "--no-locale", "--encoding=UTF8", "--no-sync"],
        what=f"initdb {name}",
    )  # fmt: skip
    with (data_dir / "postgresql.conf").open("a") as conf:
        conf.write(_SERVER_CONF)
    return PgInstance(name=name, port=free_port(), data_dir=data_dir, bindir=bindir)


def _clone_standby(primary: PgInstance, name: str, base: Path, bindir: Path) -> PgInstance:
    data_dir = base / name
    data_dir.mkdir(mode=0o700)
    _give_to_postgres(data_dir)
    conninfo = f"host={primary.host} port={primary.port} user=postgres application_name={name}"
    _run_as_postgres(
        [str(bindir / "pg_basebackup"), "-D", str(data_dir), "-d", conninfo, "-R",
         "-X", "stream", "-c", "fast", "--no-sync"],
        what=f"pg_basebackup {name}",
    )  # fmt: skip
    with (data_dir / "postgresql.auto.conf").open("a") as conf:
        conf.write(f"primary_conninfo = '{conninfo}'\n")
    return PgInstance(name=name, port=free_port(), data_dir=data_dir, bindir=bindir)


def _wait_for_quorum_standbys(primary: PgInstance, count: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    query = "SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('quorum', 'sync')"
    while time.monotonic() < deadline:
        if int(primary.psql(query)) >= count:
            return
        time.sleep(0.1)
    raise PgHarnessError(f"standbys did not reach quorum state: {primary._log_tail()}")


def _prepare_base_dir(base: Path) -> Path:
    """The postgres user must reach its directories: refuse ancestors it cannot traverse."""
    base.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return base
    postgres_uid = pwd.getpwnam(_POSTGRES_USER).pw_uid
    for directory in [base, *base.resolve().parents]:
        info = directory.stat()
        if not (info.st_mode & 0o001) and info.st_uid != postgres_uid:
            raise PgHarnessError(
                f"the postgres user cannot traverse {directory} (mode {oct(info.st_mode)}); "
                "put base_dir under a world-traversable directory such as /tmp"
            )
    return base


def _give_to_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, user=_POSTGRES_USER, group=_POSTGRES_USER)


def _as_postgres() -> dict[str, Any]:
    """PostgreSQL refuses to run as root: drop to the postgres user in the child."""
    if os.geteuid() != 0:
        return {}
    return {"user": _POSTGRES_USER, "group": _POSTGRES_USER, "extra_groups": []}


def _server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _run_as_postgres(args: list[str], *, what: str) -> None:
    result = subprocess.run(
        args, capture_output=True, text=True, env=_server_env(), timeout=120, check=False,
        cwd="/", **_as_postgres(),
    )  # fmt: skip
    if result.returncode != 0:
        raise PgHarnessError(f"{what} failed: {result.stderr.strip()[-2000:]}")


def _children_of(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                children.append(int(stat.parent.name))
    return children


def _version_key(name: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in name.split("."))
    except ValueError:
        return (0,)


def _remember(instance: PgInstance) -> None:
    global _atexit_registered
    _running[id(instance)] = instance
    if not _atexit_registered:
        atexit.register(stop_all)
        _atexit_registered = True


def _forget(instance: PgInstance) -> None:
    _running.pop(id(instance), None)


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


def _docker_available() -> bool:
    return Path("/var/run/docker.sock").exists() or bool(os.environ.get("DOCKER_HOST"))


def _container_instance(name: str) -> PgInstance:
    from testcontainers.postgres import PostgresContainer  # only when Docker is the way

    container = PostgresContainer("postgres:15", dbname=DATABASE, driver="asyncpg")
    container.start()
    dsn = container.get_connection_url()
    instance = _external(name, dsn)
    instance._container = container
    _remember(instance)
    return instance
