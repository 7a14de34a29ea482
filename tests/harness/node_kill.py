"""Killing one node of a region of two, under load, and what came of it.

``node_kill`` waits until the victim region's two nodes split its shards (each leads the shards
of its own node slot, ``regions.placement.SlotMap``), then runs appends without pause to
conversations placed on the region in the slot of the node to be killed (half through another
region's node, forwarded; half through the region's other node, forwarded inside the region).
It kills the node with the caller's ``kill`` once every conversation was acked a few times, and
goes on until each is acked a few times more. It reports the node's RTO (the kill, once done, to
the last conversation's first ack of an attempt sent after it: an answer to one sent before
does not show the plane recovered), the placement before and after, what each node's
``/healthz`` said before and what the survivor's says after, and every acked event missing
from, or out of order in, the transcripts read at the end. The e2e test kills a process on
loopback; the lab test kills a host. Both assert the same report.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from eventlog.http_headers import IDEMPOTENCY_KEY_HEADER
from eventlog.sharding import shard_of
from regions.placement import SlotMap, place_shards

CONVERSATIONS = 4
ACKS_BEFORE_KILL = 5
ACKS_AFTER_KILL = 5
RETRY_PAUSE_S = 0.05
#: how long the load may go on without a conversation acked again: the test fails past it
STALL_LIMIT_S = 60.0


class Writer(threading.Thread):
    """Appends to one conversation until told to stop, each with its own Idempotency-Key,
    retrying a retryable answer or a lost connection with the same key; keeps what was acked
    and when."""

    def __init__(self, base_url: str, headers: dict[str, str], cid: str) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=base_url, headers=headers, timeout=10.0)
        self.cid = cid
        self.acked: list[tuple[int, int, float]] = []  # (seq, n, monotonic time of the ack)
        #: monotonic time the attempt that was acked was sent, per entry of ``acked``
        self.sent: list[float] = []
        #: (monotonic time, error code) of every retryable refusal it was answered
        self.refused: list[tuple[float, str]] = []
        self.stop = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        try:
            n = 0
            while not self.stop.is_set():
                seq, sent_s = self._append(n)
                self.acked.append((seq, n, time.monotonic()))
                self.sent.append(sent_s)
                n += 1
        except Exception as exc:  # reported by the test, not lost in a thread
            self.error = repr(exc)
        finally:
            self.client.close()

    def _append(self, n: int) -> tuple[int, float]:
        """The seq of append ``n`` and when the attempt that was acked was sent."""
        body = {"type": "note", "payload": {"n": n}}
        headers = {IDEMPOTENCY_KEY_HEADER: f"{self.cid}-{n}"}
        give_up_s = time.monotonic() + STALL_LIMIT_S
        while time.monotonic() < give_up_s:
            sent_s = time.monotonic()
            try:
                reply = self.client.post(
                    f"/v1/conversations/{self.cid}/events", json=body, headers=headers
                )
            except httpx.TransportError:
                time.sleep(RETRY_PAUSE_S)
                continue
            if reply.status_code in (200, 201):
                return int(reply.json()["seq"]), sent_s
            error = reply.json()["error"]
            assert error["retryable"] is True, reply.text
            self.refused.append((time.monotonic(), str(error["code"])))
            time.sleep(RETRY_PAUSE_S)
        raise AssertionError(f"{self.cid}: append {n} not acked within {STALL_LIMIT_S} s")

    def acks_after(self, t: float) -> int:
        """Appends acked whose acked attempt was sent after ``t``."""
        return sum(1 for sent_s in self.sent if sent_s > t)

    def first_ack_sent_after(self, t: float) -> float | None:
        """When the first append whose acked attempt was sent after ``t`` was acked."""
        return next(
            (at for (_, _, at), sent_s in zip(self.acked, self.sent, strict=True) if sent_s > t),
            None,
        )


@dataclass
class NodeKillReport:
    killed: dict[str, Any]  # the node killed: index, url, node_pid
    survivor: dict[str, Any]  # the region's other node, which took the killed one's slot over
    rto_s: float
    placement_before: dict[str, Any]
    placement_after: dict[str, Any]
    #: each node's /healthz before the kill (killed, survivor) and the survivor's after it
    health_before: tuple[dict[str, Any], dict[str, Any]]
    survivor_health: dict[str, Any]
    writer_errors: list[str] = field(default_factory=list)
    #: the writers' refusals after the kill, by error code (forward_failed while the dead
    #: node's lease runs out; not_leader where the survivor took longer than a Retry-After to
    #: prepare the slot's shards, which a request waits for)
    refusals: Counter[str] = field(default_factory=Counter)
    #: per conversation: (acked, read back) where they differ
    not_read_back: dict[str, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = field(
        default_factory=dict
    )


def nodes_of(info: dict[str, Any], region: str) -> list[dict[str, Any]]:
    """The region's nodes as the plane's info names them: index, url, node_pid."""
    found = next(r for r in info["regions"] if r["name"] == region)
    first = {"index": 0, "url": found["url"], "node_pid": found["node_pid"]}
    return [first, *found["more_nodes"]]


def health(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/healthz", timeout=5.0, trust_env=False).json())


def split_between(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each node's /healthz once every one leads all the shards of its own node slot and some
    (a node that started first may hold a later sibling's slot a moment, then hands it back).
    A node that does not answer yet is not split: ``convplane up`` is ready once one node of
    each region is, and a sibling may still be starting."""

    def split() -> bool:
        try:
            healths = [health(n["url"]) for n in nodes]
        except httpx.HTTPError:
            return False
        return all(0 < h["shards_led"] == h["shards_placed"] for h in healths)

    _wait_for(split)
    return [health(n["url"]) for n in nodes]


