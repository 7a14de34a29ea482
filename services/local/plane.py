"""A whole plane on one machine: per region a database and a ``convplane node`` process.

Each region's node is its own child process (its own session), so a test or an SRE drill can
kill one region alone. Databases are SQLite files (default) or local PostgreSQL instances
(``services.local.postgres``, each its own process). ``LocalPlane.start`` writes the cluster file the
nodes read and ``<state-dir>/cluster.json`` describing the running plane (URLs, DSNs with their
passwords, pids and the tenants' API keys, in clear: it is a local development plane).

A plane outlives its processes: ``start`` on a state directory that holds one
(``<state-dir>/plane-state.json``, ``services.local.plane_state``) resumes it on its data, with
the same keys, ports, certificates and databases, and refuses arguments that would make it
another plane. ``restart_region`` brings one region's database and node back on their data.

With ``tls`` (the default) it makes a CA for the plane and a certificate per node
(``<state-dir>/tls``): the nodes' peer listeners speak mutual TLS only. Both files and the SQLite
replicas are written 0600, the state directory and each region's directory 0700 (0711 for the
state directory with ``--postgres``: the ``postgres`` user must traverse it to its data). Two
tenants: ``demo`` (a large quota) and ``demo-limited`` (a small one, to see 429s), an operator
key (``sre``, ``operator_api_key``) for drills, and a viewer key (``sre-viewer``,
``viewer_api_key``). The cluster file gets a fresh ``peer_secret`` each start (only forwards
carrying it are trusted not to charge twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from regions.placement import place_shards
from services.cluster_tls import NodeTls, issue_certificate, issue_cluster_tls
from services.config import (
    ClusterConfig,
    NodeAddress,
    RegionConfig,
    TenantConfig,
    api_key_sha256,
    write_cluster,
)
from services.deploy.db_roles import asyncpg_dsn, node_role, restrict_to_protocol
from services.local.attached_engines import AttachedEngines
from services.local.host import HarnessError, convplane_command, free_port
from services.local.plane_processes import running_processes
from services.local.plane_state import (
    STATE_FILE_NAME,
    PlaneState,
    RequestedPlane,
    SavedDatabase,
    SavedEngines,
    SavedRegion,
    conflicts,
    load_state,
    state_json,
)
from services.replay.config import ReplayConfig

#: one region could never lead a shard: its own store cannot vouch for itself (a wiped store
#: must not vote), and no other region's store is there to
MIN_REGIONS = 2
REGION_NAMES = ("us-east", "eu-west", "ap-south", "us-west", "eu-north", "ap-east", "sa-east")
DEMO_TENANT = "demo"
LIMITED_TENANT = "demo-limited"
OPERATOR_TENANT = "sre"  # the operator key: drills, evacuate/restore, halt
VIEWER_TENANT = (
    "sre-viewer"  # the viewer key: sees regions, drills, reports, audit; changes nothing
)
LIMITED_REQUESTS_PER_S = 10.0
LIMITED_BURST = 20
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
HEALTH_POLL_S = 0.1
#: the most node processes a region may run (``--nodes-per-region``; the cluster file's
#: ``more_nodes`` allows one more than its own limit)
NODES_PER_REGION_MAX = 8
#: a region's peer listener (services.listeners) is at its client port + this (with --base-port)
PEER_PORT_OFFSET = 100


class PlaneError(HarnessError):
    """The plane could not be started (a port in use, a node that exited, a timeout)."""


class DbHandle(Protocol):
    """What ``services.local.postgres`` hands back per instance."""

    @property
    def dsn(self) -> str: ...

    @property
    def pid(self) -> int: ...

    def stop(self, mode: Any = ...) -> Any: ...

    def start(self) -> Any: ...

    def keep_running(self) -> Any: ...


@dataclass
class FurtherNode:
    """A region's node beyond its first (``RegionConfig.more_nodes``): it stands by on the
    region's database and leads the region once it holds the region's lease. Its ports are
    chosen at every start (the cluster file says them): nothing of it is saved."""

    index: int
    port: int
    url: str
    peer_port: int
    peer_url: str
    log_path: Path
    node: subprocess.Popen[bytes] | None = None
    exit_reported: bool = False


@dataclass
class RegionProcess:
    name: str
    port: int
    url: str
    peer_port: int
    peer_url: str
    dsn: str
    path: str | None  # the SQLite file, when SQLite
    log_path: Path
    tls: NodeTls | None = None  # the node's certificate under the plane's CA
    #: the node's own database role's password (services.deploy.db_roles), in its pgpass file only
    db_password: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)
    db: DbHandle | None = None
    database: SavedDatabase | None = None  # how to start its PostgreSQL again, when PostgreSQL
    node: subprocess.Popen[bytes] | None = None
    exit_reported: bool = False
    more_nodes: list[FurtherNode] = field(default_factory=list)

    def processes(self) -> list[subprocess.Popen[bytes]]:
        """The region's node processes that were started, its first node's first."""
        nodes = [self.node, *(n.node for n in self.more_nodes)]
        return [n for n in nodes if n is not None]


@dataclass
class LocalPlane:
    regions: int = 3
    state_dir: Path = Path(".state/plane")
    base_port: int = 8700  # 0: any free ports
    postgres: bool = False
    host: str = "127.0.0.1"
    shard_count: int = 64
    ready_timeout_s: float = READY_TIMEOUT_S
    api_key: str = field(default_factory=lambda: "cp_" + secrets.token_urlsafe(24))
    limited_api_key: str = field(default_factory=lambda: "cp_" + secrets.token_urlsafe(24))
    operator_api_key: str = field(default_factory=lambda: "cp_" + secrets.token_urlsafe(24))
    viewer_api_key: str = field(default_factory=lambda: "cp_" + secrets.token_urlsafe(24))
    members: list[RegionProcess] = field(default_factory=list)
    sim_engines: int = 0  # simulated inference engines per region (services.local.engines)
    #: mutual TLS between the nodes under a CA generated for this plane (services.cluster_tls)
    tls: bool = True
    engines: Any = None  # SimEngines, when sim_engines > 0
    #: real engines (``convplane up --engine``), already checked (services.local.attached_engines)
    attached: AttachedEngines | None = None
    #: this process stays and supervises the plane (``up`` without ``--detach``): it carries
    #: out kill drills (``kill_region`` / ``restart_region``)
    supervised: bool = False
    #: the demo tenant's quota at each node (a load benchmark raises it: bench/rest.py)
    demo_requests_per_s: float = 1000.0
    #: node processes per region: one leads the region, the others stand by to take over
    #: (``services.control.region_nodes``)
    nodes_per_region: int = 1

    @property
    def cluster_file(self) -> Path:
        return self.state_dir / "cluster-config.json"

    @property
    def info_file(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE_NAME

    def start(self) -> dict[str, Any]:
        """Start databases and nodes, wait until every node is healthy; return the plane info."""
        if not MIN_REGIONS <= self.regions <= len(REGION_NAMES):
            raise PlaneError(
                f"--regions must be {MIN_REGIONS}..{len(REGION_NAMES)}: a region's replica votes "
                "only once another region's store vouches for its identity "
                "(eventlog/identity.py), so a lone region could never elect a leader"
            )
        if self.sim_engines > 0 and self.attached is not None:
            raise PlaneError("--sim-engines and --engine: a plane takes one or the other")
        if not 1 <= self.nodes_per_region <= NODES_PER_REGION_MAX:
            raise PlaneError(f"--nodes-per-region must be 1..{NODES_PER_REGION_MAX}")
        self.state_dir = self.state_dir.resolve()
        saved = self._saved_plane()  # before anything in the directory changes
        if saved is None and self.postgres and (self.state_dir / "postgres").exists():
            raise PlaneError(
                f"{self.state_dir} holds databases but no {STATE_FILE_NAME} (a first start "
                "that failed, or an older version's plane): remove the directory, or give "
                "another --state-dir"
            )
        _private_dir(self.state_dir, 0o711 if self.postgres else 0o700)
        try:
            self._prepare_members(saved)
            self._start_databases(saved)
            if self.sim_engines > 0:
                from services.local.engines import SimEngines

                self.engines = SimEngines(self.sim_engines, self.state_dir, self.host)
                self.engines.start([m.name for m in self.members])
            write_cluster(self.cluster_file, self.cluster_config())
            with _database_ca(self._database_ca_file()):
                asyncio.run(_migrate_all([m.dsn for m in self.members]))
            if self.postgres:
                asyncio.run(self._restrict_databases())
            if saved is None:
                write_private_json(self.state_file, state_json(self._state()))
            elif saved.engines != (engines := self._saved_engines()):
                resumed = dataclasses.replace(saved, engines=engines)
                write_private_json(self.state_file, state_json(resumed))
            for member in self.members:
                member.node = self.spawn_node(member)
                for further in member.more_nodes:
                    further.node = self.spawn_further_node(member, further)
            self.wait_healthy()
            if self.attached is not None:
                self.attached.start_workers({m.name: m.url for m in self.members})
        except BaseException:
            self.stop()
            raise
        info = self.info()
        write_private_json(self.info_file, info)
        return info

    def check_resumable(self) -> None:
        """PlaneError when the state directory holds another plane, or this one running: what
        ``start`` would refuse, said before anything else (``up`` probes engines after it)."""
        self.state_dir = self.state_dir.resolve()
        self._saved_plane()

    def _saved_plane(self) -> PlaneState | None:
        """The plane saved in the state directory, its keys adopted; PlaneError when the
        arguments would make it another plane or it is running now."""
        try:
            saved = load_state(self.state_file)
        except ValueError as exc:
            raise PlaneError(str(exc)) from exc
        if saved is None:
            return None
        requested = RequestedPlane(
            self.regions, self.postgres, self.tls, self.shard_count, self.host, self.base_port
        )
        if found := conflicts(saved, requested):
            raise PlaneError(
                f"{self.state_dir} holds another plane ({'; '.join(found)}): start it with "
                "the arguments it was made with, or give another --state-dir"
            )
        if running := running_processes(self.info_file):
            raise PlaneError(
                f"the plane in {self.state_dir} is running ({', '.join(running)}): stop it "
                f"first (convplane down --state-dir {self.state_dir})"
            )
        self.api_key, self.limited_api_key = saved.api_key, saved.limited_api_key
        self.operator_api_key, self.viewer_api_key = saved.operator_api_key, saved.viewer_api_key
        return saved

    def _state(self) -> PlaneState:
        return PlaneState(
            postgres=self.postgres,
            tls=self.tls,
            shard_count=self.shard_count,
            host=self.host,
            api_key=self.api_key,
            limited_api_key=self.limited_api_key,
            operator_api_key=self.operator_api_key,
            viewer_api_key=self.viewer_api_key,
            regions=tuple(
                SavedRegion(m.name, m.port, m.peer_port, m.db_password, m.database)
                for m in self.members
            ),
            engines=self._saved_engines(),
        )

    def _saved_engines(self) -> SavedEngines | None:
        return self.attached.saved() if self.attached is not None else None

    def info(self) -> dict[str, Any]:
        return {
            "api_key": self.api_key,
            "tenant_id": DEMO_TENANT,
            "operator_api_key": self.operator_api_key,
            "viewer_api_key": self.viewer_api_key,
            "tenants": [
                {"tenant_id": DEMO_TENANT, "api_key": self.api_key},
                {"tenant_id": LIMITED_TENANT, "api_key": self.limited_api_key},
                {
                    "tenant_id": OPERATOR_TENANT,
                    "api_key": self.operator_api_key,
                    "role": "operator",
                },
                {"tenant_id": VIEWER_TENANT, "api_key": self.viewer_api_key, "role": "viewer"},
            ],
            **(self.engines.info() if self.engines is not None else {}),
            **(self.attached.info() if self.attached is not None else {}),
            "cluster_file": str(self.cluster_file),
            "state_file": str(self.state_file),
            "supervisor_pid": os.getpid(),
            "supervised": self.supervised,
            "regions": [
                {
                    "name": m.name,
                    "url": m.url,
                    "peer_url": m.peer_url,
                    "dsn": m.dsn,
                    "path": m.path,
                    "node_pid": m.node.pid if m.node else None,
                    "db_pid": m.db.pid if m.db else None,
                    "log": str(m.log_path),
                    "more_nodes": [
                        {
                            "index": n.index,
                            "url": n.url,
                            "peer_url": n.peer_url,
                            "node_pid": n.node.pid if n.node else None,
                            "log": str(n.log_path),
                        }
                        for n in m.more_nodes
                    ],
                }
                for m in self.members
            ],
        }

    def _prepare_members(self, saved: PlaneState | None, *, check_ports: bool = True) -> None:
        """The regions: new ports and certificates, or the saved plane's (checked free)."""
        names = REGION_NAMES[: self.regions]
        tls_dir = self.state_dir / "tls"
        if saved is None:
            ports = _choose_ports(self.host, self.base_port, self.regions)
            peer_base_port = self.base_port + PEER_PORT_OFFSET if self.base_port else 0
            peer_ports = _choose_ports(self.host, peer_base_port, self.regions)
            issued = issue_cluster_tls(tls_dir, names, [self.host, "localhost"]) if self.tls else {}
        else:
            ports = [r.port for r in saved.regions]
            peer_ports = [r.peer_port for r in saved.regions]
            if check_ports:
                _check_free(self.host, [*ports, *peer_ports])
            issued = {n: _issued_tls(tls_dir, n) for n in names} if self.tls else {}
        peer_scheme = "https" if self.tls else "http"
        for index, (name, port, peer_port) in enumerate(zip(names, ports, peer_ports, strict=True)):
            region_dir = self.state_dir / name
            _private_dir(region_dir, 0o700)
            db_path = region_dir / "replica.sqlite3"
            if not self.postgres:
                _private_file(db_path)  # SQLite gives its -wal and -shm files the same mode
            self.members.append(
                RegionProcess(
                    name=name,
                    port=port,
                    url=f"http://{self.host}:{port}",
                    peer_port=peer_port,
                    peer_url=f"{peer_scheme}://{self.host}:{peer_port}",
                    tls=issued.get(name),
                    dsn=f"sqlite+aiosqlite:///{db_path}",
                    path=None if self.postgres else str(db_path),
                    log_path=region_dir / "node.log",
                )
            )
            if saved is not None:
                self.members[-1].db_password = saved.regions[index].db_password
                self.members[-1].database = saved.regions[index].database
        self._prepare_more_nodes(peer_scheme)

    def _prepare_more_nodes(self, peer_scheme: str) -> None:
        """Each region's further nodes, on free ports (``FurtherNode``)."""
        per_region = self.nodes_per_region - 1
        if per_region < 1:
            return
        ports = iter(_choose_ports(self.host, 0, 2 * per_region * len(self.members)))
        for member in self.members:
            for index in range(1, self.nodes_per_region):
                port, peer_port = next(ports), next(ports)
                member.more_nodes.append(
                    FurtherNode(
                        index=index,
                        port=port,
                        url=f"http://{self.host}:{port}",
                        peer_port=peer_port,
                        peer_url=f"{peer_scheme}://{self.host}:{peer_port}",
                        log_path=member.log_path.with_name(f"node-{index}.log"),
                    )
                )

    def _start_databases(self, saved: PlaneState | None) -> None:
        if not self.postgres:
            return
        localpg: Any = importlib.import_module("services.local.postgres")
        if saved is not None:
            for member in self.members:
                self.start_saved_database(member)
            return
        server_tls = None
        if self.tls:  # node -> database over TLS, verify-full, under the plane's CA
            issued = issue_certificate(self.state_dir / "tls", "database", [self.host, "localhost"])
            server_tls = (issued.cert_file, issued.key_file)
        started: Any = localpg.start_instances(
            self.regions, self.state_dir / "postgres", server_tls=server_tls, host=self.host
        )
        instances = asyncio.run(_awaited(started)) if inspect.isawaitable(started) else started
        for member, instance in zip(self.members, instances, strict=True):
            member.db = instance
            member.dsn = instance.dsn
            member.database = SavedDatabase(
                instance.name, instance.port, instance.password, instance.tls
            )

    def start_saved_database(self, member: RegionProcess) -> None:
        """Start ``member``'s PostgreSQL again on its data directory and port."""
        from services.local.postgres import restart_instance

        assert member.database is not None
        instance = restart_instance(member.database, self.state_dir / "postgres", host=self.host)
        member.db = instance
        member.dsn = instance.dsn

    def cluster_config(self) -> ClusterConfig:
        """The cluster file the plane writes: a subclass routes traffic differently by
        overriding this (``tests.harness.chaos`` puts fault proxies between regions)."""
        return ClusterConfig(
            regions=[
                RegionConfig(
                    name=m.name,
                    url=m.url,
                    peer_url=m.peer_url,
                    more_nodes=[NodeAddress(url=n.url, peer_url=n.peer_url) for n in m.more_nodes],
                    # the owner's DSN without its password: every node has its own in dsn_from
                    dsn=without_password(m.dsn),
                    dsn_from={s.name: self.node_dsn(s, m) for s in self.members}
                    if self.postgres
                    else {},
                )
                for m in self.members
            ],
            shard_count=self.shard_count,
            replay=self._replay_config(),
            default_model_revision=self._default_model(),
            tenants=[
                TenantConfig(
                    tenant_id=DEMO_TENANT,
                    api_key_sha256=api_key_sha256(self.api_key),
                    requests_per_s=self.demo_requests_per_s,
                    burst=max(1, int(2 * self.demo_requests_per_s)),
                ),
                TenantConfig(
                    tenant_id=LIMITED_TENANT,
                    api_key_sha256=api_key_sha256(self.limited_api_key),
                    requests_per_s=LIMITED_REQUESTS_PER_S,
                    burst=LIMITED_BURST,
                ),
                TenantConfig(
                    tenant_id=OPERATOR_TENANT,
                    api_key_sha256=api_key_sha256(self.operator_api_key),
                    role="operator",
                ),
                TenantConfig(
                    tenant_id=VIEWER_TENANT,
                    api_key_sha256=api_key_sha256(self.viewer_api_key),
                    role="viewer",
                ),
            ],
            peer_secret=secrets.token_urlsafe(32),
            local_supervisor=self.supervised,
        )

    def _default_model(self) -> str:
        """A conversation created without a model revision gets the attached engines' one,
        when they all serve the same: replay then rebuilds it with no more said."""
        served = {e.model_revision for e in self.attached.engines} if self.attached else set()
        default: str = ClusterConfig.model_fields["default_model_revision"].default
        return served.pop() if len(served) == 1 else default

    def _replay_config(self) -> ReplayConfig:
        if self.attached is not None:
            return self.attached.replay_config()
        if self.engines is not None:
            config: ReplayConfig = self.engines.replay_config()
            return config
        return ReplayConfig()

    async def _restrict_databases(self) -> None:
        """Each node's role may run the protocol's functions and read, nothing else."""
        roles = {node_role(m.name): m.db_password for m in self.members}
        for member in self.members:
            owner = asyncpg_dsn(member.dsn, ca_file=self._database_ca_file())
            await restrict_to_protocol(owner, roles)
        for member in self.members:
            _write_private(
                member.log_path.parent / "pgpass",
                f"*:*:*:{node_role(member.name)}:{member.db_password}\n",
            )

    def owner_dsn(self, member: RegionProcess) -> str:
        """An asyncpg DSN of ``member``'s database as its owner, for audits and tools."""
        return asyncpg_dsn(member.dsn, ca_file=self._database_ca_file())

    def node_dsn(self, source: RegionProcess, target: RegionProcess) -> str:
        """The DSN the node of ``source`` uses for ``target``'s database: its own role, no
        password (that is in its pgpass file)."""
        if not self.postgres:
            return target.dsn
        parts = urlsplit(target.dsn)
        netloc = f"{node_role(source.name)}@{parts.hostname}:{parts.port}"
        return parts._replace(netloc=netloc).geturl()

    def _database_ca_file(self) -> Path | None:
        return self.state_dir / "tls" / "ca.pem" if self.tls and self.postgres else None

    def spawn_node(self, member: RegionProcess) -> subprocess.Popen[bytes]:
        return _spawn(self.node_command(member, self.host), self.node_env(member), member.log_path)

    def spawn_further_node(
        self, member: RegionProcess, further: FurtherNode
    ) -> subprocess.Popen[bytes]:
        """``further``, a node of ``member``'s region beyond its first (``FurtherNode``)."""
        command = self.further_node_command(member, further, self.host)
        return _spawn(command, self.node_env(member), further.log_path)

    def further_node_command(
        self, member: RegionProcess, further: FurtherNode, host: str
    ) -> list[str]:
        """``convplane node`` for ``further`` of ``member``'s region, listening on ``host``."""
        return convplane_command(
            "node", "--cluster-file", str(self.cluster_file), "--region", member.name,
            "--node-index", str(further.index), "--host", host,
            "--port", str(further.port), "--peer-port", str(further.peer_port),
            "--log-level", "warning",
        )  # fmt: skip

    def node_command(self, member: RegionProcess, host: str) -> list[str]:
        """``convplane node`` for ``member``, listening on ``host``."""
        return convplane_command(
            "node", "--cluster-file", str(self.cluster_file), "--region", member.name,
            "--host", host, "--port", str(member.port), "--peer-port", str(member.peer_port),
            "--log-level", "warning",
        )  # fmt: skip

    def node_env(self, member: RegionProcess) -> dict[str, str]:
        """The node's environment: ours, with its database password file and TLS files."""
        env = dict(os.environ)
        if self.postgres:
            env["PGPASSFILE"] = str(member.log_path.parent / "pgpass")
        if (database_ca := self._database_ca_file()) is not None:
            env["PGSSLROOTCERT"] = str(database_ca)  # asyncpg's CA for ssl=verify-full
        if member.tls is not None:
            env["CONVPLANE_TLS_CA_FILE"] = str(member.tls.ca_file)
            env["CONVPLANE_TLS_CERT_FILE"] = str(member.tls.cert_file)
            env["CONVPLANE_TLS_KEY_FILE"] = str(member.tls.key_file)
        return env

    def wait_healthy(self, members: list[RegionProcess] | None = None) -> None:
        deadline_s = time.monotonic() + self.ready_timeout_s
        pending = list(self.members if members is None else members)
        last_reply: dict[str, str] = {}
        with httpx.Client(timeout=1.0, trust_env=False) as client:
            while pending:
                for member in list(pending):
                    self._check_alive(member)
                    ready, last_reply[member.name] = self._region_health(client, member)
                    if ready:
                        pending.remove(member)
                if pending and time.monotonic() > deadline_s:
                    raise PlaneError(self._not_healthy(pending, last_reply))
                time.sleep(HEALTH_POLL_S)

    def _region_health(self, client: httpx.Client, member: RegionProcess) -> tuple[bool, str]:
        """Whether the region is ready, and what its nodes said. A region of one node: its
        ``/healthz``. Of several: one node says it is ready and leads shards (the others,
        standing by, are ready with none; all of them when the placement gives it none)."""
        urls = [member.url, *(n.url for n in member.more_nodes)]
        said: list[str] = []
        ready_without_shards = 0

        def label(url: str) -> str:  # which node said it, where the region has several
            return f"{url}: " if len(urls) > 1 else ""

        for url in urls:
            try:
                reply = client.get(url + "/healthz")
            except httpx.HTTPError as exc:
                said.append(f"{label(url)}no answer ({type(exc).__name__})")
                continue
            said.append(f"{label(url)}{reply.status_code} {reply.text[:300]}")
            if reply.status_code != 200:
                continue
            if len(urls) == 1 or reply.json().get("shards_placed", 0) > 0:
                return True, said[-1]
            ready_without_shards += 1
        if ready_without_shards < len(urls):
            return False, "; ".join(said)
        placed = place_shards(self.shard_count, {m.name: 1.0 for m in self.members})
        return member.name not in placed.values(), "; ".join(said)

    def _not_healthy(self, pending: list[RegionProcess], last_reply: dict[str, str]) -> str:
        """What the user needs to see why: each pending node's last /healthz and log tail."""
        names = ", ".join(m.name for m in pending)
        lines = [f"nodes not healthy after {self.ready_timeout_s:g}s: {names}"]
        for member in pending:
            lines.append(f"{member.name}: last /healthz: {last_reply.get(member.name, 'none')}")
            lines.append(f"{member.name}: log tail ({member.log_path}):")
            lines.append(_tail(member.log_path, max_bytes=2000))
        return "\n".join(lines)

    @staticmethod
    def _check_alive(member: RegionProcess) -> None:
        assert member.node is not None
        code = member.node.poll()
        if code is not None:
            tail = _tail(member.log_path)
            raise PlaneError(f"node {member.name} exited with code {code}; log tail:\n{tail}")
        for further in member.more_nodes:
            code = further.node.poll() if further.node else None
            if code is not None:
                tail = _tail(further.log_path)
                raise PlaneError(
                    f"node {further.index} of {member.name} exited with code {code}; log "
                    f"tail:\n{tail}"
                )

    def exited_nodes(self) -> list[tuple[str, int]]:
        """Nodes that exited since last asked. ``up``'s supervisor reports them and restarts
        none by itself: a node that dies stays down (its shards fail over, as a region's loss
        would) until ``convplane restart-region`` or a kill drill's end brings it back."""
        exited = []
        for m in self.members:
            code = m.node.poll() if m.node else None
            if code is not None and not m.exit_reported:
                m.exit_reported = True
                exited.append((m.name, code))
            for n in m.more_nodes:
                code = n.node.poll() if n.node else None
                if code is not None and not n.exit_reported:
                    n.exit_reported = True
                    exited.append((f"{m.name}/{n.index}", code))
        return exited

    def supervise_workers(self) -> list[str]:
        """Replay workers of attached engines (``--engine`` with Kafka): one that exited is
        started again after a backoff, one that crash-loops is left down
        (``AttachedEngines.supervise_workers``). What happened, for the operator; the info file
        names the workers' new pids."""
        if self.attached is None:
            return []
        said = self.attached.supervise_workers(time.monotonic())
        if said:
            write_private_json(self.info_file, self.info())
        return said

    def kill_region(self, name: str) -> None:
        """A kill drill's fault: SIGKILL the region's node; its PostgreSQL (if any) crashes too
        (an immediate stop: no checkpoint, crash recovery at restart)."""
        member = self._member(name)
        for node in member.processes():
            if node.poll() is None:
                _signal(node, signal.SIGKILL)
                node.wait(timeout=STOP_TIMEOUT_S)
        member.exit_reported = True  # the drill did it: not an exit to report
        for further in member.more_nodes:
            further.exit_reported = True
        if member.db is not None:
            member.db.stop("immediate")

    def restart_region(self, name: str) -> None:
        """Start the region's node again on its data (stopping it first if it runs), and its
        database if that is down: the end of a kill drill, or ``convplane restart-region``."""
        member = self._member(name)
        _stop_processes(member.processes())
        if member.db is not None:
            member.db.start()
        member.node = self.spawn_node(member)
        member.exit_reported = False
        for further in member.more_nodes:
            further.node = self.spawn_further_node(member, further)
            further.exit_reported = False
        if self.attached is not None:
            self.attached.restart_region_workers(name)
        write_private_json(self.info_file, self.info())

    def kill_node(self, name: str, index: int) -> None:
        """SIGKILL node ``index`` of region ``name`` (its database untouched)."""
        member = self._member(name)
        node = member.node if index == 0 else member.more_nodes[index - 1].node
        if node is not None and node.poll() is None:
            _signal(node, signal.SIGKILL)
            node.wait(timeout=STOP_TIMEOUT_S)
        if index == 0:
            member.exit_reported = True
        else:
            member.more_nodes[index - 1].exit_reported = True

    def restart_node(self, name: str, index: int) -> None:
        """Start node ``index`` of region ``name`` again (stopping it first if it runs): in a
        region of several nodes, it comes back as a standby while another leads."""
        member = self._member(name)
        if index == 0:
            _stop_processes([member.node] if member.node is not None else [])
            member.node = self.spawn_node(member)
            member.exit_reported = False
        else:
            further = member.more_nodes[index - 1]
            _stop_processes([further.node] if further.node is not None else [])
            further.node = self.spawn_further_node(member, further)
            further.exit_reported = False
        write_private_json(self.info_file, self.info())

    def adopt(self, saved: PlaneState) -> None:
        """Take the saved plane's keys and regions without starting anything (a tool acting on
        a detached plane: ``services.local.region_restart``)."""
        self.state_dir = self.state_dir.resolve()
        self.api_key, self.limited_api_key = saved.api_key, saved.limited_api_key
        self.operator_api_key, self.viewer_api_key = saved.operator_api_key, saved.viewer_api_key
        self.members.clear()
        self._prepare_members(saved, check_ports=False)

    def _member(self, name: str) -> RegionProcess:
        for member in self.members:
            if member.name == name:
                return member
        raise PlaneError(f"no region {name!r} in this plane")

    def detach(self) -> None:
        """Leave every process running when this one exits (``convplane up --detach``): the
        databases, too, are no longer stopped at interpreter exit."""
        for member in self.members:
            if member.db is not None:
                member.db.keep_running()

    def stop(self) -> None:
        """SIGTERM every node, SIGKILL those still running after STOP_TIMEOUT_S, stop DBs."""
        if self.attached is not None:
            _stop_processes(list(self.attached.workers.values()))
        _stop_processes([node for m in self.members for node in m.processes()])
        if self.engines is not None:
            self.engines.stop()
        for m in self.members:
            if m.db is not None:
                stopped = m.db.stop()
                if inspect.isawaitable(stopped):
                    asyncio.run(_awaited(stopped))
                m.db = None


