"""The OpenAPI document is the contract: schemathesis (every check, every phase, stateful links
from ``POST /v1/conversations`` into the conversation's operations) against a real 3-region
plane finds 0 failures, with each kind of key the plane has.

Declared choices (``schemathesis.toml`` below): 503 and 504 are documented, retryable answers,
so ``not_a_server_error`` accepts them and still fails on any 500. ``CONVPLANE_SCHEMATHESIS_EXAMPLES`` raises the
examples per operation, ``CONVPLANE_SCHEMATHESIS_SEED`` changes the seed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.plane import Plane, convplane_env, start_plane, stop_plane

MAX_EXAMPLES = int(os.environ.get("CONVPLANE_SCHEMATHESIS_EXAMPLES", "15"))
SEED = int(os.environ.get("CONVPLANE_SCHEMATHESIS_SEED", "20261201"))
RUN_TIMEOUT_S = 600
SCHEMATHESIS = [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()"]
CONFIG = """\
[auth.openapi.apiKey]
bearer = "${CONVPLANE_TEST_KEY}"

[auth.openapi.peerSecret]
api_key = "${CONVPLANE_TEST_PEER_SECRET}"

[checks.not_a_server_error]
# 503 and 504 are documented retryable answers (with Retry-After); a 500 is a bug.
expected-statuses = ["2xx", "3xx", "4xx", "503", "504"]

[generation]
# A header the API does not know is no error (clients and proxies add their own); the flag
# also covers extra body properties, which tests/unit/test_openapi_document.py checks instead.
allow-extra-parameters = false
"""


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    proc, plane = start_plane(tmp_path_factory.mktemp("plane"), "--sim-engines", "1")
    try:
        yield plane
    finally:
        output = stop_plane(proc)
        assert proc.returncode == 0, output


def _run_schemathesis(plane: Plane, key: str, tmp: Path, *filters: str) -> str:
    cluster = json.loads(Path(plane.info["cluster_file"]).read_text())
    config = tmp / "schemathesis.toml"
    config.write_text(CONFIG)
    env = {
        **convplane_env(),
        "CONVPLANE_TEST_KEY": key,
        "CONVPLANE_TEST_PEER_SECRET": cluster["peer_secret"],
    }
    command = [
        *SCHEMATHESIS, "--config-file", str(config), "--no-color", "run",
        plane.urls["us-east"] + "/openapi.json", "--checks", "all",
        "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--workers", "2",
        "--generation-database", "none", "--request-timeout", "30",
        "--report", "junit", "--report-junit-path", str(tmp / "junit.xml"), *filters,
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=tmp, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-20_000:]
    return output


def _assert_all_passed(output: str, *phases: str) -> None:
    counts = re.search(r"(\d+) generated, (\d+) passed", output)
    assert counts is not None and counts[1] == counts[2] and int(counts[1]) > 0, output[-5000:]
    for phase in phases:
        assert f"✅ {phase}" in output, output[-5000:]


def test_schemathesis_finds_no_failure_with_a_tenant_key(plane: Plane, tmp_path: Path) -> None:
    output = _run_schemathesis(plane, plane.info["api_key"], tmp_path)
    _assert_all_passed(output, "Examples", "Coverage", "Fuzzing", "Stateful")


def test_schemathesis_finds_no_failure_with_the_replay_service_key(
    plane: Plane, tmp_path: Path
) -> None:
    output = _run_schemathesis(
        plane, plane.info["service_api_key"], tmp_path, "--include-path-regex", "^/v1/replays"
    )
    _assert_all_passed(output, "Examples", "Coverage", "Fuzzing")
