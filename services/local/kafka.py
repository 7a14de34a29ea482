"""A real Kafka broker (KRaft, one node) as a child process, for tests and local stacks.

The broker's jars come from Maven Central through ``replay/kafka/pom.xml``:
``ensure_kafka_jars`` runs ``mvn dependency:copy-dependencies`` once into ``.cache/kafka/lib``
(git-ignored) and reuses the result while the pom is unchanged. ``start_broker`` writes a KRaft
``server.properties`` (broker and controller in one JVM on free 127.0.0.1 ports; given another
IPv4 address of this machine as ``host``, the SASL-over-TLS listener listens there, its
certificate naming it, and nothing unauthenticated leaves loopback), formats the
storage with a random cluster id, starts ``java -cp '<lib>/*' kafka.Kafka`` and returns once a
Metadata request names the broker. A broker that does not come up in time is killed and the error
carries its log tail.

The broker a test session uses (an external one, this one, or a container) is chosen in
``tests/harness/kafka.py``.

Nothing here runs at import time.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from services.local.host import HarnessError, free_port, local_address

LOOPBACK = "127.0.0.1"

_STAMP_FILE = ".pom-sha256"
_LOG_TAIL_LINES = 60


class KafkaHarnessError(HarnessError):
    """The local broker could not be provisioned or did not come up (message has the log tail)."""


# --- jars -------------------------------------------------------------------------------------


def broker_pom() -> Path:
    """The Maven project that pins the broker's jars: package data of ``replay``, so an
    installed wheel finds it as the source tree does."""
    return Path(str(files("replay") / "kafka" / "pom.xml"))


def _pom_digest(pom_path: Path) -> str:
    return hashlib.sha256(pom_path.read_bytes()).hexdigest()


def ensure_kafka_jars(
    cache_dir: str | Path = ".cache/kafka",
    *,
    pom_path: Path | None = None,
    mvn_timeout_s: float = 600.0,
) -> Path:
    """Return ``<cache_dir>/lib`` holding the broker's jars, downloading them once per pom."""
    cache = Path(cache_dir).resolve()
    lib_dir = cache / "lib"
    pom_path = pom_path or broker_pom()
    digest = _pom_digest(pom_path)
    stamp = lib_dir / _STAMP_FILE
    if stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == digest:
        return lib_dir
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaHarnessError("Maven (mvn) is not on PATH; cannot fetch the Kafka broker jars")
    cache.mkdir(parents=True, exist_ok=True)
    # Download into a fresh directory and rename it into place, so a concurrent or interrupted
    # run never leaves a half-filled lib/ that looks complete.
    staging = Path(tempfile.mkdtemp(prefix="lib-", dir=cache))
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom_path),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}",
        "-DincludeScope=runtime",
    ]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=mvn_timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise KafkaHarnessError(f"mvn did not finish within {mvn_timeout_s}s") from exc
    if done.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
        shutil.rmtree(staging, ignore_errors=True)
        tail = (done.stdout + done.stderr)[-4000:]
        raise KafkaHarnessError(f"mvn copy-dependencies failed (rc={done.returncode}):\n{tail}")
    (staging / _STAMP_FILE).write_text(digest, encoding="utf-8")
    if lib_dir.exists():
        shutil.rmtree(lib_dir)
    staging.rename(lib_dir)
    return lib_dir


# --- broker -----------------------------------------------------------------------------------


