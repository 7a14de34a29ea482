"""Several nodes per region (``convplane up --nodes-per-region 2``): SIGKILL of the node that
leads a region, under load, is taken over by the region's other node, not by another region.

Appends run without pause to conversations placed on the region, through another region's node
(forwarded) and through the victim region's standby (forwarded inside the region). After the
kill, every conversation is acked again; the placement is the one from before the kill (no
region was declared down, no shard moved, so nothing is replayed); the standby leads every shard
placed on the region; every acked event is there, in order, without a gap. The time from the
kill to the last conversation's first ack after it (the node's RTO) is printed, not bounded.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from eventlog.http_headers import IDEMPOTENCY_KEY_HEADER
from tests.e2e.plane import Plane, postgres_reachable_dir, start_plane, stop_plane, until_answered

VICTIM = "eu-west"
ENTRY = "us-east"
CONVERSATIONS = 4
ACKS_BEFORE_KILL = 5
ACKS_AFTER_KILL = 5
RETRY_PAUSE_S = 0.05
#: how long the load may go on without the victim region's conversations acked again
STALL_LIMIT_S = 60.0


@pytest.fixture
def state_dir() -> Iterator[Path]:
    with postgres_reachable_dir("convplane-nodes-") as path:
        yield path


class Writer(threading.Thread):
    """Appends to one conversation until told to stop, each with its own Idempotency-Key,
    retrying a retryable answer or a lost connection with the same key; keeps what was acked
    and when."""

    def __init__(self, base_url: str, headers: dict[str, str], cid: str) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=base_url, headers=headers, timeout=10.0)
        self.cid = cid
        self.acked: list[tuple[int, int, float]] = []  # (seq, n, monotonic time of the ack)
        self.stop = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        try:
            n = 0
            while not self.stop.is_set():
                seq, _ = self._append(n)
                self.acked.append((seq, n, time.monotonic()))
                n += 1
        except Exception as exc:  # reported by the test, not lost in a thread
            self.error = repr(exc)
        finally:
            self.client.close()

    def _append(self, n: int) -> tuple[int, int]:
        body = {"type": "note", "payload": {"n": n}}
        headers = {IDEMPOTENCY_KEY_HEADER: f"{self.cid}-{n}"}
        give_up_s = time.monotonic() + STALL_LIMIT_S
        while time.monotonic() < give_up_s:
            try:
                reply = self.client.post(
                    f"/v1/conversations/{self.cid}/events", json=body, headers=headers
                )
            except httpx.TransportError:
                time.sleep(RETRY_PAUSE_S)
                continue
            if reply.status_code in (200, 201):
                return reply.json()["seq"], n
            assert reply.json()["error"]["retryable"] is True, reply.text
            time.sleep(RETRY_PAUSE_S)
        raise AssertionError(f"{self.cid}: append {n} not acked within {STALL_LIMIT_S} s")

    def acks_after(self, t: float) -> int:
        return sum(1 for _, _, at in self.acked if at > t)


def _region(plane: Plane, name: str) -> dict[str, Any]:
    return next(r for r in plane.info["regions"] if r["name"] == name)


def _nodes(plane: Plane, name: str) -> list[dict[str, Any]]:
    region = _region(plane, name)
    first = {"index": 0, "url": region["url"], "node_pid": region["node_pid"]}
    return [first, *region["more_nodes"]]


def _health(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/healthz", timeout=5.0).json())


def _leading_node(plane: Plane, name: str) -> dict[str, Any]:
    leading = [n for n in _nodes(plane, name) if _health(n["url"])["shards_placed"] > 0]
    assert len(leading) == 1, (name, [_health(n["url"]) for n in _nodes(plane, name)])
    return leading[0]


def _placement(plane: Plane) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {plane.info['operator_api_key']}"}
    with httpx.Client(base_url=plane.urls[ENTRY], headers=headers, timeout=10.0) as client:
        return dict(until_answered(client, "GET", "/v1/placement").json())


def _wait_for(what: str, done: Any, limit_s: float = STALL_LIMIT_S) -> None:
    deadline_s = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < deadline_s, f"not within {limit_s} s: {what}"
        time.sleep(RETRY_PAUSE_S)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_dead_node_is_replaced_inside_its_region(state_dir: Path, backend: str) -> None:
    args = ["--nodes-per-region", "2", *(["--postgres"] if backend == "postgres" else [])]
    proc, plane = start_plane(state_dir, *args)
    writers: list[Writer] = []
    try:
        leader = _leading_node(plane, VICTIM)
        standby = next(n for n in _nodes(plane, VICTIM) if n["index"] != leader["index"])
        before = _placement(plane)
        assert VICTIM in before["assignment"].values()
        cids = [plane.conversation_led_by(VICTIM, f"nodes-{i}") for i in range(CONVERSATIONS)]
        with plane.client(ENTRY) as client:
            for cid in cids:
                until_answered(client, "POST", "/v1/conversations", {"conversation_id": cid})
        # half through another region, half through the victim region's standby node
        entries = [plane.urls[ENTRY], standby["url"]]
        writers = [Writer(entries[i % 2], plane.headers, cid) for i, cid in enumerate(cids)]
        for writer in writers:
            writer.start()
        _wait_for("acks before the kill", lambda: all(
            len(w.acked) >= ACKS_BEFORE_KILL for w in writers))  # fmt: skip

        killed_s = time.monotonic()
        os.kill(leader["node_pid"], signal.SIGKILL)
        _wait_for("acks after the kill", lambda: all(
            w.acks_after(killed_s) >= ACKS_AFTER_KILL or w.error for w in writers))  # fmt: skip
        for writer in writers:
            writer.stop.set()
            writer.join(timeout=STALL_LIMIT_S)
        assert [w.error for w in writers] == [None] * len(writers)

        first_after = [min(at for _, _, at in w.acked if at > killed_s) for w in writers]
        print(f"{backend}: node RTO (kill -> every conversation acked again): "
              f"{max(first_after) - killed_s:.3f} s")  # fmt: skip

        after = _placement(plane)
        assert after["version"] == before["version"], (before, after)
        assert after["assignment"] == before["assignment"]
        assert after["down"] == []
        health = _health(standby["url"])
        assert health["shards_placed"] == health["shards_led"] > 0, health

        with plane.client(ENTRY) as client:
            for writer in writers:
                page = until_answered(
                    client, "GET", f"/v1/conversations/{writer.cid}/events?limit=1000"
                )
                events = [(e["seq"], e["payload"]["n"]) for e in page.json()["events"]]
                assert events == [(seq, n) for seq, n, _ in writer.acked], writer.cid
    finally:
        for writer in writers:
            writer.stop.set()
        output = stop_plane(proc)
        if any(w.error for w in writers):
            print(output)
