"""The benchmark's peer on the lab (``bench/rest.py --lab``): PostgreSQL's quorum replication with
the primary and each standby on a host of their own, under that host's CPU quota, replicating
over the hosts' addresses; a second peer in the same lab takes the first one's hosts again.

Needs the lab and local PostgreSQL binaries; fails loudly without them, never skips.
"""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from tests.harness.lab import Lab
from tests.harness.lab_plane import DATABASE_PORT, sync_replication_on_lab
from tests.harness.postgres import SyncReplicationCluster

HOST_CPU_QUOTA = 0.5


def _replication(peer: SyncReplicationCluster) -> set[tuple[str, str, str]]:
    rows = peer.primary.psql(
        "SELECT application_name, sync_state, host(client_addr) FROM pg_stat_replication"
    )
    return {tuple(row.split("|")) for row in rows.splitlines()}  # type: ignore[misc]


@pytest.mark.postgres
async def test_each_peer_server_runs_on_its_own_host_and_replicates_over_its_address(
    lab: Lab, chaos_dir: Path
) -> None:
    for run in ("first", "second"):
        peer, hosts = sync_replication_on_lab(
            lab, chaos_dir / f"peer-{run}", cpu_quota=HOST_CPU_QUOTA
        )
        try:
            assert set(hosts) == {"primary", "s1", "s2"}
            assert set(lab.hosts) == {"pg-primary", "pg-s1", "pg-s2"}, run  # taken again
            servers = {"primary": peer.primary, "s1": peer.standbys[0], "s2": peer.standbys[1]}
            for name, server in servers.items():
                host = hosts[name]
                assert host.cpu_quota == HOST_CPU_QUOTA
                assert server.pid in host.pids(), f"{run}: {name} runs outside its host"
                assert (server.host, server.port) == (host.address, DATABASE_PORT)
            assert _replication(peer) == {
                ("s1", "quorum", hosts["s1"].address),
                ("s2", "quorum", hosts["s2"].address),
            }
            connection = await asyncpg.connect(peer.dsn.replace("+asyncpg", ""))
            try:
                await connection.execute("CREATE TABLE IF NOT EXISTS acked (n int)")
                await connection.execute("INSERT INTO acked VALUES (1)")
                names = await connection.fetchval("SHOW synchronous_standby_names")
                assert names == "ANY 1 (s1, s2)"
            finally:
                await connection.close()
        finally:
            peer.stop()
