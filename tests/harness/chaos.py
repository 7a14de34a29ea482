"""Chaos harness: a real 3-region plane (3 PostgreSQL + 3 node processes, started the way
``convplane up --postgres`` starts them), optional fault proxies between regions, concurrent
writers over HTTP with idempotent retries, recovery-time measurement, and an audit that reads
every PostgreSQL directly. Used by ``tests/chaos`` and ``bench/failover.py``.

Proxies: with ``proxied=True`` every node reaches every *other* region's database and node
through its own TCP proxy (``<source>-><target>:db`` / ``:http``, the latter to the target's peer
listener: TLS passes through it), set through the cluster file's ``dsn_from`` / ``url_from``;
cutting a region's links partitions it. A node reaches its own
database directly; test clients reach every node directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

from eventlog.http_headers import DEADLINE_HEADER, IDEMPOTENCY_KEY_HEADER, SERVED_BY_HEADER
from eventlog.sharding import shard_of
from regions.placement import place_shards
from services.config import ClusterConfig
from services.deploy.db_roles import asyncpg_dsn
from services.local.faultproxy import HEALED, FaultProxy, ProxySpec
from services.local.plane import LocalPlane, RegionProcess

#: node settings for chaos runs: 1 s detection (the production default), a short failback
FAST_ENV = {
    "CONVPLANE_DETECTION_S": "1.0",
    "CONVPLANE_PROBE_INTERVAL_S": "0.2",
    "CONVPLANE_FAILBACK_HYSTERESIS_S": "3.0",
    "CONVPLANE_FAILBACK_STEP_INTERVAL_S": "0.5",
    "CONVPLANE_FAILBACK_SHARDS_PER_STEP": "4",
    "CONVPLANE_LEAD_CONCURRENCY_MAX": "16",
}
ATTEMPT_TIMEOUT_S = 3.0
RETRY_BACKOFF_S = 0.05
WRITE_PAUSE_S = 0.01
TRACE_MAX = 5000


@dataclass
class ChaosPlane(LocalPlane):
    """A LocalPlane whose cluster file can route inter-region traffic through fault proxies."""

    proxied: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    proxies: dict[str, FaultProxy] = field(default_factory=dict)

    def cluster_config(self) -> ClusterConfig:
        base = super().cluster_config()
        if not self.proxied:
            return base
        assert self.loop is not None, "proxies run on the test's event loop"
        future = asyncio.run_coroutine_threadsafe(self._start_proxies(), self.loop)
        future.result(timeout=30)
        regions = [
            r.model_copy(update={
                "dsn_from": {**r.dsn_from,  # the nodes' own roles; other regions via proxies
                             **{s.name: _with_port(r.dsn_from.get(s.name, r.dsn),
                                                   self.proxies[f"{s.name}->{r.name}:db"].port)
                                for s in self.members if s.name != r.name}},
                "url_from": {s.name: _with_port(r.peer_url or r.url,
                                                self.proxies[f"{s.name}->{r.name}:http"].port)
                             for s in self.members if s.name != r.name},
            })
            for r in base.regions
        ]  # fmt: skip
        return base.model_copy(update={"regions": regions})

    async def _start_proxies(self) -> None:
        for source in self.members:
            for target in self.members:
                if source.name == target.name:
                    continue
                for kind, url in (("db", target.dsn), ("http", target.peer_url)):
                    parts = urlsplit(url)
                    assert parts.hostname and parts.port
                    name = f"{source.name}->{target.name}:{kind}"
                    proxy = FaultProxy(
                        ProxySpec(name, 0, parts.hostname, parts.port), connect_timeout_s=1.0
                    )
                    await proxy.start()
                    self.proxies[name] = proxy

    async def close_proxies(self) -> None:
        for proxy in self.proxies.values():
            await proxy.close()

    def partition(self, region: str) -> None:
        """Black-hole every link into and out of ``region``."""
        for name, proxy in self.proxies.items():
            source, _, rest = name.partition("->")
            if region in (source, rest.split(":")[0]):
                proxy.set_rules(dataclasses.replace(HEALED, up="drop", down="drop"))

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.set_rules(HEALED)

    # --- processes ------------------------------------------------------------------------

    def member(self, name: str) -> RegionProcess:
        return next(m for m in self.members if m.name == name)

    def kill_region(self, name: str) -> None:
        """kill -9 the region's node and its database (the postmaster and its children)."""
        member = self.member(name)
        assert member.node is not None and member.db is not None
        os.kill(member.node.pid, signal.SIGKILL)
        kill = getattr(member.db, "kill")  # noqa: B009 - PgInstance.kill, not in the DbHandle port
        kill()
        member.node.wait(timeout=10)

    def stop_nodes(self) -> None:
        """SIGTERM every node and wait; the databases stay up (for the audit)."""
        for member in self.members:
            if member.node is not None and member.node.poll() is None:
                member.node.send_signal(signal.SIGTERM)
        for member in self.members:
            if member.node is not None:
                try:
                    member.node.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    member.node.kill()
                    member.node.wait(timeout=15)

    def restart_region(self, name: str) -> None:
        member = self.member(name)
        assert member.db is not None
        start = getattr(member.db, "start")  # noqa: B009 - PgInstance.start
        start()
        member.node = self.spawn_node(member)
        member.exit_reported = False


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit(":", 1)[0] + f":{port}"
    return parts._replace(netloc=netloc).geturl()


