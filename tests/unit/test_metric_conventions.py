"""Every series a region node exports follows Prometheus's naming conventions, checked on a
scrape of a real node's ``/metrics`` (the real wiring, ``open_runtime``, with in-memory
replicas in place of the databases; the other regions' nodes are absent, so they show as
suspected).

A new series with a bad name, type or label fails here: ``convplane_`` prefix, base units,
counters ending in ``_total``, ratios in 0..1, no id of a conversation, tenant, user or request
as a label, and label values from bounded sets only (route templates, known methods, regions).
The shipped rules and Grafana dashboard (``deploy/observability``) read only series that this
scrape shows, or recording rules the rules file defines: a renamed series fails here.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from services.api.errors import ERROR_CODES
from services.api.metrics import HTTP_METHODS
from services.bootstrap.app import create_app
from services.config import (
    ClusterConfig,
    NodeSettings,
    RegionConfig,
    TenantConfig,
    api_key_sha256,
)
from tests.unit.api_fakes import KEY_A
from tests.unit.memory_runtime import memory_runtime

ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY = ROOT / "deploy" / "observability"
DASHBOARD = OBSERVABILITY / "grafana" / "dashboards" / "convplane.json"
RULES = OBSERVABILITY / "rules" / "convplane.rules.yml"
REGIONS = ("ap-south", "eu-west", "us-east")
SELF = "us-east"
AUTH = {"Authorization": f"Bearer {KEY_A}"}
CONVERSATION = "conv-metric-label-probe-7f3a"

#: series the node must export (the issue's list; dashboards and rules read them)
REQUIRED = {
    "convplane_append_ack_latency_seconds": "histogram",
    "convplane_forward_duration_seconds": "histogram",
    "convplane_replica_call_duration_seconds": "histogram",
    "convplane_failover_rto_seconds": "histogram",
    "convplane_replay_job_duration_seconds": "histogram",
    "convplane_request_errors": "counter",
    "convplane_admission_rejections": "counter",
    "convplane_failovers": "counter",
    "convplane_placement_changes": "counter",
    "convplane_fenced_writes": "counter",
    "convplane_drills": "counter",
    "convplane_shards_led": "gauge",
    "convplane_shards_without_quorum": "gauge",
    "convplane_region_status": "gauge",
    "convplane_replica_lag_entries": "gauge",
    "convplane_replica_lag_seconds": "gauge",
    "convplane_replay_backlog_sessions": "gauge",
    "convplane_replay_spare_tokens_per_second": "gauge",
    "convplane_admission_limit": "gauge",
    "convplane_admission_queue_length": "gauge",
    "convplane_background_loop_crash_looping": "gauge",
}
#: unit suffixes Prometheus's conventions replace with a base unit
NON_BASE_UNITS = re.compile(
    r"_(ms|millis|milliseconds|us|micros|microseconds|ns|minutes|hours|days|"
    r"kb|mb|gb|kilobytes|megabytes|gigabytes|percent|percentage)(_|$)"
)
BASE_UNITS = ("_seconds", "_bytes", "_entries", "_tokens", "_ratio")
#: label names that would carry an unbounded id
FORBIDDEN_LABELS = {
    "conversation",
    "conversation_id",
    "tenant",
    "tenant_id",
    "user",
    "user_id",
    "request_id",
    "trace_id",
    "idempotency_key",
    "api_key",
    "event_id",
    "attempt_id",
}
#: label -> the values it may take
BOUNDED_LABELS: dict[str, set[str]] = {
    "method": set(HTTP_METHODS) | {"other"},
    "region": set(REGIONS),
    "leader_region": set(REGIONS),
    "target_region": set(REGIONS),
    "from_region": set(REGIONS),
    "status_class": {"1xx", "2xx", "3xx", "4xx", "5xx"},
    "code": set(ERROR_CODES) | {"other"},
    "kind": {"evacuate", "region-loss", "kill"},
    "verdict": {"passed", "failed", "aborted"},
    "call": {"prepare", "append", "status"},
}
#: the most distinct values any label may show in this scrape
LABEL_VALUES_MAX = 64


def _cluster() -> ClusterConfig:
    return ClusterConfig(
        regions=[
            # port 9 on loopback: nothing listens, a probe is refused at once
            RegionConfig(name=r, url="http://127.0.0.1:9", dsn=f"memory://{r}")
            for r in REGIONS
        ],
        shard_count=4,
        tenants=[TenantConfig(tenant_id="a", api_key_sha256=api_key_sha256(KEY_A))],
        default_model_revision="m-1",
    )


@pytest.fixture
async def node() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        NodeSettings(region=SELF, cluster=_cluster()), runtime_factory=memory_runtime()
    )
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        yield await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node")
        )


async def _scrape_after_traffic(node: httpx.AsyncClient) -> str:
    """Requests that would leak ids into labels if anything labelled by raw path or method."""
    await node.post("/v1/conversations", json={"conversation_id": CONVERSATION}, headers=AUTH)
    await node.post(f"/v1/conversations/{CONVERSATION}/events", json={"type": "note"}, headers=AUTH)
    await node.get(f"/v1/conversations/{CONVERSATION}/events", headers=AUTH)
    await node.request("BREW", f"/v1/conversations/{CONVERSATION}", headers=AUTH)
    await node.get(f"/no/such/{CONVERSATION}")
    r = await node.get("/metrics")
    assert r.status_code == 200
    return r.text


def _families(text: str) -> dict[str, tuple[str, list[Sample]]]:
    return {f.name: (f.type, list(f.samples)) for f in text_string_to_metric_families(text)}


async def test_node_series_follow_prometheus_conventions(node: httpx.AsyncClient) -> None:
    text = await _scrape_after_traffic(node)
    families = _families(text)
    assert CONVERSATION not in text  # no id anywhere: not as a label, not in a route
    for name, kind in REQUIRED.items():
        assert name in families, f"{name} is not exported"
        assert families[name][0] == kind, f"{name} is a {families[name][0]}, not a {kind}"
    values: dict[str, set[str]] = {}
    for name, (kind, samples) in families.items():
        assert name.startswith("convplane_"), f"{name}: no convplane_ prefix"
        assert not NON_BASE_UNITS.search(name), f"{name}: not in a base unit"
        if kind == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in samples), name
        else:
            assert not name.endswith("_total"), f"{name}: only counters end in _total"
        if kind == "histogram":
            assert name.endswith(BASE_UNITS), f"{name}: a histogram names its unit"
        if "_ratio" in name:
            assert all(0 <= s.value <= 1 for s in samples), f"{name}: a ratio outside 0..1"
        for sample in samples:
            for label, value in sample.labels.items():
                assert label not in FORBIDDEN_LABELS, f"{name}: label {label} is an id"
                values.setdefault(label, set()).add(value)
    for label, seen in values.items():
        assert len(seen) <= LABEL_VALUES_MAX, f"label {label}: {len(seen)} values"
        if label in BOUNDED_LABELS:
            assert seen <= BOUNDED_LABELS[label], f"label {label}: {seen - BOUNDED_LABELS[label]}"
    assert values["method"] >= {"POST", "GET", "other"}  # BREW was counted as "other"
    assert "unmatched" in values["route"]  # the unknown path, not its raw text
    assert all(r == "unmatched" or r.startswith("/") for r in values["route"])


async def test_region_status_is_one_status_per_region(node: httpx.AsyncClient) -> None:
    families = _families((await node.get("/metrics")).text)
    _, samples = families["convplane_region_status"]
    for region in REGIONS:
        ones = [s for s in samples if s.labels["region"] == region and s.value == 1.0]
        assert len(ones) == 1, f"{region}: {ones}"
    own = next(s for s in samples if s.labels["region"] == SELF and s.value == 1.0)
    assert own.labels["status"] == "up"


#: series Prometheus itself makes for every target
PROMETHEUS_SERIES = {"up"}
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                "or", "unless", "offset", "inf", "nan"}  # fmt: skip


def series_in_promql(expr: str) -> set[str]:
    """Metric and recording-rule names an expression reads: identifiers that are not functions,
    keywords, label names (inside ``{}`` or a ``by (...)`` list) or strings."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        rest = expr[match.end() :].lstrip()
        if rest.startswith("(") or match.group().lower() in PROMQL_WORDS:
            continue
        if match.start() > 0 and (
            expr[match.start() - 1].isdigit() or expr[match.start() - 1] == "."
        ):
            continue  # a number like 1e-9
        names.add(match.group())
    return names


