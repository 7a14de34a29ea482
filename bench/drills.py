"""Region-loss drills under live writers, on a running local plane; prints each drill's verdict
and RTO and a summary.

    convplane up --postgres --shard-count 16 --state-dir .state/bench-drills &
    python -m bench.drills --state-dir .state/bench-drills --rounds 2 --writers 12

Writers append 10 events/s each (idempotent retries through the next region); each round runs a
region-loss drill of every region in turn through ``convplane drill run``, so the drills' RTO
is measured while the plane carries live traffic. A program, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from eventlog.http_headers import IDEMPOTENCY_KEY_HEADER

WRITE_EVERY_S = 0.1
CALL_TIMEOUT_S = 2.0
PAUSE_BETWEEN_DRILLS_S = 2.0


class Writers:
    def __init__(self, urls: list[str], api_key: str, count: int) -> None:
        self.urls = urls
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.count = count
        self.acked = 0
        self.gave_up = 0
        self.stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(count)]  # fmt: skip

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=10)

    def _run(self, i: int) -> None:
        order = self.urls[i % len(self.urls) :] + self.urls[: i % len(self.urls)]
        cid = f"bench-drills-{i}-{int(time.time())}"
        with httpx.Client(headers=self.headers, timeout=CALL_TIMEOUT_S, trust_env=False) as c:
            while not self.stop.is_set():
                try:
                    r = c.post(order[0] + "/v1/conversations", json={"conversation_id": cid})
                    if r.status_code in (200, 201):
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            n = 0
            while not self.stop.is_set():
                n += 1
                for url in order:
                    try:
                        r = c.post(f"{url}/v1/conversations/{cid}/events",
                                   json={"type": "note", "payload": {"n": n}},
                                   headers={IDEMPOTENCY_KEY_HEADER: f"{cid}-{n}"})  # fmt: skip
                    except httpx.HTTPError:
                        continue
                    if r.status_code in (200, 201):
                        self.acked += 1
                        break
                else:
                    self.gave_up += 1
                time.sleep(WRITE_EVERY_S)


def run_drill(state_dir: Path, region: str, hold_s: float, info: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", "from services.cli.main import main; main()", "drill", "run",
         "--region", region, "--hold-s", str(hold_s), "--reason", "bench/drills.py",
         "--state-dir", str(state_dir)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    first = out.stdout.split()
    if len(first) < 2 or first[0] != "drill":
        return {"region": region, "verdict": None, "error": (out.stdout + out.stderr)[-500:]}
    drill_id = first[1].rstrip(":")
    headers = {"Authorization": f"Bearer {info['operator_api_key']}"}
    for region_info in info["regions"]:
        try:
            r = httpx.get(f"{region_info['url']}/v1/drills/{drill_id}/report", headers=headers,
                          timeout=CALL_TIMEOUT_S * 5)  # fmt: skip
        except httpx.HTTPError:
            continue
        if r.status_code == 200:
            report: dict[str, Any] = r.json()
            return report
    return {"region": region, "verdict": None, "error": "no report"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, default=Path(".state/plane"))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--writers", type=int, default=12)
    parser.add_argument("--hold-s", type=float, default=5.0)
    args = parser.parse_args()
    info = json.loads((args.state_dir / "cluster.json").read_text(encoding="utf-8"))
    urls = [r["url"] for r in info["regions"]]
    writers = Writers(urls, info["api_key"], args.writers)
    writers.start()
    time.sleep(3)
    reports = []
    try:
        for _ in range(args.rounds):
            for region in [r["name"] for r in info["regions"]]:
                report = run_drill(args.state_dir, region, args.hold_s, info)
                reports.append(report)
                print(f"{region:<10} {report.get('verdict')!s:<8} shards {report.get('shards_moved')} "
                      f"RTO p50 {report.get('rto_p50_s')} max {report.get('rto_max_s')} "
                      f"canary acked {report.get('canary_acked')} lost {report.get('canary_lost')} "
                      f"{report.get('verdict_reason', report.get('error', ''))}", flush=True)  # fmt: skip
                time.sleep(PAUSE_BETWEEN_DRILLS_S)
    finally:
        writers.close()
    maxima = [r["rto_max_s"] for r in reports if r.get("rto_max_s") is not None]
    verdicts = [r.get("verdict") for r in reports]
    print(f"writers: {args.writers}, acked {writers.acked}, gave up {writers.gave_up}")
    print(f"drills: {len(reports)}, passed {verdicts.count('passed')}, "
          f"lost canaries {sum(r.get('canary_lost') or 0 for r in reports)}")  # fmt: skip
    if maxima:
        print(f"RTO max per drill: median {statistics.median(maxima):.2f}s, "
              f"worst {max(maxima):.2f}s")  # fmt: skip


if __name__ == "__main__":
    main()
