"""``convplane worker --check`` against ``convplane sim-engine serve`` processes over loopback:
exit 0 for an engine started as replay needs it, exit 1 naming what is missing otherwise."""

from __future__ import annotations

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


def check(url: str, revision: str = MODEL) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CONVPLANE, "worker", "--check", "--region", "r1", "--engine-url", url,
         "--model-revision", revision],
        env=convplane_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_worker_check_passes_a_fit_engine_and_names_what_an_unfit_one_lacks() -> None:
    with sim_engine() as url:
        fit = check(url)
        assert fit.returncode == 0, fit.stderr
        assert "fit for replay" in fit.stdout
        wrong = check(url, "sim-llama@2")
        assert wrong.returncode == 1 and "model_revision_mismatch" in wrong.stderr
    with sim_engine("--scheduling-policy", "fcfs", "--no-prompt-tokens-details") as url:
        unfit = check(url)
        assert unfit.returncode == 1
        assert "priority_scheduling_off" in unfit.stderr
