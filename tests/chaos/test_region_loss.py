"""Chaos: kill -9 a whole region (node and PostgreSQL) under concurrent writers, fail over,
restart it, fail back; then audit every replica directly.

Needs local PostgreSQL binaries (``services.local.postgres``); fails loudly without them, never skips.
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
RECOVERY_WAIT_S = 30.0
FAILBACK_WAIT_S = 60.0


@pytest.mark.postgres
async def test_kill9_region_fails_over_then_back_without_losing_acks(chaos_dir: Path) -> None:
    plane = chaos_plane(chaos_dir, SHARDS)
    info = await asyncio.to_thread(plane.start)
    urls = {r["name"]: r["url"] for r in info["regions"]}
    writers = Writers(urls, info["api_key"], conversations_per_shard(SHARDS), SHARDS)
    running = asyncio.create_task(writers.run())
    try:
        await asyncio.sleep(3.0)
        victim = "ap-south"  # the lowest name: it also leads the control shard
        before = await get_json(urls["us-east"], "/v1/placement", info["api_key"])
        moved = sorted(int(s) for s, r in before["assignment"].items() if r == victim)
        assert moved, "the victim leads no shard; pick another seed"
        fault_s, fault_wall_ms = time.monotonic(), time.time_ns() // 1_000_000
        await asyncio.to_thread(plane.kill_region, victim)

        async def all_recovered() -> bool:
            if running.done():
                running.result()  # a writer saw an unexpected answer: raise it
            rto = recovery_times(writers.acks, moved, victim, fault_s)
            return all(v is not None for v in rto.values())

        await wait_until(all_recovered, RECOVERY_WAIT_S, "every moved shard to ack again")
        rto = recovery_times(writers.acks, moved, victim, fault_s)
        values = [v for v in rto.values() if v is not None]
        print(
            f"\nregion loss: {len(moved)} shards moved; recovery p50 {percentile(values, 50):.2f}s"
            f" p99 {percentile(values, 99):.2f}s max {max(values):.2f}s"
        )
        after = await get_json(urls["us-east"], "/v1/placement", info["api_key"])
        assert after["down"] == [victim]
        for shard, region in before["assignment"].items():  # only the victim's shards moved
            if region != victim:
                assert after["assignment"][shard] == region
        regions = await get_json(urls["eu-west"], "/v1/regions", info["api_key"])
        status = {r["name"]: r["status"] for r in regions["regions"]}
        assert status == {"us-east": "up", "eu-west": "up", "ap-south": "down"}

        await asyncio.to_thread(plane.restart_region, victim)
        full = {str(s): r for s, r in full_placement(list(urls), SHARDS).items()}

        async def failed_back() -> bool:
            p = await get_json(urls["us-east"], "/v1/placement", info["api_key"])
            return bool(p["down"] == [] and p["assignment"] == full)

        await wait_until(failed_back, FAILBACK_WAIT_S, "failback to the full placement")
        await asyncio.sleep(2.0)  # writes after failback, on the restored leaders
        route = await get_json(
            urls["us-east"], f"/v1/conversations/{writers.conversations[0]}/route", info["api_key"]
        )
        assert route["region"] == full[str(route["shard"])] and route["worker"] is None
        report = await audit_after_writers(plane, writers, running)
    finally:
        await tear_down(plane, writers, running)
    print(f"audit: {report}")
    print("recovery per shard:", {s: round(v or -1, 2) for s, v in rto.items()})
    print(
        "new leaders (shard: region, s after the fault):",
        {
            s: (r, round((ms - fault_wall_ms) / 1000, 2))
            for (s, _), (r, ms) in sorted(report.leaders.items())
            if ms >= fault_wall_ms
        },
    )
    assert report.problems == []
    assert report.acked_lost == 0 and report.acked > 100
