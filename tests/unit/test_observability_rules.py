"""convplane's Prometheus rules and config, checked by Prometheus's own ``promtool`` (Debian
package ``prometheus``; ``.ci/run`` installs it): the rules parse (``check rules``), every alert
behaves as its unit tests say (``test rules``), the compose stack's config is valid
(``check config``), and no alert goes without a unit test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY = ROOT / "deploy" / "observability"
RULES = OBSERVABILITY / "rules" / "convplane.rules.yml"
RULE_TESTS = OBSERVABILITY / "rules-tests" / "convplane.rules.test.yml"


def promtool(*args: str) -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is missing: apt-get install prometheus (.ci/run does)")
    done = subprocess.run(
        [binary, *args], cwd=OBSERVABILITY, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def test_rules_pass_promtool_check() -> None:
    assert "SUCCESS" in promtool("check", "rules", str(RULES))


def test_alerts_pass_their_unit_tests() -> None:
    assert "SUCCESS" in promtool("test", "rules", str(RULE_TESTS))


def test_compose_prometheus_config_is_valid() -> None:
    assert "SUCCESS" in promtool("check", "config", str(OBSERVABILITY / "prometheus.yml"))


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}
    fired = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts == fired, f"alerts without a firing test: {alerts - fired}"
