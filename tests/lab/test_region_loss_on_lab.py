"""Chaos on the lab: each region its own host (its PostgreSQL and its node on the host's address,
certificates for that address), writers in the root namespace; a whole host crashes (every
process of it killed at once), its shards fail over, it comes back, they fail back; then an
audit of every replica.

Needs the lab (root, iproute2, iptables, cgroup v1 cpu) and local PostgreSQL binaries; fails
loudly without them, never skips.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.harness.chaos import (
    Writers,
    conversations_per_shard,
    full_placement,
    get_json,
    percentile,
    recovery_times,
    tear_down,
    wait_until,
)
from tests.harness.chaos_audit import audit_after_writers
from tests.harness.lab import Lab
from tests.harness.lab_plane import lab_plane

SHARDS = 24
#: cores each region's host may use
HOST_CPU_QUOTA = 1.0
RECOVERY_WAIT_S = 30.0
FAILBACK_WAIT_S = 60.0


@pytest.mark.postgres
async def test_a_crashed_region_host_fails_over_then_back_without_losing_acks(
    lab: Lab, chaos_dir: Path
) -> None:
    plane = lab_plane(lab, chaos_dir / "plane", SHARDS, cpu_quota=HOST_CPU_QUOTA)
    writers: Writers | None = None
    running: asyncio.Task[None] | None = None
    try:
        info = await asyncio.to_thread(plane.start)
        urls = {r["name"]: r["url"] for r in info["regions"]}
        assert all("127.0.0.1" not in url for url in urls.values())
        key = info["api_key"]
        writers = Writers(urls, key, conversations_per_shard(SHARDS), SHARDS)
        running = asyncio.create_task(writers.run())
        await asyncio.sleep(3.0)
        victim = "ap-south"  # the lowest name: it also leads the control shard
        before = await get_json(urls["us-east"], "/v1/placement", key)
        moved = sorted(int(s) for s, r in before["assignment"].items() if r == victim)
        assert moved, "the victim leads no shard"
        fault_s = time.monotonic()
        await asyncio.to_thread(plane.kill_region, victim)

        async def all_recovered() -> bool:
            assert running is not None and writers is not None
            if running.done():
                running.result()  # a writer saw an unexpected answer: raise it
            rto = recovery_times(writers.acks, moved, victim, fault_s)
            return all(v is not None for v in rto.values())

        await wait_until(all_recovered, RECOVERY_WAIT_S, "every moved shard to ack again")
        rto = [v for v in recovery_times(writers.acks, moved, victim, fault_s).values() if v]
        print(
            f"\nhost crash: {len(moved)} shards moved; recovery p50 {percentile(rto, 50):.2f}s"
            f" p99 {percentile(rto, 99):.2f}s max {max(rto):.2f}s"
        )
        after = await get_json(urls["us-east"], "/v1/placement", key)
        assert after["down"] == [victim]
        for shard, region in before["assignment"].items():  # only the victim's shards moved
            if region != victim:
                assert after["assignment"][shard] == region

        await asyncio.to_thread(plane.restart_region, victim)
        full = {str(s): r for s, r in full_placement(list(urls), SHARDS).items()}

        async def failed_back() -> bool:
            p = await get_json(urls["us-east"], "/v1/placement", key)
            return bool(p["down"] == [] and p["assignment"] == full)

        await wait_until(failed_back, FAILBACK_WAIT_S, "failback to the full placement")
        await asyncio.sleep(2.0)  # writes after failback, on the restored leaders
        report = await audit_after_writers(plane, writers, running)
    finally:
        await tear_down(plane, writers, running)
    print(f"audit: {report}")
    assert report.problems == []
    assert report.acked_lost == 0 and report.acked > 100
