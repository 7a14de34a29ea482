"""Run the replica schema's Alembic migrations programmatically (no alembic.ini, no CWD).

Several processes may open the same database at once (leader processes of one region, test
workers); the migration runs under a lock so they take turns: a transaction-scoped advisory lock
on PostgreSQL (DDL is transactional there), BEGIN IMMEDIATE on SQLite. A database already at
the newest revision is left alone after a plain read, without the lock: a node restarting on
its data must not wait for the writer lock of a SQLite file the other regions' leaders write
to all the time (a clean-clone CI run saw a restarted node's migration wait 60 s for it).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection

from eventlog.stores._engine import (
    SQLITE_WRITE_OPTION,
    StoreConfig,
    make_engine,
    sqlite_file,
    translated,
)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
_LOCK_KEY = 0x636F6E76  # "conv": the advisory lock key of convplane's migrations


def migration_module(revision: str) -> ModuleType:
    """A revision's migration module as Alembic loads it (what a later migration, a test or a
    benchmark reads an earlier one's SQL from)."""
    script = ScriptDirectory.from_config(alembic_config()).get_revision(revision)
    if script is None:
        raise LookupError(f"no migration {revision}")
    return script.module


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    return config


async def migrate(dsn: str, revision: str = "head", *, timeout_s: float = 60.0) -> None:
    """Upgrade the database at ``dsn`` to ``revision`` (default: the newest)."""
    limits = StoreConfig(statement_timeout_s=timeout_s, pool_size=1)
    engine = make_engine(dsn, limits)
    try:
        written = sqlite_file(engine)
        async with translated("migrate", f"migrate to {revision}", sqlite_write_to=written):
            if revision == "head":
                async with engine.connect() as conn:
                    if await conn.run_sync(_at_head):
                        return
            async with engine.connect() as conn:
                if engine.dialect.name == "postgresql":
                    await conn.execute(text(f"SELECT pg_advisory_xact_lock({_LOCK_KEY})"))
                else:
                    await conn.execution_options(**{SQLITE_WRITE_OPTION: True})
                await conn.run_sync(_upgrade, revision)
                await conn.commit()
    finally:
        await engine.dispose()


def _at_head(connection: Connection) -> bool:
    """Whether the database already carries the newest revision (a read: no lock taken)."""
    current = set(MigrationContext.configure(connection).get_current_heads())
    return current == set(ScriptDirectory.from_config(alembic_config()).get_heads())


def _upgrade(connection: Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)
