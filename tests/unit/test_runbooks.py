"""Every alert links its runbook, and the runbook has a section for it; the dashboard lets an
SRE pick the datasource and the regions instead of hard-coding a datasource uid."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/observability/rules/convplane.rules.yml"
RUNBOOKS = ROOT / "docs/runbooks.md"
DASHBOARD = ROOT / "deploy/observability/grafana/dashboards/convplane.json"


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the level-2 headings (lower case, spaces to dashes)."""
    return {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^## (.+)$", markdown, flags=re.MULTILINE)
    }


def test_every_alert_names_a_runbook_section_that_exists() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    anchors = _anchors(RUNBOOKS.read_text())
    for alert in alerts:
        url = alert["annotations"].get("runbook_url", "")
        path, _, anchor = url.partition("#")
        assert path == "docs/runbooks.md", alert["alert"]
        assert anchor == alert["alert"].lower() and anchor in anchors, alert["alert"]


def test_the_dashboard_has_datasource_and_region_variables() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["region"]["type"] == "query" and variables["region"]["includeAll"]
    for panel in dashboard["panels"]:
        if "targets" in panel:
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert sum('=~"$region"' in e for e in exprs) >= 5
