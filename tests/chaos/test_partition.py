"""Chaos: partition one region away (every link to and from the other regions' nodes and
databases black-holed by fault proxies), fail over, heal, fail back; audit every replica.

The minority side must acknowledge nothing while cut off. Needs local PostgreSQL binaries; fails
loudly without them, never skips.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.chaos.plane import chaos_plane
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

SHARDS = 24
CUT_S = 6.0
#: clock granularity between the leader's committed_at and the test's cut time
ASSIGNED_GRACE_S = 0.05


@pytest.mark.postgres
async def test_partitioned_region_acks_nothing_and_its_shards_fail_over(chaos_dir: Path) -> None:
    plane = chaos_plane(chaos_dir, SHARDS, proxied=True)
    writers: Writers | None = None
    running: asyncio.Task[None] | None = None
    try:
        info = await asyncio.to_thread(plane.start)
        urls = {r["name"]: r["url"] for r in info["regions"]}
        key = info["api_key"]
        writers = Writers(urls, key, conversations_per_shard(SHARDS), SHARDS)
        running = asyncio.create_task(writers.run())
        await asyncio.sleep(3.0)
        victim = "us-east"
        before = await get_json(urls["eu-west"], "/v1/placement", key)
        moved = sorted(int(s) for s, r in before["assignment"].items() if r == victim)
        cut_s = time.monotonic()
        cut_wall_s = time.time()
        plane.partition(victim)

        async def recovered() -> bool:
            assert running is not None and writers is not None
            if running.done():
                running.result()
            rto = recovery_times(writers.acks, moved, victim, cut_s)
            return all(v is not None for v in rto.values())

        await wait_until(recovered, 30.0, "the partitioned region's shards to ack elsewhere")
        rto = [v for v in recovery_times(writers.acks, moved, victim, cut_s).values() if v]
        print(
            f"\npartition: {len(moved)} shards moved; recovery p50 {percentile(rto, 50):.2f}s "
            f"p99 {percentile(rto, 99):.2f}s max {max(rto):.2f}s"
        )
        seen_by_majority = await get_json(urls["eu-west"], "/v1/regions", key)
        assert {r["name"]: r["status"] for r in seen_by_majority["regions"]}[victim] == "down"
        seen_by_minority = await get_json(urls[victim], "/v1/regions", key)
        minority_view = {r["name"]: r["status"] for r in seen_by_minority["regions"]}
        assert minority_view[victim] == "up"  # it cannot declare anyone down alone
        assert "down" not in minority_view.values()
        await asyncio.sleep(max(0.0, cut_s + CUT_S - time.monotonic()))
        heal_s = time.monotonic()
        plane.heal()

        # The minority side acknowledged nothing while cut off: no ack it served is of an entry
        # assigned after the cut (an entry assigned before it may have reached its quorum before
        # it, and its HTTP answer may still arrive late on this loaded machine).
        minority_acks = [
            a
            for a in writers.acks
            if a.served_by == victim
            and a.assigned_wall_s > cut_wall_s + ASSIGNED_GRACE_S
            and a.acked_s <= heal_s
        ]
        assert minority_acks == [], (cut_wall_s, minority_acks[:5])

        full = {str(s): r for s, r in full_placement(list(urls), SHARDS).items()}

        async def failed_back() -> bool:
            p = await get_json(urls["eu-west"], "/v1/placement", key)
            return bool(p["down"] == [] and p["assignment"] == full)

        await wait_until(failed_back, 60.0, "failback after heal")
        await asyncio.sleep(2.0)
        report = await audit_after_writers(plane, writers, running)
    finally:
        await tear_down(plane, writers, running)
        await plane.close_proxies()
    print(f"audit: {report}")
    assert report.problems == []
    assert report.acked_lost == 0 and report.acked > 100
