"""A chaos plane whose regions are hosts of a lab (``tests.harness.lab``).

Each region is one host: its PostgreSQL listens on the host's address (TLS only, a certificate
for that address alone) and its node binds and advertises the host's address (its peer
certificate names that address, not 127.0.0.1 nor localhost); both run inside the host, under
its CPU quota. The test process reaches every host from the root namespace. A region's loss is
``kill_region``: every process of its host killed at once. A partition is ``partition``: packets
between its host and every other region's host dropped (the test process still reaches it).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.cluster_tls import issue_certificate, issue_cluster_tls
from services.local.plane import (
    REGION_NAMES,
    FurtherNode,
    PlaneError,
    RegionProcess,
    _private_dir,
)
from services.local.plane_state import PlaneState, SavedDatabase
from services.local.postgres import (
    DATABASE,
    PgHarnessError,
    PgInstance,
    _init_instance,
    _prepare_base_dir,
    _require_tls,
    _server_env,
    find_bindir,
)
from tests.harness.chaos import ChaosPlane
from tests.harness.lab import Host, Lab
from tests.harness.postgres import SyncReplicationCluster, start_sync_replication_cluster

#: seconds the nodes may take to become healthy: a plane of several hosts on a shared 2-core
#: machine starts slower than one on loopback (LocalPlane's READY_TIMEOUT_S)
LAB_READY_TIMEOUT_S = 180.0
#: every host has its own TCP stack: the same ports on each
NODE_PORT = 8700
PEER_PORT = 8800
DATABASE_PORT = 5432


@dataclass
class HostedPgInstance(PgInstance):
    """A PostgreSQL server whose postmaster runs inside a lab host."""

    lab_host: Host | None = field(default=None, repr=False)

    def _spawn(self) -> subprocess.Popen[bytes]:
        assert self.lab_host is not None
        with self.log_path.open("ab") as log:
            return self.lab_host.run(
                self.server_command(),
                user="postgres",
                env=_server_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd="/",
            )


@dataclass
class LabPlane(ChaosPlane):
    """3 regions (``regions``), each on its own host of ``lab`` with ``cpu_quota`` cores. With
    ``nodes_per_region`` above 1 (or ``node_hosts``) the region's host runs its PostgreSQL
    only, and each of its nodes has a host of its own (``<region>-n<index>``), so that a node's
    host can crash without its database. Hosts a plane stopped earlier on ``lab`` left are
    used again."""

    lab: Lab | None = None
    cpu_quota: float | None = None
    #: each node on a host of its own even in a region of one node (a like-for-like baseline
    #: for regions of several)
    node_hosts: bool = False
    hosts: dict[str, Host] = field(default_factory=dict)

    @property
    def nodes_apart(self) -> bool:
        """Whether each node runs on a host of its own, apart from its region's PostgreSQL."""
        return self.nodes_per_region > 1 or self.node_hosts

    def _host(self, name: str) -> Host:
        assert self.lab is not None
        host = self.lab.hosts.get(name) or self.lab.add_host(name, cpu_quota=self.cpu_quota)
        self.hosts[name] = host
        return host

    def _prepare_members(self, saved: PlaneState | None, *, check_ports: bool = True) -> None:
        if saved is not None:
            raise PlaneError("a lab plane always starts fresh")
        assert self.lab is not None and self.postgres, "a lab plane runs PostgreSQL on its hosts"
        names = REGION_NAMES[: self.regions]
        for name in names:
            self._host(name)
            if self.nodes_apart:
                for index in range(self.nodes_per_region):
                    self._host(self.node_host_name(name, index))
        addresses = {
            n: [self.node_host(n, i).address for i in range(self.nodes_per_region)] for n in names
        }
        issued = issue_cluster_tls(self.state_dir / "tls", names, [], hosts_of=addresses)
        for name in names:
            address = self.node_host(name, 0).address
            region_dir = self.state_dir / name
            _private_dir(region_dir, 0o700)
            self.members.append(
                RegionProcess(
                    name=name,
                    port=NODE_PORT,
                    url=f"http://{address}:{NODE_PORT}",
                    peer_port=PEER_PORT,
                    peer_url=f"https://{address}:{PEER_PORT}",
                    tls=issued[name],
                    dsn="",  # the database's, once started
                    path=None,
                    log_path=region_dir / "node.log",
                )
            )
            self.members[-1].more_nodes = [
                FurtherNode(
                    index=index,
                    port=NODE_PORT,
                    url=f"http://{addresses[name][index]}:{NODE_PORT}",
                    peer_port=PEER_PORT,
                    peer_url=f"https://{addresses[name][index]}:{PEER_PORT}",
                    log_path=region_dir / f"node-{index}.log",
                )
                for index in range(1, self.nodes_per_region)
            ]

    @staticmethod
    def node_host_name(region: str, index: int) -> str:
        return f"{region}-n{index}"

    def node_host(self, region: str, index: int) -> Host:
        """The host of ``region``'s node ``index`` (its region's host, unless nodes run
        apart)."""
        if not self.nodes_apart:
            return self.hosts[region]
        return self.hosts[self.node_host_name(region, index)]

    def region_hosts(self, region: str) -> list[Host]:
        """The hosts of ``region``: its database's and its nodes'."""
        nodes = [self.node_host(region, i) for i in range(self.nodes_per_region)]
        return [self.hosts[region], *(h for h in nodes if h is not self.hosts[region])]

    def _start_databases(self, saved: PlaneState | None) -> None:
        bindir = find_bindir()
        if bindir is None:
            raise PgHarnessError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin")
        assert self.lab is not None and self.lab.subnet is not None
        base = _prepare_base_dir(self.state_dir / "postgres")
        for member in self.members:
            host = self.hosts[member.name]
            made = _init_instance(member.name, base, bindir)
            instance = HostedPgInstance(
                name=made.name, port=DATABASE_PORT, data_dir=made.data_dir, bindir=bindir,
                host=host.address, password=made.password, lab_host=host,
            )  # fmt: skip
            issued = issue_certificate(
                self.state_dir / "tls", f"database-{member.name}", [host.address]
            )
            _require_tls(instance, issued.cert_file, issued.key_file)
            with (instance.data_dir / "pg_hba.conf").open("a") as hba:  # the lab's other hosts
                hba.write(f"hostssl all all {self.lab.subnet} scram-sha-256\n")
            instance.start()
            instance.psql(f"CREATE DATABASE {DATABASE}")
            member.db = instance
            member.dsn = instance.dsn
            assert instance.password is not None
            member.database = SavedDatabase(instance.name, instance.port, instance.password, True)

    def spawn_node(self, member: RegionProcess) -> subprocess.Popen[bytes]:
        host = self.node_host(member.name, 0)
        with member.log_path.open("ab") as log:
            return host.run(
                self.node_command(member, host.address),
                env=self.node_env(member),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def spawn_further_node(
        self, member: RegionProcess, further: FurtherNode
    ) -> subprocess.Popen[bytes]:
        host = self.node_host(member.name, further.index)
        with further.log_path.open("ab") as log:
            return host.run(
                self.further_node_command(member, further, host.address),
                env=self.node_env(member),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill_region(self, name: str) -> None:
        """Crash the region's hosts: its nodes and its PostgreSQL killed at once."""
        self.hosts[name].kill()
        if self.nodes_apart:
            for index in range(self.nodes_per_region):
                self.node_host(name, index).kill()

    def partition(self, region: str) -> None:
        """Drop every packet between ``region``'s host and every other region's host."""
        assert self.lab is not None
        inside = self.region_hosts(region)
        for host in self.hosts.values():
            if host not in inside:
                for own in inside:
                    self.lab.partition(own, host)

    def heal(self) -> None:
        assert self.lab is not None
        self.lab.heal()


def lab_plane(lab: Lab, state_dir: Path, shard_count: int, **options: Any) -> LabPlane:
    """3 regions on PostgreSQL, each on its own host of ``lab``, state under ``state_dir``."""
    return LabPlane(
        regions=3, state_dir=state_dir, base_port=0, postgres=True, shard_count=shard_count,
        ready_timeout_s=LAB_READY_TIMEOUT_S, lab=lab, **options,
    )  # fmt: skip


def sync_replication_on_lab(
    lab: Lab, base_dir: Path, *, standbys: int = 2, cpu_quota: float | None = None
) -> tuple[SyncReplicationCluster, dict[str, Host]]:
    """PostgreSQL's quorum replication (``start_sync_replication_cluster``) with each server on
    its own host of ``lab`` (``pg-primary``, ``pg-s1``, ...) with ``cpu_quota`` cores: the peer
    of a plane whose regions are lab hosts (the hosts of an earlier one, stopped, are used
    again; ``cpu_quota`` must then be theirs). Plain TCP with SCRAM from the lab's subnet (the
    plane's databases take TLS only: the peer is spared that cost). The hosts by server name."""
    assert lab.subnet is not None, "the lab is not started"
    hosts: dict[str, Host] = {}
    allowed = (
        f"host all all {lab.subnet} scram-sha-256\n"
        f"host replication all {lab.subnet} scram-sha-256\n"
    )

    def place(instance: PgInstance) -> PgInstance:
        name = f"pg-{instance.name}"  # a host an earlier peer of this lab left is taken again
        host = lab.hosts.get(name) or lab.add_host(name, cpu_quota=cpu_quota)
        hosts[instance.name] = host
        hba = instance.data_dir / "pg_hba.conf"
        if allowed not in hba.read_text():  # a standby's copy has the primary's already
            with hba.open("a") as lines:
                lines.write(allowed)
        return HostedPgInstance(
            name=instance.name, port=DATABASE_PORT, data_dir=instance.data_dir,
            bindir=instance.bindir, host=host.address, password=instance.password, lab_host=host,
        )  # fmt: skip

    return start_sync_replication_cluster(base_dir, standbys, place=place), hosts
