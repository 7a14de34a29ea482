"""Two nodes per region on the lab: each region's PostgreSQL on a host of its own and each of
its nodes on another (``LabPlane``, ``nodes_per_region=2``), the region's lease an advisory lock
held across the lab's network over TLS. The host of the node leading a region crashes under
load (every process of it killed at once, ``tests.harness.node_kill``): the region's node on
the other host takes over, and nothing leaves the region, as on loopback
(``tests/e2e/test_nodes_per_region.py``, whose check this shares).

The same node's host dropping every packet to and from the other hosts (it lives on, cut off)
is harder: nothing is refused or closed. Its database session holds the slot's lock until the
server gives the silent peer up (``eventlog.stores.region_lease.DEAD_HOLDER_S``, not TCP's two
hours), peers' forwards find no connection within ``forward_connect_timeout_s`` and go to the
other node, and those already in flight to it are given up once it has been silent for the
detection time. The region's other node takes over and nothing leaves the region either.

Needs the lab (root, iproute2, iptables, cgroup v1 cpu) and local PostgreSQL binaries; fails
loudly without them, never skips.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.test_nodes_per_region import check_stayed_in_region
from tests.harness.lab import Host, Lab
from tests.harness.lab_plane import lab_plane
from tests.harness.node_kill import node_kill

SHARDS = 12
VICTIM = "eu-west"
ENTRY = "us-east"


def _node_host_lost(lab: Lab, chaos_dir: Path, lose: Callable[[Host], None], what: str) -> None:
    """``lose(host)`` the host of the node leading a region, under load; the region's
    other node must take over, inside the region."""
    plane = lab_plane(lab, chaos_dir / "plane", SHARDS, nodes_per_region=2)
    try:
        info = plane.start()
        for member in plane.members:  # the nodes on their own hosts, apart from the database
            urls = [member.url, *(n.url for n in member.more_nodes)]
            hosts = [urlsplit(u).hostname for u in urls]
            assert hosts == [plane.node_host(member.name, i).address for i in range(2)]
            assert plane.hosts[member.name].address not in hosts

        def kill(node: dict[str, Any]) -> None:
            lose(plane.node_host(VICTIM, node["index"]))

        report = node_kill(info, VICTIM, ENTRY, kill)
        print(f"lab: node RTO (host {what} -> every conversation acked again): "
              f"{report.rto_s:.3f} s; refusals after it: {dict(report.refusals)}")  # fmt: skip
        check_stayed_in_region(report)
    finally:
        plane.stop()


@pytest.mark.postgres
def test_a_crashed_node_host_is_replaced_by_its_region_s_other_host(
    lab: Lab, chaos_dir: Path
) -> None:
    _node_host_lost(lab, chaos_dir, lambda host: host.kill(), "crashed")


@pytest.mark.postgres
def test_a_black_holed_node_host_is_replaced_by_its_region_s_other_host(
    lab: Lab, chaos_dir: Path
) -> None:
    def black_hole(victim: Host) -> None:
        for host in lab.hosts.values():
            if host is not victim:
                lab.partition(victim, host)

    _node_host_lost(lab, chaos_dir, black_hole, "black-holed")
