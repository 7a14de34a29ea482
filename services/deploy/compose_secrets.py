"""Secrets of the docker compose stack, generated at its first start, never in the repository.

``python -m services.deploy.compose_secrets --template deploy/compose-cluster.template.json --out DIR``
runs once per ``docker compose up`` (service ``secrets``, before anything else). On the first
run it generates, into ``DIR`` (a volume only the stack mounts), each file 0600:

* ``api_key``: the demo tenant's API key (the cluster file holds only its sha256);
* ``worker-key-<region>``: each region's replay worker key (a worker reads only its own
  region's, from the file into its environment: a key on a command line is visible to every
  user in ``ps``); a region's key reads transcripts only for that region's jobs;
* ``pg-<region>-password``: each region's database password (``POSTGRES_PASSWORD_FILE``);
* ``cache_salt_key`` and ``bus-secret-<region>``: replay's cache-salt key and each region's
  job-signing secret (a worker reads only its own region's);
* ``cluster.json``: the template with the peer secret, the key hashes and each DSN's password;
* ``kafka-password-<user>`` and ``kafka-cluster-id``: a SASL/PLAIN password per Kafka user
  (``node-<region>``, ``worker-<region>``) and the broker's KRaft cluster id;
* ``db-role-<region>-password``: the password of each node's database role
  (``services.deploy.db_roles``: the protocol's functions and reads, nothing else);
* ``tls/``: a cluster CA and a certificate per region (``services.cluster_tls``), shared by
  the region's nodes and valid for every host name the template gives them (``url``,
  ``peer_url`` and each of ``more_nodes``: ``node-<region>``, ``node-<region>-1``), for the
  mutual TLS of the peer listeners, and one per database server (``pg-<region>``) and the
  broker's (``kafka``): nodes reach their databases, nodes and workers the broker, over TLS
  only, verifying those names.

``main`` then writes one directory per service, holding only what that service needs
(``services.deploy.compose_bundles``); the stack mounts each service's alone.

Later runs keep what exists, so restarts keep their keys and databases; only a region's
certificate that lacks one of its nodes' host names (made by an earlier release, or before the
template named more nodes) is issued again, under the same CA. Operators who bring
their own secrets write ``DIR`` themselves (or mount it from an env-specific store).

``refuse_demo_secrets`` is the other half: a node refuses a cluster file that still carries one
of the fixed secrets convplane once shipped in its repository (anyone could read them), unless
``CONVPLANE_ALLOW_DEMO_SECRETS=1`` says this is a throwaway demo.
"""

from __future__ import annotations

import argparse
import base64
import json
import secrets
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from services.cluster_tls import certificate_hosts, issue_certificate, issue_cluster_tls
from services.config import ClusterConfig, RegionConfig, api_key_sha256
from services.deploy.compose_bundles import (
    KAFKA_CLUSTER_ID,
    KAFKA_HOST,
    kafka_password_file,
    kafka_users,
    node_role_password_file,
    pg_server_name,
    write_bundles,
    write_private,
)

#: what the repository used to ship in docker-compose.yml and deploy/: public, so never secret
KNOWN_DEMO_SECRETS = frozenset(
    {
        "demo-key-change-me",
        "service-key-change-me",
        "convplane",
        "compose-only-peer-secret-change-me-0123456789",
    }
)
_KNOWN_DEMO_KEY_HASHES = frozenset(api_key_sha256(s) for s in KNOWN_DEMO_SECRETS)
DEMO_TENANT = "demo"


class DemoSecretRefused(ValueError):
    """The cluster file carries a secret published in the repository."""


def refuse_demo_secrets(cluster: ClusterConfig) -> None:
    """Raise ``DemoSecretRefused`` naming every published secret ``cluster`` still uses."""
    found = []
    if cluster.peer_secret in KNOWN_DEMO_SECRETS:
        found.append("peer_secret")
    found += [
        f"tenant {t.tenant_id}'s API key"
        for t in cluster.tenants
        if t.api_key_sha256 in _KNOWN_DEMO_KEY_HASHES
    ]
    if cluster.replay.service_api_key_sha256 in _KNOWN_DEMO_KEY_HASHES:
        found.append("the replay service key")
    for region in cluster.regions:
        for dsn in (region.dsn, *region.dsn_from.values()):
            if urlsplit(dsn).password in KNOWN_DEMO_SECRETS:
                found.append(f"region {region.name}'s database password")
                break
    if found:
        raise DemoSecretRefused(
            "the cluster file uses secrets published in convplane's repository ("
            + ", ".join(found)
            + "): generate your own (python -m services.deploy.compose_secrets), or set "
            "CONVPLANE_ALLOW_DEMO_SECRETS=1 for a throwaway demo"
        )


