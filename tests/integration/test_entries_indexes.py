"""The log's entries table carries only the indexes its queries use: each B-tree costs every
replica an insert per entry, on every append. A database made before 0005 loses the unused one on
upgrade, and a rollback to 0004 builds it again; on PostgreSQL and on SQLite. On PostgreSQL,
0006 adds a BRIN index on ``created_at_ms`` (``list_conversations`` reads the pages written since
its cutoff; an insert rarely touches it), which a rollback to 0005 drops."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import aiosqlite
import asyncpg

from eventlog.stores import migrate
from services.deploy.db_roles import asyncpg_dsn
from tests.migrations import alembic_downgrade

PG_INDEXES = "SELECT indexname FROM pg_indexes WHERE tablename = 'entries'"
#: what every revision from 0005 on keeps: a conversation's entries (besides the key)
KEPT = {"ix_entries_conversation"}
DROPPED = "ix_entries_created"
BRIN = "ix_entries_created_brin"


async def upgrade_then_roll_back(
    dsn: str, indexes: Callable[[], Awaitable[set[str]]], key: set[str], head: set[str]
) -> None:
    await migrate(dsn, "0004")
    assert await indexes() == key | KEPT | {DROPPED}
    await migrate(dsn)
    assert await indexes() == key | KEPT | head
    await alembic_downgrade(dsn, "0005")
    assert await indexes() == key | KEPT
    await alembic_downgrade(dsn, "0004")
    assert await indexes() == key | KEPT | {DROPPED}


async def test_postgresql_entries_keep_the_key_the_conversation_index_and_a_brin(
    pg_databases: list[str],
) -> None:
    dsn = pg_databases[0]

    async def indexes() -> set[str]:
        conn = await asyncpg.connect(asyncpg_dsn(dsn))
        try:
            return {r["indexname"] for r in await conn.fetch(PG_INDEXES)}
        finally:
            await conn.close()

    await upgrade_then_roll_back(dsn, indexes, key={"entries_pkey"}, head={BRIN})


async def test_a_brin_built_concurrently_before_the_upgrade_is_kept(
    pg_databases: list[str],
) -> None:
    """An operator of a large log builds the index without blocking writes before upgrading
    (0006's docstring); the migration then finds it and adds nothing."""
    dsn = pg_databases[0]
    await migrate(dsn, "0005")
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        await conn.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {BRIN} ON entries USING brin "
            "(created_at_ms) WITH (autosummarize = on)"
        )
        await migrate(dsn)
        assert {r["indexname"] for r in await conn.fetch(PG_INDEXES)} == (
            {"entries_pkey", BRIN} | KEPT
        )
    finally:
        await conn.close()


async def test_a_brin_a_failed_concurrent_build_left_invalid_is_built_again(
    pg_databases: list[str],
) -> None:
    """A ``CREATE INDEX CONCURRENTLY`` that fails leaves an INVALID index under its name, which
    no query uses and which ``IF NOT EXISTS`` would keep: the migration drops and rebuilds it."""
    dsn = pg_databases[0]
    await migrate(dsn, "0005")
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    valid = f"SELECT indisvalid FROM pg_index WHERE indexrelid = '{BRIN}'::regclass"
    try:
        await conn.execute(f"CREATE INDEX {BRIN} ON entries USING brin (created_at_ms)")
        # what a failed concurrent build leaves (the catalog flag it would not have set)
        await conn.execute(
            f"UPDATE pg_index SET indisvalid = false WHERE indexrelid = '{BRIN}'::regclass"
        )
        assert await conn.fetchval(valid) is False
        await migrate(dsn)
        assert await conn.fetchval(valid) is True
    finally:
        await conn.close()


async def test_sqlite_entries_keep_only_the_key_and_the_conversation_index(
    tmp_path: Path,
) -> None:
    async def indexes() -> set[str]:
        async with aiosqlite.connect(tmp_path / "replica.db") as db:
            rows = await db.execute_fetchall("PRAGMA index_list('entries')")
        return {str(r[1]) for r in rows if not str(r[1]).startswith("sqlite_autoindex_")}

    dsn = f"sqlite+aiosqlite:///{tmp_path / 'replica.db'}"
    await upgrade_then_roll_back(dsn, indexes, key=set(), head=set())
