"""The region's slot leases (``eventlog.stores.region_lease``) on real PostgreSQL and on a real
file: one holder at a time per slot, the next one gets it once the holder is gone (closed,
released, its session ended by the server, its process killed), and neither regions nor a
region's slots share one."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from eventlog.stores.region_lease import (
    SQLITE_LEASE_SUFFIX,
    FileRegionLease,
    RegionLease,
    open_region_lease,
)
from services.deploy.db_roles import asyncpg_dsn

TIMEOUT_S = 5.0


async def _open(dsn: str, region: str = "eu-west", slot: int = 0) -> RegionLease:
    return await open_region_lease(dsn, region, slot, timeout_s=TIMEOUT_S)


async def _slots_are_leases_of_their_own(dsn: str) -> None:
    """Slot 0 and slot 1 of one region are held by different nodes at once; a released slot
    goes to the next node that asks, and its old holder may take it again later."""
    first, second, taker = await _open(dsn), await _open(dsn, slot=1), await _open(dsn, slot=1)
    try:
        assert await first.try_acquire()
        assert await second.try_acquire()  # another slot of the same region
        assert not await taker.try_acquire()
        assert second.reachable and taker.reachable  # a refusal reached the store
        await second.release()
        assert not await second.still_held()
        assert await taker.try_acquire()
        await taker.release()
        assert await second.try_acquire()  # released, not closed: it can ask again
    finally:
        for lease in (first, second, taker):
            await lease.close()


@pytest.mark.postgres
async def test_a_regions_slots_are_leases_of_their_own_on_postgres(
    pg_databases: list[str],
) -> None:
    await _slots_are_leases_of_their_own(pg_databases[0])


async def test_a_regions_slots_are_leases_of_their_own_on_files(tmp_path: Path) -> None:
    await _slots_are_leases_of_their_own(f"sqlite+aiosqlite:///{tmp_path / 'replica.sqlite3'}")
    assert (tmp_path / f"replica.sqlite3{SQLITE_LEASE_SUFFIX}-1").exists()


@pytest.mark.postgres
async def test_one_holder_per_region_on_postgres(pg_databases: list[str]) -> None:
    dsn = pg_databases[0]
    first, second, other_region = await _open(dsn), await _open(dsn), await _open(dsn, "us-east")
    try:
        assert await first.try_acquire()
        assert not await second.try_acquire()
        assert await other_region.try_acquire()  # another region's lease is another lock
        assert await first.still_held()
        assert not await second.still_held()
        await first.close()
        assert await second.try_acquire()
        assert await second.still_held()
    finally:
        for lease in (first, second, other_region):
            await lease.close()


@pytest.mark.postgres
async def test_a_holder_whose_session_ended_lost_the_lease(pg_databases: list[str]) -> None:
    """The server ends the holder's session (what a restart or a cut connection does): the
    holder says it lost the lease, and a standby takes it."""
    dsn = pg_databases[0]
    holder, standby = await _open(dsn), await _open(dsn)
    try:
        assert await holder.try_acquire()
        admin = await asyncpg.connect(asyncpg_dsn(dsn))
        try:
            ended = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks "
                "WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()"
            )
        finally:
            await admin.close()
        assert ended == 1
        assert not await holder.still_held()
        assert await standby.try_acquire()
        assert not await holder.try_acquire()  # it asks again, as a standby does
    finally:
        await holder.close()
        await standby.close()


async def test_one_holder_per_file(tmp_path: Path) -> None:
    dsn = f"sqlite+aiosqlite:///{tmp_path / 'replica.sqlite3'}"
    first, second = await _open(dsn), await _open(dsn)
    try:
        assert isinstance(first, FileRegionLease)
        assert await first.try_acquire()
        assert await first.try_acquire()  # still its own
        assert not await second.try_acquire()
        await first.close()
        assert not await first.still_held()
        assert await second.try_acquire()
    finally:
        await first.close()
        await second.close()


async def test_a_killed_holder_process_frees_the_file_lease(tmp_path: Path) -> None:
    """Another process holds the lease and is killed with SIGKILL: the kernel releases the
    lock, with no timeout to wait out."""
    path = tmp_path / "replica.sqlite3"
    lease_file = f"{path}{SQLITE_LEASE_SUFFIX}"
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLD, lease_file, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        assert (await holder.stdout.readline()).strip() == b"held"
        standby = await _open(f"sqlite+aiosqlite:///{path}")
        try:
            assert not await standby.try_acquire()
            holder.kill()
            await holder.wait()
            deadline_s = time.monotonic() + TIMEOUT_S
            while not await standby.try_acquire():
                assert time.monotonic() < deadline_s, "the lease was not released"
                await asyncio.sleep(0.01)
        finally:
            await standby.close()
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()


_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
time.sleep(600)
"""
