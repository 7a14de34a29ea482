"""docker-compose.yml as Docker would run it (compose-go's loader, ``tests/compose_spec``), held
to what a deployment must be: healthchecks and healthy dependencies, nothing as root, the plain
HTTP API on loopback only, every node of the cluster template a service of its region's
identity, nodes on their databases as least-privilege roles over TLS, Kafka over SASL_SSL,
and each container seeing only its own secrets, checked on the files the secrets service
really writes. Needs Go and, the first time, the Go module proxy (never skipped).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from services.config import load_cluster
from services.deploy.compose_secrets import main as generate_secrets
from services.deploy.db_roles import node_role
from tests.compose_spec.loader import build_loader, load_project

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
TEMPLATE = ROOT / "deploy" / "compose-cluster.template.json"
MOUNT = "/run/convplane-secrets"
REGIONS = ("us-east", "eu-west", "ap-south")
LOOPBACK = {"127.0.0.1", "::1"}


def expected_secrets(service: str) -> set[str]:
    """What each kind of service needs to read, and nothing more (paths in its mount)."""
    for region in REGIONS:
        # its cluster file, its role's password, its TLS key: both nodes of a region are one
        # identity
        if service in {f"node-{region}", f"node-{region}-1"}:
            return {"cluster.json", "pgpass", "tls/ca.pem", f"tls/{region}.pem",
                    f"tls/{region}-key.pem"}  # fmt: skip
        if service == f"worker-{region}":  # its own region's keys and its Kafka password
            return {f"worker-key-{region}", f"bus-secret-{region}", "cache_salt_key",
                    "kafka-password", "tls/ca.pem"}  # fmt: skip
        if service == f"pg-{region}":  # the owner's password, who may log in how, its TLS key
            return {f"pg-{region}-password", "pg_hba.conf", f"tls/pg-{region}.pem",
                    f"tls/pg-{region}-key.pem"}  # fmt: skip
    return {
        "kafka": {"server.properties", "kafka.pem", "kafka-cluster-id"},
        "db-init": {"databases.json", "tls/ca.pem"},  # owner DSNs and the roles' passwords
    }.get(service, set())  # engines, Prometheus, Grafana, vLLM: none


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    return load_project(build_loader(), COMPOSE_FILE)


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compose") / "secrets"
    generate_secrets(["--template", str(TEMPLATE), "--out", str(out)])
    return out


def services(project: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = project["services"]
    return found


def one_shots(project: dict[str, Any]) -> set[str]:
    """Services others wait to complete: they run once and exit."""
    return {
        name
        for service in services(project).values()
        for name, dependency in (service.get("depends_on") or {}).items()
        if dependency["condition"] == "service_completed_successfully"
    }


def long_running(project: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    shots = one_shots(project)
    return ((n, s) for n, s in services(project).items() if n not in shots)


def region_nodes(project: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every node service with its region: both of each region."""
    for region in REGIONS:
        for name in (f"node-{region}", f"node-{region}-1"):
            yield region, services(project)[name]


def visible_secrets(service: dict[str, Any], secrets_dir: Path) -> dict[str, str]:
    """Every file of the secrets volume the service mounts: path in its mount -> content."""
    visible = {}
    for volume in service.get("volumes") or []:
        if volume["type"] != "volume" or volume["source"] != "secrets":
            continue
        assert volume["target"] == MOUNT, volume
        subpath = (volume.get("volume") or {}).get("subpath", "")
        base = secrets_dir / subpath
        for file in base.rglob("*"):
            if file.is_file():
                visible[str(file.relative_to(base))] = file.read_text(encoding="utf-8")
    return visible


def test_the_file_loads_and_every_region_has_its_services(project: dict[str, Any]) -> None:
    for region in REGIONS:
        for kind in ("pg", "node", "engine", "worker"):
            assert f"{kind}-{region}" in services(project)
    assert one_shots(project) == {"secrets", "db-init"}
    for name in one_shots(project):
        assert services(project)[name].get("restart", "no") == "no", name


def test_every_long_running_service_has_a_healthcheck(project: dict[str, Any]) -> None:
    probes = {"node-": "/healthz", "pg-": "pg_isready", "kafka": "kafka-broker-api-versions",
              "engine-": "/health", "worker-": "--check"}  # fmt: skip
    for name, service in long_running(project):
        check = service.get("healthcheck") or {}
        test = " ".join(check.get("test") or [])
        assert test and not check.get("disable") and test != "NONE", f"{name}: no healthcheck"
        for prefix, probe in probes.items():
            if name.startswith(prefix):
                assert probe in test, f"{name}'s healthcheck does not ask {probe}: {test}"


