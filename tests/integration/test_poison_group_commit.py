"""A poison entry inside a group commit fails only its own append, on real PostgreSQL and SQLite.

The log core refuses such values at its edge (``eventlog.wire_values``); these tests go under it,
straight to the store, the way a bug in the core would: first with the store's own pre-check
(the poison never joins a group), then with the pre-check switched off, so the poison reaches the
database inside a group of other shards' appends and the group is split down to the culprit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from eventlog.errors import InvariantViolation
from eventlog.model import Accepted, LogEntry, Promised
from eventlog.replica import ReplicaStore
from eventlog.stores import open_replica_store, sql_store

POISONS = {
    "sqlite": "attempt-\ud800",  # no store can encode a lone surrogate
    "postgres": "attempt-\x00",  # PostgreSQL text cannot hold NUL
}
SHARDS = 6
#: a long linger, so the six appends below form one group
LIMITS: dict[str, Any] = {"batch_linger_ms": 50.0}


def entry(lsn: int, attempt_id: str | None = None) -> LogEntry:
    return LogEntry(
        lsn=lsn,
        epoch=1,
        tenant_id="t",
        conversation_id="c",
        seq=lsn,
        event_type="tool.attempt" if attempt_id else "note",
        idempotency_key=None,
        attempt_id=attempt_id,
        token_count=1,
        created_at_ms=int(time.time() * 1000),
        body="{}",
    )


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[tuple[ReplicaStore, str]]:
    store = await open_replica_store(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}", "r", **LIMITS)
    yield store, POISONS["sqlite"]
    await store.close()


@pytest.fixture
async def postgres_store(pg_databases: list[str]) -> AsyncIterator[tuple[ReplicaStore, str]]:
    store = await open_replica_store(pg_databases[0], "r", **LIMITS)
    yield store, POISONS["postgres"]
    await store.close()


async def appends_around_a_poison(store: ReplicaStore, poison: str) -> list[object]:
    for shard in range(SHARDS):
        assert isinstance(await store.prepare(shard, 1, 10), Promised)
    calls: list[Awaitable[object]] = [
        store.append(shard, 1, 0, 0, [entry(1, poison if shard == 2 else None)], 0)
        for shard in range(SHARDS)
    ]
    return await asyncio.gather(*calls, return_exceptions=True)


def assert_only_the_poison_failed(outcomes: list[object]) -> None:
    for shard, outcome in enumerate(outcomes):
        if shard == 2:
            assert isinstance(outcome, InvariantViolation), outcome
        else:
            assert outcome == Accepted(1), (shard, outcome)


async def poison_refused_before_it_joins_a_group(store: ReplicaStore, poison: str) -> None:
    assert_only_the_poison_failed(await appends_around_a_poison(store, poison))
    # the store keeps working for everyone, the poisoned shard included
    assert await store.append(2, 1, 0, 0, [entry(1)], 0) == Accepted(1)


async def group_split_down_to_its_culprit(
    store: ReplicaStore, poison: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_check: Callable[..., None] = lambda *_args, **_kwargs: None  # noqa: E731
    monkeypatch.setattr(sql_store, "check_storable", no_check)
    assert_only_the_poison_failed(await appends_around_a_poison(store, poison))
    for shard in range(SHARDS):
        log = await store.read_log(shard, 0, 10)
        assert [e.lsn for e in log] == ([] if shard == 2 else [1])
    assert await store.append(2, 1, 0, 0, [entry(1)], 0) == Accepted(1)


async def test_sqlite_refuses_a_poison_append_before_it_joins_a_group(
    sqlite_store: tuple[ReplicaStore, str],
) -> None:
    await poison_refused_before_it_joins_a_group(*sqlite_store)


async def test_postgres_refuses_a_poison_append_before_it_joins_a_group(
    postgres_store: tuple[ReplicaStore, str],
) -> None:
    await poison_refused_before_it_joins_a_group(*postgres_store)


async def test_sqlite_splits_a_failed_group_down_to_its_culprit(
    sqlite_store: tuple[ReplicaStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    await group_split_down_to_its_culprit(*sqlite_store, monkeypatch)


async def test_postgres_splits_a_failed_group_down_to_its_culprit(
    postgres_store: tuple[ReplicaStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    await group_split_down_to_its_culprit(*postgres_store, monkeypatch)
