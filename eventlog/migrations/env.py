"""Alembic environment: runs on the connection ``eventlog.stores.migrate`` hands over.

``migrate`` opens the connection itself (async engine, the store's own connection settings, and a
lock so that several processes migrating one database at once take turns), then runs Alembic on it
through ``run_sync``; this file only configures the context. Run from the ``alembic`` command line
(``alembic -c eventlog/migrations/alembic.ini -x dsn=... upgrade head``) it opens its own engine.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection


def _run_on(connection: Connection) -> None:
    context.configure(connection=connection, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()


def _run() -> None:
    connection = context.config.attributes.get("connection")
    if isinstance(connection, Connection):
        _run_on(connection)
        return
    dsn = context.get_x_argument(as_dictionary=True).get("dsn")
    if not dsn:
        raise SystemExit("pass the database with -x dsn=postgresql+asyncpg://... or sqlite+...")
    asyncio.run(_run_cli(dsn))


async def _run_cli(dsn: str) -> None:
    from eventlog.stores._engine import StoreConfig, make_engine

    engine = make_engine(dsn, StoreConfig())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run_on)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; pass -x dsn=...")
_run()
