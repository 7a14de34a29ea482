"""Replay workers of attached engines are started again when they exit
(``services.local.attached_engines``): after a delay doubled per restart in the window, and
left down once they crash-loop, until ``restart-region``. Workers here are real processes
that exit at once with code 3; the supervisor's clock is handed in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.local.attached_engines import (
    WORKER_RESTART_WINDOW_S,
    WORKER_RESTARTS_MAX,
    AttachedEngine,
    AttachedEngines,
)


class ExitingWorkers(AttachedEngines):
    """Each worker a process that exits with code 3 (waited for: its exit is seen at once)."""

    spawned = 0

    def _spawn(self, e: AttachedEngine) -> None:
        self.spawned += 1
        worker = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        worker.wait(timeout=30)
        self.workers[e.engine_id] = worker


def _workers(tmp_path: Path) -> ExitingWorkers:
    engine = AttachedEngine("us-east", "http://engine", "e0", "m@r1", {}, {})
    workers = ExitingWorkers([engine], tmp_path, kafka_bootstrap_servers="127.0.0.1:9")
    workers.start_workers({"us-east": "http://node"})
    assert workers.spawned == 1
    return workers


def test_an_exited_worker_is_started_again_after_a_delay_that_doubles(tmp_path: Path) -> None:
    workers = _workers(tmp_path)
    said = workers.supervise_workers(0.0)
    assert len(said) == 1 and "exited with code 3; starting it again in 1 s" in said[0], said
    assert workers.supervise_workers(0.9) == [] and workers.spawned == 1
    assert workers.supervise_workers(1.0) == ["replay worker e0 started again"]
    assert workers.spawned == 2
    said = workers.supervise_workers(1.0)  # it exited again: twice the delay
    assert "starting it again in 2 s" in said[0], said
    assert workers.supervise_workers(2.9) == [] and workers.spawned == 2
    assert workers.supervise_workers(3.0) == ["replay worker e0 started again"]


def test_a_crash_looping_worker_is_left_down_until_its_region_restarts(tmp_path: Path) -> None:
    workers = _workers(tmp_path)
    now_s = 0.0
    for _ in range(WORKER_RESTARTS_MAX):
        now_s += 100.0  # well past every delay, inside the window
        workers.supervise_workers(now_s)  # the exit seen
        assert workers.supervise_workers(now_s + 60.0)[-1] == "replay worker e0 started again"
    assert workers.spawned == 1 + WORKER_RESTARTS_MAX
    said = workers.supervise_workers(now_s + 61.0)
    assert len(said) == 1 and "left down" in said[0] and "restart-region us-east" in said[0]
    assert workers.supervise_workers(now_s + 10_000.0) == []  # stays down
    assert workers.spawned == 1 + WORKER_RESTARTS_MAX
    workers.restart_region_workers("eu-west")  # another region's: nothing
    assert workers.spawned == 1 + WORKER_RESTARTS_MAX
    workers.restart_region_workers("us-east")
    assert workers.spawned == 2 + WORKER_RESTARTS_MAX
    assert "starting it again in 1 s" in workers.supervise_workers(now_s + 10_001.0)[0]


def test_restarts_older_than_the_window_no_longer_count(tmp_path: Path) -> None:
    workers = _workers(tmp_path)
    now_s = 0.0
    for _ in range(2 * WORKER_RESTARTS_MAX):  # one restart per window: never crash-looping
        said = workers.supervise_workers(now_s)
        assert "starting it again in 1 s" in said[0], said
        assert workers.supervise_workers(now_s + 1.0) == ["replay worker e0 started again"]
        now_s += WORKER_RESTART_WINDOW_S + 2.0
    assert workers.spawned == 1 + 2 * WORKER_RESTARTS_MAX


def test_without_kafka_there_is_no_worker_process_to_supervise(tmp_path: Path) -> None:
    engine = AttachedEngine("us-east", "http://engine", "e0", "m@r1", {}, {})
    workers = ExitingWorkers([engine], tmp_path)
    workers.start_workers({"us-east": "http://node"})
    workers.restart_region_workers("us-east")
    assert workers.spawned == 0 and workers.supervise_workers(0.0) == []
