"""``convplane up --engine REGION=URL`` against a real vLLM started with vLLM's defaults and
``--disable-log-stats``: refused before anything starts, each failed check named with the flag
that fixes it. A well-configured one is attached with its worker in ``test_failover_real``."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.e2e.plane import CONVPLANE, convplane_env
from tests.vllm.servers import VllmServer


def test_up_refuses_a_badly_configured_vllm_saying_which_checks_failed_and_why(
    badly_configured: VllmServer, tmp_path: Path
) -> None:
    state_dir = tmp_path / "plane"
    result = subprocess.run(
        [*CONVPLANE, "up", "--state-dir", str(state_dir), "--base-port", "0",
         "--engine", f"eu-west={badly_configured.url}"],
        env={**convplane_env(), "COLUMNS": "1000"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = " ".join(result.stdout.split())
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"engine {badly_configured.url} (--engine eu-west=...) is unfit" in output, output
    for failed in ("exports_metrics", "accepts_chat_template", "reports_cached_tokens"):
        assert f"{failed}:" in output, output
    assert "--trust-request-chat-template" in output and "--disable-log-stats" in output, output
    assert not state_dir.exists()  # nothing started
