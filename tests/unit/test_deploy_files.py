"""docker-compose.yml cannot be run here (no Docker engine), so check what can be checked: it
parses, every region in the cluster template has its database, node, engine and worker, and the
cluster file the secrets service generates from the template is valid."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from services.config import NodeSettings
from services.deploy.compose_secrets import ensure_secrets

ROOT = Path(__file__).resolve().parents[2]


def test_compose_has_a_full_stack_per_region(tmp_path: Path) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    cluster = ensure_secrets(ROOT / "deploy" / "compose-cluster.template.json", tmp_path)
    services = compose["services"]
    assert "kafka" in services and "secrets" in services
    for region in cluster.regions:
        for role in ("pg", "node", "engine", "worker"):
            assert f"{role}-{region.name}" in services
        assert f"pg-{region.name}:5432" in region.dsn
    assert cluster.replay.kafka_bootstrap_servers == "kafka:9092"


def test_every_node_of_the_cluster_file_is_a_service_started_as_that_node(
    tmp_path: Path,
) -> None:
    """A node finds its own addresses in the cluster file by its region and ``--node-index``:
    each node the file lists must be the service its URLs name, started with that region and
    index, listening on the ports its URLs say, with its region's certificate."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    cluster = ensure_secrets(ROOT / "deploy" / "compose-cluster.template.json", tmp_path)
    services = compose["services"]
    started = set()
    for region in cluster.regions:
        assert region.node_count == 2, region.name  # the stack runs two nodes per region
        peer_urls = [region.peer_url, *(node.peer_url for node in region.more_nodes)]
        for index, (url, peer_url) in enumerate(zip(region.node_urls(), peer_urls, strict=True)):
            host, port = urlsplit(url).hostname, urlsplit(url).port
            assert peer_url is not None and urlsplit(peer_url).hostname == host, peer_url
            command = services[host]["command"]
            assert command[command.index("--region") + 1] == region.name, host
            given = command[command.index("--node-index") + 1] if "--node-index" in command else 0
            assert int(given) == index, host
            assert int(command[command.index("--port") + 1]) == port, host
            assert int(command[command.index("--peer-port") + 1]) == urlsplit(peer_url).port
            environment = services[host]["environment"]
            assert environment["CONVPLANE_TLS_CERT_FILE"].endswith(f"/tls/{region.name}.pem")
            started.add(host)
    assert started == {name for name, s in services.items() if s.get("command", [""])[0] == "node"}


def test_the_console_urls_name_every_region_at_its_published_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console reads every region from the operator's browser, which reaches the nodes on
    the host ports compose publishes, not at the in-network names of the cluster file."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    cluster = ensure_secrets(ROOT / "deploy" / "compose-cluster.template.json", tmp_path)
    for region in cluster.regions:
        node = compose["services"][f"node-{region.name}"]
        # parsed the way the node parses it: from its environment
        monkeypatch.setenv("CONVPLANE_CONSOLE_URLS", node["environment"]["CONVPLANE_CONSOLE_URLS"])
        urls = NodeSettings(region=region.name)
        published = {int(p.split(":")[-2]) for p in node["ports"]}  # [IP:]HOST:CONTAINER
        assert set(urls.console_urls) == {r.name for r in cluster.regions}
        assert int(urls.console_urls[region.name].rsplit(":", 1)[1]) in published


def test_vllm_is_pinned_and_started_as_the_worker_self_check_requires() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    vllm = compose["services"]["vllm-us-east"]
    assert not vllm["image"].endswith(":latest") and ":" in vllm["image"]
    flags = vllm["command"]
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details",
                 "--trust-request-chat-template", "--enable-auto-tool-choice"):  # fmt: skip
        assert flag in flags
    assert "--tool-call-parser" in flags and "--disable-log-stats" not in flags
    assert flags[flags.index("--scheduling-policy") + 1] == "priority"
    served = flags[flags.index("--served-model-name") + 1]
    assert served.endswith("@" + flags[flags.index("--revision") + 1])


