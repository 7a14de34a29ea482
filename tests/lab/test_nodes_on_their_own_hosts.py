"""Two nodes per region on the lab: each region's PostgreSQL on a host of its own and each of
its nodes on another (``LabPlane``, ``nodes_per_region=2``), the region's lease an advisory lock
held across the lab's network over TLS. The host of the node leading a region crashes under
load (every process of it killed at once, ``tests.harness.node_kill``): the region's node on
the other host takes over, and nothing leaves the region, as on loopback
(``tests/e2e/test_nodes_per_region.py``, whose check this shares).

Needs the lab (root, iproute2, iptables, cgroup v1 cpu) and local PostgreSQL binaries; fails
loudly without them, never skips.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.test_nodes_per_region import check_stayed_in_region
from tests.harness.lab import Lab
from tests.harness.lab_plane import lab_plane
from tests.harness.node_kill import node_kill

SHARDS = 12
VICTIM = "eu-west"
ENTRY = "us-east"


@pytest.mark.postgres
def test_a_crashed_node_host_is_replaced_by_its_region_s_other_host(
    lab: Lab, chaos_dir: Path
) -> None:
    plane = lab_plane(lab, chaos_dir / "plane", SHARDS, nodes_per_region=2)
    try:
        info = plane.start()
        for member in plane.members:  # the nodes on their own hosts, apart from the database
            urls = [member.url, *(n.url for n in member.more_nodes)]
            hosts = [urlsplit(u).hostname for u in urls]
            assert hosts == [plane.node_host(member.name, i).address for i in range(2)]
            assert plane.hosts[member.name].address not in hosts

        def kill(node: dict[str, Any]) -> None:
            plane.node_host(VICTIM, node["index"]).kill()

        report = node_kill(info, VICTIM, ENTRY, kill)
        print(f"lab: node RTO (host crash -> every conversation acked again): {report.rto_s:.3f} s")
        check_stayed_in_region(report)
    finally:
        plane.stop()
