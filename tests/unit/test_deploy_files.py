"""docker-compose.yml cannot be run here (no Docker engine), so check what can be checked: it
parses, every region in the cluster template has its database, node, engine and worker, and the
cluster file the secrets service generates from the template is valid."""

from __future__ import annotations

from pathlib import Path

import yaml

from services.compose_secrets import ensure_secrets

ROOT = Path(__file__).resolve().parents[2]


def test_compose_has_a_full_stack_per_region(tmp_path: Path) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    cluster = ensure_secrets(ROOT / "deploy" / "compose-cluster.template.json", tmp_path)
    services = compose["services"]
    assert "kafka" in services and "secrets" in services
    for region in cluster.regions:
        for role in ("pg", "node", "engine", "worker"):
            assert f"{role}-{region.name}" in services
        node_command = services[f"node-{region.name}"]["command"]
        assert node_command[node_command.index("--region") + 1] == region.name
        assert f"pg-{region.name}:5432" in region.dsn
        peer_port = node_command[node_command.index("--peer-port") + 1]
        assert region.peer_url == f"https://node-{region.name}:{peer_port}"
        environment = services[f"node-{region.name}"]["environment"]
        assert environment["CONVPLANE_TLS_CERT_FILE"].endswith(f"/tls/{region.name}.pem")
    assert cluster.replay.kafka_bootstrap_servers == "kafka:9092"
