"""Engines for the replica stores, and the one place driver errors become convplane errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from eventlog.errors import InvalidRequest, InvariantViolation, ReplicaUnavailable
from eventlog.stores.sqlite_locks import write_lock_note

#: execution option that makes a SQLite transaction start with BEGIN IMMEDIATE (writer lock)
SQLITE_WRITE_OPTION = "convplane_sqlite_write"
#: execution option marking a PostgreSQL engine whose connections all run in autocommit
AUTOCOMMIT_OPTION = "convplane_autocommit"


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Bounds of one store. Every name is a limit; see ``open_replica_store``."""

    #: how long a group waits for more appends after its first, while the replica is busy
    #: (the previous group held several appends; ``group_commit``'s docstring says why)
    batch_linger_ms: float = 8.0
    batch_events_max: int = 512  # entries per group (a call counts at least 1)
    queue_max: int = 4096  # appends waiting for a group; beyond it append fails fast
    statement_timeout_s: float = 5.0  # every database call (checkout + statement)
    connect_timeout_s: float = 5.0
    #: reads and prepares; the group committer and the status reads keep two more (PostgreSQL)
    pool_size: int = 5
    pool_max_overflow: int = 2

    def __post_init__(self) -> None:
        if self.batch_linger_ms < 0 or self.batch_events_max < 1 or self.queue_max < 1:
            raise InvalidRequest(f"invalid store limits: {self}")
        if self.statement_timeout_s <= 0 or self.connect_timeout_s <= 0 or self.pool_size < 1:
            raise InvalidRequest(f"invalid store limits: {self}")


def dialect_of(dsn: str) -> str:
    """``postgresql`` or ``sqlite``; anything else is a configuration error."""
    url = make_url(dsn)
    if url.drivername == "postgresql+asyncpg":
        return "postgresql"
    if url.drivername == "sqlite+aiosqlite" and url.database not in (None, "", ":memory:"):
        return "sqlite"
    raise InvalidRequest(
        f"unsupported replica dsn {url.render_as_string(hide_password=True)!r}: use "
        "postgresql+asyncpg://... or sqlite+aiosqlite:///path (a file: an ack must be durable)"
    )


def sqlite_file(engine: AsyncEngine) -> str | None:
    """The file of a SQLite engine (what ``translated`` names the write lock's holder of);
    None for PostgreSQL."""
    return engine.url.database if engine.dialect.name == "sqlite" else None


