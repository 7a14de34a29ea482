"""The event log on three real PostgreSQL servers (regions a, b, c): durability across the loss
of any one region's database, catch-up after restart, idempotency and tool effects under
concurrency. Every test ends with ``log_audit`` reading the replicas' logs directly.

These tests need PostgreSQL (``pg_instances`` starts it or fails loudly; never a skip).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from eventlog.conversations import AppendedEvent
from eventlog.errors import EffectConflict
from tests.conftest import LOG_REGIONS, LogCluster
from tests.integration.pg_log import (
    CATCH_UP_WAIT_S,
    TENANT,
    append_round,
    audit_all,
    create,
    direct_stores,
    lead_all,
    served_everything,
    wait_caught_up,
)

pytestmark = pytest.mark.postgres


# --- losing one region's database ----------------------------------------------------------


@pytest.mark.parametrize("lost", LOG_REGIONS)
async def test_acked_events_survive_the_abrupt_loss_of_any_one_database(
    log_cluster: LogCluster, log_audit: Callable[..., Any], lost: str
) -> None:
    node = await log_cluster.node("a")  # "a" leads every shard; lost == "a" is its own database
    await lead_all(node)
    conversations = await create(node, 12)
    acked = await append_round(node, conversations, "before")
    survivors = tuple(r for r in LOG_REGIONS if r != lost)

    log_cluster.instances[lost].kill()  # SIGKILL the postmaster and its children

    during: list[AppendedEvent] = []
    for round_number in range(3):
        during += await append_round(node, conversations, f"during-{round_number}")
    assert all(set(e.acked_by) <= set(survivors) and len(e.acked_by) >= 2 for e in during)
    acked += during
    await served_everything(node, acked)
    await audit_all(log_audit, node, await direct_stores(log_cluster, survivors), acked, 2)

    await asyncio.to_thread(log_cluster.instances[lost].start)
    acked += await append_round(node, conversations, "after")
    await wait_caught_up(node, lost)
    await served_everything(node, acked)
    await audit_all(log_audit, node, await direct_stores(log_cluster), acked, 3)


async def test_a_killed_database_that_comes_back_mid_stream_catches_up(
    log_cluster: LogCluster, log_audit: Callable[..., Any]
) -> None:
    """Appends run without pause while region b's database is killed and restarted."""
    node = await log_cluster.node("a")
    await lead_all(node)
    conversations = await create(node, 8)
    acked: list[AppendedEvent] = []
    stop = asyncio.Event()
    progress = asyncio.Condition()

    async def writer(conversation_id: str) -> None:
        for n in itertools.count():
            if stop.is_set():
                return
            acked.append(await node.append_event(TENANT, conversation_id, "note", {"n": n}))
            async with progress:
                progress.notify_all()

    async def until_acked(count: int) -> None:
        async with asyncio.timeout(CATCH_UP_WAIT_S), progress:
            await progress.wait_for(lambda: len(acked) >= count)

    writers = [asyncio.ensure_future(writer(c)) for c in conversations]
    try:
        await until_acked(50)
        log_cluster.instances["b"].kill()
        await until_acked(len(acked) + 100)  # acknowledged by a and c alone
        await asyncio.to_thread(log_cluster.instances["b"].start)
        await until_acked(len(acked) + 50)
    finally:
        stop.set()
        await asyncio.gather(*writers)
    await wait_caught_up(node, "b")
    await served_everything(node, acked)
    await audit_all(log_audit, node, await direct_stores(log_cluster), acked, 3)


# --- idempotency and tool effects under concurrency ----------------------------------------


async def test_fifty_concurrent_retries_with_one_idempotency_key_yield_one_event(
    log_cluster: LogCluster, log_audit: Callable[..., Any]
) -> None:
    node = await log_cluster.node("a")
    await lead_all(node)
    [conversation] = await create(node, 1)
    calls = [
        node.append_event(
            TENANT, conversation, "message.user", {"content": "hi"}, idempotency_key="k-1"
        )
        for _ in range(50)
    ]
    results = await asyncio.gather(*calls)

    assert len({(r.event_id, r.seq, r.lsn) for r in results}) == 1
    assert sum(not r.replayed for r in results) == 1
    served = await node.list_events(TENANT, conversation, 0, 100)
    assert [(e.seq, e.event_id) for e in served] == [(1, results[0].event_id)]
    # a late retry, after the commit, still returns the original
    again = await node.append_event(
        TENANT, conversation, "message.user", {"content": "hi"}, idempotency_key="k-1"
    )
    assert (again.event_id, again.replayed) == (results[0].event_id, True)
    await audit_all(log_audit, node, await direct_stores(log_cluster), list(results), 3)


async def test_one_committed_effect_per_attempt_under_concurrency(
    log_cluster: LogCluster, log_audit: Callable[..., Any]
) -> None:
    node = await log_cluster.node("a")
    await lead_all(node)
    [conversation] = await create(node, 1)
    attempt = {"attempt_id": "att-1", "tool": "refund", "argument_digest": "sha256:abc"}
    await node.append_event(TENANT, conversation, "tool.attempt", attempt)

    def effect(n: int) -> dict[str, Any]:
        return {"attempt_id": "att-1", "status": "committed", "result": {"refund_id": n}}

    racing = await asyncio.gather(
        *[node.append_event(TENANT, conversation, "tool.effect", effect(n)) for n in range(20)],
        return_exceptions=True,
    )
    winners = [r for r in racing if isinstance(r, AppendedEvent)]
    losers = [r for r in racing if not isinstance(r, AppendedEvent)]
    assert len(winners) == 1 and not winners[0].replayed
    assert len(losers) == 19 and all(isinstance(e, EffectConflict) for e in losers)

    winning_payload = effect(racing.index(winners[0]))
    repeats = await asyncio.gather(
        *[
            node.append_event(TENANT, conversation, "tool.effect", winning_payload)
            for _ in range(20)
        ]
    )
    assert {(r.event_id, r.replayed) for r in repeats} == {(winners[0].event_id, True)}

    status = await node.tool_attempt(TENANT, conversation, "att-1")
    assert status.state == "committed"
    assert [e.event_type for e in status.events] == ["tool.attempt", "tool.effect"]
    assert status.events[1].payload == winning_payload
    served = await node.list_events(TENANT, conversation, 0, 100)
    assert [e.event_type for e in served] == ["tool.attempt", "tool.effect"]
    await audit_all(log_audit, node, await direct_stores(log_cluster), winners, 3)