def _dashboard_exprs() -> Iterator[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            yield annotation["expr"]


def _rules() -> list[dict[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promql_names_are_found() -> None:
    assert series_in_promql(
        'histogram_quantile(0.99, sum by (le, region) (rate(a_b_bucket{x="y z"}[5m]))) > 1e-9'
        " and on (node) c:d:e == 0"
    ) == {"a_b_bucket", "c:d:e"}


async def test_dashboard_and_rules_read_series_that_exist(node: httpx.AsyncClient) -> None:
    families = _families(await _scrape_after_traffic(node))
    exported = PROMETHEUS_SERIES | {
        name + suffix for name, (kind, _) in families.items() for suffix in SUFFIXES[kind]
    }
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    known = exported | recorded
    exprs = list(_dashboard_exprs())
    assert len(exprs) >= 20
    for expr in exprs + [rule["expr"] for rule in _rules()]:
        unknown = series_in_promql(expr) - known
        assert not unknown, f"{expr!r} reads series nobody exports: {unknown}"
    dashboard = json.loads(DASHBOARD.read_text())
    assert {a["name"] for a in dashboard["annotations"]["list"]} >= {"Drills", "Failovers"}
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("region", "shards", "appends", "latency", "failover", "replay", "drills"):
        assert topic in titles, f"the dashboard has no {topic} panel"
