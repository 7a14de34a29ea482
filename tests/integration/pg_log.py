"""Helpers of the log-on-PostgreSQL tests: lead every shard, create and append, read each
database directly, audit what the databases hold against what was acknowledged."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from eventlog.conversations import AppendedEvent
from eventlog.node import LogNode
from tests.conftest import LOG_REGIONS, LogCluster

TENANT = "t1"
CATCH_UP_WAIT_S = 30.0  # how long a restarted replica may take to catch up before we fail


async def lead_all(node: LogNode) -> None:
    for shard in range(node.config.shard_count):
        await node.lead_shard(shard)


async def create(node: LogNode, count: int, prefix: str = "conv") -> list[str]:
    ids = [f"{prefix}-{i}" for i in range(count)]
    for conversation_id in ids:
        await node.create_conversation(TENANT, conversation_id, "rev-1", {})
    return ids


async def append_round(node: LogNode, conversation_ids: list[str], tag: str) -> list[AppendedEvent]:
    """One message per conversation, concurrently; every call must be acknowledged."""
    calls = [
        node.append_event(TENANT, cid, "message.user", {"content": f"{tag} {cid}"})
        for cid in conversation_ids
    ]
    return list(await asyncio.gather(*calls))


async def direct_stores(cluster: LogCluster, regions: tuple[str, ...] = LOG_REGIONS) -> Any:
    return {region: await cluster.store(region) for region in regions}


async def audit_all(
    audit: Callable[..., Any],
    node: LogNode,
    stores: dict[str, Any],
    acked: list[AppendedEvent],
    holders_min: int,
) -> None:
    for shard in range(node.config.shard_count):
        leader = node.leader(shard)
        assert leader is not None
        await audit(stores, shard, leader.commit_lsn, acked, holders_min=holders_min)


async def wait_caught_up(node: LogNode, region: str) -> None:
    """Until ``region``'s replica holds every shard's log through the leader's commit point."""
    async with asyncio.timeout(CATCH_UP_WAIT_S):
        while True:
            leaders = [node.leader(s) for s in range(node.config.shard_count)]
            if all(ld is not None and region in ld.holders(ld.commit_lsn) for ld in leaders):
                return
            await asyncio.sleep(0.05)


async def served_everything(node: LogNode, acked: list[AppendedEvent]) -> None:
    """Every acknowledged event is served by list_events, once, at its seq."""
    by_conversation: dict[str, set[tuple[int, str]]] = {}
    for event in acked:
        by_conversation.setdefault(event.conversation_id, set()).add((event.seq, event.event_id))
    for conversation_id, expected in by_conversation.items():
        served = await node.list_events(TENANT, conversation_id, 0, 1000)
        assert [e.seq for e in served] == list(range(1, len(served) + 1))
        assert expected <= {(e.seq, e.event_id) for e in served}
