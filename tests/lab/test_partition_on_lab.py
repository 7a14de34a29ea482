"""Chaos on the lab: one region's host cut off from the other regions' hosts by dropped packets
(no refusal ever comes back; the writers in the root namespace still reach every host); its
shards fail over, the minority side acknowledges nothing while cut off, heal, fail back; then an
audit of every replica (``chaos_scenarios.partition``, as ``tests/chaos`` runs it through
proxies).

Needs the lab and local PostgreSQL binaries; fails loudly without them, never skips.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.chaos_scenarios import partition
from tests.harness.lab import Lab
from tests.harness.lab_plane import lab_plane

SHARDS = 24
#: cores each region's host may use
HOST_CPU_QUOTA = 1.0


@pytest.mark.postgres
async def test_a_region_host_cut_off_by_dropped_packets_acks_nothing_and_fails_over(
    lab: Lab, chaos_dir: Path
) -> None:
    plane = lab_plane(lab, chaos_dir / "plane", SHARDS, cpu_quota=HOST_CPU_QUOTA)
    report = await partition(plane, SHARDS)
    assert report.problems == []
    assert report.acked_lost == 0 and report.acked > 100
