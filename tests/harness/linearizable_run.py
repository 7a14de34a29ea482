"""The linearizability run, on whatever plane a test hands it: clients record a history of
appends, transcript reads, last-seq reads, tool attempts, racing tool effects and
attempt-status reads while one region is partitioned away and healed (its shards fail over
and back) and then another is killed with -9 and restarted; Porcupine (``tests/lincheck``) must
find the whole history linearizable.

Clients reach every node directly, the cut-off one included, so a deposed leader answering
reads from its own memory, a read of uncommitted state, a lost acknowledgment, a second effect
for one attempt or an attempt shown pending after its effect committed (what an application
checks before it re-runs a tool) shows up as a non-linearizable history.

``tests/chaos/test_linearizable_history.py`` runs it on loopback with fault proxies;
``tests/lab/test_linearizable_history_on_lab.py`` on the lab's hosts, where a partition drops
packets and a kill takes the host's database with its node.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from eventlog.sharding import shard_of
from tests.harness.chaos import ChaosPlane, get_json
from tests.lincheck.checker import check_history
from tests.lincheck.history import HistoryRecorder

CONVERSATIONS = 6
CLIENTS_PER_CONVERSATION = 3
SEED = 7
CALM_S = 3.0
PARTITION_S = 6.0
AFTER_HEAL_S = 6.0  # failback hysteresis is 3 s in FAST_ENV: shards move back in this window
KILLED_S = 5.0
AFTER_RESTART_S = 5.0


async def check_a_history_under_partition_and_kill(
    plane: ChaosPlane, shard_count: int, chaos_dir: Path, lincheck_binary: Path
) -> None:
    """Start ``plane``, run the clients through the faults, check the history (asserting),
    stop the plane whatever happens."""
    clients: list[asyncio.Task[None]] = []
    recorder: HistoryRecorder | None = None
    try:
        info = await asyncio.to_thread(plane.start)
        urls = {r["name"]: r["url"] for r in info["regions"]}
        recorder = HistoryRecorder(urls, info["api_key"], SEED)
        placement = await get_json(urls["us-east"], "/v1/placement", info["api_key"])
        conversations = [f"lin-{i}" for i in range(CONVERSATIONS)]
        leaders = [placement["assignment"][str(shard_of(c, shard_count))] for c in conversations]
        # cut off the region leading most of the conversations; then kill another one
        cut = max(sorted(urls), key=leaders.count)
        killed = next(r for r in sorted(urls) if r != cut)
        headers = {"Authorization": f"Bearer {info['api_key']}"}
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=50)
        async with httpx.AsyncClient(headers=headers, limits=limits, trust_env=False) as client:
            for c in conversations:
                await recorder.create(client, c)
            clients = [
                asyncio.create_task(recorder.run_client(client, i * CONVERSATIONS + n, c))
                for n, c in enumerate(conversations)
                for i in range(CLIENTS_PER_CONVERSATION)
            ]
            await asyncio.sleep(CALM_S)
            plane.partition(cut)
            await asyncio.sleep(PARTITION_S)
            plane.heal()
            await asyncio.sleep(AFTER_HEAL_S)
            await asyncio.to_thread(plane.kill_region, killed)
            await asyncio.sleep(KILLED_S)
            await asyncio.to_thread(plane.restart_region, killed)
            await asyncio.sleep(AFTER_RESTART_S)
            recorder.stop.set()
            await asyncio.gather(*clients)
            await recorder.final_reads(client)
        history = chaos_dir / "history.json"
        recorder.write(history)
        counts = recorder.counts()
        print(
            f"\nhistory: cut {cut}, killed {killed}; operations {counts}, "
            f"failed append attempts {recorder.failed_attempts}"
        )
        # the run must have exercised what it claims: faults answered with unknown outcomes,
        # and reads at every region
        assert recorder.failed_attempts > 0, "no append saw the faults"
        assert counts.get("read", 0) > 100 and counts.get("last", 0) > 50, counts
        assert counts.get("effect", 0) > 50 and counts.get("status", 0) > 50, counts
        conflicts = sum(1 for op in recorder.operations if op.get("conflict"))
        assert conflicts > 0, "no two effects raced for one attempt"
        regions_read = {op["region"] for op in recorder.operations if op["op"] == "read"}
        assert regions_read == set(urls), regions_read
        verdict = check_history(lincheck_binary, history, chaos_dir / "history.html")
        print(f"porcupine: {verdict.summary}")
        assert verdict.exit_code != 2, f"checker gave no answer: {verdict.stderr}"
        assert verdict.linearizable, (
            f"not linearizable: {verdict.summary}; history and Porcupine's visualization in "
            f"{chaos_dir} (set CONVPLANE_CHAOS_KEEP=1 to keep them)"
        )
    finally:
        if recorder is not None:
            recorder.stop.set()
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
        await asyncio.to_thread(plane.stop)
        await plane.close_proxies()