def test_workers_get_the_nodes_salt_key_and_only_their_regions_bus_secret(
    tmp_path: Path,
) -> None:
    """The secrets service generates replay's keys; each worker's entrypoint reads the salt key
    the nodes use and the signing secret of its own region, by file, never from the compose
    file itself."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    cluster = ensure_secrets(ROOT / "deploy" / "compose-cluster.template.json", tmp_path)
    assert cluster.replay.cache_salt_key == (tmp_path / "cache_salt_key").read_text().strip()
    entrypoint = " ".join(compose["x-worker-entrypoint"])
    assert "CONVPLANE_CACHE_SALT_KEY=$$(cat /run/convplane-secrets/cache_salt_key)" in entrypoint
    assert "CONVPLANE_REPLAY_BUS_SECRET=$$(cat $$CONVPLANE_BUS_SECRET_FILE)" in entrypoint
    for region in cluster.regions:
        worker = compose["services"][f"worker-{region.name}"]
        secret_file = worker["environment"]["CONVPLANE_BUS_SECRET_FILE"]
        assert secret_file == f"/run/convplane-secrets/bus-secret-{region.name}"
        secret = (tmp_path / f"bus-secret-{region.name}").read_text().strip()
        assert cluster.replay.bus_secrets[region.name] == secret
        assert len(set(cluster.replay.bus_secrets.values())) == len(cluster.regions)


def test_prometheus_and_grafana_are_wired_to_the_shipped_files() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    for service in ("prometheus", "grafana"):
        for volume in services[service]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{service} mounts {source}, which is missing"
    prometheus = yaml.safe_load((ROOT / "deploy/observability/prometheus.yml").read_text())
    targets = [t for c in prometheus["scrape_configs"][0]["static_configs"] for t in c["targets"]]
    cluster_template = (ROOT / "deploy" / "compose-cluster.template.json").read_text()
    for target in targets:
        host, port = target.split(":")
        assert host in services and port in services[host]["command"], target
        assert f"http://{host}:{port}" in cluster_template, target
    datasource = yaml.safe_load(
        (ROOT / "deploy/observability/grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"
    dashboard = json.loads(
        (ROOT / "deploy/observability/grafana/dashboards/convplane.json").read_text()
    )
    # the dashboard picks its datasource by variable, defaulting to the one provisioned here
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert variable["current"]["value"] == datasource["uid"]


def test_prometheus_scrapes_every_node_and_the_dashboard_tells_them_apart() -> None:
    """Every node of the cluster template is scraped under a `node` label of its own, and the
    dashboard's region filter picks exactly that region's nodes (a region's second node is
    `<region>-1`, which a filter equal to the region name would miss)."""
    template = json.loads((ROOT / "deploy" / "compose-cluster.template.json").read_text())
    region_of_target = {
        f"{urlsplit(url).hostname}:{urlsplit(url).port}": region["name"]
        for region in template["regions"]
        for url in [region["url"], *(node["url"] for node in region.get("more_nodes", []))]
    }
    prometheus = yaml.safe_load((ROOT / "deploy/observability/prometheus.yml").read_text())
    region_of_label = {}
    for config in prometheus["scrape_configs"][0]["static_configs"]:
        (target,) = config["targets"]
        assert config["labels"]["node"] not in region_of_label, config
        region_of_label[config["labels"]["node"]] = region_of_target.pop(target)
    assert not region_of_target, f"nodes nobody scrapes: {region_of_target}"
    assert len(region_of_label) == 2 * len(template["regions"])
    dashboard = (ROOT / "deploy/observability/grafana/dashboards/convplane.json").read_text()
    filters = set(re.findall(r'node=~\\"([^"\\]+)\\"', dashboard))
    assert filters, "the dashboard filters no panel by node"
    for node_filter in filters:
        for region in template["regions"]:
            # Grafana puts one chosen region into a regex escaped; Prometheus anchors it
            pattern = node_filter.replace("$region", re.escape(region["name"]))
            picked = {label for label in region_of_label if re.fullmatch(pattern, label)}
            wanted = {label for label, r in region_of_label.items() if r == region["name"]}
            assert picked == wanted, (node_filter, region["name"])
