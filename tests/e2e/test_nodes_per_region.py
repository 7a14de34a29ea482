"""Several nodes per region (``convplane up --nodes-per-region 2``): the region's two nodes
split its shards; SIGKILL of one of them, under load on its shards (``tests.harness.node_kill``),
is taken over by the region's other node, not by another region: every conversation is acked
again, the placement is the one from before the kill (no region declared down, no shard moved,
so nothing is replayed), the survivor leads every shard placed on the region, and every acked
event is there, in order. The node's RTO is printed, not bounded."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.plane import postgres_reachable_dir, start_plane, stop_plane
from tests.harness.node_kill import NodeKillReport, node_kill

VICTIM = "eu-west"
ENTRY = "us-east"


@pytest.fixture
def state_dir() -> Iterator[Path]:
    with postgres_reachable_dir("convplane-nodes-") as path:
        yield path


def check_stayed_in_region(report: NodeKillReport) -> None:
    """What a node's death inside a region of several nodes must leave behind."""
    assert report.writer_errors == []
    before, after = report.placement_before, report.placement_after
    assert after["version"] == before["version"], (before, after)
    assert after["assignment"] == before["assignment"]
    assert after["down"] == []
    killed, survivor = report.health_before
    assert killed["shards_led"] > 0 and survivor["shards_led"] > 0, report.health_before
    health = report.survivor_health
    region_shards = killed["shards_placed"] + survivor["shards_placed"]
    assert health["shards_placed"] == health["shards_led"] == region_shards, health
    assert report.not_read_back == {}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_dead_node_is_replaced_inside_its_region(state_dir: Path, backend: str) -> None:
    args = ["--nodes-per-region", "2", *(["--postgres"] if backend == "postgres" else [])]
    proc, plane = start_plane(state_dir, *args)

    def kill(node: dict[str, Any]) -> None:
        os.kill(node["node_pid"], signal.SIGKILL)

    try:
        report = node_kill(plane.info, VICTIM, ENTRY, kill)
        print(f"{backend}: node RTO (kill -> every conversation acked again): "
              f"{report.rto_s:.3f} s")  # fmt: skip
        check_stayed_in_region(report)
    finally:
        stop_plane(proc)
