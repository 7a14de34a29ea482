"""docker-compose.yml cannot be run here (no Docker engine), so check what can be checked: it
parses, every region in the cluster file has its database, node, engine and worker, and the
cluster file the nodes read is valid."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from services.config import ClusterConfig

ROOT = Path(__file__).resolve().parents[2]


def test_compose_has_a_full_stack_per_region() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    cluster = ClusterConfig.model_validate(
        json.loads((ROOT / "deploy" / "compose-cluster.json").read_text())
    )
    services = compose["services"]
    assert "kafka" in services
    for region in cluster.regions:
        for role in ("pg", "node", "engine", "worker"):
            assert f"{role}-{region.name}" in services
        node_command = services[f"node-{region.name}"]["command"]
        assert node_command[node_command.index("--region") + 1] == region.name
        assert f"pg-{region.name}:5432" in region.dsn
    assert cluster.replay.kafka_bootstrap_servers == "kafka:9092"


def test_vllm_is_pinned_and_started_as_the_worker_self_check_requires() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    vllm = compose["services"]["vllm-us-east"]
    assert not vllm["image"].endswith(":latest") and ":" in vllm["image"]
    flags = vllm["command"]
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details"):
        assert flag in flags
    assert flags[flags.index("--scheduling-policy") + 1] == "priority"
    served = flags[flags.index("--served-model-name") + 1]
    assert served.endswith("@" + flags[flags.index("--revision") + 1])


def test_workers_share_the_nodes_salt_key_and_their_regions_bus_secret() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    cluster = ClusterConfig.model_validate(
        json.loads((ROOT / "deploy" / "compose-cluster.json").read_text())
    )
    for region in cluster.regions:
        env = compose["services"][f"worker-{region.name}"]["environment"]
        assert env["CONVPLANE_CACHE_SALT_KEY"] == cluster.replay.cache_salt_key
        assert env["CONVPLANE_REPLAY_BUS_SECRET"] == cluster.replay.bus_secrets[region.name]
