"""The log's entries table carries only the indexes its queries use (migration 0005): each index
costs every replica an insert per entry, on every append. A database made before 0005 loses the
unused one on upgrade, and a rollback to 0004 builds it again; on PostgreSQL and on SQLite."""

from __future__ import annotations

from pathlib import Path

import aiosqlite
import asyncpg

from eventlog.stores import migrate
from services.local.postgres import asyncpg_dsn
from tests.migrations import alembic_downgrade

PG_INDEXES = "SELECT indexname FROM pg_indexes WHERE tablename = 'entries'"
#: what every revision from 0005 on keeps: the key (shard, lsn), and a conversation's entries
KEPT = {"ix_entries_conversation"}


async def test_postgresql_entries_keep_only_the_key_and_the_conversation_index(
    pg_databases: list[str],
) -> None:
    dsn = pg_databases[0]

    async def indexes() -> set[str]:
        conn = await asyncpg.connect(asyncpg_dsn(dsn))
        try:
            return {r["indexname"] for r in await conn.fetch(PG_INDEXES)}
        finally:
            await conn.close()

    await migrate(dsn, "0004")
    assert await indexes() == {"entries_pkey", "ix_entries_created"} | KEPT
    await migrate(dsn)
    assert await indexes() == {"entries_pkey"} | KEPT
    await alembic_downgrade(dsn, "0004")
    assert await indexes() == {"entries_pkey", "ix_entries_created"} | KEPT


async def test_sqlite_entries_keep_only_the_key_and_the_conversation_index(
    tmp_path: Path,
) -> None:
    dsn = f"sqlite+aiosqlite:///{tmp_path / 'replica.db'}"

    async def indexes() -> set[str]:
        async with aiosqlite.connect(tmp_path / "replica.db") as db:
            rows = await db.execute_fetchall("PRAGMA index_list('entries')")
        return {str(r[1]) for r in rows if not str(r[1]).startswith("sqlite_autoindex_")}

    await migrate(dsn, "0004")
    assert await indexes() == {"ix_entries_created"} | KEPT
    await migrate(dsn)
    assert await indexes() == KEPT
    await alembic_downgrade(dsn, "0004")
    assert await indexes() == {"ix_entries_created"} | KEPT
