"""No secret in the repository: the compose stack generates its own at first start, passes
them as files or environment (never on a command line), and a node refuses the secrets the
repository once published unless told it is a throwaway demo. A region's certificate covers
every node of the region, also in a secrets volume an earlier release made."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from cryptography import x509

from services.config import ClusterConfig, NodeSettings, api_key_sha256, load_cluster
from services.deploy.compose_secrets import (
    KNOWN_DEMO_SECRETS,
    DemoSecretRefused,
    ensure_secrets,
    refuse_demo_secrets,
)

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "deploy" / "compose-cluster.template.json"
#: the cluster file the repository used to ship (deploy/compose-cluster.json)
PUBLISHED_CLUSTER = {
    "regions": [
        {"name": "us-east", "url": "http://node-us-east:8700",
         "dsn": "postgresql+asyncpg://postgres:convplane@pg-us-east:5432/convplane"},
    ],
    "tenants": [{"tenant_id": "demo", "api_key_sha256": api_key_sha256("demo-key-change-me")}],
    "peer_secret": "compose-only-peer-secret-change-me-0123456789",
    "replay": {"service_api_key_sha256": api_key_sha256("service-key-change-me")},
}  # fmt: skip


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def _node_hosts(region: dict[str, Any]) -> set[str]:
    """Every host name a region of the template names for its nodes, read from the JSON."""
    nodes = [region, *region.get("more_nodes", [])]
    return {urlsplit(node[key]).hostname for node in nodes for key in ("url", "peer_url")}


def _certificate(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _dns_names(cert: x509.Certificate) -> set[str]:
    alt_names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(alt_names.get_values_for_type(x509.DNSName))


def _one_node_per_region(template: dict[str, Any]) -> dict[str, Any]:
    """``template`` as releases before two nodes per region shipped it."""
    for region in template["regions"]:
        del region["more_nodes"]
    return template


def _files(directory: Path) -> dict[str, bytes]:
    return {str(f.relative_to(directory)): f.read_bytes() for f in directory.rglob("*")
            if f.is_file()}  # fmt: skip


def test_secrets_are_generated_once_private_and_consistent(tmp_path: Path) -> None:
    out = tmp_path / "secrets"
    cluster = ensure_secrets(TEMPLATE, out)
    assert _mode(out) == 0o700
    assert {_mode(f) for f in out.iterdir() if f.is_file()} == {0o600}
    assert _mode(out / "tls") == 0o700 and _mode(out / "tls" / "us-east-key.pem") == 0o600
    assert load_cluster(out / "cluster.json") == cluster
    api_key = (out / "api_key").read_text().strip()
    worker_keys = {r.name: (out / f"worker-key-{r.name}").read_text().strip()
                   for r in cluster.regions}  # fmt: skip
    service_key = worker_keys["us-east"]
    assert [t.api_key_sha256 for t in cluster.tenants] == [api_key_sha256(api_key)]
    assert cluster.replay.service_api_key_sha256 is None  # no key shared by every region
    assert cluster.replay.worker_keys_sha256 == {
        r: api_key_sha256(k) for r, k in worker_keys.items()
    }
    assert len(set(worker_keys.values())) == len(cluster.regions)
    passwords = {r.name: urlsplit(r.dsn).password for r in cluster.regions}
    for name, password in passwords.items():
        assert password == (out / f"pg-{name}-password").read_text().strip()
    assert len({*passwords.values(), api_key, service_key, cluster.peer_secret}) == 6
    refuse_demo_secrets(cluster)  # nothing published
    assert ensure_secrets(TEMPLATE, out) == cluster  # a restart keeps its keys
    assert ensure_secrets(TEMPLATE, tmp_path / "elsewhere").peer_secret != cluster.peer_secret


def test_the_repository_holds_no_secret() -> None:
    text = (ROOT / "docker-compose.yml").read_text() + TEMPLATE.read_text()
    for secret in KNOWN_DEMO_SECRETS - {"convplane"}:  # "convplane" is also the stack's name
        assert secret not in text
    template = json.loads(TEMPLATE.read_text())
    assert "peer_secret" not in template and "tenants" not in template
    assert all(urlsplit(r["dsn"]).password is None for r in template["regions"])
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        assert "POSTGRES_PASSWORD" not in service.get("environment", {}), name
        assert "--api-key" not in service.get("command", []), name  # ps would show it


def test_published_secrets_are_refused_each_by_name() -> None:
    with pytest.raises(DemoSecretRefused) as refused:
        refuse_demo_secrets(ClusterConfig.model_validate(PUBLISHED_CLUSTER))
    for what in ("peer_secret", "tenant demo", "replay service key", "us-east's database"):
        assert what in str(refused.value)


def test_a_node_with_published_secrets_does_not_start(tmp_path: Path) -> None:
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps(PUBLISHED_CLUSTER))
    refused = subprocess.run(
        [sys.executable, "-m", "services.cli.node", "--cluster-file", str(cluster_file),
         "--region", "us-east", "--port", "0"],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "published in convplane's repository" in refused.stderr


def test_a_demo_may_allow_published_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = ClusterConfig.model_validate(PUBLISHED_CLUSTER)
    assert not NodeSettings(region="us-east", cluster=cluster).allow_demo_secrets
    monkeypatch.setenv("CONVPLANE_ALLOW_DEMO_SECRETS", "1")
    assert NodeSettings(region="us-east", cluster=cluster).allow_demo_secrets


def test_a_region_certificate_covers_every_host_of_its_nodes(tmp_path: Path) -> None:
    """Peers verify the host name of the node they call, whichever of the region's nodes."""
    template = json.loads(TEMPLATE.read_text())
    out = tmp_path / "secrets"
    ensure_secrets(TEMPLATE, out)
    ca = _certificate(out / "tls" / "ca.pem")
    for region in template["regions"]:
        cert = _certificate(out / "tls" / f"{region['name']}.pem")
        assert _node_hosts(region) == {f"node-{region['name']}", f"node-{region['name']}-1"}
        assert _node_hosts(region) <= _dns_names(cert), region["name"]
        cert.verify_directly_issued_by(ca)


def test_an_earlier_releases_certificate_is_issued_again_under_the_same_ca(
    tmp_path: Path,
) -> None:
    """A secrets volume from a release of one node per region: the region certificates gain
    the new nodes' hosts, every other secret (the CA first) stays as it was."""
    earlier_template = tmp_path / "earlier-template.json"
    earlier_template.write_text(json.dumps(_one_node_per_region(json.loads(TEMPLATE.read_text()))))
    out = tmp_path / "secrets"
    ensure_secrets(earlier_template, out)
    before = _files(out)
    ensure_secrets(TEMPLATE, out)
    after = _files(out)
    assert set(after) == set(before)
    template = json.loads(TEMPLATE.read_text())
    regions = [r["name"] for r in template["regions"]]
    reissued = {f"tls/{name}{suffix}.pem" for name in regions for suffix in ("", "-key")}
    assert {name for name in before if before[name] != after[name]} == reissued | {"cluster.json"}
    ca = _certificate(out / "tls" / "ca.pem")
    for region in template["regions"]:
        cert = _certificate(out / "tls" / f"{region['name']}.pem")
        assert _node_hosts(region) <= _dns_names(cert), region["name"]
        cert.verify_directly_issued_by(ca)
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        identity = uris.get_values_for_type(x509.UniformResourceIdentifier)
        assert identity == [f"urn:convplane:region:{region['name']}"]  # still speaks for it
    ensure_secrets(TEMPLATE, out)
    assert _files(out) == after  # covered now: a later start issues nothing
