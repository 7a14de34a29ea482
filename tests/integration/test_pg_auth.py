"""The harness's local PostgreSQL servers authenticate every connection with SCRAM and a
password generated per server: neither a local user on the socket nor anyone on 127.0.0.1
gets in without it (they used to run with ``trust``: any local user was a superuser)."""

from __future__ import annotations

import subprocess
from urllib.parse import urlsplit

import asyncpg
import pytest

from services.deploy.db_roles import asyncpg_dsn
from services.local.postgres import PgInstance, _as_postgres, _server_env

pytestmark = pytest.mark.postgres


def _plain(dsn: str) -> str:
    return asyncpg_dsn(dsn)


async def test_connections_need_the_generated_password(pg_instances: list[PgInstance]) -> None:
    instance = pg_instances[0]
    assert instance.password, "the harness's servers must have a generated password"
    assert len({i.password for i in pg_instances}) == len(pg_instances)  # one each
    parts = urlsplit(_plain(instance.dsn))
    no_password = parts._replace(netloc=f"postgres@{parts.hostname}:{parts.port}").geturl()
    wrong = parts._replace(netloc=f"postgres:wrong@{parts.hostname}:{parts.port}").geturl()
    for dsn in (no_password, wrong):
        with pytest.raises((asyncpg.InvalidPasswordError, asyncpg.ClientConfigurationError)):
            await asyncpg.connect(dsn, timeout=10)
    conn = await asyncpg.connect(_plain(instance.dsn), timeout=10)
    try:
        assert await conn.fetchval("SELECT current_setting('password_encryption')") == (
            "scram-sha-256"
        )
    finally:
        await conn.close()


def test_the_local_socket_needs_the_password_too(pg_instances: list[PgInstance]) -> None:
    instance = pg_instances[0]
    assert instance.bindir is not None
    socket_dir = instance.data_dir.parent / f"{instance.data_dir.name}.sock"
    result = subprocess.run(
        [str(instance.bindir / "psql"), "-X", "-w", "-h", str(socket_dir), "-p",
         str(instance.port), "-U", "postgres", "-d", "postgres", "-c", "SELECT 1"],
        capture_output=True, text=True, timeout=30, check=False, env=_server_env(),
        cwd="/", **_as_postgres(),
    )  # fmt: skip
    assert result.returncode != 0
    assert "password" in result.stderr