def random_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (22 chars), never
    starting with "-" (as Kafka's own ``Uuid.randomUuid``): the storage tool would read such an
    id as an option and refuse to format (1 start in 64 failed that way)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass(frozen=True, slots=True)
class BrokerSecurity:
    """Extra listeners of a local broker: SASL/PLAIN users, over plaintext on loopback and
    (with ``tls``) over TLS, on the broker's host, with a certificate the harness makes
    (``make_tls_files``). The PLAINTEXT listener stays on loopback for the harness's own
    readiness probe and inter-broker traffic."""

    sasl_users: Mapping[str, str]  # user -> password
    tls: bool = False


@dataclass(frozen=True, slots=True)
class TlsFiles:
    ca_cert: Path  # clients verify the broker with this
    server_pem: Path  # the broker's key (PKCS#8, unencrypted) and certificate, PEM


def make_tls_files(directory: Path, host: str = LOOPBACK, timeout_s: float = 60.0) -> TlsFiles:
    """A throwaway CA and a server certificate for the IP address ``host`` (and ``localhost``
    when it is loopback) (``openssl``), for tests only."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise KafkaHarnessError("openssl is not on PATH; a TLS listener needs it")
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = directory / "ca.key", directory / "ca.pem"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.crt"
    ext = directory / "san.ext"
    names = f"IP:{host},DNS:localhost" if host == LOOPBACK else f"IP:{host}"
    ext.write_text(f"subjectAltName={names}\n", encoding="utf-8")
    steps = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca_cert,
         "-days", "2", "-subj", "/CN=convplane-test-ca"],
        ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", key],
        ["req", "-new", "-key", key, "-out", csr, "-subj", f"/CN={host}"],
        ["x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial",
         "-out", cert, "-days", "2", "-extfile", ext],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run(
            [openssl, *map(str, step)], capture_output=True, text=True, timeout=timeout_s
        )
        if done.returncode != 0:
            raise KafkaHarnessError(f"openssl {step[0]} failed: {done.stderr[-2000:]}")
    server_pem = directory / "server.pem"
    server_pem.write_text(key.read_text() + cert.read_text(), encoding="utf-8")
    return TlsFiles(ca_cert, server_pem)


def _security_settings(
    security: BrokerSecurity, host: str, sasl_port: int, ssl_port: int, tls: TlsFiles | None
) -> tuple[list[str], dict[str, str]]:
    """(extra listeners, extra settings) for ``server_properties``."""
    users = " ".join(f'user_{u}="{p}"' for u, p in security.sasl_users.items())
    jaas = f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
    listeners = [f"SASL_PLAINTEXT://{LOOPBACK}:{sasl_port}"]  # passwords in clear: loopback
    settings = {
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
    }
    if tls is not None:
        listeners.append(f"SASL_SSL://{host}:{ssl_port}")
        settings.update(
            {
                "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas,
                "listener.name.sasl_ssl.ssl.keystore.type": "PEM",
                "listener.name.sasl_ssl.ssl.keystore.location": str(tls.server_pem),
            }
        )
    return listeners, settings


def server_properties(
    base_dir: Path,
    broker_port: int,
    controller_port: int,
    extra_listeners: Sequence[str] = (),
    extra_settings: Mapping[str, str] | None = None,
) -> str:
    """The broker's settings: PLAINTEXT and the controller on loopback only (nothing
    unauthenticated elsewhere), ``extra_listeners`` wherever they name."""
    listeners = [f"PLAINTEXT://{LOOPBACK}:{broker_port}", *extra_listeners]
    protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
    protocols += [f"{p}:{p}" for p in (lst.split(":", 1)[0] for lst in extra_listeners)]
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{LOOPBACK}:{controller_port}",
        "listeners": ",".join([*listeners, f"CONTROLLER://{LOOPBACK}:{controller_port}"]),
        "advertised.listeners": ",".join(listeners),
        "listener.security.protocol.map": ",".join(protocols),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(base_dir / "data"),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        # 50 partitions (the default) make the first consumer group wait for 50 leaders.
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.retention.hours": "24",
        **(extra_settings or {}),
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


_LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
"""


def _metadata_names_a_broker(host: str, port: int, timeout_s: float) -> bool:
    """Send a Metadata v0 request (all topics) and report whether the reply lists a broker.

    Raw protocol on purpose: it needs no event loop, so sync fixtures and the CLI can call it.
    """
    client_id = b"convplane-probe"
    header = struct.pack(">hhih", 3, 0, 7, len(client_id)) + client_id
    body = struct.pack(">i", 0)  # zero topics in v0 = all topics
    request = header + body
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(struct.pack(">i", len(request)) + request)
            size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
            reply = _recv_exactly(sock, min(size, 1 << 20))
    except OSError:
        return False
    if len(reply) < 8:
        return False
    correlation_id, broker_count = struct.unpack(">ii", reply[:8])
    return bool(correlation_id == 7 and broker_count >= 1)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining > 0:
        chunk = sock.recv(remaining)
        if not chunk:
            raise ConnectionError("connection closed")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "<no log>"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class KafkaBroker:
    """A running single-node KRaft broker (child process)."""

    bootstrap_servers: str
    process: subprocess.Popen[bytes]
    base_dir: Path
    log_path: Path
    start_duration_s: float
    sasl_bootstrap_servers: str | None = None  # SASL_PLAINTEXT listener (BrokerSecurity)
    sasl_ssl_bootstrap_servers: str | None = None  # SASL_SSL listener (BrokerSecurity.tls)
    tls: TlsFiles | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def is_running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        return _tail(self.log_path, lines)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (controlled shutdown), then SIGKILL if it has not exited within timeout_s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30.0)
        self._close_log()

    def _close_log(self) -> None:
        stdout = self.process.stdout
        if stdout is not None:
            stdout.close()

    def __enter__(self) -> KafkaBroker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise KafkaHarnessError("java is not on PATH; the local Kafka broker needs Java 11+")
    return java


