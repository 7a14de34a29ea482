"""Chaos on the lab: each region its own host (its PostgreSQL and its node on the host's address,
certificates for that address), writers in the root namespace; a whole host crashes (every
process of it killed at once), its shards fail over, it comes back, they fail back; then an
audit of every replica (``chaos_scenarios.region_loss``, as ``tests/chaos`` runs it on loopback).

Needs the lab (root, iproute2, iptables, cgroup v1 cpu) and local PostgreSQL binaries; fails
loudly without them, never skips.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.harness.chaos_scenarios import region_loss
from tests.harness.lab import Lab
from tests.harness.lab_plane import lab_plane

SHARDS = 24
#: cores each region's host may use
HOST_CPU_QUOTA = 1.0


@pytest.mark.postgres
async def test_a_crashed_region_host_fails_over_then_back_without_losing_acks(
    lab: Lab, chaos_dir: Path
) -> None:
    plane = lab_plane(lab, chaos_dir / "plane", SHARDS, cpu_quota=HOST_CPU_QUOTA)
    report = await region_loss(plane, SHARDS)
    for member in plane.members:  # every node on its own host's address
        assert urlsplit(member.url).hostname == plane.hosts[member.name].address
    assert report.problems == []
    assert report.acked_lost == 0 and report.acked > 100
