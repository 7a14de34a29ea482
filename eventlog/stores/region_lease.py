"""A region's slot leases: which of a region's nodes leads which of the shards placed on it.

A region of N nodes splits the shards placed on it into N slots (``regions.placement.SlotMap``); the
node that holds a slot's lease leads that slot's shards. The region's nodes share its replica
database, so the database decides, and a holder's death releases its leases by itself, with no
timeout to wait out:

* **PostgreSQL**: a session-level advisory lock in the region's own database, on a connection
  kept open for it. A node that dies closes its connection (its process: at once), the server
  ends the session and the lock goes to the next node that asks. A holder whose host died or
  whose packets are dropped closes nothing: the session asks the server to give such a peer up
  within about ``DEAD_HOLDER_S`` (TCP keepalives, and ``tcp_user_timeout`` for what it sent
  and was never acknowledged), instead of TCP's defaults (two hours before the first
  keepalive), for which the slot's shards would have no leader.
* **SQLite** (every node on one machine): an exclusive ``flock`` on a file beside the database,
  which the kernel releases when the holding process exits.

A lease only says who *should* lead. Safety does not rest on it: two nodes that both believe
they hold it (a holder cut from its database while a standby takes the lock) only fence each
other's epochs on the replicas, as any two leaders of a shard do.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from eventlog.sharding import stable_hash
from eventlog.stores._engine import StoreConfig, dialect_of, make_engine

#: the advisory lock's first key ("conl"); the second is the slot's hash, so regions that share
#: one database (tests) hold leases of their own
LEASE_KEY = 0x636F6E6C
#: the suffix of the SQLite lease file of slot 0, beside the database file (slot i: ``-i`` more)
SQLITE_LEASE_SUFFIX = "-region-lease"
#: seconds after which the server ends the session of a holder it no longer hears (module
#: docstring): keepalives after 1 s of silence, each second, the last unanswered at this
DEAD_HOLDER_S = 3
#: the lease session's TCP settings for that (per session; ignored over a Unix socket)
_DEAD_HOLDER_SETTINGS = (
    "SET tcp_keepalives_idle = 1",
    "SET tcp_keepalives_interval = 1",
    f"SET tcp_keepalives_count = {DEAD_HOLDER_S - 1}",
    f"SET tcp_user_timeout = {DEAD_HOLDER_S * 1000}",
)


class RegionLease(Protocol):
    async def try_acquire(self) -> bool:
        """Take the lease if it is free; whether this node holds it now."""

    async def still_held(self) -> bool:
        """Whether this node still holds the lease it took (False once it is lost)."""

    async def release(self) -> None:
        """Give the lease up, if held; it may be taken again later."""

    async def close(self) -> None:
        """Release the lease, if held, and what it holds."""

    @property
    def reachable(self) -> bool:
        """Whether the last call reached the lease's store (a node that cannot reach it could
        not lead the slot, so does not ask for it back)."""


async def open_region_lease(
    dsn: str, region: str, slot: int = 0, *, timeout_s: float
) -> RegionLease:
    """The lease of ``region``'s node slot ``slot``, whose replica database is at ``dsn``; each
    call under ``timeout_s``. Slot 0's lease is the one a region of an earlier release had."""
    if dialect_of(dsn) == "postgresql":
        name = region if slot == 0 else f"{region}/{slot}"
        return PostgresRegionLease(dsn, name, timeout_s=timeout_s)
    path = dsn.split(":///", 1)[1] + SQLITE_LEASE_SUFFIX
    return FileRegionLease(path if slot == 0 else f"{path}-{slot}")


class PostgresRegionLease:
    def __init__(self, dsn: str, name: str, *, timeout_s: float) -> None:
        limits = StoreConfig(
            statement_timeout_s=timeout_s,
            connect_timeout_s=timeout_s,
            pool_size=1,
            pool_max_overflow=0,
        )
        self._engine = make_engine(dsn, limits, autocommit=True)
        self._keys = {"key": LEASE_KEY, "region": stable_hash(name) & 0x7FFFFFFF}
        self._timeout_s = timeout_s
        self._connection: AsyncConnection | None = None
        self._held = False
        self._reachable = True

    @property
    def reachable(self) -> bool:
        return self._reachable

    async def try_acquire(self) -> bool:
        if self._held:
            return True
        statement = text("SELECT pg_try_advisory_lock(:key, :region)")
        try:
            async with asyncio.timeout(self._timeout_s):
                if self._connection is None:
                    self._connection = await self._engine.connect()
                    for setting in _DEAD_HOLDER_SETTINGS:
                        await self._connection.execute(text(setting))
                result = await self._connection.execute(statement, self._keys)
                self._held = bool(result.scalar_one())
            self._reachable = True
        except (OSError, SQLAlchemyError, TimeoutError):
            self._reachable = False
            await self.release()
        return self._held

    async def still_held(self) -> bool:
        if not self._held or self._connection is None:
            return False
        try:  # the session lives, so its lock does (nothing here ever unlocks it)
            async with asyncio.timeout(self._timeout_s):
                await self._connection.execute(text("SELECT 1"))
            self._reachable = True
        except (OSError, SQLAlchemyError, TimeoutError):
            self._reachable = False
            await self.release()
        return self._held

    async def close(self) -> None:
        await self.release()
        await self._engine.dispose()

    async def release(self) -> None:
        """Forget the lease and end its session: the server releases the lock (at once, if
        the connection still reaches it). The connection is invalidated, not returned to the
        pool: a pooled connection keeps its session, and so the lock."""
        self._held = False
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._timeout_s):
                    await connection.invalidate()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._timeout_s):
                    await connection.close()


class FileRegionLease:
    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None

    @property
    def reachable(self) -> bool:
        return True  # a file beside the database, on the node's own machine

    async def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    async def still_held(self) -> bool:
        return self._fd is not None  # the kernel never takes a flock back from a live holder

    async def close(self) -> None:
        await self.release()

    async def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # releases the lock