def _settled(url: str, shards: int) -> dict[str, Any]:
    """The node's /healthz once it leads ``shards`` shards, all it should (the killed node's
    slot's shards that took no write are led too, each in its own time), or as it is after
    ``STALL_LIMIT_S``: the caller's assertion then shows what is missing."""
    deadline_s = time.monotonic() + STALL_LIMIT_S
    while True:
        reply = health(url)
        if reply["shards_led"] == reply["shards_placed"] == shards:
            return reply
        if time.monotonic() > deadline_s:
            return reply
        time.sleep(RETRY_PAUSE_S)


def conversations_on(
    info: dict[str, Any], region: str, slot: int, count: int, prefix: str
) -> list[str]:
    """``count`` conversations placed on ``region`` whose shards are in its node slot ``slot``."""
    cluster = json.loads(Path(info["cluster_file"]).read_text())
    shard_count = int(cluster["shard_count"])
    weights = {r["name"]: float(r["capacity_weight"]) for r in cluster["regions"]}
    placement = place_shards(shard_count, weights)
    slots = SlotMap(shard_count, weights)
    node_count = len(nodes_of(info, region))
    cids = (f"{prefix}-{i}" for i in range(100_000))
    return [
        c
        for c in cids
        if placement[shard_of(c, shard_count)] == region
        and slots.slot(shard_of(c, shard_count), node_count) == slot
    ][:count]


def node_kill(
    info: dict[str, Any], victim: str, entry: str, kill: Callable[[dict[str, Any]], None]
) -> NodeKillReport:
    """Kill ``victim``'s first node (``kill(node)``) under load entering at ``entry``."""
    entry_url = next(r["url"] for r in info["regions"] if r["name"] == entry)
    headers = {"Authorization": f"Bearer {info['api_key']}"}
    operator = {"Authorization": f"Bearer {info['operator_api_key']}"}
    killed, survivor = nodes_of(info, victim)
    killed_health, survivor_health = split_between([killed, survivor])
    with httpx.Client(base_url=entry_url, headers=operator, timeout=10.0) as client:
        before = _answered(client, "GET", "/v1/placement")
    slot = killed["index"]
    cids = conversations_on(info, victim, slot, CONVERSATIONS, f"node-kill-{time.time_ns()}")
    with httpx.Client(base_url=entry_url, headers=headers, timeout=10.0) as client:
        for cid in cids:
            _answered(client, "POST", "/v1/conversations", {"conversation_id": cid})
    entries = [entry_url, survivor["url"]]
    writers = [Writer(entries[i % 2], headers, cid) for i, cid in enumerate(cids)]
    try:
        for writer in writers:
            writer.start()
        _wait_for(lambda: all(len(w.acked) >= ACKS_BEFORE_KILL or w.error for w in writers))
        kill(killed)
        killed_s = time.monotonic()  # the fault in place (dropping packets takes a while)
        _wait_for(
            lambda: all(w.acks_after(killed_s) >= ACKS_AFTER_KILL or w.error for w in writers)
        )
    finally:
        for writer in writers:
            writer.stop.set()
        for writer in writers:
            writer.join(timeout=STALL_LIMIT_S)
    errors = [f"{w.cid}: {w.error}" for w in writers if w.error]
    firsts = [w.first_ack_sent_after(killed_s) for w in writers if not w.error]
    rto_s = max((float("inf") if f is None else f for f in firsts), default=float("inf"))
    rto_s -= killed_s
    with httpx.Client(base_url=entry_url, headers=operator, timeout=10.0) as client:
        after = _answered(client, "GET", "/v1/placement")
    report = NodeKillReport(
        killed,
        survivor,
        rto_s,
        before,
        after,
        (killed_health, survivor_health),
        _settled(
            survivor["url"], killed_health["shards_placed"] + survivor_health["shards_placed"]
        ),
        errors,
        Counter(code for w in writers for at, code in w.refused if at > killed_s),
    )
    with httpx.Client(base_url=entry_url, headers=headers, timeout=10.0) as client:
        for writer in writers:
            page = _answered(client, "GET", f"/v1/conversations/{writer.cid}/events?limit=1000")
            read = [(e["seq"], e["payload"]["n"]) for e in page["events"]]
            acked = [(seq, n) for seq, n, _ in writer.acked]
            if read != acked:
                report.not_read_back[writer.cid] = (acked, read)
    return report


def _answered(
    client: httpx.Client, method: str, path: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The request's JSON answer once it is 200 or 201 (a retryable 503 and a lost connection
    are tried again, within ``STALL_LIMIT_S``)."""
    give_up_s = time.monotonic() + STALL_LIMIT_S
    while True:
        try:
            reply = client.request(method, path, json=body)
        except httpx.TransportError:
            reply = None
        if reply is not None and reply.status_code in (200, 201):
            return dict(reply.json())
        if reply is not None and reply.status_code not in (503, 504):
            raise AssertionError(f"{method} {path}: {reply.status_code} {reply.text}")
        assert time.monotonic() < give_up_s, f"{method} {path} not answered: {reply}"
        time.sleep(RETRY_PAUSE_S)


def _wait_for(done: Callable[[], bool]) -> None:
    deadline_s = time.monotonic() + STALL_LIMIT_S
    while not done():
        assert time.monotonic() < deadline_s, f"the load stalled for {STALL_LIMIT_S} s"
        time.sleep(RETRY_PAUSE_S)