def _spawn(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log_file:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # signals reach it only through this supervisor
        )


def _stop_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each running one, SIGKILL those still running after STOP_TIMEOUT_S."""
    running = [p for p in processes if p.poll() is None]
    for proc in running:
        _signal(proc, signal.SIGTERM)
    deadline_s = time.monotonic() + STOP_TIMEOUT_S
    for proc in running:
        try:
            proc.wait(timeout=max(0.1, deadline_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(proc, signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)


@contextlib.contextmanager
def _database_ca(ca_file: Path | None) -> Iterator[None]:
    """``PGSSLROOTCERT`` for this process while it migrates (asyncpg reads the CA of
    ``ssl=verify-full`` from there), as before afterwards."""
    if ca_file is None:
        yield
        return
    previous = os.environ.get("PGSSLROOTCERT")
    os.environ["PGSSLROOTCERT"] = str(ca_file)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("PGSSLROOTCERT", None)
        else:
            os.environ["PGSSLROOTCERT"] = previous


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


async def _migrate_all(dsns: list[str]) -> None:
    """Migrate every database once, here, so the nodes never race on a fresh schema."""
    from eventlog.stores import migrate

    for dsn in dsns:
        await migrate(dsn)


def _signal(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        proc.send_signal(signum)
    except ProcessLookupError:
        pass


def _choose_ports(host: str, base_port: int, count: int) -> list[int]:
    if base_port == 0:
        return [free_port(host) for _ in range(count)]
    ports = [base_port + i for i in range(count)]
    _check_free(host, ports)
    return ports


def _check_free(host: str, ports: list[int]) -> None:
    for port in ports:
        with socket.socket() as sock:
            # as uvicorn binds: connections of a plane just stopped (TIME_WAIT) do not count
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise PlaneError(
                    f"port {port} is in use (by this plane still running, or another program)"
                ) from exc


def _issued_tls(directory: Path, region: str) -> NodeTls:
    """The certificate ``issue_cluster_tls`` made for ``region`` at the plane's first start."""
    tls = NodeTls(
        directory / "ca.pem", directory / f"{region}.pem", directory / f"{region}-key.pem"
    )
    for path in (tls.ca_file, tls.cert_file, tls.key_file):
        if not path.is_file():
            raise PlaneError(f"{path} is missing: the plane's certificates are incomplete")
    return tls


def _tail(path: Path, max_bytes: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-max_bytes:].decode("utf-8", errors="replace")


def write_private_json(path: Path, value: dict[str, Any]) -> None:
    """Write ``value`` to ``path`` readable by this user only (it holds API keys)."""
    _write_private(path, json.dumps(value, indent=2) + "\n")


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)
    _private_file(tmp)
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def without_password(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    return parts._replace(netloc=f"{parts.username}@{parts.hostname}:{parts.port}").geturl()


def _private_file(path: Path) -> None:
    """Create ``path`` (if missing) as 0600 before anything is written into it."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    path.chmod(0o600)


def _private_dir(path: Path, mode: int) -> None:
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    path.chmod(mode)
