"""Replica stores on SQLAlchemy: PostgreSQL (asyncpg) and SQLite (aiosqlite, the embedded default).

    store = await open_replica_store("postgresql+asyncpg://...", region="eu", batch_linger_ms=1)
    ...
    await store.close()

Public: ``open_replica_store``, ``migrate``, ``SqlReplicaStore``, ``StoreConfig``.
"""

from __future__ import annotations

from typing import Any

from eventlog.clock import Clock
from eventlog.stores._engine import StoreConfig, dialect_of, make_engine
from eventlog.stores.migrate import migrate
from eventlog.stores.sql_store import SqlReplicaStore

__all__ = ["SqlReplicaStore", "StoreConfig", "migrate", "open_replica_store"]


async def open_replica_store(
    dsn: str, region: str, *, clock: Clock | None = None, **limits: Any
) -> SqlReplicaStore:
    """Migrate the database at ``dsn`` to the newest schema and return an open store on it.

    ``dsn``: ``postgresql+asyncpg://user@host:port/db`` or ``sqlite+aiosqlite:///path``.
    ``limits``: the fields of ``StoreConfig`` (``batch_linger_ms``, ``batch_events_max``,
    ``queue_max``, ``statement_timeout_s``, ``connect_timeout_s``, ``pool_size``, ...).
    """
    store_limits = StoreConfig(**limits)
    dialect_of(dsn)  # reject an unsupported dsn before touching anything
    await migrate(dsn)
    engine = make_engine(dsn, store_limits, autocommit=True)
    return SqlReplicaStore(engine, region, store_limits, clock)