def pg_dsn(sqlalchemy_dsn: str) -> str:
    return asyncpg_dsn(sqlalchemy_dsn)


# --- writers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ack:
    conversation_id: str
    shard: int
    seq: int
    #: the append's Idempotency-Key, or ``attempt:<attempt_id>`` (``effect:<attempt_id>``) for a
    #: tool attempt (its effect) sent without one (``chaos_audit.entry_identity``)
    key: str
    entry_region: str
    served_by: str
    sent_s: float
    acked_s: float
    #: wall-clock time the leader assigned the entry (the response's committed_at): an entry
    #: assigned after a region was cut off can only be acked if it reached a quorum after the cut
    assigned_wall_s: float = 0.0


@dataclass
class Writers:
    """One writer per conversation; each append retried with the same Idempotency-Key (other
    entry regions in turn) until acknowledged or stopped. With ``keyless_tool_events`` two
    appends in three are a ``tool.attempt`` and then its ``tool.effect``, sent without a key and
    retried with the same body: the log knows each again by its ``attempt_id``."""

    urls: Mapping[str, str]
    api_key: str
    conversations: list[str]
    shard_count: int
    keyless_tool_events: bool = False
    acks: list[Ack] = field(default_factory=list)
    unacked: dict[str, str] = field(default_factory=dict)  # key -> conversation, at stop
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    attempts: int = 0
    #: failed attempts (conversation, sent, ended, entry region, status or exception name),
    #: the most recent TRACE_MAX of them, for explaining a slow recovery
    failures: list[tuple[str, float, float, str, str]] = field(default_factory=list)
    _entry_offset: dict[str, int] = field(default_factory=dict)

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
        headers = {"Authorization": f"Bearer {self.api_key}"}
        async with httpx.AsyncClient(headers=headers, limits=limits, trust_env=False) as client:
            regions = list(self.urls)
            for i, cid in enumerate(self.conversations):
                await self._request(
                    client,
                    regions,
                    i,
                    "/v1/conversations",
                    {"conversation_id": cid},
                    f"create-{cid}",
                    cid,
                    create=True,
                )
            await asyncio.gather(
                *(self._write(client, regions, i, cid) for i, cid in enumerate(self.conversations))
            )

    async def _write(self, client: httpx.AsyncClient, regions: list[str], i: int, cid: str) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            key = f"{cid}-k{n}"
            body: dict[str, Any] = {"type": "note", "payload": {"n": n}}
            keyed = not self.keyless_tool_events or n % 3 == 1
            if not keyed and n % 3 == 2:
                attempt = {"attempt_id": f"{cid}-a{n}", "tool": "chaos", "argument_digest": f"{n}"}
                body = {"type": "tool.attempt", "payload": attempt}
                key = f"attempt:{attempt['attempt_id']}"
            elif not keyed:  # the previous append's attempt took effect
                effect = {"attempt_id": f"{cid}-a{n - 1}", "status": "committed"}
                body = {"type": "tool.effect", "payload": effect}
                key = f"effect:{effect['attempt_id']}"
            await self._request(
                client, regions, i, f"/v1/conversations/{cid}/events", body, key, cid, keyed=keyed
            )
            await asyncio.sleep(WRITE_PAUSE_S)

    async def _request(
        self,
        client: httpx.AsyncClient,
        regions: list[str],
        i: int,
        path: str,
        body: dict[str, Any],
        key: str,
        cid: str,
        *,
        create: bool = False,
        keyed: bool = True,
    ) -> None:
        """``key`` goes as the Idempotency-Key when ``keyed``; it names the ack either way."""
        attempt = 0
        headers = {DEADLINE_HEADER: str(int(ATTEMPT_TIMEOUT_S * 1000))}
        if keyed:
            headers[IDEMPOTENCY_KEY_HEADER] = key
        while True:
            # Sticky entry region (like a client behind a health-checked balancer): keep the
            # one that answered last; move to the next after any failure.
            entry = regions[(i + self._entry_offset.get(cid, 0)) % len(regions)]
            attempt += 1
            self.attempts += 1
            sent_s = time.monotonic()
            error = ""
            try:
                r = await client.post(
                    self.urls[entry] + path,
                    json=body,
                    timeout=ATTEMPT_TIMEOUT_S,
                    headers=headers,
                )
            except httpx.HTTPError as exc:
                r, error = None, type(exc).__name__
            if r is not None and r.status_code in (200, 201):
                if not create:
                    data = r.json()
                    served_by = r.headers.get(SERVED_BY_HEADER, "?")
                    shard = shard_of(cid, self.shard_count)
                    ack = Ack(
                        cid,
                        shard,
                        data["seq"],
                        key,
                        entry,
                        served_by,
                        sent_s,
                        time.monotonic(),
                        datetime.fromisoformat(data["committed_at"]).timestamp(),
                    )
                    self.acks.append(ack)
                return
            self._entry_offset[cid] = self._entry_offset.get(cid, 0) + 1
            outcome = error if r is None else f"{r.status_code} {r.text[:80]}"
            self.failures.append((cid, sent_s, time.monotonic(), entry, outcome))
            del self.failures[:-TRACE_MAX]
            if r is not None and r.status_code < 500 and r.status_code != 429:
                raise AssertionError(f"{path} via {entry}: {r.status_code} {r.text[:300]}")
            if self.stop.is_set() and not create:
                self.unacked[key] = cid  # outcome unknown; the audit does not count it
                return
            await asyncio.sleep(RETRY_BACKOFF_S * (0.5 + (attempt % 3) / 2))


