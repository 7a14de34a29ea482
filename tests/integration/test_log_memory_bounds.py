"""A tenant with a huge conversation cannot push a node's memory past a stated bound.

The log node runs on three SQLite replicas (the history lives on disk, as in production; SQLite's
own page cache is C memory that ``tracemalloc`` does not see), and ``tracemalloc`` measures the
Python heap the node allocates while a conversation many times the bound is written, loaded
again from the replicas by a new leader, read back and retried. What bounds it
(``eventlog.config.LogConfig``): a load or read holds one page of ``conversation_page_events``
entries; an events read stops at ``read_page_bytes_max``; the leader buffer keeps at most
``buffer_bytes_max`` committed and ``inflight_bytes_max`` uncommitted bytes; the state keeps
references, not bodies, for at most ``idempotency_keys_per_conversation_max`` keys.
"""

from __future__ import annotations

import asyncio
import random
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from eventlog.clock import SystemClock
from eventlog.config import LogConfig
from eventlog.conversation_state import ConversationState, StateConfig
from eventlog.errors import InvalidRequest, Overloaded
from eventlog.memory_replica import MemoryReplica
from eventlog.model import LogEntry, entry_size_bytes
from eventlog.node import LogNode
from eventlog.replica import ReplicaStore
from eventlog.stores import open_replica_store

MIB = 1024 * 1024
EVENT_BYTES = 32 * 1024
EVENTS = 800  # 25 MiB of bodies: more than three times the bound below
WRITERS = 8  # appends in flight at once
#: the stated bound of this configuration: one 0.5 MiB page, 1 MiB buffer, 1 MiB in flight,
#: 1 MiB of cached state, and the node's working overhead
MEMORY_BOUND_BYTES = 8 * MIB
CONFIG = LogConfig(
    shard_count=1,
    conversation_page_events=16,
    read_page_bytes_max=1 * MIB,
    buffer_bytes_max=1 * MIB,
    inflight_bytes_max=1 * MIB,
    conversation_cache_bytes_max=1 * MIB,
    idempotency_keys_per_conversation_max=100,
)


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[dict[str, ReplicaStore]]:
    stores: dict[str, ReplicaStore] = {
        r: await open_replica_store(f"sqlite+aiosqlite:///{tmp_path / r}.db", r)
        for r in ("a", "b", "c")
    }
    yield stores
    for store in stores.values():
        await store.close()


def _node(
    region: str, replicas: dict[str, ReplicaStore], clock: SystemClock, config: LogConfig = CONFIG
) -> LogNode:
    return LogNode(region=region, replicas=replicas, config=config, clock=clock,
                   rng=random.Random(region))  # fmt: skip


async def _write_huge(node: LogNode) -> None:
    await node.create_conversation("t1", "huge", "m@1", {})
    filler = "x" * EVENT_BYTES

    async def writer(w: int) -> None:
        for n in range(w, EVENTS, WRITERS):
            payload = {"content": f"{n} {filler}"}
            await node.append_event("t1", "huge", "message.user", payload, idempotency_key=f"k{n}")
            if n % 100 == 0:
                attempt = {"attempt_id": f"a{n}", "tool": "search", "argument_digest": "d"}
                await node.append_event("t1", "huge", "tool.attempt", attempt)

    await asyncio.gather(*(writer(w) for w in range(WRITERS)))


async def test_a_huge_conversation_stays_under_the_memory_bound(
    replicas: dict[str, ReplicaStore],
) -> None:
    clock = SystemClock()
    first, second = _node("a", replicas, clock), _node("b", replicas, clock)
    try:
        await first.lead_shard(0)
        tracemalloc.start()
        baseline = tracemalloc.get_traced_memory()[0]
        await _write_huge(first)
        written_peak = tracemalloc.get_traced_memory()[1] - baseline

        await first.resign_shard(0)  # a new leader knows nothing: it loads from the replicas
        await second.lead_shard(0)
        tracemalloc.reset_peak()
        baseline = tracemalloc.get_traced_memory()[0]
        info = await second.get_conversation("t1", "huge")
        page = await second.list_events("t1", "huge", 0, 1000)
        status = await second.tool_attempt("t1", "huge", "a700")
        retried = await second.append_event(
            "t1", "huge", "message.user", {"content": f"{EVENTS - 1} {'x' * EVENT_BYTES}"},
            idempotency_key=f"k{EVENTS - 1}",
        )  # fmt: skip
        read_peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
        await first.close()
        await second.close()
    assert info.last_seq == EVENTS + EVENTS // 100
    # the read stops at read_page_bytes_max: at most one piece of conversation_page_events more
    page_max = CONFIG.read_page_bytes_max // EVENT_BYTES + CONFIG.conversation_page_events
    assert 1 <= len(page) <= page_max < EVENTS
    assert status.state == "pending" and status.events[0].payload["attempt_id"] == "a700"
    assert retried.replayed  # the newest keys are remembered across the new leader's load
    print(
        f"peak: writing {written_peak / MIB:.2f} MiB, loading and reading {read_peak / MIB:.2f} MiB"
    )
    assert written_peak < MEMORY_BOUND_BYTES, f"writing peaked at {written_peak / MIB:.1f} MiB"
    assert read_peak < MEMORY_BOUND_BYTES, (
        f"loading and reading peaked at {read_peak / MIB:.1f} MiB"
    )


