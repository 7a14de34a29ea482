"""``convplane_append`` (migration 0004: the group's tail appends as two set statements) is held
to migration 0001's loop, sub-batch by sub-batch, on real PostgreSQL.

Two databases get the same random groups: the first runs the function the migrations install
now, the second 0001's body. After every group both must have answered the same rows, and at the
end both must hold the same shard rows and entries. The groups mix what a replica meets: appends
at the tail (the fast path), re-sent and conflicting suffixes, mismatches, stale epochs, new
epochs, empty sub-batches (commit pushes), truncations of committed entries (reply kind 3),
shards never seen before, and groups where a shard appears twice (which must take the loop).
Then concurrent groups from several connections (new shards and shared ones: no deadlock, no
duplicate row, every shard gapless), and 0004's downgrade back to the loop.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from eventlog.model import LogEntry
from eventlog.stores._pg_writes import _APPEND, append_arrays
from eventlog.stores._plan import AppendRequest
from eventlog.stores.migrate import migrate, migration_module
from services.deploy.db_roles import asyncpg_dsn, restrict_to_protocol
from tests.migrations import alembic_downgrade

GROUPS = 400
SHARDS = 5  # few shards: repeats, conflicts and truncations come often
SEED = 20261202


class Generator:
    """Random groups against what the first database holds (so many sub-batches land at the
    tail, and the rest is wrong in every way a stale or new leader can be)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def group(self, shards: dict[int, asyncpg.Record]) -> list[AppendRequest]:
        rng = self.rng
        size = rng.choice([1, 1, 2, 3, 5, 8])
        requests: list[AppendRequest] = []
        chosen = rng.sample(range(SHARDS + 2), k=min(size, SHARDS + 2))
        if rng.random() < 0.15 and chosen:
            chosen.append(chosen[0])  # a shard twice in one group
        for shard in chosen:
            requests.append(self.request(shard, shards.get(shard)))
        return requests

    def request(self, shard: int, row: asyncpg.Record | None) -> AppendRequest:
        rng = self.rng
        promised = row["promised_epoch"] if row else 0
        last_lsn = row["last_lsn"] if row else 0
        last_epoch = row["last_epoch"] if row else 0
        commit_lsn = row["commit_lsn"] if row else 0
        roll = rng.random()
        epoch = max(promised, 1) + (1 if roll < 0.1 else 0) - (1 if 0.1 <= roll < 0.2 else 0)
        if rng.random() < 0.6:  # at the tail: the fast path
            prev_lsn, prev_epoch = last_lsn, last_epoch
        else:
            prev_lsn = rng.randint(max(0, commit_lsn - 1), last_lsn + 2)
            prev_epoch = rng.choice([last_epoch, max(0, last_epoch - 1), epoch])
            if prev_lsn == 0:
                prev_epoch = 0
        count = rng.choice([0, 1, 1, 2, 3])
        epoch = max(epoch, 1)
        low = min(max(1, prev_epoch), epoch)
        epochs = sorted(rng.randint(low, epoch) for _ in range(count))
        entries = tuple(
            LogEntry(
                lsn=prev_lsn + k + 1,
                epoch=e,
                tenant_id="t",
                conversation_id=f"c{shard}",
                seq=prev_lsn + k + 1,
                event_type="note",
                idempotency_key=rng.choice([None, f"k{rng.randint(0, 9)}"]),
                attempt_id=None,
                token_count=rng.randint(0, 9),
                created_at_ms=rng.randint(0, 10**12),
                body=f'{{"n": {rng.randint(0, 10**6)}}}',
            )
            for k, e in enumerate(epochs)
        )
        leader_commit = rng.randint(0, prev_lsn + count + 3)
        return AppendRequest(shard, epoch, prev_lsn, prev_epoch, entries, leader_commit)


async def _rows(conn: asyncpg.Connection, requests: list[AppendRequest]) -> list[tuple[int, ...]]:
    rows = await conn.fetch(_APPEND, *append_arrays(requests))
    return sorted((int(i), int(k), int(v)) for i, k, v in rows)


async def _contents(conn: asyncpg.Connection) -> tuple[list[Any], list[Any]]:
    shards = await conn.fetch("SELECT * FROM shards ORDER BY shard")
    entries = await conn.fetch("SELECT * FROM entries ORDER BY shard, lsn")
    return [tuple(r) for r in shards], [tuple(r) for r in entries]


async def test_set_based_append_matches_the_loop(pg_databases: list[str]) -> None:
    current_dsn, loop_dsn = pg_databases[0], pg_databases[1]
    await migrate(current_dsn)
    await migrate(loop_dsn)
    current = await asyncpg.connect(asyncpg_dsn(current_dsn))
    loop = await asyncpg.connect(asyncpg_dsn(loop_dsn))
    try:
        await loop.execute(migration_module("0001").APPEND_FUNCTION)
        generator = Generator(random.Random(SEED))
        kinds: dict[int, int] = {}
        fast_groups = 0
        for number in range(GROUPS):
            shards = {r["shard"]: r for r in await current.fetch("SELECT * FROM shards")}
            requests = generator.group(shards)
            got = await _rows(current, requests)
            want = await _rows(loop, requests)
            assert got == want, f"group {number}: {requests}"
            for _, kind, _ in got:
                kinds[kind] = kinds.get(kind, 0) + 1
            distinct = len({r.shard for r in requests}) == len(requests)
            if distinct and len(requests) > 1 and all(k == 0 for _, k, _ in got):
                fast_groups += 1
        assert await _contents(current) == await _contents(loop)
    finally:
        await current.close()
        await loop.close()
    # the generator reached every reply kind, and whole groups that the fast path takes
    assert set(kinds) == {0, 1, 2, 3}, kinds
    assert fast_groups > 20, fast_groups


