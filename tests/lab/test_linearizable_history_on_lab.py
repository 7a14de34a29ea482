"""Chaos judged by Porcupine on the lab: each region its own host (its PostgreSQL and its node
on the host's address, under a CPU quota), clients in the root namespace reaching every host,
the cut-off one included. ``tests.harness.linearizable_run`` partitions one region's host by
dropped packets (nothing is refused: the peers' calls time out), heals it, then crashes another
region's host (its node and its database killed at once) and brings it back; the recorded
history must be linearizable.

Needs the lab (root, iproute2, iptables, cgroup v1 cpu), local PostgreSQL binaries and a Go
toolchain; fails loudly without them, never skips.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.lab import Lab
from tests.harness.lab_plane import lab_plane
from tests.harness.linearizable_run import check_a_history_under_partition_and_kill

SHARDS = 8
#: cores each region's host may use
HOST_CPU_QUOTA = 1.0


@pytest.mark.postgres
async def test_a_history_across_lab_hosts_under_dropped_packets_and_a_host_crash_is_linearizable(
    lab: Lab, chaos_dir: Path, lincheck_binary: Path
) -> None:
    plane = lab_plane(lab, chaos_dir / "plane", SHARDS, cpu_quota=HOST_CPU_QUOTA)
    await check_a_history_under_partition_and_kill(plane, SHARDS, chaos_dir, lincheck_binary)
