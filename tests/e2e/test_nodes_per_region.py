"""Several nodes per region (``convplane up --nodes-per-region 2``): the region's two nodes
split its shards; SIGKILL of one of them, under load on its shards (``tests.harness.node_kill``),
is taken over by the region's other node, not by another region: every conversation is acked
again, the placement is the one from before the kill (no region declared down, no shard moved,
so nothing is replayed), the survivor leads every shard placed on the region, every acked event
is there, in order. The refusals writers got after the kill are printed, not asserted: a
request for a shard whose lead the survivor is preparing waits for it, at most a Retry-After,
and on a loaded machine (CI) preparing took longer, so some were told ``not_leader``. The node's RTO is printed, not bounded.

A kill drill of one node (``convplane drill run --kind kill --node 1``) does the same through
the drill API: the supervisor kills that node only and starts it again, and the drill's report
says the node's slot recovered, nothing was lost and the placement kept its version."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.plane import (
    CONVPLANE,
    convplane_env,
    plane_info,
    postgres_reachable_dir,
    start_plane,
    stop_plane,
)
from tests.harness.node_kill import NodeKillReport, node_kill, nodes_of, split_between

VICTIM = "eu-west"
ENTRY = "us-east"
#: how long ``convplane drill run`` may take (hold 4 s, restore, read-back), and how long a
#: start refused by preflight (a shard not writable yet, just after the plane came up) is
#: tried again
DRILL_RUN_WAIT_S = 180.0
PREFLIGHT_RETRY_S = 30.0


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
              f"{report.rto_s:.3f} s; refusals after the kill: {dict(report.refusals)}")  # fmt: skip
        check_stayed_in_region(report)
    finally:
        stop_plane(proc)


def test_a_node_kill_drill_kills_one_node_and_reports_that_it_stayed_in_its_region(
    state_dir: Path,
) -> None:
    proc, plane = start_plane(state_dir, "--nodes-per-region", "2")
    try:
        first, second = nodes_of(plane.info, VICTIM)
        split_between([first, second])
        run = [*CONVPLANE, "drill", "run", "--kind", "kill", "--region", VICTIM, "--node", "1",
               "--hold-s", "4", "--reason", "e2e node kill", "--state-dir", str(state_dir)]  # fmt: skip
        deadline = time.monotonic() + PREFLIGHT_RETRY_S
        while True:
            out = subprocess.run(run, env=convplane_env(), capture_output=True, text=True,
                                 timeout=DRILL_RUN_WAIT_S)  # fmt: skip
            if "preflight refused" not in out.stderr or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"kill of {VICTIM} node 1 -> passed" in out.stdout, out.stdout
        assert "placement unchanged, no shard left the region" in out.stdout
        operator = {"Authorization": f"Bearer {plane.info['operator_api_key']}"}
        with httpx.Client(base_url=first["url"], headers=operator, timeout=20.0) as client:
            [drill] = client.get("/v1/drills").json()["drills"]
            report = client.get(f"/v1/drills/{drill['drill_id']}/report").json()
        assert (report["verdict"], report["node"], report["stayed_in_region"]) == (
            "passed",
            1,
            True,
        )
        assert report["canary_lost"] == 0
        assert report["shards_recovered"] == report["shards_moved"] > 0, report
        assert len(set(report["placement_versions"].values())) == 1, report["placement_versions"]
        print(f"node kill drill: RTO by shard {report['rto_by_shard_s']}")
        with pytest.raises(ProcessLookupError):
            os.kill(second["node_pid"], 0)  # the node the drill named was SIGKILLed ...
        os.kill(first["node_pid"], 0)  # ... and only it: its sibling runs on
        restarted = nodes_of(plane_info(state_dir), VICTIM)[1]  # the supervisor started it again
        assert restarted["node_pid"] != second["node_pid"]
        os.kill(restarted["node_pid"], 0)
    finally:
        stop_plane(proc)
