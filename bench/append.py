"""Quorum appends through convplane vs PostgreSQL's own quorum synchronous replication.

A program, not a test::

    .venv/bin/python -m bench.append [--seconds 15] [--writers 256]      # mode 1: throughput
    .venv/bin/python -m bench.append --delay-ms 20 [--writers 16]        # mode 2: ack latency

Mode 1 starts 3 local PostgreSQL servers (regions a, b, c) and, separately, a sync-replication
cluster (primary + 2 streaming standbys, ``synchronous_standby_names = 'ANY 1 (s1, s2)'``). It
runs ``--writers`` concurrent writers, one conversation each, appending 1 KiB messages:

- convplane: one in-process ``LogNode`` of region a leading every shard, W = 2 of 3, writers
  call ``LogNode.append_event`` directly (no HTTP: the REST layer is not measured);
- peer: the same writers insert the same 1 KiB rows into the primary, one transaction per event
  (autocommit ``INSERT``), through an asyncpg pool; a commit returns once one standby has flushed.

Both run in this process on uvloop, the event loop node processes run (``--loop asyncio``: on
asyncio's own). It prints events/s of both, their ratio and ack latency percentiles. Mode 2 puts
a fault proxy with ``--delay-ms`` each way between the leader and the two remote databases (its
own database direct) and compares ack latency with the floor: one round trip through a proxy
plus one local single-row commit, both measured in the same run. The last line is ONE JSON
object.

``--py-spy FILE`` samples this process with py-spy during convplane's measured run (raw
collapsed stacks) and ``--profile FILE`` with cProfile; both cost CPU, so numbers from such a
run are not the benchmark's.

All servers are stopped on exit, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import asyncpg
import uvloop

from bench.pg_peer import (
    CALL_TIMEOUT_S,
    TENANT,
    Recorder,
    drive,
    payload_text,
    plain_dsn,
    run_peer,
)
from bench.profiling import py_spy
from eventlog.clock import SystemClock
from eventlog.config import LogConfig
from eventlog.node import LogNode
from eventlog.stores import SqlReplicaStore, StoreConfig, open_replica_store
from services.local.faultproxy import FaultProxy, ProxyRules, ProxySpec
from services.local.postgres import PgInstance, start_instances
from tests.harness.postgres import (
    SyncReplicationCluster,
    dsn_via,
    start_sync_replication_cluster,
)

REGIONS = ("a", "b", "c")
T = TypeVar("T")
LEAD_CONCURRENCY_MAX = 8  # shards taking leadership at once (each is a few round trips)


# --- convplane -----------------------------------------------------------------------------


async def open_store(dsn: str, region: str, args: argparse.Namespace) -> SqlReplicaStore:
    return await open_replica_store(
        dsn,
        region,
        batch_linger_ms=args.store_linger_ms,
        batch_events_max=args.store_batch_max,
        queue_max=16_384,
    )


async def open_convplane(
    dsns: dict[str, str], args: argparse.Namespace
) -> tuple[LogNode, list[SqlReplicaStore]]:
    stores = [await open_store(dsns[region], region, args) for region in REGIONS]
    config = LogConfig(shard_count=args.shards, batch_events_max=args.leader_batch_max)
    node = LogNode(
        region="a",
        replicas={s.region: s for s in stores},
        config=config,
        clock=SystemClock(),
        rng=random.Random(args.seed),
    )
    leading = asyncio.Semaphore(LEAD_CONCURRENCY_MAX)

    async def lead(shard: int) -> None:
        async with leading:
            await node.lead_shard(shard)

    await asyncio.gather(*(lead(shard) for shard in range(args.shards)))
    return node, stores


async def run_convplane(
    dsns: dict[str, str],
    args: argparse.Namespace,
    before_drive: Callable[[], Awaitable[None]] | None = None,
    cpu_of: Mapping[str, int] | None = None,
) -> Recorder:
    """Lead every shard, create the conversations, ``before_drive()``, then measure appends
    (and the CPU of ``cpu_of``'s process trees and of this process, ``drive``)."""
    node, stores = await open_convplane(dsns, args)
    try:
        conversations = [f"bench-{i}" for i in range(args.writers)]
        await asyncio.gather(
            *(node.create_conversation(TENANT, c, "rev-1", {}) for c in conversations)
        )
        if before_drive is not None:
            await before_drive()
        text = payload_text(args.payload_bytes, args.seed)
        acked_by: set[tuple[str, ...]] = set()

        async def append(index: int) -> None:
            event = await node.append_event(
                TENANT, conversations[index], "message.user", {"content": text}, token_count=256
            )
            if len(acked_by) < 8:
                acked_by.add(event.acked_by)

        profiler = cProfile.Profile() if args.profile else None
        if profiler is not None:
            profiler.enable()
        with py_spy(os.getpid(), args.py_spy):
            recorder = await drive(args.writers, args.warmup_s, args.seconds, append, cpu_of)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        groups = {s.region: s.groups_committed for s in stores}
        print(f"convplane: acked_by seen {sorted(acked_by)}; groups committed {groups}")
        return recorder
    finally:
        await node.close()
        for store in stores:
            await store.close()


# --- the peer: PostgreSQL quorum synchronous replication -----------------------------------


async def run_peer_for(
    dsn: str, args: argparse.Namespace, cpu_of: Mapping[str, int] | None = None
) -> Recorder:
    return await run_peer(
        dsn,
        writers=args.writers,
        pool_max=args.peer_pool_max,
        payload_bytes=args.payload_bytes,
        seed=args.seed,
        warmup_s=args.warmup_s,
        seconds=args.seconds,
        cpu_of=cpu_of,
    )


# --- mode 2: latency against the floor -------------------------------------------------------


async def median_ms(samples: int, call: Callable[[], Awaitable[Any]]) -> float:
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        await call()
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


async def measure_floor(local_dsn: str, proxy_dsn: str, payload_bytes: int) -> dict[str, float]:
    """One round trip through a delay proxy (SELECT 1) + one local single-row insert+commit."""
    local = await asyncpg.connect(plain_dsn(local_dsn), timeout=CALL_TIMEOUT_S)
    remote = await asyncpg.connect(plain_dsn(proxy_dsn), timeout=CALL_TIMEOUT_S)
    try:
        await local.execute("CREATE TABLE IF NOT EXISTS floor_probe (id serial, v text)")
        row = "x" * payload_bytes
        commit_ms = await median_ms(
            50, lambda: local.execute("INSERT INTO floor_probe (v) VALUES ($1)", row)
        )
        round_trip_ms = await median_ms(20, lambda: remote.fetchval("SELECT 1"))
    finally:
        await local.close(timeout=CALL_TIMEOUT_S)
        await remote.close(timeout=CALL_TIMEOUT_S)
    return {"local_commit_ms": commit_ms, "round_trip_ms": round_trip_ms}


async def close_proxy(proxy: FaultProxy) -> None:
    """Close, then give its connection handlers a moment to end (the proxy does not await them;
    a handler still running when the loop closes is reported as a cancelled task)."""
    await proxy.close()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(2.0):
            while True:
                if not proxy.connections_active:
                    return
                await asyncio.sleep(0.01)


def through(proxy: FaultProxy, dsn: str) -> str:
    return dsn_via(dsn, "127.0.0.1", proxy.port)


async def mode_latency(servers: list[PgInstance], args: argparse.Namespace) -> dict[str, Any]:
    dsns = {region: s.dsn for region, s in zip(REGIONS, servers, strict=True)}
    proxies = []
    for region in ("b", "c"):
        target = urlsplit(dsns[region])
        proxy = FaultProxy(ProxySpec(f"a->{region}", 0, target.hostname or "", target.port or 0))
        await proxy.start()
        dsns[region] = through(proxy, dsns[region])
        proxies.append(proxy)
    floor: dict[str, float] = {}

    async def delay_then_measure_floor() -> None:
        # Leadership (a few round trips per shard) is taken before the delay: it is not measured.
        for proxy in proxies:
            proxy.set_rules(ProxyRules(up_delay_ms=args.delay_ms, down_delay_ms=args.delay_ms))
        floor.update(await measure_floor(dsns["a"], dsns["b"], args.payload_bytes))

    try:
        recorder = await run_convplane(dsns, args, delay_then_measure_floor)
    finally:
        for proxy in proxies:
            await close_proxy(proxy)
    floor_ms = 2 * args.delay_ms + floor["local_commit_ms"]
    result = {
        "delay_ms": args.delay_ms,
        "floor_ms": round(floor_ms, 2),
        "ack_p50_ms": round(recorder.percentile_ms(0.50), 2),
        "ack_p99_ms": round(recorder.percentile_ms(0.99), 2),
    }
    print(
        f"floor: 2 x {args.delay_ms} ms + local commit {floor['local_commit_ms']:.2f} ms "
        f"= {floor_ms:.2f} ms (measured round trip through the proxy: "
        f"{floor['round_trip_ms']:.2f} ms)"
    )
    report("convplane", recorder)
    target_ms = 1.5 * floor_ms + 10
    print(f"p99 {result['ack_p99_ms']} ms vs target 1.5 x floor + 10 = {target_ms:.2f} ms")
    return result


# --- mode 1 ----------------------------------------------------------------------------------


def report(name: str, recorder: Recorder) -> None:
    print(
        f"{name:>10}: {recorder.events_per_s:9.0f} events/s   "
        f"p50 {recorder.percentile_ms(0.5):7.2f} ms   p99 {recorder.percentile_ms(0.99):7.2f} ms"
        + (f"   errors {recorder.errors}" if recorder.errors else "")
    )
    if recorder.cpu_s_per_1000_events:
        print(f"{'':>10}  CPU s per 1,000 events: {recorder.cpu_s_per_1000_events}")


async def mode_throughput(
    servers: list[PgInstance], peer: SyncReplicationCluster, args: argparse.Namespace
) -> dict[str, Any]:
    dsns = {region: s.dsn for region, s in zip(REGIONS, servers, strict=True)}
    replicas = {f"postgres-{region}": s.pid for region, s in zip(REGIONS, servers, strict=True)}
    ours = await run_convplane(dsns, args, cpu_of=replicas)
    report("convplane", ours)
    peer_servers = {"postgres-primary": peer.primary.pid}
    peer_servers |= {f"postgres-standby-{i}": s.pid for i, s in enumerate(peer.standbys, 1)}
    theirs = await run_peer_for(peer.dsn, args, cpu_of=peer_servers)
    report("pg-syncrep", theirs)
    ratio = ours.events_per_s / theirs.events_per_s if theirs.events_per_s else float("nan")
    print(f"throughput ratio convplane / postgres quorum sync rep: {ratio:.2f}")
    return {
        "convplane_events_per_s": round(ours.events_per_s, 1),
        "postgres_quorum_events_per_s": round(theirs.events_per_s, 1),
        "throughput_ratio": round(ratio, 3),
        "ack_p50_ms": round(ours.percentile_ms(0.50), 2),
        "ack_p99_ms": round(ours.percentile_ms(0.99), 2),
        "cpu_s_per_1000_events": ours.cpu_s_per_1000_events,
        "postgres_cpu_s_per_1000_events": theirs.cpu_s_per_1000_events,
        "postgres_ack_p50_ms": round(theirs.percentile_ms(0.50), 2),
        "postgres_ack_p99_ms": round(theirs.percentile_ms(0.99), 2),
        "writers": args.writers,
        "seconds": args.seconds,
    }


# --- program ---------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds per system")
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--writers", type=int, default=None, help="default 256; 16 with --delay-ms")
    p.add_argument("--payload-bytes", type=int, default=1024)
    p.add_argument("--delay-ms", type=float, default=None, help="mode 2: proxy delay each way")
    p.add_argument("--shards", type=int, default=64)
    p.add_argument("--leader-batch-max", type=int, default=256, help="LogConfig.batch_events_max")
    p.add_argument(
        "--store-linger-ms", type=float, default=StoreConfig().batch_linger_ms, help="when busy"
    )
    p.add_argument("--store-batch-max", type=int, default=512)
    p.add_argument("--peer-pool-max", type=int, default=80, help="server max_connections=100")
    p.add_argument("--profile", help="cProfile the convplane run into this file")
    p.add_argument("--py-spy", type=Path, help="record the convplane run with py-spy (raw)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--loop", choices=("uvloop", "asyncio"), default="uvloop", help="event loop of the run"
    )
    args = p.parse_args(argv)
    if args.writers is None:
        args.writers = 16 if args.delay_ms is not None else 256
    return args


def run_on(loop: str, main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop (what node processes run: ``services.bootstrap.serve``) or on
    asyncio's own loop; both systems of a run share it."""
    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # also when started with SIGINT ignored (nohup, &)
    base = Path(tempfile.mkdtemp(prefix="convplane-bench-"))
    os.chmod(base, 0o711)  # the postgres user must reach the data directories
    stoppers: list[Callable[[], None]] = []
    try:
        servers = start_instances(3, base / "log")
        stoppers += [lambda s=s: s.stop("immediate") for s in servers]  # type: ignore[misc]
        if args.delay_ms is not None:
            result = run_on(args.loop, mode_latency(servers, args))
        else:
            peer = start_sync_replication_cluster(base / "peer", standbys=2)
            stoppers.append(peer.stop)
            result = run_on(args.loop, mode_throughput(servers, peer, args))
        print(json.dumps(result))
        return 0
    finally:
        for stop in stoppers:
            with contextlib.suppress(Exception):
                stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
