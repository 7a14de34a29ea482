"""Chaos: client writers (``convplane_client.AsyncClient``, nothing else between them and the
plane) drive conversations while a whole region is killed with SIGKILL and restarted. Afterwards
every append the client acknowledged is in its transcript exactly once, at the acknowledged seq;
nothing the writers sent is there twice; and every tool's effect is recorded at most once, with
the tool run again only after a call of ``run_tool_once`` for that attempt gave up.

Needs local PostgreSQL binaries (``services.local.postgres``); fails loudly without them, never skips.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from convplane_client import AsyncClient, ClientConfig, ConvplaneError
from eventlog.sharding import shard_of
from services.local.chaos import conversations_per_shard, full_placement, get_json, wait_until
from tests.chaos.plane import chaos_plane

SHARDS = 12
VICTIM = "ap-south"  # the lowest name: it also leads the control shard
TOOL_EVERY = 3  # every third step of a writer is a tool call
STEP_PAUSE_S = 0.02
RECOVERY_WAIT_S = 45.0
FAILBACK_WAIT_S = 60.0
CONFIG = ClientConfig(
    attempts_max=40, deadline_s=20.0, request_timeout_s=3.0, backoff_max_s=0.5,
    region_unreachable_s=1.0,
)  # fmt: skip


class CountingTransport(httpx.AsyncHTTPTransport):
    """Counts what each request met (status, or the transport error): the faults the client
    absorbed."""

    def __init__(self) -> None:
        super().__init__(limits=httpx.Limits(max_connections=100))
        self.outcomes: collections.Counter[str] = collections.Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except httpx.TransportError as exc:
            self.outcomes[type(exc).__name__] += 1
            raise
        self.outcomes[str(response.status_code)] += 1
        return response


@dataclass
class ExternalSystem:
    """The tools' side of the world, deduplicating by idempotency key as a payment API does."""

    runs: collections.Counter[str] = field(default_factory=collections.Counter)

    async def charge(self, attempt_id: str) -> dict[str, str]:
        self.runs[attempt_id] += 1
        return {"receipt": attempt_id}


@dataclass
class ClientWriters:
    client: AsyncClient
    conversations: list[str]
    external: ExternalSystem = field(default_factory=ExternalSystem)
    #: (conversation, marker) -> acked seq
    acked: dict[tuple[str, str], int] = field(default_factory=dict)
    acked_at_s: dict[str, list[float]] = field(default_factory=dict)
    #: calls that gave up (their outcome unknown), per conversation or attempt
    gave_up: collections.Counter[str] = field(default_factory=collections.Counter)
    tool_runs_returned: dict[str, int] = field(default_factory=dict)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        for cid in self.conversations:
            await self.client.create_conversation(cid)
        await asyncio.gather(*(self._write(cid) for cid in self.conversations))

    async def _write(self, cid: str) -> None:
        step = 0
        while not self.stop.is_set():
            step += 1
            if step % TOOL_EVERY == 0:
                await self._run_tool(cid, f"{cid}-t{step}")
            else:
                await self._append(cid, f"{cid}-n{step}")
            await asyncio.sleep(STEP_PAUSE_S)

    async def _append(self, cid: str, marker: str) -> None:
        key = None
        while True:  # the writer's own loop: a call that gave up is sent again, same key
            try:
                appended = await self.client.append(
                    cid, "note", {"marker": marker}, idempotency_key=key
                )
            except ConvplaneError as exc:
                if not exc.retryable:
                    raise
                self.gave_up[cid] += 1
                key = exc.idempotency_key
                if self.stop.is_set():
                    return  # outcome unknown: not counted as acked
                continue
            self.acked[(cid, marker)] = appended.seq
            self.acked_at_s.setdefault(cid, []).append(time.monotonic())
            return

    async def _run_tool(self, cid: str, attempt_id: str) -> None:
        while True:
            try:
                run = await self.client.run_tool_once(
                    cid, attempt_id, "charge", {"attempt": attempt_id}, self.external.charge
                )
            except ConvplaneError as exc:
                if not exc.retryable:
                    raise
                self.gave_up[attempt_id] += 1
                if self.stop.is_set():
                    return
                continue
            assert run.state == "committed" and run.result == {"receipt": attempt_id}
            self.tool_runs_returned[attempt_id] = self.tool_runs_returned.get(attempt_id, 0) + 1
            return


