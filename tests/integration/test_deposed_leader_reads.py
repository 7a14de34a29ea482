"""A deposed leader's reads on real PostgreSQL, while its status reads are still under way.

A leader answers a read only after a read-index round sent after the read began confirmed its
epoch at a quorum (``eventlog.read_index``). Two layers share work between reads, and each may
let a read lean on an answer given before it began, which a newer leader could have overtaken:

- ``ReadIndex``: a read that arrives while a round is under way must join the *next* round;
- ``StatusReads``: a status call that arrives while its replica's query is under way must wait
  for the *next* query.

Here node a leads; its links to b's and c's databases go through fault proxies that hold the
databases' answers. A read starts a round; b's and c's servers answer its status queries (with
a's epoch) and the proxies hold the answers. Then node b, cut off from a's database, takes the
shard over at b and c and acknowledges an event; a has heard nothing of it. A second read at a
begins (of the conversation, and of its transcript), the answers are let through, and both reads
must be refused (Fenced): had they been given the first query's or the first round's answers, a
would have answered without the event b acknowledged before they began.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pytest

from eventlog.errors import Fenced, NoQuorum
from services.deploy.db_roles import asyncpg_dsn
from services.local.faultproxy import HEALED, ProxyRules
from tests.conftest import LogCluster
from tests.integration.pg_log import TENANT, append_round, create, lead_all, wait_caught_up

pytestmark = pytest.mark.postgres

#: how a's status queries at b's and c's servers stand when the second read begins
Layer = Literal["round under way", "round abandoned, queries under way"]

#: statements on a's connections outlive the test's steps (a timeout would drop the
#: connection and its held answer with it)
_STORE_LIMITS = {"statement_timeout_s": 60.0}
_HOLD_ANSWERS = ProxyRules(up="pass", down="drop")
_STATUS_ANSWERED = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND state = 'idle' AND query LIKE '%shard = ANY(%' AND query_start > $1"
)


@pytest.mark.parametrize("layer", ["round under way", "round abandoned, queries under way"])
async def test_a_read_begun_after_a_newer_leader_took_over_is_refused(
    log_cluster: LogCluster, layer: Layer
) -> None:
    round_under_way = layer == "round under way"
    a = await log_cluster.node(
        "a",
        proxied=("b", "c"),
        store_limits=_STORE_LIMITS,
        # a round's calls wait for the held answers (round under way) or give up on them
        replica_call_timeout_s=30.0 if round_under_way else 0.5,
        replica_suspect_after_s=60.0,  # a keeps reading rather than refusing up front
    )
    await lead_all(a)
    [conversation] = await create(a, 1)
    await append_round(a, [conversation], "before")
    for region in ("b", "c"):
        await wait_caught_up(a, region)
    shard = a.shard_of(conversation)
    old_epoch = a.leader(shard).epoch
    assert (await a.get_conversation(TENANT, conversation)).last_seq == 1

    b = await log_cluster.node("b", proxied=("a",), seed=2)
    log_cluster.proxies["b->a"].set_rules(ProxyRules(up="cut", down="cut"))
    watchers = [await _connect(log_cluster, region) for region in ("b", "c")]
    try:
        marks = [await w.fetchval("SELECT clock_timestamp()") for w in watchers]
        for link in ("a->b", "a->c"):
            log_cluster.proxies[link].set_rules(_HOLD_ANSWERS)
        first_read = asyncio.ensure_future(a.get_conversation(TENANT, conversation))
        for watcher, mark in zip(watchers, marks, strict=True):
            await _until_status_answered(watcher, mark)

        await b.lead_shard(shard)
        assert b.leader(shard).epoch > old_epoch
        acknowledged = await b.append_event(TENANT, conversation, "note", {"k": "after"})
        assert acknowledged.seq == 2

        if round_under_way:
            assert not first_read.done()  # the second read must wait for the next round
        else:
            with pytest.raises(NoQuorum):  # its status calls gave up; the queries did not
                await first_read
        second_read = asyncio.ensure_future(a.get_conversation(TENANT, conversation))
        transcript_read = asyncio.ensure_future(a.list_events(TENANT, conversation, 0, 10))
        await asyncio.sleep(0.1)  # their round starts, or waits behind the first
        for link in ("a->b", "a->c"):
            log_cluster.proxies[link].set_rules(HEALED)

        # each is refused: fenced by its own round, or by the leader's stop (the other read's
        # round fenced it first: "read round cancelled") if it waited for the next round
        with pytest.raises((Fenced, NoQuorum)):
            await second_read
        with pytest.raises((Fenced, NoQuorum)):
            await transcript_read
        if round_under_way:  # begun before b's promise, it may be answered from a's state
            assert (await first_read).last_seq == 1
        assert not a.leads(shard)
        assert (await b.get_conversation(TENANT, conversation)).last_seq == 2
    finally:
        for watcher in watchers:
            await watcher.close()


async def _connect(cluster: LogCluster, region: str) -> Any:
    import asyncpg

    return await asyncpg.connect(asyncpg_dsn(cluster.dsns[region]))


async def _until_status_answered(watcher: Any, mark: Any) -> None:
    """Until a status query started after ``mark`` has been answered by the watcher's server
    (the answer may still be held on its way back)."""
    for _ in range(1000):
        if await watcher.fetchval(_STATUS_ANSWERED, mark) >= 1:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the server never answered a's status query")
