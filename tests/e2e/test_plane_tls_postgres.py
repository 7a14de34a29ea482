"""``convplane up --postgres`` (TLS on by default): every node reaches every database over TLS
with ``verify-full`` under the plane's CA; a connection in clear, or one that trusts another
CA, is refused even with the right password."""

from __future__ import annotations

import asyncio
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
