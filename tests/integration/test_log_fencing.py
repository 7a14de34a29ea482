"""Leaders that must not acknowledge: one cut off from the quorum, one fenced by a newer epoch.
Three real PostgreSQL servers (regions a, b, c); node a's links to b's and c's databases go
through fault proxies where a test partitions it.

What "acknowledges nothing" means here (DESIGN.md, "Indeterminate outcomes"): an append that
times out was proposed and may be written to the leader's own database, so recovery may still
commit it later; a client retries it with the same Idempotency-Key and gets it exactly once. An
append refused up front (NoQuorum from the fail-fast check) is written nowhere, ever.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any, Literal

import pytest

from eventlog.conversations import AppendedEvent
from eventlog.errors import Fenced, NoQuorum, NotLeader, Unavailable
from eventlog.node import LogNode
from services.local.faultproxy import HEALED
from tests.conftest import LOG_REGIONS, LogCluster
from tests.integration.pg_log import (
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

SUSPICION_WAIT_S = 30.0  # how long the leader may take to notice it lost its quorum


async def all_bodies(cluster: LogCluster, node: LogNode) -> list[dict[str, Any]]:
    """Every entry body on every replica (committed or not), read directly."""
    stores = await direct_stores(cluster)
    bodies = []
    for store in stores.values():
        for shard in range(node.config.shard_count):
            bodies += [json.loads(e.body) for e in await store.read_log(shard, 0, 100_000)]
    return bodies


async def until_quorum_lost(node: LogNode, conversations: list[str]) -> None:
    """Until the leaders of the conversations' shards refuse proposals up front (NoQuorum).
    (A leader notices only through failed calls: an idle shard's leader has not noticed.)"""
    async with asyncio.timeout(SUSPICION_WAIT_S):
        for shard in sorted({node.shard_of(c) for c in conversations}):
            leader = node.leader(shard)
            assert leader is not None
            while True:
                try:
                    leader.check_can_propose()
                except NoQuorum:
                    break
                await asyncio.sleep(0.05)


async def until_fenced(node: LogNode, conversations: list[str]) -> None:
    """Until ``node`` has stopped leading the conversations' shards (a replica refused it)."""
    async with asyncio.timeout(SUSPICION_WAIT_S):
        while True:
            if not any(node.leads(node.shard_of(c)) for c in conversations):
                return
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("mode", ["drop", "cut"])
async def test_a_leader_cut_off_from_the_quorum_acknowledges_nothing(
    log_cluster: LogCluster, log_audit: Callable[..., Any], mode: Literal["drop", "cut"]
) -> None:
    a = await log_cluster.node("a", proxied=("b", "c"))
    await lead_all(a)
    conversations = await create(a, 8)
    acked = await append_round(a, conversations, "before")
    for name in ("a->b", "a->c"):
        proxy = log_cluster.proxies[name]
        proxy.set_rules(dataclasses.replace(proxy.rules, up=mode, down=mode))

    # 1. Proposed, then timed out: 503-class, outcome unknown.
    unknown = await asyncio.gather(
        *[
            a.append_event(TENANT, c, "note", {"k": f"u-{c}"}, idempotency_key=f"u-{c}")
            for c in conversations
        ],
        return_exceptions=True,
    )
    assert all(isinstance(r, Unavailable) for r in unknown), unknown

    # 2. Once the leader suspects both links: refused up front, nothing proposed anywhere.
    await until_quorum_lost(a, conversations)
    last_lsns = [a.leader(s).last_lsn for s in range(a.config.shard_count)]
    for c in conversations:
        with pytest.raises(NoQuorum):
            await a.append_event(TENANT, c, "note", {"k": f"f-{c}"}, idempotency_key=f"f-{c}")
    assert [a.leader(s).last_lsn for s in range(a.config.shard_count)] == last_lsns

    # 3. The majority side fails over while a is still cut off; then the links heal.
    b = await log_cluster.node("b", seed=2)
    await lead_all(b)
    for name in ("a->b", "a->c"):
        log_cluster.proxies[name].set_rules(HEALED)
    with pytest.raises((Fenced, NotLeader, NoQuorum)):  # not yet heard of b, or fenced
        await a.append_event(TENANT, conversations[0], "note", {"k": "stale"})
    await until_fenced(a, conversations)  # a's retries reach the replicas, which refuse them
    with pytest.raises(NotLeader):
        await a.append_event(TENANT, conversations[0], "note", {"k": "stale"})

    # Nothing refused up front exists anywhere; each timed-out append exists at most once and
    # a retry with its key returns it exactly once; everything acknowledged is served by b.
    bodies = await all_bodies(log_cluster, b)
    assert not [x for x in bodies if str(x.get("idempotency_key", "")).startswith("f-")]
    assert not [x for x in bodies if x.get("payload") == {"k": "stale"}]
    retried = [
        await b.append_event(TENANT, c, "note", {"k": f"u-{c}"}, idempotency_key=f"u-{c}")
        for c in conversations
    ]
    for c in conversations:
        served = await b.list_events(TENANT, c, 0, 100)
        keys = [e.payload.get("k") for e in served]
        assert keys.count(f"u-{c}") == 1 and f"f-{c}" not in keys, keys
    acked += retried + await append_round(b, conversations, "after")
    await served_everything(b, acked)
    for region in LOG_REGIONS:
        await wait_caught_up(b, region)
    await audit_all(log_audit, b, await direct_stores(log_cluster), acked, 3)


async def test_a_stale_leader_is_fenced_by_a_newer_epoch(
    log_cluster: LogCluster, log_audit: Callable[..., Any]
) -> None:
    a = await log_cluster.node("a")
    await lead_all(a)
    conversations = await create(a, 8)
    acked: list[AppendedEvent] = []
    for round_number in range(3):
        acked += await append_round(a, conversations, f"a-{round_number}")
    epochs_of_a = [a.leader(s).epoch for s in range(a.config.shard_count)]

    b = await log_cluster.node("b", seed=2)
    await lead_all(b)
    assert all(b.leader(s).epoch > epochs_of_a[s] for s in range(b.config.shard_count))

    # a still believes it leads: its next append is refused by the replicas (Fenced), and
    # after that it knows it does not lead (NotLeader).
    for c in conversations:
        with pytest.raises((Fenced, NotLeader)):
            await a.append_event(TENANT, c, "note", {"k": "stale"})
    assert not any(a.leads(a.shard_of(c)) for c in conversations)
    with pytest.raises(NotLeader):
        await a.append_event(TENANT, conversations[0], "note", {"k": "stale"})

    await served_everything(b, acked)
    acked += await append_round(b, conversations, "b")
    for region in LOG_REGIONS:
        await wait_caught_up(b, region)
    bodies = await all_bodies(log_cluster, b)
    assert not [x for x in bodies if x.get("payload") == {"k": "stale"}]
    for c in conversations:
        served = await b.list_events(TENANT, c, 0, 100)
        assert [e.seq for e in served] == [1, 2, 3, 4]
    await audit_all(log_audit, b, await direct_stores(log_cluster), acked, 3)
