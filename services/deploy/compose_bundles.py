"""What each service of the docker compose stack may read: its own secrets, nothing else.

``write_bundles(out_dir, cluster)`` copies, from what ``services.deploy.compose_secrets`` generated in
``out_dir``, one directory per service into ``out_dir/bundles/``; docker-compose.yml mounts each
service's directory alone (a volume ``subpath``) at ``/run/convplane-secrets``:

* ``node-<region>``: ``cluster.json`` with no database password in it (every region's DSN
  names the node's own role, ``services.deploy.db_roles``, and asks for TLS, verify-full),
  ``pgpass`` (its role's password, ``PGPASSFILE``), ``tls/ca.pem``, ``tls/<region>.pem``,
  ``tls/<region>-key.pem``;
* ``worker-<region>``: ``worker-key-<region>``, ``bus-secret-<region>``, ``cache_salt_key``,
  ``kafka-password`` (its Kafka user's, ``worker-<region>``) and ``tls/ca.pem``;
* ``kafka``: ``server.properties`` (listeners, and every Kafka user's password: the broker
  checks them), ``kafka.pem`` (its key and certificate) and ``kafka-cluster-id``;
* ``pg-<region>``: ``pg-<region>-password`` (the owner's), ``pg_hba.conf`` (TCP only over
  TLS) and the server's ``tls/pg-<region>.pem`` and key;
* ``db-init``: ``databases.json`` (each region's owner DSN and every node role's password) and
  ``tls/ca.pem``, for the one-shot that migrates the databases and creates the roles
  (``services.deploy.compose_databases``).

Engines and the observability services mount none. The CA's key, the demo API key and
every other region's secrets stay in ``out_dir``, which only the generator mounts. A node's
cluster file still carries what every node needs: the peer secret, replay's cache-salt key and
each region's job-signing secret.

Bundles are rewritten from ``out_dir`` at every start, so they follow a rotation there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from services.config import ClusterConfig
from services.deploy.db_roles import node_role

BUNDLES_DIR = "bundles"
DB_INIT = "db-init"
KAFKA_HOST = "kafka"
KAFKA_CLUSTER_ID = "kafka-cluster-id"
#: where every service finds its bundle (docker-compose.yml mounts it there)
MOUNTED_AT = "/run/convplane-secrets"
#: PostgreSQL's client authentication: the local socket (pg_isready, the image's initdb) and
#: TCP only over TLS, every login by password
PG_HBA = "local all all scram-sha-256\nhostssl all all all scram-sha-256\n"


def kafka_users(region: str) -> tuple[str, str]:
    """The broker's SASL users of ``region``: its node's and its worker's."""
    return f"node-{region}", f"worker-{region}"


def kafka_password_file(user: str) -> str:
    return f"kafka-password-{user}"


def node_role_password_file(region: str) -> str:
    return f"db-role-{region}-password"


def pg_server_name(region: str) -> str:
    """The database server's host name in the stack, and its certificate's name."""
    return f"pg-{region}"


def write_bundles(out_dir: Path, cluster: ClusterConfig) -> Path:
    """Write every service's directory under ``out_dir/bundles`` (module docstring)."""
    # rewritten in place, never removed: a running service's mount points at its directory
    root = private_dir(out_dir / BUNDLES_DIR)
    tls = out_dir / "tls"
    role_passwords = {
        node_role(r.name): _read(out_dir / node_role_password_file(r.name)) for r in cluster.regions
    }
    for region in cluster.regions:
        name = region.name
        node = private_dir(root / f"node-{name}")
        node_file = node_cluster(
            cluster, name, _read(out_dir / kafka_password_file(f"node-{name}"))
        )
        write_private(node / "cluster.json", node_file.model_dump_json(indent=2))
        write_private(
            node / "pgpass", f"*:*:*:{node_role(name)}:{role_passwords[node_role(name)]}\n"
        )
        _copy(tls, node / "tls", ["ca.pem", f"{name}.pem", f"{name}-key.pem"])
        worker = private_dir(root / f"worker-{name}")
        _copy(out_dir, worker, [f"worker-key-{name}", f"bus-secret-{name}", "cache_salt_key"])
        write_private(
            worker / "kafka-password", _read(out_dir / kafka_password_file(f"worker-{name}"))
        )
        _copy(tls, worker / "tls", ["ca.pem"])
        pg = private_dir(root / pg_server_name(name))
        _copy(out_dir, pg, [f"pg-{name}-password"])
        write_private(pg / "pg_hba.conf", PG_HBA)
        server = pg_server_name(name)
        _copy(tls, pg / "tls", [f"{server}.pem", f"{server}-key.pem"])
    _write_kafka_bundle(out_dir, cluster, private_dir(root / KAFKA_HOST))
    db_init = private_dir(root / DB_INIT)
    databases = {
        "owner_dsns": {r.name: r.dsn for r in cluster.regions},
        "node_role_passwords": role_passwords,
    }
    write_private(db_init / "databases.json", json.dumps(databases, indent=2))
    _copy(tls, db_init / "tls", ["ca.pem"])
    return root