def _format_storage(java: str, lib_dir: Path, config_path: Path, log_path: Path) -> None:
    cmd = [
        java,
        "-Xmx256m",
        "-cp",
        f"{lib_dir}/*",
        "kafka.tools.StorageTool",
        "format",
        "--ignore-formatted",  # a state dir reused by `convplane kafka up` keeps its cluster id
        "-t",
        random_cluster_id(),
        "-c",
        str(config_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    log_path.write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise KafkaHarnessError(f"kafka StorageTool format failed:\n{_tail(log_path)}")


def start_broker(
    base_dir: str | Path,
    *,
    lib_dir: Path | None = None,
    start_timeout_s: float = 90.0,
    heap_max: str = "512m",
    security: BrokerSecurity | None = None,
    host: str = LOOPBACK,
) -> KafkaBroker:
    """Format and start a one-node KRaft broker under ``base_dir``; return when it serves.
    With ``security``, SASL (and TLS) listeners besides the PLAINTEXT one. ``host``: an IPv4
    address of this machine (``services.local.host.local_address``) where the SASL_SSL
    listener listens; another than loopback needs ``security`` with TLS."""
    host = local_address(host)
    if host != LOOPBACK and (security is None or not security.tls):
        raise KafkaHarnessError(
            f"a broker on {host} takes clients from other hosts: it needs SASL over TLS "
            "(BrokerSecurity with tls=True); without it, it listens on 127.0.0.1 only"
        )
    base = Path(base_dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    lib = lib_dir if lib_dir is not None else ensure_kafka_jars()
    java = _java()
    broker_port, controller_port, sasl_port = free_port(), free_port(), free_port()
    ssl_port = free_port(host)
    tls = make_tls_files(base / "tls", host) if security is not None and security.tls else None
    listeners, extra = (
        _security_settings(security, host, sasl_port, ssl_port, tls) if security else ([], {})
    )
    config_path = base / "server.properties"
    properties = server_properties(base, broker_port, controller_port, listeners, extra)
    config_path.write_text(properties, encoding="utf-8")
    log4j_path = base / "log4j.properties"
    log4j_path.write_text(_LOG4J_PROPERTIES, encoding="utf-8")
    _format_storage(java, lib, config_path, base / "format.log")

    log_path = base / "broker.log"
    log_file = log_path.open("wb")
    cmd = [
        java,
        f"-Xmx{heap_max}",
        "-Xms128m",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j.configuration=file:{log4j_path}",
        f"-Dkafka.logs.dir={base / 'logs'}",
        "-cp",
        f"{lib}/*",
        "kafka.Kafka",
        str(config_path),
    ]
    started = time.monotonic()
    # A new session: Ctrl-C in a terminal reaches the Python parent, which stops the broker in
    # order, instead of killing the JVM under it.
    process = subprocess.Popen(
        cmd, stdout=log_file, stderr=subprocess.STDOUT, cwd=base, start_new_session=True
    )
    log_file.close()
    broker = KafkaBroker(f"{LOOPBACK}:{broker_port}", process, base, log_path, 0.0)
    if security is not None:
        broker.sasl_bootstrap_servers = f"{LOOPBACK}:{sasl_port}"
        if tls is not None:
            broker.sasl_ssl_bootstrap_servers = f"{host}:{ssl_port}"
            broker.tls = tls
    _wait_until_serving(broker, broker_port, started, start_timeout_s)
    broker.start_duration_s = time.monotonic() - started
    return broker


def _wait_until_serving(broker: KafkaBroker, port: int, started: float, timeout_s: float) -> None:
    while True:
        if not broker.is_running():
            raise KafkaHarnessError(
                f"Kafka broker exited with rc={broker.process.returncode} before serving; "
                f"log tail ({broker.log_path}):\n{broker.log_tail()}"
            )
        if _metadata_names_a_broker(LOOPBACK, port, timeout_s=2.0):
            return
        if time.monotonic() - started > timeout_s:
            tail = broker.log_tail()
            broker.kill()
            raise KafkaHarnessError(
                f"Kafka broker did not serve within {timeout_s}s; log tail:\n{tail}"
            )
        time.sleep(0.2)
