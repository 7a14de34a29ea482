"""Hostile-client benchmark: a tenant's append latency through one region, first alone, then
while a stranger holds idle sockets and another client holds half-sent bodies against the same
region; and whether any peer ever suspects the region meanwhile.

A real 3-region plane (``convplane up``: SQLite, TLS between nodes) on 127.0.0.1 only. Every
attack is bounded in count and time. The last line printed is one JSON object.

    .venv/bin/python -m bench.hostile [--appends 200] [--idle-sockets 1000] [--slow-bodies 60]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from eventlog.sharding import shard_of
from regions.placement import place_shards
from services.local.plane import LocalPlane

TARGET, OBSERVER = "eu-west", "us-east"
WATCH_POLL_S = 0.2


def _latencies_ms(url: str, key: str, cid: str, count: int) -> tuple[list[float], int]:
    """Latencies of ``count`` appends (each under a 10 s deadline) and how many failed."""
    headers = {"Authorization": f"Bearer {key}"}
    out, failed = [], 0
    with httpx.Client(base_url=url, headers=headers, timeout=20.0, trust_env=False) as client:
        for i in range(count):
            started = time.perf_counter()
            try:
                if i == 0:
                    client.post("/v1/conversations", json={"conversation_id": cid})
                r = client.post(
                    f"/v1/conversations/{cid}/events", json={"type": "note", "payload": {"i": i}}
                )
                ok = r.status_code == 201
            except httpx.HTTPError:
                ok = False
            out.append((time.perf_counter() - started) * 1000)
            failed += not ok
    return out, failed


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
        "max_ms": round(ordered[-1], 2),
    }


def _watch(observer_url: str, key: str, stop: threading.Event, seen: list[str]) -> None:
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        while not stop.wait(WATCH_POLL_S):
            regions = client.get(
                observer_url + "/v1/regions", headers={"Authorization": f"Bearer {key}"}
            )
            view = next(r for r in regions.json()["regions"] if r["name"] == TARGET)
            seen += view["suspected_by"] + ([] if view["status"] == "up" else [view["status"]])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--idle-sockets", type=int, default=1000)
    parser.add_argument("--slow-bodies", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="convplane-hostile-") as tmp:
        plane = LocalPlane(regions=3, state_dir=Path(tmp), base_port=0, shard_count=16)
        info = plane.start()
        try:
            result = _run(plane, info, args)
        finally:
            plane.stop()
    print(json.dumps(result))


def _run(plane: LocalPlane, info: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    urls = {r["name"]: r["url"] for r in info["regions"]}
    key = info["api_key"]
    placement = place_shards(16, {r: 1.0 for r in urls})
    cids = [c for c in (f"bench-{i}" for i in range(1000)) if placement[shard_of(c, 16)] == TARGET]
    alone, alone_failed = _latencies_ms(urls[TARGET], key, cids[0], args.appends)
    host, port = urls[TARGET].removeprefix("http://").split(":")
    assert host == "127.0.0.1"
    idle = [
        socket.create_connection((host, int(port)), timeout=5) for _ in range(args.idle_sockets)
    ]
    head = (f"POST /v1/conversations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{").encode()  # fmt: skip
    slow = [socket.create_connection((host, int(port)), timeout=5) for _ in range(args.slow_bodies)]
    for sock in slow:
        sock.sendall(head)
    stop, suspicions = threading.Event(), list[str]()
    watcher = threading.Thread(target=_watch, args=(urls[OBSERVER], key, stop, suspicions))
    watcher.start()
    try:
        attacked, attacked_failed = _latencies_ms(urls[TARGET], key, cids[1], args.appends)
    finally:
        stop.set()
        watcher.join()
        for sock in idle + slow:
            sock.close()
    return {
        "appends": args.appends,
        "idle_sockets": args.idle_sockets,
        "slow_bodies": args.slow_bodies,
        "alone": {**_summary(alone), "failed": alone_failed},
        "under_attack": {**_summary(attacked), "failed": attacked_failed},
        "suspicions_of_target": len(suspicions),
    }


if __name__ == "__main__":
    main()
