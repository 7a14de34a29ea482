"""CPU seconds of process trees (a node, a postmaster and its backends), read from ``/proc``."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU seconds of a live process and of its children that ended (a PostgreSQL backend
    that exits moves into its postmaster's cutime/cstime), 0 when it is gone. Summed over the
    live processes of a tree this counts every CPU second once."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / CLOCK_TICKS_PER_S


def descendants(root: int) -> list[int]:
    """``root`` and every live process below it (a postmaster and its backends)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def cpu_snapshot(groups: dict[str, int]) -> dict[str, dict[int, float]]:
    """Per named group (a node pid, a postmaster pid) the CPU seconds of each of its processes."""
    return {name: {pid: cpu_s(pid) for pid in descendants(root)} for name, root in groups.items()}


def cpu_used(before: dict[str, dict[int, float]], groups: dict[str, int]) -> dict[str, float]:
    after = cpu_snapshot(groups)
    return {
        name: sum(after[name][pid] - before[name].get(pid, 0.0) for pid in after[name])
        for name in groups
    }
