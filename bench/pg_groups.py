"""What one group commit costs a replica's PostgreSQL server, by the group's shape: the set-based
``convplane_append`` (migration 0004) against migration 0001's loop, and both against the peer's
unit of work (one autocommit ``INSERT`` of the same 1 KiB row), in the same server and run.

A program, not a test::

    .venv/bin/python -m bench.pg_groups [--seconds 3]

Under ``bench/rest.py``'s load a node's group to one replica holds several sub-batches of about
one entry each (one entry per shard: each shard has one batch in flight per replica), where
``bench/append.py``'s single leader sends groups of about a hundred entries. This measures the
server side of both functions for such shapes: one local PostgreSQL
(``services.local.postgres``, fsync on), one connection, groups sent back to back, and the CPU
of that connection's backend read from ``/proc`` (``bench.cpu``). Shapes are
``sub-batches x entries per sub-batch``; each shard's sub-batch appends at its tail, the
common case. The loop runs as ``convplane_append_loop`` (0001's body under another name,
created here only). Each shape is measured in alternating slices of both functions, so that
drift in the machine's speed hits both alike.

Per shape it prints the backend's CPU microseconds per group and per entry for each function,
``set_speedup`` (the loop's CPU over the set-based one's) and ``peer_ratio``: the peer's CPU per
event over the set-based group's CPU per entry (above 1: the group writes an entry for less
server CPU than the peer writes an event). The last line is ONE JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from typing import Any

import asyncpg

from bench.cpu import cpu_s
from bench.local_pg import one_postgres
from bench.pg_peer import PEER_INSERT, PEER_TABLE, TENANT, payload_text
from eventlog.model import LogEntry
from eventlog.stores import open_replica_store
from eventlog.stores._pg_writes import _ACCEPTED as ACCEPTED
from eventlog.stores._pg_writes import _APPEND, append_arrays
from eventlog.stores._plan import AppendRequest
from eventlog.stores.migrate import migration_module
from services.deploy.db_roles import asyncpg_dsn

SHAPES = (
    (1, 1),
    (5, 1),
    (10, 1),
    (20, 1),
    (40, 1),
    (1, 5),
    (1, 20),
    (20, 5),
)  # (sub-batches, entries each)
SHARDS = 64
CALL_TIMEOUT_S = 10.0
SLICES = 6  # each shape's time, split into alternating slices of the two functions
LOOP_APPEND = _APPEND.replace("convplane_append(", "convplane_append_loop(")


class Tails:
    """Each shard's last lsn, so that every sub-batch appends at its shard's tail."""

    def __init__(self) -> None:
        self._last: dict[int, int] = {}
        self._next_shard = 0

    def group(self, subs: int, per: int, body: str) -> list[AppendRequest]:
        requests = []
        for _ in range(subs):
            shard = self._next_shard
            self._next_shard = (self._next_shard + 1) % SHARDS
            last = self._last.get(shard, 0)
            entries = tuple(
                LogEntry(lsn, 1, TENANT, f"c{shard}", lsn, "message.user", None, None, 256, 0, body)
                for lsn in range(last + 1, last + per + 1)
            )
            requests.append(AppendRequest(shard, 1, last, 1 if last else 0, entries, last))
            self._last[shard] = last + per
        return requests


def loop_function() -> str:
    """Migration 0001's ``convplane_append`` body, created as ``convplane_append_loop``."""
    sql: str = migration_module("0001").APPEND_FUNCTION
    return sql.replace("FUNCTION convplane_append(", "FUNCTION convplane_append_loop(")


async def append_at_tails(
    conn: asyncpg.Connection, statement: str, requests: list[AppendRequest]
) -> None:
    """One group through ``statement`` (either function); every sub-batch must be accepted
    (else the benchmark would time another path of the function)."""
    rows = await conn.fetch(statement, *append_arrays(requests))
    if sorted(int(kind) for _, kind, _ in rows) != [ACCEPTED] * len(requests):
        raise RuntimeError(f"convplane_append did not accept every sub-batch: {rows}")


async def backend_cpu_per_call(
    conn: asyncpg.Connection, seconds: float, call: Any
) -> tuple[float, int]:
    """(backend CPU seconds, calls) for calls made back to back for ``seconds``."""
    backend = await conn.fetchval("SELECT pg_backend_pid()")
    cpu_before, calls = cpu_s(backend), 0
    ends = time.perf_counter() + seconds
    while time.perf_counter() < ends:
        await asyncio.wait_for(call(), CALL_TIMEOUT_S)
        calls += 1
    return cpu_s(backend) - cpu_before, calls


async def measure(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    store = await open_replica_store(dsn, region="bench")  # creates the schema
    await store.close()
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        await conn.execute(loop_function())
        body = payload_text(args.payload_bytes, seed=1)
        await conn.execute(PEER_TABLE)
        peer_seq = itertools.count()
        peer_cpu, peer_events = await backend_cpu_per_call(
            conn,
            args.seconds,
            lambda: conn.execute(
                PEER_INSERT, "c0", next(peer_seq), TENANT, "message.user", body, 0
            ),
        )
        peer_us = 1e6 * peer_cpu / peer_events
        print(f"peer: one autocommit INSERT per event: {peer_us:.1f} us backend CPU per event")
        tails, shapes = Tails(), {}
        for subs, per in SHAPES:
            used = {"loop": [0.0, 0], "set": [0.0, 0]}
            for _ in range(SLICES):
                for name, statement in (("loop", LOOP_APPEND), ("set", _APPEND)):
                    cpu, groups = await backend_cpu_per_call(
                        conn,
                        args.seconds / SLICES / 2,
                        lambda s=subs, p=per, q=statement: append_at_tails(
                            conn, q, tails.group(s, p, body)
                        ),
                    )
                    used[name][0] += cpu
                    used[name][1] += int(groups)
            loop_us, set_us = (1e6 * used[n][0] / used[n][1] for n in ("loop", "set"))
            per_entry_us = set_us / (subs * per)
            shapes[f"{subs}x{per}"] = {
                "groups": used["set"][1],
                "loop_us_per_group": round(loop_us, 1),
                "us_per_group": round(set_us, 1),
                "us_per_entry": round(per_entry_us, 1),
                "set_speedup": round(loop_us / set_us, 3),
                "peer_ratio": round(peer_us / per_entry_us, 3),
            }
            print(f"{subs:>3} sub-batches x {per:>2} entries: loop {loop_us:7.1f}, set "
                  f"{set_us:7.1f} us per group ({loop_us / set_us:.2f} x), "
                  f"{per_entry_us:6.1f} us per entry, peer_ratio {peer_us / per_entry_us:.2f}")  # fmt: skip
        return {"peer_us_per_event": round(peer_us, 1), "shapes": shapes}
    finally:
        await conn.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=3.0, help="per shape, and for the peer")
    p.add_argument("--payload-bytes", type=int, default=1024)
    args = p.parse_args()
    with one_postgres("pg-groups") as dsn:
        result = asyncio.run(measure(dsn, args))
    print(json.dumps({**result, "seconds": args.seconds, "payload_bytes": args.payload_bytes}))


if __name__ == "__main__":
    main()
