"""Chaos, judged by an outsider's checker, on loopback: a real plane (3 PostgreSQL + 3 node
processes, every inter-region link through a fault proxy) runs
``tests.harness.linearizable_run`` (a history of appends, reads, tool attempts and racing
effects while one region is partitioned away and healed, then another killed with -9 and
restarted); Porcupine must find the history linearizable. Needs local PostgreSQL binaries and a
Go toolchain; fails loudly without them, never skips.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.plane import chaos_plane
from tests.harness.linearizable_run import check_a_history_under_partition_and_kill

SHARDS = 8


@pytest.mark.postgres
async def test_history_under_partition_and_kill_is_linearizable(
    chaos_dir: Path, lincheck_binary: Path
) -> None:
    plane = chaos_plane(chaos_dir, SHARDS, proxied=True)
    await check_a_history_under_partition_and_kill(plane, SHARDS, chaos_dir, lincheck_binary)