# --- the state's own bounds (pure) -------------------------------------------------------------


def _entry(seq: int, *, key: str | None = None, attempt: str | None = None,
           at_ms: int = 0) -> LogEntry:  # fmt: skip
    event_type = "conversation.created" if seq == 0 else "tool.attempt" if attempt else "note"
    body = f'{{"event_id": "e{seq}", "fingerprint": "f{seq}", "payload": {{}}}}'
    return LogEntry(lsn=seq + 1, epoch=1, tenant_id="t", conversation_id="c", seq=seq,
                    event_type=event_type, idempotency_key=key, attempt_id=attempt,
                    token_count=1, created_at_ms=at_ms, body=body)  # fmt: skip


def test_idempotency_keys_are_kept_for_the_window_and_up_to_the_count() -> None:
    limits = StateConfig(idempotency_keys_max=3, idempotency_retention_ms=1_000)
    state = ConversationState(created=_entry(0), limits=limits)
    for seq in range(1, 6):
        state.apply(_entry(seq, key=f"k{seq}", at_ms=seq * 100))
    assert list(state.keys) == ["k3", "k4", "k5"]  # the newest three
    state.forget_keys(now_ms=1_350)  # k3 (at 300) is older than the 1 s window
    assert list(state.keys) == ["k4", "k5"]
    assert state.existing_result("note", None, "f5", "k5") is not None
    assert state.existing_result("note", None, "f3", "k3") is None  # forgotten: a new append


def test_state_keeps_no_bodies_and_refuses_attempts_past_the_bound() -> None:
    state = ConversationState(created=_entry(0), limits=StateConfig(tool_attempts_max=2))
    before = state.size_bytes
    small = _entry(1, key="k1")
    big = replace(small, body=small.body[:-1] + ', "pad": "' + "x" * MIB + '"}')
    state.apply(big)
    assert state.size_bytes - before < 1024  # a reference, not the 1 MiB body
    state.apply(_entry(2, attempt="a1"))
    state.apply(_entry(3, attempt="a2"))
    state.check_room_for_attempt("a2", "tool.attempt")  # a known attempt is always answered
    with pytest.raises(InvalidRequest):
        state.check_room_for_attempt("a3", "tool.attempt")


# --- the leader's buffer in bytes -----------------------------------------------------------


class HeldAppends(MemoryReplica):
    """A replica whose appends wait for ``gate`` (a slow or cut-off database)."""

    def __init__(self, region: str, gate: asyncio.Event) -> None:
        super().__init__(region)
        self.gate = gate

    async def append(self, *args: Any) -> Any:
        await self.gate.wait()
        return await super().append(*args)


async def test_the_leader_sheds_past_its_in_flight_bytes_and_trims_its_buffer_in_bytes() -> None:
    gate = asyncio.Event()
    replicas: dict[str, ReplicaStore] = {
        "a": MemoryReplica("a"), "b": HeldAppends("b", gate), "c": HeldAppends("c", gate),
    }  # fmt: skip
    config = LogConfig(shard_count=1, inflight_bytes_max=100 * 1024, buffer_bytes_max=200 * 1024)
    node = _node("a", replicas, SystemClock(), config)
    try:
        gate.set()
        await node.lead_shard(0)
        await node.create_conversation("t1", "c", "m@1", {})
        gate.clear()  # nothing commits from here: b and c hold every append
        big = {"content": "x" * 60 * 1024}
        first = asyncio.create_task(node.append_event("t1", "c", "note", big))
        await asyncio.sleep(0)  # proposed: 60 KiB in flight, alone, so accepted
        with pytest.raises(Overloaded):
            await node.append_event("t1", "c", "note", big)  # 120 KiB would pass 100 KiB
        gate.set()
        await first
        for _ in range(6):  # 360 KiB committed, through a 200 KiB buffer
            await node.append_event("t1", "c", "note", big)
        leader = node.leader(0)
        assert leader is not None
        held = [leader.entry(lsn) for lsn in range(1, leader.last_lsn + 1)]
        held_bytes = sum(entry_size_bytes(e) for e in held if e is not None)
        assert held[0] is None and held_bytes <= config.buffer_bytes_max
    finally:
        await node.close()
