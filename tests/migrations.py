"""Taking a replica database back to an older schema revision, as an operator rolling back a
release would (``eventlog.stores.migrate`` only upgrades)."""

from __future__ import annotations

from alembic import command
from sqlalchemy.engine import Connection

from eventlog.stores._engine import StoreConfig, make_engine
from eventlog.stores.migrate import alembic_config


async def alembic_downgrade(dsn: str, revision: str) -> None:
    engine = make_engine(dsn, StoreConfig(pool_size=1))
    try:
        async with engine.connect() as conn:

            def downgrade(connection: Connection) -> None:
                config = alembic_config()
                config.attributes["connection"] = connection
                command.downgrade(config, revision)

            await conn.run_sync(downgrade)
            await conn.commit()
    finally:
        await engine.dispose()