def conversations_per_shard(shard_count: int, per_shard: int = 1) -> list[str]:
    found: dict[int, list[str]] = {s: [] for s in range(shard_count)}
    i = 0
    while any(len(v) < per_shard for v in found.values()):
        cid = f"chaos-{i}"
        bucket = found[shard_of(cid, shard_count)]
        if len(bucket) < per_shard:
            bucket.append(cid)
        i += 1
    return [c for v in found.values() for c in v]


# --- recovery time --------------------------------------------------------------------------


def recovery_times(
    acks: list[Ack], moved_shards: list[int], victim: str, fault_s: float
) -> dict[int, float | None]:
    """Per moved shard: fault -> first ack served by another region (None: not yet)."""
    out: dict[int, float | None] = {}
    for shard in moved_shards:
        times = [
            a.acked_s
            for a in acks
            if a.shard == shard and a.served_by != victim and a.acked_s >= fault_s
        ]
        out[shard] = min(times) - fault_s if times else None
    return out


def led_as_placed(acks: list[Ack], placement: Mapping[str, str], since_s: float) -> bool:
    """Whether every shard of ``placement`` acked a write since ``since_s`` served by the region
    it names: that region's leader took over (an assignment alone may run ahead of it)."""
    served = {(str(a.shard), a.served_by) for a in acks if a.acked_s >= since_s}
    return all((shard, region) in served for shard, region in placement.items())


async def wait_led_as_placed(
    url: str, api_key: str, writers: Writers, since_s: float, timeout_s: float, what: str
) -> None:
    """Until ``url``'s node sees no region down and the full placement, and every shard's
    placed leader acked a write since ``since_s`` (``led_as_placed``)."""
    full = {str(s): r for s, r in full_placement(list(writers.urls), writers.shard_count).items()}

    seen: dict[str, Any] = {}

    async def led() -> bool:
        seen.update(await get_json(url, "/v1/placement", api_key))
        return bool(
            seen["down"] == []
            and seen["assignment"] == full
            and led_as_placed(writers.acks, full, since_s)
        )

    try:
        await wait_until(led, timeout_s, what)
    except TimeoutError as exc:
        served = {(str(a.shard), a.served_by) for a in writers.acks if a.acked_s >= since_s}
        unled = sorted(int(s) for s, r in full.items() if (s, r) not in served)
        raise TimeoutError(
            f"{exc}: down {seen.get('down')}, assignment as placed: "
            f"{seen.get('assignment') == full}, shards without an ack from their placed "
            f"region since: {unled}"
        ) from exc


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(sorted(values), n=100, method="inclusive")[int(q) - 1]


async def wait_until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    """Poll ``check`` every 0.1 s (an HTTP error counts as not yet) until it holds; a
    TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if await check():
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")


def full_placement(cluster_regions: list[str], shard_count: int) -> dict[int, str]:
    return place_shards(shard_count, {r: 1.0 for r in cluster_regions})


async def get_json(url: str, path: str, api_key: str) -> Any:
    async with httpx.AsyncClient(trust_env=False) as client:
        r = await client.get(
            url + path, headers={"Authorization": f"Bearer {api_key}"}, timeout=5.0
        )
        r.raise_for_status()
        return r.json()


async def tear_down(
    plane: ChaosPlane, writers: Writers | None, running: asyncio.Task[None] | None
) -> None:
    """Stop writers (cancelling them if they did not finish) and every process of the plane."""
    if writers is not None:
        writers.stop.set()
    if running is not None:
        if not running.done():
            running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    await asyncio.to_thread(plane.stop)
