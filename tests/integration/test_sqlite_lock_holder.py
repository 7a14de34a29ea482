"""A write to a SQLite replica that waits past its deadline for the file's write lock says which
process holds the lock: an operator, or a CI log, can then tell a busy writer from a stuck one
(two clean-clone CI runs failed on a replica's write lock held for longer than the wait, and
said nothing of who held it)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog.errors import ReplicaUnavailable
from eventlog.identity import IdentityRecord
from eventlog.stores import open_replica_store
from eventlog.stores.sqlite_locks import write_lock_holders

#: a process that takes the file's write lock, says so, and keeps it until its stdin closes
HOLDER = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def replica(tmp_path: Path) -> Path:
    return tmp_path / "replica.sqlite3"


@pytest.fixture
def held_by_another_process(replica: Path) -> Iterator[int]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(replica)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.communicate(timeout=30)


async def test_a_write_that_times_out_on_the_lock_names_the_process_holding_it(
    replica: Path, request: pytest.FixtureRequest
) -> None:
    dsn = f"sqlite+aiosqlite:///{replica}"
    store = await open_replica_store(dsn, "us-east", statement_timeout_s=0.3)
    try:
        holder_pid: int = request.getfixturevalue("held_by_another_process")  # after migrating
        assert write_lock_holders(str(replica)) == [holder_pid]
        with pytest.raises(ReplicaUnavailable) as caught:
            await store.record_identity("eu-west", IdentityRecord("abc", 1))
        message = str(caught.value)
        assert f"write lock held by pid {holder_pid}: {sys.executable}" in message
    finally:
        await store.close()


async def test_no_holder_is_named_when_nobody_holds_the_lock(replica: Path) -> None:
    store = await open_replica_store(f"sqlite+aiosqlite:///{replica}", "us-east")
    try:
        await store.record_identity("eu-west", IdentityRecord("abc", 1))
        assert write_lock_holders(str(replica)) == []
    finally:
        await store.close()


def test_waiters_and_other_files_are_not_holders(tmp_path: Path) -> None:
    database = tmp_path / "replica.sqlite3"
    shm = Path(str(database) + "-shm")
    shm.write_bytes(b"")
    inode = os.stat(shm).st_ino
    proc_locks = tmp_path / "locks"
    proc_locks.write_text(
        f"1: POSIX  ADVISORY  WRITE 101 fe:00:{inode} 120 120\n"
        f"1: -> POSIX  ADVISORY  WRITE 102 fe:00:{inode} 120 120\n"  # waiting for it
        f"2: POSIX  ADVISORY  READ 103 fe:00:{inode} 124 124\n"  # a reader's lock
        f"3: POSIX  ADVISORY  WRITE 104 fe:00:{inode + 1} 120 120\n"  # another file
        f"4: POSIX  ADVISORY  WRITE 105 fe:00:{inode} 0 EOF\n"  # the whole file
        f"5: POSIX  ADVISORY  WRITE x fe:00:{inode} ? 120\n"  # a shape not known: skipped
    )
    assert write_lock_holders(str(database), proc_locks) == [101, 105]