def test_every_dependency_waits_for_health_or_completion(project: dict[str, Any]) -> None:
    shots = one_shots(project)
    for name, service in services(project).items():
        for dependency, how in (service.get("depends_on") or {}).items():
            wanted = "service_completed_successfully" if dependency in shots else "service_healthy"
            assert how["condition"] == wanted, f"{name} -> {dependency}: {how['condition']}"
    for region in REGIONS:
        for name in (f"node-{region}", f"node-{region}-1"):
            node = services(project)[name]["depends_on"]
            assert {"db-init", f"pg-{region}", "kafka"} <= set(node), name


def test_published_ports_bind_loopback_only(project: dict[str, Any]) -> None:
    """The client API is plain HTTP: published on a network, keys and transcripts would cross
    it in clear (docs/install-and-operate.md says how to expose it behind TLS)."""
    published = 0
    for name, service in services(project).items():
        for port in service.get("ports") or []:
            published += 1
            assert port.get("host_ip") in LOOPBACK, f"{name} publishes {port} beyond loopback"
    assert published >= 2 * len(REGIONS)


def test_every_node_of_the_cluster_template_runs_as_its_regions_identity(
    project: dict[str, Any],
) -> None:
    """Each node the template lists is the service its URL names, started with its region and
    node index, mounting its region's bundle and certificate, on a loopback port of its own."""
    host_ports = [
        (port.get("host_ip"), port["published"])
        for service in services(project).values()
        for port in service.get("ports") or []
    ]
    assert len(host_ports) == len(set(host_ports)), f"a host port is published twice: {host_ports}"
    nodes = {n for n, s in services(project).items() if (s.get("command") or [])[:1] == ["node"]}
    listed = set()
    for region in json.loads(TEMPLATE.read_text())["regions"]:
        first = services(project)[f"node-{region['name']}"]
        for index, address in enumerate([region, *region.get("more_nodes", [])]):
            name = urlsplit(address["url"]).hostname
            listed.add(name)
            command = services(project)[name]["command"]
            assert command[command.index("--region") + 1] == region["name"], name
            given = command[command.index("--node-index") + 1] if "--node-index" in command else 0
            assert int(given) == index, name
            node = services(project)[name]
            for key in ("volumes", "environment", "depends_on", "healthcheck"):
                assert node[key] == first[key], f"{name}'s {key} differ from its region's first"
            assert [p.get("host_ip") for p in node["ports"]] == ["127.0.0.1"], name
    assert listed == nodes and len(nodes) == 2 * len(REGIONS)


def dockerfile_user(context: Path, dockerfile: str) -> str | None:
    users = re.findall(r"^USER\s+(\S+)", (context / dockerfile).read_text(), re.MULTILINE)
    return users[-1] if users else None


def test_no_service_runs_as_root(project: dict[str, Any]) -> None:
    for name, service in services(project).items():
        user = service.get("user")
        if user is None and "build" in service:
            build = service["build"]
            user = dockerfile_user(Path(build["context"]), build.get("dockerfile", "Dockerfile"))
        assert user is not None, f"{name} runs as its image's default user, unchecked (root?)"
        assert user.split(":")[0] not in {"0", "root"}, f"{name} runs as {user}"


def test_each_service_mounts_only_its_own_secrets(
    project: dict[str, Any], secrets_dir: Path
) -> None:
    for name, service in services(project).items():
        if name == "secrets":  # the generator: the one service that mounts them all
            continue
        assert set(visible_secrets(service, secrets_dir)) == expected_secrets(name), name


def test_workers_and_engines_see_no_key_of_the_cluster_or_of_another_region(
    project: dict[str, Any], secrets_dir: Path
) -> None:
    """By content, not only by file name: a copy under another name counts too."""
    never = {"the CA key": secrets_dir / "tls" / "ca-key.pem",
             "the peer secret": secrets_dir / "peer_secret",
             "the demo API key": secrets_dir / "api_key"}  # fmt: skip
    for region in REGIONS:
        never[f"{region}'s node key"] = secrets_dir / "tls" / f"{region}-key.pem"
        never[f"{region}'s database password"] = secrets_dir / f"pg-{region}-password"
        never[f"{region}'s node role password"] = secrets_dir / f"db-role-{region}-password"
    for name, service in services(project).items():
        if not name.startswith(("worker-", "engine-")):
            continue
        region = name.split("-", 1)[1]
        forbidden = dict(never)
        for other in set(REGIONS) - {region}:
            for secret in (f"bus-secret-{other}", f"worker-key-{other}",
                           f"kafka-password-worker-{other}"):  # fmt: skip
                forbidden[f"{other}'s {secret}"] = secrets_dir / secret
        contents = "\n".join(visible_secrets(service, secrets_dir).values())
        for what, file in forbidden.items():
            assert file.read_text().strip() not in contents, f"{name} can read {what}"