def ensure_secrets(template_path: Path, out_dir: Path) -> ClusterConfig:
    """Generate what ``out_dir`` lacks (module docstring); return the cluster it describes."""
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    out_dir.chmod(0o700)
    template = json.loads(template_path.read_text(encoding="utf-8"))
    api_key = _secret_file(out_dir / "api_key", lambda: "cp_" + secrets.token_urlsafe(24))
    peer_secret = _secret_file(out_dir / "peer_secret", lambda: secrets.token_urlsafe(32))
    for region in template["regions"]:
        password_file = out_dir / f"pg-{region['name']}-password"
        password = _secret_file(password_file, lambda: secrets.token_urlsafe(24))
        parts = urlsplit(region["dsn"])
        netloc = f"{parts.username}:{password}@{parts.hostname}:{parts.port}"
        region["dsn"] = parts._replace(netloc=netloc).geturl()
        _secret_file(out_dir / node_role_password_file(region["name"]), _role_password)
        for user in kafka_users(region["name"]):
            _secret_file(out_dir / kafka_password_file(user), _role_password)
    _secret_file(out_dir / KAFKA_CLUSTER_ID, _kafka_cluster_id)
    template["tenants"] = [{"tenant_id": DEMO_TENANT, "api_key_sha256": api_key_sha256(api_key)}]
    template["peer_secret"] = peer_secret
    replay = template.setdefault("replay", {})
    replay["worker_keys_sha256"] = {
        region["name"]: api_key_sha256(
            _secret_file(
                out_dir / f"worker-key-{region['name']}", lambda: "cps_" + secrets.token_urlsafe(24)
            )
        )
        for region in template["regions"]
    }
    replay["cache_salt_key"] = _secret_file(
        out_dir / "cache_salt_key", lambda: secrets.token_hex(32)
    )
    replay["bus_secrets"] = {
        region["name"]: _secret_file(
            out_dir / f"bus-secret-{region['name']}", lambda: secrets.token_hex(32)
        )
        for region in template["regions"]
    }
    cluster = ClusterConfig.model_validate(template)
    _ensure_tls(out_dir / "tls", cluster.regions)
    cluster_file = out_dir / "cluster.json"
    write_private(cluster_file, cluster.model_dump_json(indent=2))
    return cluster


def _role_password() -> str:
    return secrets.token_urlsafe(24)  # what services.deploy.db_roles takes: [A-Za-z0-9_-]{16,128}


def _kafka_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")


def _node_hosts(region: RegionConfig) -> list[str]:
    """Every host name at which the template says the region's nodes listen."""
    urls = [*region.node_urls(), *region.node_peer_urls(region.name)]
    return list(dict.fromkeys(host for url in urls if (host := urlsplit(url).hostname)))


def _ensure_tls(tls_dir: Path, regions: list[RegionConfig]) -> None:
    hosts_of = {region.name: _node_hosts(region) for region in regions}
    if not (tls_dir / "ca.pem").exists():
        issue_cluster_tls(tls_dir, list(hosts_of), [], hosts_of=hosts_of)
    for name, hosts in hosts_of.items():
        # peers verify the host name of the node they call: a certificate from an earlier
        # release, made for the region's first node only, would fail its siblings
        cert_file = tls_dir / f"{name}.pem"
        if not cert_file.exists() or not set(hosts) <= certificate_hosts(cert_file):
            issue_certificate(tls_dir, name, hosts, region=name)
    for region in hosts_of:
        server = pg_server_name(region)
        if not (tls_dir / f"{server}.pem").exists():
            issue_certificate(tls_dir, server, [server])
    if not (tls_dir / f"{KAFKA_HOST}.pem").exists():
        issue_certificate(tls_dir, KAFKA_HOST, [KAFKA_HOST])


def _secret_file(path: Path, generate: Callable[[], str]) -> str:
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    value = generate()
    write_private(path, value + "\n")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    cluster = ensure_secrets(args.template, args.out)
    write_bundles(args.out, cluster)
    print(
        f"secrets for {len(cluster.regions)} regions in {args.out} (demo key: {args.out}/api_key)"
    )


if __name__ == "__main__":
    main()
