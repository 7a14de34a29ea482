"""The replay self-check (``convplane worker --check``) against real vLLM servers: a server
started as replay needs it is fit, its priority scheduling seen by the queue probe; one started
with vLLM's defaults (FCFS) and --disable-log-stats is unfit, with each missing flag named.

The priority probe judges by timing, and says ``unverified`` when its timing cannot tell (a
loaded machine): a check is run again, up to ``CHECKS_MAX`` times, until it can. What must
never happen is the opposite verdict."""

from __future__ import annotations

import json
import subprocess

from tests.e2e.plane import CONVPLANE, convplane_env
from tests.vllm.servers import CHECKS_MAX, MODEL_REVISION, VllmServer, decisive_check


def check_cli(url: str, *flags: str, until: str = "") -> subprocess.CompletedProcess[str]:
    """``worker --check --json``, again while the priority probe could not tell, or (with
    ``until``) while its verdict is not that one."""
    for _ in range(CHECKS_MAX):
        result = subprocess.run(
            [*CONVPLANE, "worker", "--check", "--json", "--region", "r1", "--engine-url", url,
             "--model-revision", MODEL_REVISION, *flags],
            env=convplane_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        verdict = json.loads(result.stdout)["checks"]["priority_scheduling"]
        if verdict != "unverified" and (not until or verdict == until):
            break
    return result


async def test_a_well_configured_server_passes_every_check_priority_seen_not_declared(
    well_configured: VllmServer,
) -> None:
    fitness = await decisive_check(well_configured.url)
    assert fitness.fit, fitness.reasons()
    assert set(fitness.verdicts().values()) == {"passed"}, fitness.reasons()
    result = check_cli(well_configured.url)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["fit"] is True and set(report["checks"].values()) == {"passed"}, report


def test_a_badly_configured_server_is_unfit_and_each_missing_flag_is_named(
    badly_configured: VllmServer,
) -> None:
    result = check_cli(badly_configured.url)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["fit"] is False
    assert report["checks"] == {
        "serves_revision": "passed",
        "exports_metrics": "failed",  # --disable-log-stats
        "accepts_tools": "passed",  # tool_choice none needs no --enable-auto-tool-choice
        "accepts_chat_template": "failed",  # no --trust-request-chat-template
        "caches_prefixes": "unverified",  # cached tokens are not reported ...
        "reports_cached_tokens": "failed",  # ... without --enable-prompt-tokens-details
        "priority_scheduling": "failed",  # FCFS: the live-priority probe waited its turn
    }, report
    assert "--trust-request-chat-template" in report["reasons"]["accepts_chat_template"]
    assert "first-come-first-served" in report["reasons"]["priority_scheduling"]
    # a declaration never outranks what the probe saw (it counts only where the probe could
    # not tell, so a run in which the probe saw FCFS must still say failed)
    declared = check_cli(badly_configured.url, "--declare-priority-scheduling", until="failed")
    assert json.loads(declared.stdout)["checks"]["priority_scheduling"] == "failed"
    assert set(report["reasons"]) == {n for n, v in report["checks"].items() if v != "passed"}
