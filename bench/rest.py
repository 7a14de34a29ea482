"""Appends through the REST API of a local 3-region plane vs PostgreSQL's own quorum
synchronous replication, with a native load generator.

A program, not a test::

    .venv/bin/python -m bench.rest [--seconds 20] [--connections 63] [--reads] [--py-spy DIR]

It starts the plane the way ``convplane up --regions 3 --postgres`` does (``LocalPlane``: one
PostgreSQL and one node process per region, mutual TLS between the nodes), with the demo
tenant's quota raised out of the way, creates ``--conversations`` conversations and asks each
one's ``/route``. Then ``wrk`` (Debian package ``wrk``; a C load generator, so the client does
not compete with the nodes for the interpreter) posts 1 KiB ``message.user`` events, a fresh
``Idempotency-Key`` per request, over ``--connections`` keep-alive connections, in two modes:

- ``route``: the client follows ``/route``; one wrk thread per region sends that region the
  conversations it serves (nothing is forwarded);
- ``any``: every request enters the first region, which forwards the two thirds it does not
  lead to their leaders over the pooled peer connections.

``--reads`` adds two modes after them, route-following linearizable reads (the leader confirms
it still leads before it answers) of the conversations the two modes wrote: ``reads``, ``GET
/v1/conversations/{id}``, against the peer's readers asking its primary for a conversation's
last seq at the same concurrency; and ``pages``, the first ``PAGE_EVENTS`` events of the
transcript (``GET .../events?limit=20``), against the peer's readers selecting a conversation's
first 20 rows (``bench/pg_peer.py``, ``run_peer_reads``, after each of its write runs). The
JSON's ``reads`` and ``pages`` each hold ``reads_per_s``, ``peer_reads_per_s`` and
``read_ratio``.

Each mode gets a short unmeasured warm-up run first. CPU seconds of every node process, of each
region's PostgreSQL (postmaster and backends) and of wrk are read from ``/proc`` around the
measured run and reported per 1,000 acknowledged events. The peer (``bench/pg_peer.py``:
primary + 2 standbys, ``ANY 1``) is measured at the same concurrency before the plane starts and
again after it stopped, and at 256 writers, with the CPU of its three servers and of this
process (its asyncpg client): this machine's speed drifts by tens of percent within minutes, so
the peer brackets the plane, and the best of its measurements is the peer's number
(``peer_before_after_events_per_s`` shows the drift). The last line is ONE JSON object.

``--py-spy DIR`` records the first region's node (``--py-spy-region 1`` or ``2``: another
one, a leader of forwarded appends) with py-spy during the measured runs
(``raw`` collapsed stacks, one file per mode) for profiling; it costs CPU, so numbers from such
a run are not the benchmark's.

``--cpus N`` pins everything (plane, peer, their clients, wrk) to the first N CPUs: how each
side's throughput grows with cores (``--cpus 1`` against the default, all of them).

``--lab`` (root; ``tests.harness.lab``) runs both sides on hosts of a lab on this machine,
each with ``--host-cpu`` cores of CPU quota: each region (its node and its PostgreSQL) on its
own host (with ``--growth`` or several nodes per region: its PostgreSQL, and each node on a
host of its own), and the peer's primary and each standby on their own. wrk and the peer's client run
outside the lab, unquota'd, as clients would. A lab run compares per host, where a plain run
compares per machine: the JSON's ``hosts`` gives each host's cores used in the measured runs
against its quota (the plane's route mode; the peer's best run).

``--nodes-per-region N`` runs the plane with N nodes per region (``convplane up
--nodes-per-region``; on the lab, each node on a host of its own), the route mode sending each
conversation to the node that ``/route`` says leads it (``node_url``). ``--growth`` measures
the route mode on a plane of one node per region first, in the same run, and reports
``growth_ratio``: the events/s of N nodes per region over that of one. ``--growth-rounds K``
measures K such pairs (fresh planes each time, the first K-1 alternating which goes first)
and reports each pair's ratio and their median: on the lab the same plane's events/s moved by
up to 1.7x between consecutive runs (2026-12-07), so one pair says little.

Every process started here is stopped on exit, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.cpu import cpu_snapshot, cpu_used
from bench.pg_peer import Recorder, payload_text, run_peer, run_peer_reads
from bench.profiling import py_spy
from services.local.plane import LocalPlane
from tests.harness.lab import Lab
from tests.harness.lab_plane import lab_plane, sync_replication_on_lab
from tests.harness.postgres import SyncReplicationCluster, start_sync_replication_cluster

CALL_TIMEOUT_S = 10.0  # every setup call to the plane
SETUP_RETRIES = 50  # a setup call answered 503 is asked again, this many times at most
SETUP_RETRY_PAUSE_S = 0.1
WRK_TIMEOUT_S = 15  # wrk counts a response slower than this as a timeout error
BENCH_TENANT_REQUESTS_PER_S = 1_000_000.0  # the demo tenant's quota, out of the way
PEER_WRITERS_MAX = 256  # the peer is also measured at bench/append.py's concurrency
APPEND_LABELS = ('route="/v1/conversations/{conversation_id}/events"', 'method="POST"')

WRK_SCRIPT = """
-- generated by bench/rest.py: thread i posts to targets[i], round-robin over its conversations
local targets = {TARGETS}
local body = [[{BODY}]]
local auth = "Bearer {KEY}"
local next_thread = 0

