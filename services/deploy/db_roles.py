"""Least-privilege database roles: each node gets one that can do only what the protocol needs.

The log's writes on PostgreSQL are two functions (migration 0001): ``convplane_append`` (the
fenced, log-matching group append) and ``convplane_prepare`` (the fenced promise plus the tail).
``restrict_to_protocol`` makes them ``SECURITY DEFINER`` (they run as the schema's owner, with a
fixed ``search_path``) and gives each node's role only:

* ``EXECUTE`` on those two functions and on ``convplane_append_as`` (migration 0007: the
  append with the store's identity checked and the replicas' held positions kept);
* ``SELECT`` on ``shards``, ``entries``, ``replica_identity``, ``replica_registry``,
  ``replica_positions`` and ``alembic_version`` (reads, recovery, identity sweeps, the schema check every node makes
  when it opens a store);
* ``INSERT`` and ``UPDATE`` on ``replica_registry`` (the identity sweep's upsert: the one write
  outside the two functions; it should become a function too);
* ``CONNECT`` on the database.

No role but the owner may ``INSERT``, ``UPDATE``, ``DELETE``, ``TRUNCATE`` or change the schema.
So a compromised node can no longer run arbitrary SQL on any replica: it cannot delete or
rewrite history outside the protocol's rules (the functions refuse a write with a stale epoch,
refuse to truncate a committed entry, and keep the log-matching rule), drop tables, or read
other databases. What it still can do, as any node of the cluster can: take part in the
protocol (prepare a shard at a higher epoch, append entries as a leader would, which the other
nodes see as a new leader), and read every replica's log. Each node holds only its own role's
password (``convplane up``: a pgpass file per node, ``PGPASSFILE``), never another node's or the
owner's.

SQLite replicas have no roles: they are for one machine, where the file mode is the boundary.

``asyncpg_dsn`` turns a node's SQLAlchemy URL into the DSN asyncpg connects with, for whatever
sets roles up over asyncpg (``compose_databases``, ``convplane up``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg

PROTOCOL_FUNCTIONS = ("convplane_append", "convplane_append_as", "convplane_prepare")
READABLE_TABLES = (
    "shards",
    "entries",
    "replica_identity",
    "replica_registry",
    "replica_positions",
    "alembic_version",
)
#: tables a node writes directly (table -> privileges), when the schema has them
WRITABLE_TABLES = {"replica_registry": "INSERT, UPDATE"}
_ROLE_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_PASSWORD_RE = re.compile(r"^[A-Za-z0-9_-]{16,128}$")


def node_role(region: str) -> str:
    """The role of the node of ``region`` (region names are ``[a-z0-9-]``)."""
    return "convplane_node_" + region.replace("-", "_")


async def restrict_to_protocol(
    owner_dsn: str, roles: Mapping[str, str], *, timeout_s: float = 30.0
) -> None:
    """As the owner at ``owner_dsn`` (an asyncpg DSN): lock the schema down and create (or
    re-key) each role in ``roles`` (role -> password) with the grants in the module docstring.
    Idempotent."""
    for role, password in roles.items():
        # DDL takes no bind parameters: both are checked to be plain tokens before being quoted
        if not _ROLE_RE.fullmatch(role) or not _PASSWORD_RE.fullmatch(password):
            raise ValueError(f"role {role!r} or its password is not a plain token")
    conn = await asyncpg.connect(owner_dsn, timeout=timeout_s)
    try:
        async with conn.transaction():
            database = await conn.fetchval("SELECT current_database()")
            existing = {
                r["tablename"]
                for r in await conn.fetch(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                )
            }
            readable = ", ".join(t for t in READABLE_TABLES if t in existing)
            # a database at an older revision lacks the newer functions (migration 0007
            # restricts its own where it finds the others restricted)
            defined = {
                r["proname"]
                for r in await conn.fetch(
                    "SELECT proname FROM pg_proc WHERE proname = ANY($1::text[])",
                    list(PROTOCOL_FUNCTIONS),
                )
            }
            functions = [f for f in PROTOCOL_FUNCTIONS if f in defined]
            await conn.execute(f'REVOKE ALL ON DATABASE "{database}" FROM PUBLIC')
            await conn.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
            for function in functions:
                await conn.execute(
                    f"ALTER FUNCTION {function} SECURITY DEFINER SET search_path = public, pg_temp"
                )
                await conn.execute(f"REVOKE ALL ON FUNCTION {function} FROM PUBLIC")
            for role, password in roles.items():
                exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role)
                verb = "ALTER" if exists else "CREATE"
                await conn.execute(f"{verb} ROLE {role} LOGIN PASSWORD '{password}'")
                await conn.execute(f'GRANT CONNECT ON DATABASE "{database}" TO {role}')
                await conn.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
                await conn.execute(f"GRANT SELECT ON {readable} TO {role}")
                for table, privileges in WRITABLE_TABLES.items():
                    if table in existing:
                        await conn.execute(f"GRANT {privileges} ON {table} TO {role}")
                for function in functions:
                    await conn.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {role}")
    finally:
        await conn.close(timeout=timeout_s)


def asyncpg_dsn(sqlalchemy_dsn: str, *, ca_file: Path | None = None) -> str:
    """A SQLAlchemy asyncpg URL as asyncpg's own DSN: SQLAlchemy hands ``?ssl=`` to
    ``asyncpg.connect(ssl=...)``, a DSN names the same thing ``sslmode``; ``ca_file`` becomes
    its ``sslrootcert`` (else asyncpg reads ``PGSSLROOTCERT``)."""
    parts = urlsplit(sqlalchemy_dsn.replace("postgresql+asyncpg://", "postgresql://", 1))
    query = [
        "sslmode=" + q.removeprefix("ssl=") if q.startswith("ssl=") else q
        for q in parts.query.split("&")
        if q
    ]
    if ca_file is not None:
        query.append(f"sslrootcert={ca_file}")
    return parts._replace(query="&".join(query)).geturl()