def test_nodes_use_their_own_role_over_tls_never_the_owner(
    project: dict[str, Any], secrets_dir: Path
) -> None:
    for region, node in region_nodes(project):
        visible = visible_secrets(node, secrets_dir)
        cluster_file = next(a for a in node["command"] if a.endswith("cluster.json"))
        cluster = load_cluster(secrets_dir / "bundles" / f"node-{region}" / "cluster.json")
        assert cluster_file == f"{MOUNT}/cluster.json"
        dsns = [r.dsn for r in cluster.regions]
        dsns += [d for r in cluster.regions for d in r.dsn_from.values()]
        for dsn in dsns:
            parts = urlsplit(dsn)
            assert parts.username == node_role(region), f"node-{region} connects as {dsn}"
            assert parts.password is None, f"node-{region}'s cluster file holds a password"
            assert parse_qs(parts.query).get("ssl") == ["verify-full"], dsn
        assert visible["pgpass"].strip().split(":")[3] == node_role(region)
        environment = node["environment"]
        assert environment["PGPASSFILE"] == f"{MOUNT}/pgpass"
        assert environment["PGSSLROOTCERT"] == f"{MOUNT}/tls/ca.pem"
        for other in REGIONS:  # no owner's password, whatever the file
            owner_password = (secrets_dir / f"pg-{other}-password").read_text().strip()
            assert owner_password not in "\n".join(visible.values())


def test_databases_take_tcp_only_over_tls(project: dict[str, Any], secrets_dir: Path) -> None:
    for region in REGIONS:
        pg = services(project)[f"pg-{region}"]
        settings = dict(
            arg.split("=", 1) for arg in pg["command"] if "=" in arg and not arg.startswith("-")
        )
        assert settings["ssl"] == "on" and settings["hba_file"] == f"{MOUNT}/pg_hba.conf"
        hba = visible_secrets(pg, secrets_dir)["pg_hba.conf"]
        rules = [line.split() for line in hba.splitlines() if line and not line.startswith("#")]
        assert rules and all(rule[0] in {"local", "hostssl"} for rule in rules), hba
        assert all(rule[-1] == "scram-sha-256" for rule in rules), hba


def test_kafka_takes_clients_only_over_sasl_ssl(project: dict[str, Any], secrets_dir: Path) -> None:
    kafka = services(project)["kafka"]
    properties = dict(
        line.split("=", 1)
        for line in visible_secrets(kafka, secrets_dir)["server.properties"].splitlines()
        if "=" in line
    )
    protocols = dict(p.split(":") for p in properties["listener.security.protocol.map"].split(","))
    for listener in properties["listeners"].split(","):
        name, address = listener.split("://")
        if not address.startswith("127.0.0.1:"):  # reachable from the other containers
            assert protocols[name] == "SASL_SSL", listener
    for region in REGIONS:
        worker = services(project)[f"worker-{region}"]["command"]
        assert worker[worker.index("--kafka-security-protocol") + 1] == "SASL_SSL"
        assert worker[worker.index("--kafka-sasl-username") + 1] == f"worker-{region}"
        cluster = load_cluster(secrets_dir / "bundles" / f"node-{region}" / "cluster.json")
        assert cluster.replay.kafka_security_protocol == "SASL_SSL"
        assert cluster.replay.kafka_sasl_username == f"node-{region}"


def test_every_secret_path_a_service_names_is_in_its_mount(
    project: dict[str, Any], secrets_dir: Path
) -> None:
    """The other half of least privilege: what a service was left without, it never needed."""
    for name, service in services(project).items():
        if name == "secrets":
            continue
        words = [*(service.get("command") or []), *(service.get("entrypoint") or [])]
        words += [str(v) for v in (service.get("environment") or {}).values()]
        named = {m for w in words for m in re.findall(MOUNT + r"/([\w./-]+)", w)}
        missing = named - set(visible_secrets(service, secrets_dir))
        assert not missing, f"{name} names {sorted(missing)} but cannot read them"