function setup(thread)
  next_thread = next_thread + 1
  local target = targets[(next_thread - 1) % #targets + 1]
  thread.addr = wrk.lookup(target.host, target.port)[1]
  thread:set("ids", target.ids)
  thread:set("tid", next_thread)
end

function init(args)
  n = 0
end

function request()
  n = n + 1
  local id = ids[n % #ids + 1]
{REQUEST}
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "non_2xx": %d, "connect_errors": %d, ' ..
    '"read_errors": %d, "write_errors": %d, "timeouts": %d, "p50_us": %d, "p90_us": %d, ' ..
    '"p99_us": %d, "p999_us": %d, "max_us": %d}\\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max))
end
"""


#: the body of wrk's ``request()``: an append with a fresh Idempotency-Key, or a read
APPEND_REQUEST = """  local headers = {
    ["Authorization"] = auth,
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = "{RUN}-" .. tid .. "-" .. n,
  }
  return wrk.format("POST", "/v1/conversations/" .. id .. "/events", headers, body)"""
READ_REQUEST = (
    """  return wrk.format("GET", "/v1/conversations/" .. id, {["Authorization"] = auth})"""
)
#: events in a transcript page read (``pages`` mode)
PAGE_EVENTS = 20
PAGE_REQUEST = f"""  return wrk.format("GET", "/v1/conversations/" .. id .. "/events?limit={PAGE_EVENTS}",
    {{["Authorization"] = auth}})"""


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    conversation_ids: list[str]


def lua_targets(targets: list[Target]) -> str:
    def one(t: Target) -> str:
        ids = ", ".join(f'"{c}"' for c in t.conversation_ids)
        return f'{{host = "{t.host}", port = "{t.port}", ids = {{{ids}}}}}'

    return "{" + ", ".join(one(t) for t in targets) + "}"


def wrk_script(
    path: Path, targets: list[Target], api_key: str, body: str, run: str, request: str
) -> Path:
    text = (
        WRK_SCRIPT.replace("{REQUEST}", request)
        .replace("{TARGETS}", lua_targets(targets))
        .replace("{BODY}", body)
        .replace("{KEY}", api_key)
        .replace("{RUN}", run)
    )
    path.write_text(text)
    return path


# --- CPU accounting ----------------------------------------------------------------------------


# --- one mode ----------------------------------------------------------------------------------


def run_wrk(
    script: Path, url: str, threads: int, connections: int, seconds: float
) -> dict[str, Any]:
    wrk = subprocess.Popen(
        ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds:g}s",
         "--timeout", f"{WRK_TIMEOUT_S}s", "-s", str(script), url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = wrk.communicate(timeout=seconds + 2 * WRK_TIMEOUT_S + 30)
    except BaseException:
        wrk.kill()
        wrk.wait()
        raise
    if wrk.returncode != 0:
        raise RuntimeError(f"wrk failed ({wrk.returncode}): {err.decode()[-2000:]}")
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"wrk printed no summary: {out.decode()[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def measure_mode(
    name: str,
    targets: list[Target],
    plane_info: dict[str, Any],
    work: Path,
    args: argparse.Namespace,
    request: str = APPEND_REQUEST,
) -> dict[str, Any]:
    """One mode, measured with wrk; a mode of reads (``READ_REQUEST``) counts reads where an
    append mode counts events."""
    body = json.dumps(
        {"type": "message.user", "payload": {"content": payload_text(args.payload_bytes, 1)}}
    )
    regions = plane_info["regions"]
    groups = node_pids(plane_info)
    groups |= {f"postgres-{r['name']}": int(r["db_pid"]) for r in regions}
    url = regions[0]["url"]
    threads = len(targets)
    connections = args.connections - args.connections % threads
    key = plane_info["api_key"]
    warm = wrk_script(work / f"{name}-warm.lua", targets, key, body, f"{name}w", request)
    run_wrk(warm, url, threads, connections, args.warmup_s)
    script = wrk_script(work / f"{name}.lua", targets, key, body, name, request)
    spied = regions[args.py_spy_region]
    spied_nodes = [spied, *spied.get("more_nodes", [])]
    spied_node = spied_nodes[min(args.py_spy_node, len(spied_nodes) - 1)]
    spy_out = args.py_spy / f"{name}-{spied['name']}.txt" if args.py_spy else None
    before = cpu_snapshot(groups)
    with py_spy(int(spied_node["node_pid"]), spy_out):
        summary = run_wrk(script, url, threads, connections, args.seconds)
    used = cpu_used(before, groups)
    statuses = append_statuses(plane_info) if request == APPEND_REQUEST else {}
    acked = summary["requests"] - summary["non_2xx"]
    seconds = summary["duration_us"] / 1e6
    result = {
        "events_per_s": round(acked / seconds, 1),
        "ack_p50_ms": round(summary["p50_us"] / 1000, 2),
        "ack_p99_ms": round(summary["p99_us"] / 1000, 2),
        "ack_p90_p999_max_ms": [
            round(summary[k] / 1000, 1) for k in ("p90_us", "p999_us", "max_us")
        ],
        "non_2xx": summary["non_2xx"],
        "socket_errors": sum(
            summary[k] for k in ("connect_errors", "read_errors", "write_errors", "timeouts")
        ),
        "connections": connections,
        "statuses_since_start": statuses,
        "cpu_s_per_1000_events": {
            process: round(1000 * s / max(acked, 1), 3) for process, s in used.items()
        },
    }
    print(f"{name:>6}: {json.dumps(result)}", flush=True)
    return result


def node_pids(plane_info: dict[str, Any]) -> dict[str, int]:
    """Each node process's pid by group name: ``node-<region>`` for a region of one node,
    ``node-<region>/<index>`` for each node of a region of several (each a host of its own on
    the lab, apart from the region's PostgreSQL)."""
    groups = {}
    for region in plane_info["regions"]:
        nodes = [region, *region.get("more_nodes", [])]
        for index, node in enumerate(nodes):
            name = region["name"] if len(nodes) == 1 else f"{region['name']}/{index}"
            groups[f"node-{name}"] = int(node["node_pid"])
    return groups


def node_urls(plane_info: dict[str, Any]) -> list[str]:
    return [node["url"] for r in plane_info["regions"] for node in [r, *r.get("more_nodes", [])]]


def append_statuses(plane_info: dict[str, Any]) -> dict[str, float]:
    """Appends answered so far, by status, summed over the nodes' /metrics (warm-ups and
    forwards included: a forwarded append is counted at its entry node and at its leader)."""
    counts: dict[str, float] = {}
    for url in node_urls(plane_info):
        text = httpx.get(url + "/metrics", timeout=CALL_TIMEOUT_S).text
        for line in text.splitlines():
            if line.startswith("convplane_http_requests_total{") and all(
                label in line for label in APPEND_LABELS
            ):
                status = line.split('status="', 1)[1].split('"', 1)[0]
                counts[status] = counts.get(status, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


# --- setup -------------------------------------------------------------------------------------


def create_conversations(plane_info: dict[str, Any], count: int) -> dict[str, list[str]]:
    """``count`` conversations created through the first region; their ids by the client URL
    of the node serving them (``/route``'s ``node_url``)."""
    regions = plane_info["regions"]
    headers = {"Authorization": f"Bearer {plane_info['api_key']}"}
    by_node: dict[str, list[str]] = {url: [] for url in node_urls(plane_info)}
    with httpx.Client(base_url=regions[0]["url"], headers=headers, timeout=CALL_TIMEOUT_S) as http:
        for index in range(count):
            conversation_id = f"bench-rest-{index}"
            body = {"conversation_id": conversation_id}
            answered(partial(http.post, "/v1/conversations", json=body), ok=(201, 409))
            path = f"/v1/conversations/{conversation_id}/route"
            route = answered(partial(http.get, path), ok=(200,))
            by_node[route.json()["node_url"]].append(conversation_id)
    return by_node


def answered(call: Callable[[], httpx.Response], *, ok: tuple[int, ...]) -> httpx.Response:
    """``call``'s answer once its status is in ``ok``; a retryable 503 (a shard changing hands
    inside a region that just started: its first node may hold a later one's slot a moment)
    is asked again, a few times."""
    for _ in range(SETUP_RETRIES):
        reply = call()
        if reply.status_code in ok:
            return reply
        if reply.status_code != 503:
            break
        time.sleep(SETUP_RETRY_PAUSE_S)
    reply.raise_for_status()
    raise RuntimeError(f"{reply.request.url}: {reply.status_code} {reply.text[:300]}")


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def start_plane(
    work: Path, args: argparse.Namespace, lab: Lab | None, nodes_per_region: int
) -> LocalPlane:
    """3 regions on PostgreSQL: on this machine's loopback, or each on its own host of ``lab``
    (each of its nodes on another, with several)."""
    planes = len(list(work.glob("plane-*")))  # a fresh directory for each plane started
    state_dir = work / f"plane-{planes}-{nodes_per_region}"
    if lab is not None:
        return lab_plane(
            lab, state_dir, args.shards, cpu_quota=args.host_cpu,
            demo_requests_per_s=BENCH_TENANT_REQUESTS_PER_S, nodes_per_region=nodes_per_region,
            node_hosts=args.growth,  # one node per region on its own host too: like for like
        )  # fmt: skip
    return LocalPlane(
        regions=3,
        state_dir=state_dir,
        base_port=0,
        postgres=True,
        shard_count=args.shards,
        demo_requests_per_s=BENCH_TENANT_REQUESTS_PER_S,
        nodes_per_region=nodes_per_region,
    )


def start_peer(
    work: Path, label: str, args: argparse.Namespace, lab: Lab | None
) -> SyncReplicationCluster:
    base = work / f"peer-{label}"
    if lab is None:
        return start_sync_replication_cluster(base, standbys=2)
    peer, _hosts = sync_replication_on_lab(lab, base, cpu_quota=args.host_cpu)
    return peer


def measure_plane(
    work: Path,
    args: argparse.Namespace,
    lab: Lab | None,
    nodes_per_region: int,
    *,
    route_only: bool = False,
) -> dict[str, dict[str, Any]]:
    plane = start_plane(work, args, lab, nodes_per_region)
    try:
        info = plane.start()
        by_node = create_conversations(info, args.conversations)
        print(f"conversations by serving node: { {u: len(c) for u, c in by_node.items()} }")
        route_targets = [Target(*host_port(url), ids) for url, ids in by_node.items() if ids]
        if route_only:
            label = f"route-{nodes_per_region}"
            return {"route": measure_mode(label, route_targets, info, work, args)}
        host, port = host_port(info["regions"][0]["url"])
        everything = [c for ids in by_node.values() for c in ids]
        any_targets = [Target(host, port, everything[i::3]) for i in range(3)]
        modes = {
            "route": measure_mode("route", route_targets, info, work, args),
            "any": measure_mode("any", any_targets, info, work, args),
        }
        if args.reads:  # the conversations hold the two modes' events by now
            modes["reads"] = measure_mode("reads", route_targets, info, work, args, READ_REQUEST)
            modes["pages"] = measure_mode("pages", route_targets, info, work, args, PAGE_REQUEST)
        return modes
    finally:
        plane.stop()


def measure_peer(
    work: Path, args: argparse.Namespace, writer_counts: list[int], label: str, lab: Lab | None
) -> dict[str, dict[str, Any]]:
    peer = start_peer(work, label, args, lab)
    try:
        results = {}
        servers = {"postgres-primary": peer.primary.pid}
        servers |= {f"postgres-standby-{i}": s.pid for i, s in enumerate(peer.standbys, 1)}
        for writers in writer_counts:
            recorder = asyncio.run(
                run_peer(
                    peer.dsn,
                    writers=writers,
                    pool_max=args.peer_pool_max,
                    payload_bytes=args.payload_bytes,
                    seed=1,
                    warmup_s=args.warmup_s,
                    seconds=args.peer_seconds,
                    cpu_of=servers,  # and this process: the asyncpg client
                )
            )
            key = f"{writers}-{label}"
            results[key] = peer_result(recorder, "events", "ack")
            print(f"  peer, {writers} writers, {label}: {json.dumps(results[key])}", flush=True)
        # of the conversations the writers just wrote, from the primary
        for kind, page_events in (("reads", 0), ("pages", PAGE_EVENTS)) if args.reads else ():
            recorder = asyncio.run(
                run_peer_reads(
                    peer.dsn,
                    readers=args.connections,
                    pool_max=args.peer_pool_max,
                    warmup_s=args.warmup_s,
                    seconds=args.peer_seconds,
                    page_events=page_events,
                    cpu_of=servers,
                )
            )
            key = f"{kind}-{args.connections}-{label}"
            results[key] = peer_result(recorder, "reads", "read")
            print(f"  peer, {args.connections} {kind} readers, {label}: {json.dumps(results[key])}")
        return results
    finally:
        peer.stop()


def peer_result(recorder: Recorder, unit: str, latency: str) -> dict[str, Any]:
    """A peer run's numbers, named by what it did (``events``/``ack`` or ``reads``/``read``)."""
    return {
        f"{unit}_per_s": round(recorder.events_per_s, 1),
        f"cpu_s_per_1000_{unit}": recorder.cpu_s_per_1000_events,
        f"{latency}_p50_ms": round(recorder.percentile_ms(0.5), 2),
        f"{latency}_p99_ms": round(recorder.percentile_ms(0.99), 2),
        "errors": sum(recorder.errors.values()),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per mode")
    p.add_argument("--warmup-s", type=float, default=3.0)
    p.add_argument("--peer-seconds", type=float, default=10.0, help="per peer concurrency")
    p.add_argument("--connections", type=int, default=63, help="rounded down to 3 threads")
    p.add_argument("--conversations", type=int, default=192)
    p.add_argument("--payload-bytes", type=int, default=1024)
    p.add_argument("--shards", type=int, default=64)
    p.add_argument("--peer-pool-max", type=int, default=80, help="server max_connections=100")
    p.add_argument("--no-peer", action="store_true", help="skip the peer (profiling runs)")
    p.add_argument("--reads", action="store_true",
                   help="also linearizable reads, route-following, against the peer's primary")  # fmt: skip
    p.add_argument("--cpus", type=int, default=0,
                   help="run everything (plane, peer, wrk) on the first N CPUs (0: all)")  # fmt: skip
    p.add_argument("--lab", action="store_true",
                   help="each region and each peer server on its own lab host (root)")  # fmt: skip
    p.add_argument("--host-cpu", type=float, default=0.5,
                   help="with --lab: each host's CPU quota, in cores")  # fmt: skip
    p.add_argument("--nodes-per-region", type=int, default=1, choices=range(1, 9),
                   help="node processes per region (each on a host of its own with --lab)")  # fmt: skip
    p.add_argument("--growth", action="store_true",
                   help="also the route mode with 1 node per region, for growth_ratio")  # fmt: skip
    p.add_argument("--growth-rounds", type=int, default=1,
                   help="measure both planes this often; growth_ratio is the median")  # fmt: skip
    p.add_argument("--py-spy", type=Path, help="record the first node with py-spy into DIR")
    p.add_argument("--py-spy-region", type=int, default=0, choices=(0, 1, 2),
                   help="record this region's node instead (0: the any-region entry node)")  # fmt: skip
    p.add_argument("--py-spy-node", type=int, default=0,
                   help="record this node of the region (its last where it has fewer)")  # fmt: skip
    return p.parse_args(argv)


def reads_summary(
    reads: dict[str, Any], peer: dict[str, dict[str, Any]], kind: str = "reads"
) -> dict[str, Any]:
    """A read mode (``reads`` or ``pages``) as reads (``measure_mode`` words every mode as
    events), against the peer's best run of the same kind."""
    peer_best = max(
        (p["reads_per_s"] for key, p in peer.items() if key.startswith(f"{kind}-")),
        default=float("nan"),
    )
    return {
        "reads_per_s": reads["events_per_s"],
        "read_p50_ms": reads["ack_p50_ms"],
        "read_p99_ms": reads["ack_p99_ms"],
        "non_2xx": reads["non_2xx"],
        "peer_reads_per_s": peer_best,
        "read_ratio": round(reads["events_per_s"] / peer_best, 3),
        "cpu_s_per_1000_reads": reads["cpu_s_per_1000_events"],
    }


def hosts_summary(
    route: dict[str, Any], peer: dict[str, dict[str, Any]], quota: float
) -> dict[str, dict[str, float]]:
    """Each lab host's cores in use during a measured run, and that as a share of its quota:
    a region's host (its node and its PostgreSQL) in the route mode, each peer server's host in
    the peer's best write run. A host near 1.0 is the one that bounds its side."""
    cores: dict[str, float] = {}
    rate = route["events_per_s"] / 1000
    for process, per_1000 in route["cpu_s_per_1000_events"].items():
        region = process.split("-", 1)[1]  # node-us-east, postgres-us-east
        cores[region] = cores.get(region, 0.0) + per_1000 * rate
    writes = [p for p in peer.values() if "events_per_s" in p]
    if writes:
        best = max(writes, key=lambda p: p["events_per_s"])
        for process, per_1000 in best["cpu_s_per_1000_events"].items():
            if process.startswith("postgres-"):  # postgres-primary, postgres-standby-1
                name = "pg-" + process.removeprefix("postgres-").replace("standby-", "s")
                cores[name] = per_1000 * best["events_per_s"] / 1000
    return {
        host: {"cores": round(used, 3), "of_quota": round(used / quota, 3)}
        for host, used in cores.items()
    }


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian: apt-get install -y wrk)")
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    cpus = sorted(os.sched_getaffinity(0))
    if args.cpus:
        if not 0 < args.cpus <= len(cpus):
            raise SystemExit(f"--cpus {args.cpus}: this process may use {len(cpus)} CPUs")
        cpus = cpus[: args.cpus]
        os.sched_setaffinity(0, cpus)  # every process started from here inherits it
    if args.py_spy is not None:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="convplane-bench-rest-"))
    os.chmod(work, 0o711)  # the postgres user must reach the data directories
    cleanup: list[Callable[[], None]] = [lambda: shutil.rmtree(work, ignore_errors=True)]
    lab = Lab() if args.lab else None
    try:
        if lab is not None:
            lab.start()
            cleanup.insert(0, lab.close)  # its processes stopped before their files go
        print(f"load average before: {os.getloadavg()}", flush=True)
        # the peer before and after the plane: this machine's speed drifts by tens of percent
        # within minutes, and a ratio against one side of the drift would say more about it
        peer = {} if args.no_peer else measure_peer(work, args, [args.connections], "before", lab)
        growth = args.growth and args.nodes_per_region > 1
        # (events/s with one node per region, with N): the pairs before the last alternate
        # which goes first, since this machine's speed drifts between runs
        pairs: list[tuple[float, float]] = []
        for pair in range(args.growth_rounds - 1 if growth else 0):
            order = (1, args.nodes_per_region) if pair % 2 else (args.nodes_per_region, 1)
            rates = {
                n: measure_plane(work, args, lab, n, route_only=True)["route"]["events_per_s"]
                for n in order
            }
            pairs.append((rates[1], rates[args.nodes_per_region]))
        single = measure_plane(work, args, lab, 1, route_only=True)["route"] if growth else None
        modes = measure_plane(work, args, lab, args.nodes_per_region)
        if not args.no_peer:
            counts = sorted({args.connections, PEER_WRITERS_MAX})
            peer |= measure_peer(work, args, counts, "after", lab)
        print(f"load average after: {os.getloadavg()}", flush=True)
    finally:
        for step in cleanup:
            step()
    route, any_region = modes["route"], modes["any"]
    # the ratio is against the peer's best measurement (the most favourable to the peer)
    peer_best = max(
        (p["events_per_s"] for p in peer.values() if "events_per_s" in p), default=float("nan")
    )
    same_writers = [peer[f"{args.connections}-{when}"]["events_per_s"]
                    for when in ("before", "after") if f"{args.connections}-{when}" in peer]  # fmt: skip
    result = {
        **{k: route[k] for k in ("events_per_s", "ack_p50_ms", "ack_p99_ms", "non_2xx")},
        "peer_events_per_s": peer_best,
        "throughput_ratio": round(route["events_per_s"] / peer_best, 3),
        "peer_before_after_events_per_s": same_writers,
        "forwarded_ratio": round(any_region["events_per_s"] / route["events_per_s"], 3),
        "cpu_s_per_1000_events": route["cpu_s_per_1000_events"],
        "any_region": any_region,
        "peer": peer,
        "connections": route["connections"],
        "seconds": args.seconds,
        "cpus": len(cpus),
        "nodes_per_region": args.nodes_per_region,
    }
    if single is not None:
        pairs.append((single["events_per_s"], route["events_per_s"]))
        ratios = [round(several / one, 3) for one, several in pairs]
        result["one_node_per_region_events_per_s"] = single["events_per_s"]
        result["growth_pairs_events_per_s"] = pairs
        result["growth_ratios"] = ratios
        result["growth_ratio"] = statistics.median(ratios)
    for kind in ("reads", "pages"):
        if kind in modes:
            result[kind] = reads_summary(modes[kind], peer, kind)
    if args.lab:
        result["host_cpu_quota"] = args.host_cpu
        result["hosts"] = hosts_summary(route, peer, args.host_cpu)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
