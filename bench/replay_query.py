"""The replay scheduler's "conversations active since T" (``list_conversations``) on a long log,
with migration 0006's BRIN index on ``created_at_ms`` against the same server without it and
against the query it replaced (every entry of the shard aggregated, filtered on the latest
activity); and what the BRIN index costs an insert, against no extra index and the B-tree
migration 0005 dropped.

A program, not a test::

    .venv/bin/python -m bench.replay_query [--entries 1000000] [--window-entries 20000]

One local PostgreSQL (``services.local.postgres``), loaded with ``--entries`` entries in 64
shards (100 per conversation, in time order, as a log grows) and analysed. The query runs through
``SqlReplicaStore.list_conversations`` on one shard with the cutoff at the last
``--window-entries`` entries, ``--calls`` times, first with the BRIN index, then without it;
then the query before 0006 as raw SQL. Inserts: ``--insert-rows`` rows in statements of 100 into
three scratch copies of ``entries`` (no extra index, the BRIN, the old B-tree), alternated
``--insert-rounds`` times, the backend's CPU read from ``/proc`` (``bench.cpu``). The last line
is ONE JSON object: median milliseconds per query for each, ``speedup_vs_old_query``, and median
backend CPU microseconds per inserted row for each index.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench.cpu import cpu_s
from bench.local_pg import one_postgres
from eventlog.stores import open_replica_store
from services.deploy.db_roles import asyncpg_dsn

SHARDS = 64
SHARD = 3
PER_CONVERSATION = 100
BASE_MS = 1_000_000
BRIN = "ix_entries_created_brin"
#: ``SqlReplicaStore.list_conversations`` as it was before migration 0006
OLD_QUERY = """
SELECT tenant_id, conversation_id, max(created_at_ms) AS last_activity_ms,
       CAST(sum(token_count) AS BIGINT) AS token_count, max(seq) AS last_seq
FROM entries WHERE shard = $1 AND lsn <= $2 AND conversation_id != ''
GROUP BY tenant_id, conversation_id HAVING max(created_at_ms) >= $3
ORDER BY max(created_at_ms) DESC, conversation_id, tenant_id LIMIT $4
"""
#: entries numbered g: shard g % 64, conversation (g / 6400, g % 64), in time order
ROWS = """
SELECT g % {shards}, g, 1, 'demo', 'c' || (g / {span}) || '-' || (g % {shards}),
       (g % {span}) / {shards}, 'message.user', NULL, NULL, 10, {base} + g, repeat('x', {body})
FROM generate_series({first}, {last}) g
"""
INSERT_INDEXES = {
    "none": "",
    "brin": "CREATE INDEX ON {t} USING brin (created_at_ms) WITH (autosummarize = on)",
    "btree": "CREATE INDEX ON {t} (shard, created_at_ms)",
}


def rows(first: int, last: int, body_bytes: int) -> str:
    span = SHARDS * PER_CONVERSATION
    return ROWS.format(
        shards=SHARDS, span=span, base=BASE_MS, body=body_bytes, first=first, last=last
    )


async def timed_ms(call: Callable[[], Awaitable[Any]], calls: int) -> tuple[float, int]:
    """Median milliseconds of ``calls`` calls after one warm-up call, and the rows it gave."""
    found = len(await call())
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples), found


async def measure_query(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    store = await open_replica_store(dsn, "bench")  # migrates to the newest schema
    try:
        await conn.execute(
            "INSERT INTO entries (shard, lsn, epoch, tenant_id, conversation_id, seq, event_type, "
            "idempotency_key, attempt_id, token_count, created_at_ms, body) "
            + rows(1, args.entries, args.body_bytes)
        )
        await conn.execute("VACUUM ANALYZE entries")
        since_ms = BASE_MS + args.entries - args.window_entries
        max_lsn, limit = 2**62, 1000

        def new_query() -> Awaitable[Any]:
            return store.list_conversations(SHARD, since_ms, max_lsn, limit)

        brin_ms, found = await timed_ms(new_query, args.calls)
        await conn.execute(f"DROP INDEX {BRIN}")
        await conn.execute("ANALYZE entries")
        no_brin_ms, found_without = await timed_ms(new_query, args.calls)
        old_ms, found_old = await timed_ms(
            lambda: conn.fetch(OLD_QUERY, SHARD, max_lsn, since_ms, limit), args.calls
        )
        if not found == found_without == found_old:
            raise SystemExit(f"the queries disagree: {found}, {found_without}, {found_old} rows")
    finally:
        await store.close()
        await conn.close()
    return {
        "conversations_found": found,
        "brin_ms": round(brin_ms, 2),
        "no_brin_ms": round(no_brin_ms, 2),
        "old_query_ms": round(old_ms, 2),
        "speedup_vs_old_query": round(old_ms / brin_ms, 1),
    }


async def measure_inserts(dsn: str, args: argparse.Namespace) -> dict[str, float]:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    per_row_us: dict[str, list[float]] = {name: [] for name in INSERT_INDEXES}
    try:
        backend = conn.get_server_pid()
        for _ in range(args.insert_rounds):
            for name, index in INSERT_INDEXES.items():
                table = f"insert_{name}"
                await conn.execute(f"DROP TABLE IF EXISTS {table}")
                await conn.execute(f"CREATE TABLE {table} (LIKE entries INCLUDING INDEXES)")
                for existing in await conn.fetch(
                    "SELECT indexname FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE "
                    "'%USING brin%'",
                    table,
                ):
                    await conn.execute(f"DROP INDEX {existing['indexname']}")
                if index:
                    await conn.execute(index.format(t=table))
                before_s = cpu_s(backend)
                for first in range(1, args.insert_rows + 1, 100):
                    last = min(first + 99, args.insert_rows)
                    await conn.execute(f"INSERT INTO {table} " + rows(first, last, 1024))
                per_row_us[name].append((cpu_s(backend) - before_s) * 1e6 / args.insert_rows)
                await conn.execute(f"DROP TABLE {table}")
    finally:
        await conn.close()
    return {name: round(statistics.median(v), 2) for name, v in per_row_us.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--window-entries", type=int, default=20_000, help="entries since the cutoff")
    p.add_argument("--body-bytes", type=int, default=300, help="of the loaded entries")
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--insert-rows", type=int, default=200_000)
    p.add_argument("--insert-rounds", type=int, default=5)
    args = p.parse_args()
    with one_postgres("replay-query") as dsn:
        query = asyncio.run(measure_query(dsn, args))
        print("list_conversations:", json.dumps(query), flush=True)
        inserts = asyncio.run(measure_inserts(dsn, args))
        print("backend CPU us per inserted row:", json.dumps(inserts), flush=True)
    print(json.dumps({**query, "insert_us_per_row": inserts, "entries": args.entries,
                      "window_entries": args.window_entries}))  # fmt: skip


if __name__ == "__main__":
    main()