def node_cluster(cluster: ClusterConfig, region_name: str, kafka_password: str) -> ClusterConfig:
    """``cluster`` as the node of ``region_name`` reads it: every region's database as that
    node's own role, no password (it is in the node's ``pgpass``), never the owner; the broker
    over SASL_SSL as the node's own Kafka user."""
    role = node_role(region_name)
    regions = []
    for region in cluster.regions:
        parts = urlsplit(region.dsn)
        netloc = f"{role}@{parts.hostname}:{parts.port}"
        dsn = parts._replace(netloc=netloc).geturl()
        regions.append(region.model_copy(update={"dsn": dsn, "dsn_from": {}}))
    replay = cluster.replay.model_copy(
        update={
            "kafka_security_protocol": "SASL_SSL",
            "kafka_ssl_cafile": f"{MOUNTED_AT}/tls/ca.pem",
            "kafka_sasl_mechanism": "PLAIN",
            "kafka_sasl_username": f"node-{region_name}",
            "kafka_sasl_password": kafka_password,
        }
    )
    return cluster.model_copy(update={"regions": regions, "replay": replay})


def _write_kafka_bundle(out_dir: Path, cluster: ClusterConfig, bundle: Path) -> None:
    """The broker's own configuration (KRaft, one node): clients only over SASL_SSL on
    9092; the controller and the broker's own connections on loopback inside its container."""
    users = " ".join(
        f'user_{user}="{_read(out_dir / kafka_password_file(user))}"'
        for region in cluster.regions
        for user in kafka_users(region.name)
    )
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": "1@127.0.0.1:9093",
        "controller.listener.names": "CONTROLLER",
        "listeners": "SASL_SSL://:9092,INTERNAL://127.0.0.1:9094,CONTROLLER://127.0.0.1:9093",
        "advertised.listeners": f"SASL_SSL://{KAFKA_HOST}:9092,INTERNAL://127.0.0.1:9094",
        "listener.security.protocol.map": (
            "SASL_SSL:SASL_SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
        ),
        "inter.broker.listener.name": "INTERNAL",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": (
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
        ),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": f"{MOUNTED_AT}/{KAFKA_HOST}.pem",
        "log.dirs": "/tmp/kafka-logs",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    properties = "".join(f"{key}={value}\n" for key, value in settings.items())
    write_private(bundle / "server.properties", properties)
    tls = out_dir / "tls"
    key_and_cert = _read(tls / f"{KAFKA_HOST}-key.pem") + "\n" + _read(tls / f"{KAFKA_HOST}.pem")
    write_private(bundle / f"{KAFKA_HOST}.pem", key_and_cert + "\n")
    _copy(out_dir, bundle, [KAFKA_CLUSTER_ID])


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """Write ``path`` as 0600 from its first byte, atomically."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    tmp.replace(path)


def _copy(source_dir: Path, target_dir: Path, names: list[str]) -> None:
    private_dir(target_dir)
    for name in names:
        write_private(target_dir / name, (source_dir / name).read_text(encoding="utf-8"))


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8").strip()
