"""Running schemathesis against a real plane, shared by the OpenAPI contract tests: its
configuration (503 and 504 are documented, retryable answers, so ``not_a_server_error``
accepts them and still fails on any 500; unknown headers are no error), one worker, a fixed
seed (``CONVPLANE_SCHEMATHESIS_SEED``) and ``CONVPLANE_SCHEMATHESIS_EXAMPLES`` examples per
operation."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.e2e.plane import Plane, convplane_env

MAX_EXAMPLES = int(os.environ.get("CONVPLANE_SCHEMATHESIS_EXAMPLES", "15"))
SEED = int(os.environ.get("CONVPLANE_SCHEMATHESIS_SEED", "20261201"))
RUN_TIMEOUT_S = 600
SCHEMATHESIS = [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()"]
CONFIG = """\
[auth.openapi.apiKey]
bearer = "${CONVPLANE_TEST_KEY}"

[checks.not_a_server_error]
# 503 and 504 are documented retryable answers (with Retry-After); a 500 is a bug.
expected-statuses = ["2xx", "3xx", "4xx", "503", "504"]

[phases.stateful.generation]
# Stateful scenarios (a create, then operations on what it made, by the document's links):
# enough that the links a tenant key can follow are covered whatever the rest of the document
# draws from the shared seed. With 15, a new field in the practice requests left 4 covered;
# 60 and 150 both cover 6 (every link a tenant key reaches here)
max-examples = 60

[generation]
# A header the API does not know is no error (clients and proxies add their own); the flag
# also covers extra body properties, which tests/unit/test_openapi_document.py checks instead.
allow-extra-parameters = false
"""


def run_schemathesis(plane: Plane, key: str, tmp: Path, *filters: str) -> str:
    config = tmp / "schemathesis.toml"
    config.write_text(CONFIG)
    env = {
        **convplane_env(),
        "CONVPLANE_TEST_KEY": key,
    }
    # One worker: schemathesis's worker threads compile code concurrently, and CPython before
    # 3.13 shares the AST builder's recursion counter between threads (python/cpython#106905):
    # two workers failed CI once with "SystemError: AST constructor recursion depth mismatch".
    command = [
        *SCHEMATHESIS, "--config-file", str(config), "--no-color", "run",
        plane.urls["us-east"] + "/openapi.json", "--checks", "all",
        "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--workers", "1",
        "--generation-database", "none", "--request-timeout", "30", *filters,
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=tmp, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-20_000:]
    return output


def assert_all_passed(output: str, *phases: str) -> None:
    counts = re.search(r"(\d+) generated, (\d+) passed", output)
    assert counts is not None and counts[1] == counts[2] and int(counts[1]) > 0, output[-5000:]
    for phase in phases:
        assert f"✅ {phase}" in output, output[-5000:]
