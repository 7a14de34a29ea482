"""Chaos: client writers (``convplane_client``'s asyncio client for two conversations in three,
its blocking client in worker threads for the third; nothing else between them and the plane)
drive conversations while a whole region is killed with SIGKILL and restarted. Afterwards
every append the client acknowledged is in its transcript exactly once, at the acknowledged seq;
nothing the writers sent is there twice; and every tool's effect is recorded at most once, with
the tool run again only after a call of ``run_tool_once`` for that attempt gave up.

Needs local PostgreSQL binaries (``services.local.postgres``); fails loudly without them, never skips.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from convplane_client import (
    Appended,
    AsyncClient,
    Client,
    ClientConfig,
    ConversationCreated,
    ConvplaneError,
    Event,
    ToolRun,
)
from eventlog.sharding import shard_of
from tests.chaos.plane import chaos_plane
from tests.harness.chaos import conversations_per_shard, full_placement, get_json, wait_until

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


@dataclass
class Outcomes:
    """What each request met (its status, or the transport error): the faults the clients
    absorbed."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, outcome: str) -> None:
        with self._lock:  # the blocking client sends from worker threads
            self.counts[outcome] += 1

    def faults(self) -> int:
        return sum(n for outcome, n in self.counts.items() if outcome not in {"200", "201"})


class CountingAsyncTransport(httpx.AsyncHTTPTransport):
    def __init__(self, outcomes: Outcomes) -> None:
        super().__init__()
        self.outcomes = outcomes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except httpx.TransportError as exc:
            self.outcomes.note(type(exc).__name__)
            raise
        self.outcomes.note(str(response.status_code))
        return response


class CountingTransport(httpx.HTTPTransport):
    def __init__(self, outcomes: Outcomes) -> None:
        super().__init__()
        self.outcomes = outcomes

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = super().handle_request(request)
        except httpx.TransportError as exc:
            self.outcomes.note(type(exc).__name__)
            raise
        self.outcomes.note(str(response.status_code))
        return response


@dataclass
class ExternalSystem:
    """The tools' side of the world, deduplicating by idempotency key as a payment API does."""

    runs: collections.Counter[str] = field(default_factory=collections.Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def charge(self, attempt_id: str) -> dict[str, str]:
        with self._lock:  # the blocking client's writers run it in worker threads
            self.runs[attempt_id] += 1
        return {"receipt": attempt_id}


class InThreads:
    """The blocking client, each call in a worker thread: awaitable like ``AsyncClient``."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def create_conversation(self, conversation_id: str) -> ConversationCreated:
        return await asyncio.to_thread(self.client.create_conversation, conversation_id)

    async def append(
        self, cid: str, event_type: str, payload: dict[str, Any], *, idempotency_key: str | None
    ) -> Appended:
        call = functools.partial(self.client.append, idempotency_key=idempotency_key)
        return await asyncio.to_thread(call, cid, event_type, payload)

    async def run_tool_once(
        self, cid: str, attempt_id: str, tool: str, arguments: Any, fn: Callable[[str], Any]
    ) -> ToolRun:
        run = self.client.run_tool_once
        return await asyncio.to_thread(run, cid, attempt_id, tool, arguments, fn)

    async def transcript(self, cid: str) -> list[Event]:
        return await asyncio.to_thread(self.client.transcript, cid)


@dataclass
class ClientWriters:
    #: each conversation's writer drives it through one of the clients
    clients: dict[str, AsyncClient | InThreads]
    external: ExternalSystem = field(default_factory=ExternalSystem)
    #: (conversation, marker) -> acked seq
    acked: dict[tuple[str, str], int] = field(default_factory=dict)
    acked_at_s: dict[str, list[float]] = field(default_factory=dict)
    #: calls that gave up (their outcome unknown), per conversation or attempt
    gave_up: collections.Counter[str] = field(default_factory=collections.Counter)
    tool_runs_returned: dict[str, int] = field(default_factory=dict)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def conversations(self) -> list[str]:
        return list(self.clients)

    async def run(self) -> None:
        for cid, client in self.clients.items():
            await client.create_conversation(cid)
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
                appended = await self.clients[cid].append(
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
                run = await self.clients[cid].run_tool_once(
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
    outcomes = Outcomes()
    http = httpx.AsyncClient(trust_env=False, transport=CountingAsyncTransport(outcomes))
    client = AsyncClient(urls, api_key, config=CONFIG, http_client=http)
    http_blocking = httpx.Client(trust_env=False, transport=CountingTransport(outcomes))
    blocking = Client(urls, api_key, config=CONFIG, http_client=http_blocking)
    placement = await get_json(urls["us-east"], "/v1/placement", api_key)
    led_by: dict[str, list[str]] = collections.defaultdict(list)
    for cid in conversations_per_shard(SHARDS, per_shard=2):
        led_by[placement["assignment"][str(shard_of(cid, SHARDS))]].append(cid)
    on_victim = led_by[VICTIM]
    assert len(on_victim) >= 2, "the victim must lead a conversation of each client"
    # every region's conversations alternate between the two clients
    writers = ClientWriters(
        {cid: InThreads(blocking) if j % 2 else client
         for cids in led_by.values() for j, cid in enumerate(cids)}
    )  # fmt: skip
    running = asyncio.create_task(writers.run())
    try:
        await asyncio.sleep(3.0)
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
        transcripts = {cid: await c.transcript(cid) for cid, c in writers.clients.items()}
    finally:
        writers.stop.set()
        if not running.done():
            running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await client.aclose()
        blocking.close()
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
        f" requests by outcome {dict(outcomes.counts)}"
    )
    assert outcomes.faults() > 0, "the kill cost the clients nothing: no retry was exercised"
    assert len(writers.acked) > 100
    assert (duplicates, lost, moved) == ({}, [], [])
    assert all(n == 1 for n in effects.values()), effects
    assert set(writers.tool_runs_returned) <= set(effects)  # a completed call's effect is there
    assert rerun == {}  # a tool ran twice only where a run_tool_once call had given up
