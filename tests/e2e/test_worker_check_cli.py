"""``convplane worker --check`` against ``convplane sim-engine serve`` processes over loopback:
exit 0 for an engine started as replay needs it, exit 1 naming what is missing otherwise."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from services.local.host import free_port
from tests.e2e.plane import CONVPLANE, convplane_env

MODEL = "sim-llama@1"
START_WAIT_S = 30.0


@contextmanager
def sim_engine(*flags: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [*CONVPLANE, "sim-engine", "serve", "--port", str(port), "--model", MODEL, *flags],
        env=convplane_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_WAIT_S
        while True:
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"sim engine did not start (exit code {proc.returncode})")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def check(url: str, revision: str = MODEL, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CONVPLANE, "worker", "--check", "--region", "r1", "--engine-url", url,
         "--model-revision", revision, *flags],
        env=convplane_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_worker_check_passes_a_fit_engine_and_names_what_an_unfit_one_lacks() -> None:
    with sim_engine() as url:
        fit = check(url)
        assert fit.returncode == 0, fit.stderr
        assert "is fit for replay" in fit.stdout
        assert "UNVERIFIED" not in fit.stdout  # priority scheduling seen in the queue probe
        wrong = check(url, "sim-llama@2")
        assert wrong.returncode == 1 and "FAILED     serves_revision" in wrong.stderr
    with sim_engine("--no-prompt-tokens-details", "--no-trust-request-chat-template") as url:
        unfit = check(url)
        assert unfit.returncode == 1
        assert "accepts_chat_template" in unfit.stderr
        assert "reports_cached_tokens" in unfit.stderr


def test_worker_check_json_reports_every_check_with_a_reason_for_each_not_passed() -> None:
    with sim_engine("--scheduling-policy", "fcfs", "--no-log-stats") as url:
        unfit = check(url, MODEL, "--json")
        declared = check(url, MODEL, "--json", "--declare-priority-scheduling")
    assert unfit.returncode == 1, unfit.stderr
    report = json.loads(unfit.stdout)
    assert report["fit"] is False
    assert report["checks"]["exports_metrics"] == "failed"
    assert report["checks"]["priority_scheduling"] == "failed"  # seen serving FCFS
    assert report["checks"]["accepts_tools"] == "passed"
    assert set(report["reasons"]) == {"exports_metrics", "priority_scheduling"}
    assert all(report["reasons"].values())
    assert "first-come-first-served" in report["reasons"]["priority_scheduling"]
    # a declaration does not outrank what the probe saw
    assert json.loads(declared.stdout)["checks"]["priority_scheduling"] == "failed"