@pytest.mark.postgres
async def test_client_writers_lose_and_repeat_nothing_across_a_region_kill(
    chaos_dir: Path,
) -> None:
    plane = chaos_plane(chaos_dir, SHARDS)
    info = await asyncio.to_thread(plane.start)
    urls = {r["name"]: r["url"] for r in info["regions"]}
    api_key = info["api_key"]
    transport = CountingTransport()
    http = httpx.AsyncClient(trust_env=False, transport=transport)
    client = AsyncClient(urls, api_key, config=CONFIG, http_client=http)
    writers = ClientWriters(client, conversations_per_shard(SHARDS))
    running = asyncio.create_task(writers.run())
    try:
        await asyncio.sleep(3.0)
        placement = await get_json(urls["us-east"], "/v1/placement", api_key)
        on_victim = [
            cid for cid in writers.conversations
            if placement["assignment"][str(shard_of(cid, SHARDS))] == VICTIM
        ]  # fmt: skip
        assert on_victim, "the victim leads no writer's conversation"
        fault_s = time.monotonic()
        await asyncio.to_thread(plane.kill_region, VICTIM)

        async def every_writer_acked_since_the_kill() -> bool:
            if running.done():
                running.result()  # a writer met an error that is not retryable: raise it
            return all(
                any(t > fault_s for t in writers.acked_at_s.get(cid, []))
                for cid in writers.conversations
            )

        await wait_until(every_writer_acked_since_the_kill, RECOVERY_WAIT_S, "writers to ack")
        recovered_s = time.monotonic() - fault_s
        await asyncio.to_thread(plane.restart_region, VICTIM)
        full = {str(s): r for s, r in full_placement(list(urls), SHARDS).items()}

        async def failed_back() -> bool:
            if running.done():
                running.result()
            p = await get_json(urls["us-east"], "/v1/placement", api_key)
            return bool(p["down"] == [] and p["assignment"] == full)

        await wait_until(failed_back, FAILBACK_WAIT_S, "failback to the full placement")
        await asyncio.sleep(2.0)  # writes on the restored leaders
        writers.stop.set()
        await asyncio.wait_for(running, 90)
        transcripts = {cid: await client.transcript(cid) for cid in writers.conversations}
    finally:
        writers.stop.set()
        if not running.done():
            running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await client.aclose()
        await asyncio.to_thread(plane.stop)

    markers: collections.Counter[tuple[str, str]] = collections.Counter()
    seq_of: dict[tuple[str, str], int] = {}
    effects: collections.Counter[str] = collections.Counter()
    for cid, events in transcripts.items():
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        for event in events:
            if event.type == "note":
                markers[(cid, event.payload["marker"])] += 1
                seq_of[(cid, event.payload["marker"])] = event.seq
            elif event.type == "tool.effect":
                effects[event.payload["attempt_id"]] += 1
    duplicates = {m: n for m, n in markers.items() if n > 1}
    lost = [m for m in writers.acked if m not in markers]
    moved = [m for m, seq in writers.acked.items() if m in seq_of and seq_of[m] != seq]
    tools = writers.external.runs
    rerun = {a: n for a, n in tools.items() if n > 1 and not writers.gave_up[a]}
    print(
        f"\nclient failover: {len(writers.acked)} appends acked, {len(writers.tool_runs_returned)}"
        f" tool calls completed, {sum(writers.gave_up.values())} calls gave up and were sent"
        f" again; every writer acked again {recovered_s:.1f}s after the kill;"
        f" tool runs {sum(tools.values())} for {len(tools)} attempts;"
        f" requests by outcome {dict(transport.outcomes)}"
    )
    faults = sum(n for outcome, n in transport.outcomes.items() if outcome not in {"200", "201"})
    assert faults > 0, "the kill cost the client nothing: the test exercised no retry"
    assert len(on_victim) >= 1 and len(writers.acked) > 100
    assert (duplicates, lost, moved) == ({}, [], [])
    assert all(n == 1 for n in effects.values()), effects
    assert set(writers.tool_runs_returned) <= set(effects)  # a completed call's effect is there
    assert rerun == {}  # a tool ran twice only where a run_tool_once call had given up