def make_engine(dsn: str, limits: StoreConfig, *, autocommit: bool = False) -> AsyncEngine:
    """A small pooled engine. PostgreSQL: asyncpg with a per-command timeout; ``autocommit``
    (the replica store's engine) makes every statement its own transaction. SQLite: WAL,
    synchronous=FULL (an ack survives power loss), and explicit BEGIN so that writers can take
    the database lock up front with BEGIN IMMEDIATE (the check-and-write is then atomic even with
    several processes on one file)."""
    if dialect_of(dsn) == "postgresql":
        return _postgres_engine(dsn, limits, autocommit=autocommit)
    engine = create_async_engine(
        dsn,
        pool_size=limits.pool_size,
        max_overflow=limits.pool_max_overflow,
        pool_pre_ping=True,
        pool_timeout=limits.statement_timeout_s,
        connect_args={"timeout": limits.statement_timeout_s},
    )
    busy_timeout_ms = int(limits.statement_timeout_s * 1000)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (below)
        cursor = dbapi_connection.cursor()
        for pragma in (
            "journal_mode=WAL",
            "synchronous=FULL",
            f"busy_timeout={busy_timeout_ms}",
            "foreign_keys=ON",
        ):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        write = connection.get_execution_options().get(SQLITE_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def _postgres_engine(dsn: str, limits: StoreConfig, *, autocommit: bool) -> AsyncEngine:
    """An autocommit engine checks a pooled connection locally instead of pinging it.

    SQLAlchemy's ``pool_pre_ping`` costs asyncpg three round trips per checkout (BEGIN, ``;``,
    ROLLBACK), and a node checks out for every replica status read: about 14 % of a node's
    CPU under load (``python -m bench.rest --py-spy``). What the ping catches, a database that
    restarted or dropped the connection, asyncpg already knows locally: the socket's EOF closes
    the connection (``is_closed``), and the checkout hook below discards it and takes a fresh
    one. A link that went silent without a close is caught by the statement timeout either
    way, and a disconnect seen mid-statement invalidates the pool (SQLAlchemy's default).
    """
    engine = create_async_engine(
        dsn,
        pool_size=limits.pool_size,
        max_overflow=limits.pool_max_overflow,
        pool_pre_ping=not autocommit,
        pool_timeout=limits.statement_timeout_s,
        connect_args={
            "timeout": limits.connect_timeout_s,
            "command_timeout": limits.statement_timeout_s,
            "server_settings": {"synchronous_commit": "on"},
        },
        **({"isolation_level": "AUTOCOMMIT"} if autocommit else {}),
    )
    if autocommit:
        engine.update_execution_options(**{AUTOCOMMIT_OPTION: True})

        @event.listens_for(engine.sync_engine, "checkout")
        def _discard_closed(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
            if dbapi_connection.driver_connection.is_closed():
                raise exc.DisconnectionError("the database closed this connection")

    return engine


@asynccontextmanager
async def translated(
    region: str, what: str, *, sqlite_write_to: str | None = None
) -> AsyncIterator[None]:
    """Driver errors -> ``ReplicaUnavailable`` (raised from the driver's exception), once.

    Errors that mean our SQL or data is wrong (integrity, programming, data errors) are bugs:
    ``InvariantViolation``. Everything that means "the database could not be reached or did not
    answer in time" is ``ReplicaUnavailable``, which the core treats as a lost message.
    ``sqlite_write_to``: the SQLite file a write goes to; its error names the write lock's
    holder (``sqlite_locks``).
    """
    try:
        yield
    except (exc.IntegrityError, exc.ProgrammingError, exc.DataError) as error:
        if _sqlstate(error) in SCHEMA_MISSING:
            raise ReplicaUnavailable(
                f"replica {region} has no convplane schema during {what} (database re-created "
                f"and not migrated yet?): {error}"
            ) from error
        raise InvariantViolation(f"{region}: {what}: {error}") from error
    except (exc.SQLAlchemyError, OSError, TimeoutError, UnicodeError) as error:
        if _is_bad_data(error):  # parameters the driver could not encode: our bug, not an outage
            raise InvariantViolation(f"{region}: {what}: {error}") from error
        holder = write_lock_note(sqlite_write_to) if sqlite_write_to else ""
        raise ReplicaUnavailable(
            f"replica {region} unavailable during {what}: {type(error).__name__}: {error}{holder}"
        ) from error


#: SQLSTATEs of a database without our schema (dropped and re-created, not migrated yet): an
#: outage of that replica, not a bug in our SQL. undefined_table, undefined_function,
#: invalid_catalog_name (the database itself is gone)
SCHEMA_MISSING = frozenset({"42P01", "42883", "3D000"})


def _sqlstate(error: BaseException) -> str | None:
    orig = getattr(error, "orig", None)
    for candidate in (orig, getattr(orig, "__cause__", None)):
        sqlstate = getattr(candidate, "sqlstate", None)
        if isinstance(sqlstate, str):
            return sqlstate
    return None


def _is_bad_data(error: BaseException) -> bool:
    """Values the database refused (not an outage): the driver could not encode a parameter,
    or PostgreSQL answered SQLSTATE class 22, "data exception" (e.g. a NUL in text)."""
    if isinstance(error, UnicodeError):
        return True
    if not isinstance(error, exc.StatementError):
        return False
    if isinstance(getattr(error, "orig", None), UnicodeError | ValueError):
        return True
    sqlstate = _sqlstate(error)
    return sqlstate is not None and sqlstate.startswith("22")


@asynccontextmanager
async def checked_out(
    engine: AsyncEngine, region: str, what: str, timeout_s: float, *, write: bool = False
) -> AsyncIterator[AsyncConnection]:
    """A pooled connection whose whole use runs under ``timeout_s`` with translated errors.

    PostgreSQL connections run in autocommit (every call is one statement, one round trip);
    ``write`` on SQLite makes the first ``begin()`` a BEGIN IMMEDIATE.
    """
    written = sqlite_file(engine) if write else None
    async with translated(region, what, sqlite_write_to=written), asyncio.timeout(timeout_s):
        async with engine.connect() as connection:
            if engine.dialect.name == "postgresql":
                if not engine.get_execution_options().get(AUTOCOMMIT_OPTION, False):
                    await connection.execution_options(isolation_level="AUTOCOMMIT")
            elif write:
                await connection.execution_options(**{SQLITE_WRITE_OPTION: True})
            yield connection
