"""The compose stack's database set-up on real PostgreSQL (TLS only, verify-full): from the
files the secrets service writes, ``db-init`` migrates each database as its owner and
restricts each node's role; a node then opens every replica as its own role, with nothing but
its own bundle (cluster file and pgpass), and cannot write outside the protocol; both nodes of
a region, one role, take their node slots' leases."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from eventlog.stores import open_replica_store
from eventlog.stores.region_lease import open_region_lease
from services.config import load_cluster
from services.deploy.compose_bundles import write_bundles
from services.deploy.compose_databases import prepare_databases
from services.deploy.compose_secrets import ensure_secrets
from services.deploy.db_roles import asyncpg_dsn, node_role

pytestmark = pytest.mark.postgres


async def test_nodes_open_their_replicas_as_their_own_restricted_role(
    pg_databases: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fresh region names: roles are per server, shared by every test's database
    regions = [f"c{uuid.uuid4().hex[:8]}-{i}" for i in range(len(pg_databases))]
    out = tmp_path / "secrets"
    out.mkdir(mode=0o700)
    template_regions = []
    for name, dsn in zip(regions, pg_databases, strict=True):
        parts = urlsplit(dsn)
        # the harness's servers have their own owner password: the secrets service keeps it
        (out / f"pg-{name}-password").write_text(f"{parts.password}\n")
        netloc = f"{parts.username}@{parts.hostname}:{parts.port}"
        template_regions.append(
            {"name": name, "url": "http://x:1", "dsn": parts._replace(netloc=netloc).geturl()}
        )
    (tmp_path / "template.json").write_text(json.dumps({"regions": template_regions}))
    write_bundles(out, ensure_secrets(tmp_path / "template.json", out))
    bundles = out / "bundles"
    # the harness's servers are under the harness's CA, not the one the secrets service made
    harness_ca = Path(os.environ["PGSSLROOTCERT"])
    shutil.copyfile(harness_ca, bundles / "db-init" / "tls" / "ca.pem")

    assert await prepare_databases(bundles / "db-init") == sorted(regions)

    node = regions[0]
    monkeypatch.setenv("PGPASSFILE", str(bundles / f"node-{node}" / "pgpass"))
    cluster = load_cluster(bundles / f"node-{node}" / "cluster.json")
    for region in cluster.regions:
        store = await open_replica_store(region.dsn, region.name)  # what the node does
        await store.close()
        conn = await asyncpg.connect(asyncpg_dsn(region.dsn), timeout=10)
        try:
            assert await conn.fetchval("SELECT current_user") == node_role(node)
            assert await conn.fetchval("SELECT count(*) FROM entries") == 0
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute("DELETE FROM entries")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute("CREATE TABLE intruder (x int)")
        finally:
            await conn.close()
    # the region's two nodes are one role: each takes its own node slot's lease (the advisory
    # lock is open to the restricted role), and the slot a sibling holds stays its
    own = next(region for region in cluster.regions if region.name == node)
    leases = [await open_region_lease(own.dsn, node, slot, timeout_s=10) for slot in (0, 1)]
    rival = await open_region_lease(own.dsn, node, 0, timeout_s=10)
    try:
        assert [await lease.try_acquire() for lease in leases] == [True, True]
        assert not await rival.try_acquire() and rival.reachable
    finally:
        for lease in (*leases, rival):
            await lease.close()
