"""The chaos tier's scenarios, on any ``ChaosPlane``: 3 regions on loopback with fault proxies
(``tests/chaos``) or 3 hosts of a lab (``tests/lab``, ``tests.harness.lab_plane``). Each starts
the plane, drives writers over HTTP from the test process, injects its fault through the plane
(``kill_region``, ``partition``, ``heal``, ``restart_region``), checks what the plane reports
and ends with the audit of every replica (``chaos_audit``); the plane is stopped on every path.
"""

from __future__ import annotations

import asyncio
import time

from tests.harness.chaos import (
    ChaosPlane,
    Writers,
    conversations_per_shard,
    full_placement,
    get_json,
    percentile,
    recovery_times,
    tear_down,
    wait_led_as_placed,
    wait_until,
)
from tests.harness.chaos_audit import AuditReport, audit_after_writers

#: seconds every moved shard may take to ack again on another region
RECOVERY_WAIT_S = 30.0
#: seconds the plane may take to lead every shard as placed (at start, after heal or restart:
#: a restarted region's PostgreSQL and node start first, on a machine other tests share)
FAILBACK_WAIT_S = 120.0
#: seconds a partition lasts
CUT_S = 6.0
#: clock granularity between the leader's committed_at and the test's cut time
ASSIGNED_GRACE_S = 0.05
#: seconds of writes on the restored leaders before the audit
AFTER_FAILBACK_S = 2.0


async def region_loss(plane: ChaosPlane, shard_count: int) -> AuditReport:
    """Kill a whole region (node and database) under writers: only its shards move, the others
    see it down; restart it, fail back; the audit's report (the caller asserts on it)."""
    writers: Writers | None = None
    running: asyncio.Task[None] | None = None
    try:
        urls, key, writers, running = await _start_with_writers(plane, shard_count, "us-east")
        victim = "ap-south"  # the lowest name: it also leads the control shard
        before = await get_json(urls["us-east"], "/v1/placement", key)
        moved = sorted(int(s) for s, r in before["assignment"].items() if r == victim)
        assert moved, "the victim leads no shard"
        fault_s, fault_wall_ms = time.monotonic(), time.time_ns() // 1_000_000
        await asyncio.to_thread(plane.kill_region, victim)
        await _wait_recovered(writers, running, moved, victim, fault_s, "region loss")
        after = await get_json(urls["us-east"], "/v1/placement", key)
        assert after["down"] == [victim]
        for shard, region in before["assignment"].items():  # only the victim's shards moved
            if region != victim:
                assert after["assignment"][shard] == region
        regions = await get_json(urls["eu-west"], "/v1/regions", key)
        status = {r["name"]: r["status"] for r in regions["regions"]}
        assert status == {"us-east": "up", "eu-west": "up", "ap-south": "down"}

        restart_s = time.monotonic()
        await asyncio.to_thread(plane.restart_region, victim)
        await wait_led_as_placed(
            urls["us-east"], key, writers, restart_s, FAILBACK_WAIT_S, "failback"
        )
        await asyncio.sleep(AFTER_FAILBACK_S)
        full = full_placement(list(urls), shard_count)
        route = await get_json(
            urls["us-east"], f"/v1/conversations/{writers.conversations[0]}/route", key
        )
        assert route["region"] == full[route["shard"]] and route["worker"] is None
        report = await audit_after_writers(plane, writers, running)
    finally:
        await tear_down(plane, writers, running)
    print(f"audit: {report}")
    print(
        "new leaders (shard: region, s after the fault):",
        {
            s: (r, round((ms - fault_wall_ms) / 1000, 2))
            for (s, _), (r, ms) in sorted(report.leaders.items())
            if ms >= fault_wall_ms
        },
    )
    return report


async def partition(plane: ChaosPlane, shard_count: int) -> AuditReport:
    """Cut one region off from the others (the writers still reach it): the majority declares it
    down and takes its shards, the minority declares nobody down and acknowledges nothing
    assigned after the cut; heal, fail back; the audit's report."""
    writers: Writers | None = None
    running: asyncio.Task[None] | None = None
    try:
        urls, key, writers, running = await _start_with_writers(plane, shard_count, "eu-west")
        victim = "us-east"
        before = await get_json(urls["eu-west"], "/v1/placement", key)
        moved = sorted(int(s) for s, r in before["assignment"].items() if r == victim)
        assert moved, "the victim leads no shard"
        cut_s, cut_wall_s = time.monotonic(), time.time()
        plane.partition(victim)
        await _wait_recovered(writers, running, moved, victim, cut_s, "partition")
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
        await wait_led_as_placed(urls["eu-west"], key, writers, heal_s, FAILBACK_WAIT_S, "failback")
        await asyncio.sleep(AFTER_FAILBACK_S)
        report = await audit_after_writers(plane, writers, running)
    finally:
        await tear_down(plane, writers, running)
        await plane.close_proxies()
    print(f"audit: {report}")
    return report


async def _start_with_writers(
    plane: ChaosPlane, shard_count: int, observer: str
) -> tuple[dict[str, str], str, Writers, asyncio.Task[None]]:
    """Start the plane and one writer per shard; return (urls, api key, writers, their task)
    once ``observer`` sees every shard led as placed."""
    info = await asyncio.to_thread(plane.start)
    urls = {r["name"]: r["url"] for r in info["regions"]}
    key = info["api_key"]
    writers = Writers(urls, key, conversations_per_shard(shard_count), shard_count)
    running = asyncio.create_task(writers.run())
    try:
        await wait_led_as_placed(
            urls[observer], key, writers, time.monotonic(), FAILBACK_WAIT_S, "the first leaders"
        )
    except BaseException:
        await tear_down(plane, writers, running)
        raise
    return urls, key, writers, running


async def _wait_recovered(
    writers: Writers,
    running: asyncio.Task[None],
    moved: list[int],
    victim: str,
    fault_s: float,
    fault: str,
) -> None:
    """Until every moved shard acked a write served by another region; prints the RTOs."""

    async def recovered() -> bool:
        if running.done():
            running.result()  # a writer saw an unexpected answer: raise it
        rto = recovery_times(writers.acks, moved, victim, fault_s)
        return all(v is not None for v in rto.values())

    await wait_until(recovered, RECOVERY_WAIT_S, "every moved shard to ack again elsewhere")
    rto = [v for v in recovery_times(writers.acks, moved, victim, fault_s).values() if v]
    print(
        f"\n{fault}: {len(moved)} shards moved; recovery p50 {percentile(rto, 50):.2f}s"
        f" p99 {percentile(rto, 99):.2f}s max {max(rto):.2f}s"
    )
