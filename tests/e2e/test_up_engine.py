"""``convplane up --engine REGION=URL`` with ``convplane sim-engine serve`` as the engine (its
flags mirror vLLM's): a bad option or an engine that is unreachable or unfit is refused before
anything starts, saying why; a fit one gets its region's in-process worker, which joins once
its own self-check passes; with Kafka, a worker process that is killed is started again. The
same against a real vLLM: ``tests/vllm``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from services.local.host import free_port
from tests.e2e.plane import CONVPLANE, convplane_env, start_plane, stop_plane
from tests.e2e.test_worker_check_cli import MODEL, sim_engine

WORKER_WAIT_S = 60.0


def up(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CONVPLANE, "up", "--regions", "3", "--state-dir", str(state_dir), "--base-port", "0",
         *args],
        env={**convplane_env(), "COLUMNS": "400"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("us-east", "expected REGION=URL"),
        ("eu-central=http://127.0.0.1:8000", "no region 'eu-central' in this plane"),
        ("us-east=localhost:8000", "is not an http(s) URL with a host"),
        ("us-east=http://127.0.0.1:{closed}", "cannot be reached"),
    ],
)
def test_a_bad_engine_option_is_refused_and_nothing_starts(
    tmp_path: Path, option: str, said: str
) -> None:
    result = up(tmp_path / "plane", "--engine", option.format(closed=free_port()))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "not starting the plane" in result.stdout and said in result.stdout, result.stdout
    assert not (tmp_path / "plane").exists()


def test_an_unfit_engine_is_refused_with_each_failed_check_and_why(tmp_path: Path) -> None:
    with sim_engine("--no-trust-request-chat-template", "--no-log-stats") as url:
        result = up(tmp_path / "plane", "--engine", f"eu-west={url}")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"engine {url} (--engine eu-west=...) is unfit" in result.stdout, result.stdout
    assert "exports_metrics" in result.stdout and "--disable-log-stats" in result.stdout
    assert "accepts_chat_template" in result.stdout
    assert "--trust-request-chat-template" in result.stdout
    assert not (tmp_path / "plane").exists()


def test_a_fit_engine_gets_its_regions_in_process_worker(tmp_path: Path) -> None:
    with sim_engine() as url:
        proc, plane = start_plane(tmp_path / "plane", "--engine", f"eu-west={url}")
        try:
            (engine,) = plane.info["engines"]
            assert engine["region"] == "eu-west" and engine["model_revision"] == MODEL
            assert engine["worker"] == "in-process"
            assert engine["reasons"] == {}  # priority scheduling seen in the queue probe
            operator = {"Authorization": f"Bearer {plane.info['operator_api_key']}"}
            deadline = time.monotonic() + WORKER_WAIT_S
            while True:  # the node's worker runs its own self-check before it joins
                status = httpx.get(plane.urls["eu-west"] + "/v1/replays", headers=operator,
                                   timeout=10.0).json()  # fmt: skip
                checks = status["worker_engine_checks"]
                if checks.get("eu-west-w-eu-west-engine0") == []:
                    break
                assert time.monotonic() < deadline, status
                time.sleep(0.2)
            assert status["mode"] == "embedded"
            other = httpx.get(plane.urls["us-east"] + "/v1/replays", headers=operator,
                              timeout=10.0).json()  # fmt: skip
            assert other["worker_engine_checks"] == {}  # only the region named gets it
        finally:
            output = stop_plane(proc)
        assert proc.returncode == 0, output
        assert "fit for replay, in-process worker" in " ".join(output.split()), output


def test_a_killed_kafka_worker_is_started_again_by_the_supervisor(
    tmp_path: Path, kafka_bootstrap_servers: str
) -> None:
    """With Kafka each engine has its own ``convplane worker`` process; SIGKILLed, the ``up``
    supervisor starts it again (after its 1 s delay) and the info file names the new pid."""
    with sim_engine() as url:
        state_dir = tmp_path / "plane"
        proc, plane = start_plane(state_dir, "--engine", f"eu-west={url}",
                                  "--kafka-bootstrap-servers", kafka_bootstrap_servers)  # fmt: skip
        try:
            (engine,) = plane.info["engines"]
            assert engine["worker"] == "kafka"
            first = engine["worker_pid"]
            os.kill(first, signal.SIGKILL)

            def current_pid() -> int | None:
                info = json.loads((state_dir / "cluster.json").read_text())
                pid: int = info["engines"][0]["worker_pid"]
                return pid if pid != first else None

            deadline = time.monotonic() + WORKER_WAIT_S
            while (second := current_pid()) is None:
                assert time.monotonic() < deadline, "the worker was not started again"
                time.sleep(0.2)
            os.kill(second, 0)  # it runs
        finally:
            output = stop_plane(proc)
        assert proc.returncode == 0, output
        said = " ".join(output.split())
        assert f"replay worker {engine['engine_id']} exited with code -9" in said, output
        assert f"replay worker {engine['engine_id']} started again" in said, output
        with pytest.raises(ProcessLookupError):
            os.kill(second, 0)  # the plane stopped it


def test_a_plain_up_attaches_the_saved_engines_again_and_without_engines_forgets_them(
    tmp_path: Path,
) -> None:
    """A plane started with ``--engine`` is the same plane after a stop: a plain ``up``
    checks the same engine again and gives its region the worker again; one that is gone
    refuses the resume, naming ``--without-engines``, which resumes without (and forgets)."""
    state_dir = tmp_path / "plane"
    salt_keys = []
    with sim_engine() as url:
        for args in (["--engine", f"eu-west={url}"], []):
            proc, plane = start_plane(state_dir, *args)
            output = stop_plane(proc)
            assert proc.returncode == 0, output
            (engine,) = plane.info["engines"]
            assert (engine["region"], engine["url"]) == ("eu-west", url), args
            cluster = json.loads(Path(plane.info["cluster_file"]).read_text())
            salt_keys.append(cluster["replay"]["cache_salt_key"])
        assert "attaching the saved plane's engines again" in output, output
    assert salt_keys[0] == salt_keys[1]  # caches replayed before the stop stay reachable
    gone = up(state_dir, "--shard-count", "16")  # the engine's server has stopped
    assert gone.returncode == 1, gone.stdout + gone.stderr
    assert "cannot be reached" in gone.stdout and "--without-engines" in gone.stdout, gone.stdout
    for args in (["--without-engines"], []):
        proc, plane = start_plane(state_dir, *args)
        output = stop_plane(proc)
        assert proc.returncode == 0, output
        assert "engines" not in plane.info, (args, plane.info)
