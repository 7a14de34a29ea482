"""A database already at the newest revision is left alone by ``migrate`` without taking the
migration lock: a node restarting on its SQLite replica while another region's leader holds
that file's writer lock starts instead of failing (a clean-clone CI run saw a restarted node's
migration wait 60 s for the lock and the node's start fail)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from eventlog.errors import ReplicaUnavailable
from eventlog.stores._engine import SQLITE_WRITE_OPTION, StoreConfig, make_engine
from eventlog.stores.migrate import migrate


async def test_a_database_at_head_migrates_while_another_writer_holds_the_lock(
    tmp_path: Path,
) -> None:
    dsn = f"sqlite+aiosqlite:///{tmp_path / 'replica.sqlite'}"
    await migrate(dsn)
    other = make_engine(dsn, StoreConfig(statement_timeout_s=5.0))
    try:
        async with other.connect() as holder:
            await holder.execution_options(**{SQLITE_WRITE_OPTION: True})
            async with holder.begin():  # BEGIN IMMEDIATE: the writer lock, held
                await holder.execute(text("SELECT 1"))
                await migrate(dsn, timeout_s=0.5)  # at head: returns without waiting for it
                with pytest.raises(ReplicaUnavailable, match="locked"):
                    # any other revision must still take the lock (and here cannot)
                    await migrate(dsn, revision="base", timeout_s=0.5)
    finally:
        await other.dispose()