NODE_ROLE, NODE_PASSWORD = "convplane_node_migration_test", "migration-test-password-0123456789"
FUNCTION_SETTINGS = "SELECT prosecdef, proconfig FROM pg_proc WHERE proname = 'convplane_append'"


@asynccontextmanager
async def restricted_then_upgraded(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A database at 0003 restricted to the protocol (``services.deploy.db_roles``, with a node role)
    and then upgraded to the newest migration; its owner's connection. The role is dropped
    after."""
    await migrate(dsn, "0003")
    await restrict_to_protocol(asyncpg_dsn(dsn), {NODE_ROLE: NODE_PASSWORD})
    await migrate(dsn)
    owner = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        yield owner
    finally:
        await owner.execute(f"DROP OWNED BY {NODE_ROLE}")
        await owner.execute(f"DROP ROLE {NODE_ROLE}")
        await owner.close()


async def _node_appends_only_through_the_function(dsn: str, lsn: int) -> None:
    """The node role appends entry ``lsn`` of shard 3 through ``convplane_append`` and may not
    touch the tables itself."""
    parts = urlsplit(asyncpg_dsn(dsn))
    netloc = f"{NODE_ROLE}:{NODE_PASSWORD}@{parts.hostname}:{parts.port}"
    node = await asyncpg.connect(parts._replace(netloc=netloc).geturl())
    try:
        entry = LogEntry(lsn, 1, "t", "c", lsn, "note", None, None, 1, 0, "{}")
        request = AppendRequest(3, 1, lsn - 1, 1 if lsn > 1 else 0, (entry,), lsn - 1)
        assert await _rows(node, [request]) == [(0, 0, lsn)]
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await node.execute("DELETE FROM entries")
    finally:
        await node.close()


async def test_upgrade_keeps_the_node_roles_restrictions(pg_databases: list[str]) -> None:
    """A database restricted to the protocol (``services.deploy.db_roles``) at 0003 and upgraded to the
    set-based function still runs it as its owner, with the pinned search_path, and a node's
    role can still append through it (and only through it)."""
    async with restricted_then_upgraded(pg_databases[0]) as owner:
        definer, config = await owner.fetchrow(FUNCTION_SETTINGS)
        assert definer
        assert "search_path=public, pg_temp" in config
        assert "plan_cache_mode=force_generic_plan" in config
        await _node_appends_only_through_the_function(pg_databases[0], 1)


async def test_concurrent_groups_on_new_and_shared_shards(pg_databases: list[str]) -> None:
    """Leaders write into one replica's database at once: groups from several connections, each
    round on shards some of which none has written before (the function creates their rows) and
    some shared with the other connections (its locks order them). No group may fail (no
    deadlock, no duplicate shard row), and every shard must end gapless, its row naming its last
    entry."""
    dsn = pg_databases[0]
    await migrate(dsn)
    writers = [await asyncpg.connect(asyncpg_dsn(dsn)) for _ in range(4)]
    rng = random.Random(SEED + 1)
    generator = Generator(rng)
    try:
        for round_ in range(60):
            rows = {r["shard"]: r for r in await writers[0].fetch("SELECT * FROM shards")}
            newest = 100 + 2 * round_  # two shards no group has touched yet, every round
            groups = []
            for _ in writers:
                shards = rng.sample(range(100, newest), k=min(3, newest - 100))
                shards += [newest, newest + 1]
                rng.shuffle(shards)
                groups.append([generator.request(s, rows.get(s)) for s in shards])
            await asyncio.gather(
                *(_rows(conn, group) for conn, group in zip(writers, groups, strict=True))
            )
        shards = await writers[0].fetch("SELECT shard, last_lsn, last_epoch FROM shards")
        for shard, last_lsn, last_epoch in shards:
            entries = await writers[0].fetch(
                "SELECT lsn, epoch FROM entries WHERE shard = $1 ORDER BY lsn", shard
            )
            assert [e["lsn"] for e in entries] == list(range(1, last_lsn + 1)), shard
            assert (entries[-1]["epoch"] if entries else 0) == last_epoch, shard
        assert len(shards) == 2 * 60  # every shard a group named has its row
    finally:
        for conn in writers:
            await conn.close()


async def test_downgrade_restores_the_loop_and_keeps_the_restrictions(
    pg_databases: list[str],
) -> None:
    """0004's downgrade puts 0001's loop back, keeps what ``services.deploy.db_roles`` set on the
    function (the node role still appends through it, and only through it), and the upgrade
    after it works again."""
    dsn = pg_databases[0]
    source = "SELECT prosrc FROM pg_proc WHERE proname = 'convplane_append'"
    reference = await asyncpg.connect(asyncpg_dsn(pg_databases[1]))
    try:
        await reference.execute(migration_module("0001").APPEND_FUNCTION)
        loop = await reference.fetchval(source)
    finally:
        await reference.close()
    async with restricted_then_upgraded(dsn) as owner:
        set_based = await owner.fetchval(source)
        assert set_based != loop
        await alembic_downgrade(dsn, "0003")
        assert await owner.fetchval(source) == loop
        definer, config = await owner.fetchrow(FUNCTION_SETTINGS)
        assert definer and "search_path=public, pg_temp" in config
        await _node_appends_only_through_the_function(dsn, 1)
        await migrate(dsn)
        assert await owner.fetchval(source) == set_based
        await _node_appends_only_through_the_function(dsn, 2)
