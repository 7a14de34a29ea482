"""Chaos: every link between the regions' nodes is reset again and again (each connection killed
with a TCP RST at both ends, new ones let through) while writers append through every region,
two thirds of them forwarded: notes with an Idempotency-Key, and tool attempts and their
effects without one. A forward whose connection dies after it left is sent again when the leader
answers a repeat with the first one's result (``services.api.forward_batch``: a key, or a tool
event's attempt id): the test goes on until the nodes resent some, then audits every replica:
no acknowledged append lost, no key or tool attempt applied twice, every acknowledgment true.
Needs local PostgreSQL binaries; fails loudly without them, never skips.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.local.faultproxy import HEALED
from tests.chaos.plane import chaos_plane
from tests.harness.chaos import Writers, conversations_per_shard, tear_down
from tests.harness.chaos_audit import audit_after_writers

SHARDS = 12
RESETS_S = 30.0  # at most this long resetting links, waiting for the nodes to resend
RESENT_MIN = 5


async def _resent(urls: dict[str, str]) -> float:
    """Forwards sent again after a lost attempt, over every node (their ``/metrics``)."""
    total = 0.0
    async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
        for url in urls.values():
            text = (await client.get(url + "/metrics")).text
            for family in text_string_to_metric_families(text):
                if family.name == "convplane_forwarded_requests":
                    total += sum(
                        s.value
                        for s in family.samples
                        if s.name.endswith("_total") and s.labels.get("outcome") == "resent"
                    )
    return total


@pytest.mark.postgres
async def test_forwards_on_reset_connections_are_sent_again_and_applied_once(
    chaos_dir: Path,
) -> None:
    plane = chaos_plane(chaos_dir, SHARDS, proxied=True)
    writers: Writers | None = None
    running: asyncio.Task[None] | None = None
    links = []
    try:
        info = await asyncio.to_thread(plane.start)
        urls = {r["name"]: r["url"] for r in info["regions"]}
        writers = Writers(
            urls,
            info["api_key"],
            conversations_per_shard(SHARDS, 3),
            SHARDS,
            keyless_tool_events=True,
        )
        running = asyncio.create_task(writers.run())
        links = [proxy for name, proxy in plane.proxies.items() if name.endswith(":http")]
        reset = dataclasses.replace(HEALED, up="cut", down="cut")
        await asyncio.sleep(2.0)  # the conversations exist, appends flow
        resets, resent = 0, 0.0
        deadline_s = time.monotonic() + RESETS_S
        while time.monotonic() < deadline_s and resent < RESENT_MIN:
            for proxy in links:
                proxy.set_rules(reset)  # every connection of the link gets a RST ...
                proxy.set_rules(HEALED)  # ... and the next one passes
            resets += 1
            await asyncio.sleep(0.2)
            if running.done():
                running.result()  # a writer's unexpected answer fails the test here
            if resets % 10 == 0:
                resent = await _resent(urls)
        unknown = sum("outcome_unknown" in f[4] for f in writers.failures)
        print(f"\nforward resets: {resets} rounds, {resent:.0f} forwards resent, {unknown} "
              f"appends answered outcome_unknown (retried by the writers)")  # fmt: skip
        assert resent >= RESENT_MIN, "the resets never caught a forward in flight"
        await asyncio.sleep(1.0)
        report = await audit_after_writers(plane, writers, running)
    finally:
        for proxy in links:
            proxy.set_rules(HEALED)
        await tear_down(plane, writers, running)
        await plane.close_proxies()
    print(f"audit: {report}")
    assert report.problems == []
    assert report.acked_lost == 0 and report.acked > 100
