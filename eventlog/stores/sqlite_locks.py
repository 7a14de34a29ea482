"""Which process holds a SQLite file's write lock, for the error of a write that waited too long.

A SQLite replica is written by every node that leads a shard, and by operator commands; a
write that waits past its deadline says who held the lock, so an operator (or a CI log) can
tell a busy writer from a stuck one. In WAL mode the write lock is a POSIX lock on byte 120 of
the ``-shm`` file (``WAL_WRITE_LOCK``), which Linux lists in ``/proc/locks`` with its pid.
Elsewhere nothing is found and the error says nothing more.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC_LOCKS = Path("/proc/locks")
#: the byte of the ``-shm`` file whose lock is SQLite's WAL write lock
WAL_WRITE_LOCK_BYTE = 120
_CMDLINE_MAX = 160


def write_lock_holders(database: str, proc_locks: Path = PROC_LOCKS) -> list[int]:
    """The pids holding ``database``'s WAL write lock (none where it cannot be known)."""
    try:
        shm_inode = os.stat(database + "-shm").st_ino
        lines = proc_locks.read_text().splitlines()
    except OSError:
        return []
    holders = []
    for line in lines:
        fields = line.split()
        if len(fields) < 8 or fields[1] == "->":  # "->": a waiter, not a holder
            continue
        _, kind, _, _, pid, device, start, end = fields[:8]
        if kind != "POSIX" or device.rsplit(":", 1)[-1] != str(shm_inode):
            continue
        try:  # a line of another shape is nobody's: an error path must not raise its own
            first, last = int(start), WAL_WRITE_LOCK_BYTE if end == "EOF" else int(end)
            if first <= WAL_WRITE_LOCK_BYTE <= last:
                holders.append(int(pid))
        except ValueError:
            continue
    return holders


def write_lock_note(database: str) -> str:
    """`` (write lock held by pid N: its command line)`` or, where no holder is known, ``""``."""
    holders = write_lock_holders(database)
    if not holders:
        return ""
    described = "; ".join(f"pid {pid}: {_command_line(pid)}" for pid in holders)
    return f" (write lock held by {described})"


def _command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return text[:_CMDLINE_MAX] + ("..." if len(text) > _CMDLINE_MAX else "")
