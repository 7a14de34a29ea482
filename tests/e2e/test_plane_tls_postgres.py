"""``convplane up --postgres`` (TLS on by default): every node reaches every database over TLS
with ``verify-full`` under the plane's CA; a connection in clear, or one that trusts another
CA, is refused even with the right password."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from services.cluster_tls import issue_cluster_tls
from tests.e2e.plane import Plane, start_plane, stop_plane


@pytest.fixture(scope="module")
def plane() -> Iterator[Plane]:
    import os
    import shutil
    import tempfile

    # under /tmp (0711): the postgres user must reach its data directories
    state_dir = Path(tempfile.mkdtemp(prefix="convplane-tls-pg-"))
    os.chmod(state_dir, 0o711)
    proc, plane = start_plane(state_dir / "plane", "--postgres")
    try:
        yield plane
    finally:
        output = stop_plane(proc)
        shutil.rmtree(state_dir, ignore_errors=True)
        assert proc.returncode == 0, output


async def _connect(dsn: str, tls: ssl.SSLContext | bool) -> str:
    parts = urlsplit(dsn)
    conn = await asyncpg.connect(
        host=parts.hostname, port=parts.port, user=parts.username, password=parts.password,
        database=parts.path.lstrip("/"), ssl=tls, timeout=10,
    )  # fmt: skip
    try:
        return str(
            await conn.fetchval("SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        )
    finally:
        await conn.close()


def test_nodes_write_through_verified_tls_and_nothing_else_gets_in(
    plane: Plane, tmp_path: Path
) -> None:
    cid = plane.conversation_led_by("eu-west", "tls-pg")
    with plane.client("us-east") as client:  # forwarded over mutual TLS, acked by a quorum
        created = client.post("/v1/conversations", json={"conversation_id": cid})
        assert created.status_code == 201, created.text
        appended = client.post(
            f"/v1/conversations/{cid}/events", json={"type": "note", "payload": {"x": 1}}
        )
        assert appended.status_code == 201 and len(appended.json()["acked_by"]) >= 2
    region = plane.info["regions"][0]
    assert region["dsn"].endswith("?ssl=verify-full")
    ca_file = Path(plane.info["cluster_file"]).parent / "tls" / "ca.pem"
    verified = ssl.create_default_context(cafile=str(ca_file))
    assert asyncio.run(_connect(region["dsn"], verified)) == "true"
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):  # no hba entry in clear
        asyncio.run(_connect(region["dsn"], False))
    other_ca = issue_cluster_tls(tmp_path / "other", ["x"], ["127.0.0.1"])["x"].ca_file
    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(_connect(region["dsn"], ssl.create_default_context(cafile=str(other_ca))))


async def _as_role(dsn: str, user: str, password: str, ca_file: Path, sql: str) -> object:
    parts = urlsplit(dsn)
    conn = await asyncpg.connect(
        host=parts.hostname, port=parts.port, user=user, password=password,
        database=parts.path.lstrip("/"), ssl=ssl.create_default_context(cafile=str(ca_file)),
        timeout=10,
    )  # fmt: skip
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def test_each_node_holds_only_its_own_role_which_can_run_the_protocol_and_read(
    plane: Plane,
) -> None:
    state_dir = Path(plane.info["cluster_file"]).parent
    ca_file = state_dir / "tls" / "ca.pem"
    cluster = json.loads(Path(plane.info["cluster_file"]).read_text())
    for region in cluster["regions"]:  # the shared cluster file holds no password
        assert urlsplit(region["dsn"]).password is None
        assert all(urlsplit(d).password is None for d in region["dsn_from"].values())
    host, port, database, user, password = (
        (state_dir / "us-east" / "pgpass").read_text().strip().split(":")
    )
    assert (host, port, database, user) == ("*", "*", "*", "convplane_node_us_east")
    remote = next(r for r in plane.info["regions"] if r["name"] == "eu-west")["dsn"]
    entries = asyncio.run(_as_role(remote, user, password, ca_file, "SELECT count(*) FROM entries"))
    assert isinstance(entries, int) and entries > 0
    for sql in (
        "DELETE FROM entries",
        "DELETE FROM replica_registry",
        "UPDATE shards SET promised_epoch = 0",
        "DROP TABLE entries",
        "CREATE TABLE mine (x int)",
    ):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            asyncio.run(_as_role(remote, user, password, ca_file, sql))
