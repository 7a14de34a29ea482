"""``convplane worker``: one replay worker against a vLLM-compatible engine, over Kafka.
``convplane kafka up``: a local one-node KRaft broker for development.

Nothing happens at import time; the worker's graph is wired in ``services.bootstrap.worker``.
"""

from __future__ import annotations

import asyncio
import json
import socket

import typer


async def _check_engine(
    engine_url: str,
    model_revision: str,
    replay_priority: int,
    priority_declared: bool,
    as_json: bool,
) -> int:
    """``convplane worker --check``: the engine's replay self-check, printed; 0 when fit."""
    from replay.engines.vllm_http import VllmHttpEngine

    engine = VllmHttpEngine("check", engine_url, model_revision)
    try:
        fitness = await engine.self_check(replay_priority, priority_declared=priority_declared)
    finally:
        await engine.aclose()
    if as_json:
        typer.echo(json.dumps(fitness.as_json(), indent=2, sort_keys=False))
    else:
        for check in fitness.checks:
            reason = f": {check.reason}" if check.reason else ""
            typer.echo(
                f"{check.verdict.upper():10} {check.name}{reason}", err=check.verdict == "failed"
            )
        verdict = "fit" if fitness.fit else "UNFIT"
        typer.echo(f"engine {engine_url} is {verdict} for replay of {model_revision!r}")
    return 0 if fitness.fit else 1


def register(app: typer.Typer) -> None:
    @app.command("worker")
    def worker(
        region: str = typer.Option(..., help="Region whose replay jobs this worker takes."),
        engine_url: str = typer.Option(..., help="Base URL of the vLLM-compatible engine."),
        bootstrap_servers: str = typer.Option("", help="Kafka bootstrap servers."),
        region_url: str = typer.Option("", help="Base URL of the region's REST API."),
        api_key: str = typer.Option("", envvar="CONVPLANE_WORKER_API_KEY", help="Service key."),
        check: bool = typer.Option(
            False, "--check", help="Only run the engine self-check, print it, exit 0 if fit."
        ),
        as_json: bool = typer.Option(
            False, "--json", help="With --check: print {fit, checks, reasons} as JSON."
        ),
        declare_priority_scheduling: bool = typer.Option(
            False,
            "--declare-priority-scheduling",
            help="The engine runs --scheduling-policy priority: counts where the check's queue "
            "probe cannot tell (never over an engine seen serving FCFS); otherwise replay "
            "takes a smaller share of its spare there.",
        ),
        model_revision: str = typer.Option("default", help="Model revision the engine serves."),
        worker_id: str = typer.Option("", help="Worker id (default: host-pid)."),
        capacity_tokens_per_s: float = typer.Option(20_000.0, help="Engine prefill capacity."),
        concurrency: int = typer.Option(2, min=1, max=64, help="Replays in flight."),
        bus_secret: str = typer.Option(
            "",
            envvar="CONVPLANE_REPLAY_BUS_SECRET",
            help="The region's replay bus secret (64 hex: replay.bus_secrets[region] in the "
            "cluster file): jobs and results are signed and checked with it.",
        ),
        kafka_security_protocol: str = typer.Option(
            "PLAINTEXT", help="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."
        ),
        kafka_ssl_cafile: str = typer.Option("", help="CA bundle for the brokers' certificates."),
        kafka_ssl_certfile: str = typer.Option("", help="Client certificate (mutual TLS)."),
        kafka_ssl_keyfile: str = typer.Option("", help="Client certificate's key."),
        kafka_sasl_mechanism: str = typer.Option(
            "PLAIN", help="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."
        ),
        kafka_sasl_username: str = typer.Option("", help="SASL user."),
        kafka_sasl_password: str = typer.Option(
            "", envvar="CONVPLANE_KAFKA_SASL_PASSWORD", help="SASL password."
        ),
        cache_salt_key: str = typer.Option(
            "",
            envvar="CONVPLANE_CACHE_SALT_KEY",
            help="The cluster's cache-salt key (64 hex: replay.cache_salt_key in the cluster "
            "file); the salts must equal those /route hands the live path.",
        ),
        session_timeout_s: float = typer.Option(
            10.0,
            min=6.0,  # the broker's default group.min.session.timeout.ms
            max=300.0,
            help="A worker silent this long (crashed) loses its jobs to the rest of the group.",
        ),
    ) -> None:
        """Run one replay worker until SIGINT/SIGTERM. It joins the region's worker group only
        once its engine passes the self-check (--check runs just that)."""
        import os
        import re

        from replay.worker import WorkerConfig

        if check:
            priority = WorkerConfig().replay_priority
            raise typer.Exit(
                asyncio.run(
                    _check_engine(
                        engine_url, model_revision, priority, declare_priority_scheduling, as_json
                    )
                )
            )
        for name, value in (
            ("--bootstrap-servers", bootstrap_servers),
            ("--region-url", region_url),
            ("--api-key", api_key),
        ):
            if not value:
                raise typer.BadParameter("required (unless --check)", param_hint=name)
        if not re.fullmatch(r"[0-9a-f]{64}", bus_secret):
            raise typer.BadParameter("64 lowercase hex characters", param_hint="--bus-secret")
        if kafka_security_protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise typer.BadParameter("unknown protocol", param_hint="--kafka-security-protocol")
        if kafka_sasl_mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise typer.BadParameter("unknown mechanism", param_hint="--kafka-sasl-mechanism")
        from replay.bus.kafka import KafkaSecurity

        security = KafkaSecurity(
            protocol=kafka_security_protocol,  # type: ignore[arg-type]
            ssl_cafile=kafka_ssl_cafile or None,
            ssl_certfile=kafka_ssl_certfile or None,
            ssl_keyfile=kafka_ssl_keyfile or None,
            sasl_mechanism=kafka_sasl_mechanism,  # type: ignore[arg-type]
            sasl_username=kafka_sasl_username or None,
            sasl_password=kafka_sasl_password or None,
        )
        if not re.fullmatch(r"[0-9a-f]{64}", cache_salt_key):
            raise typer.BadParameter("64 lowercase hex characters", param_hint="--cache-salt-key")
        from services.bootstrap.worker import run_worker
        from services.tracing import install_from_env

        install_from_env(region)  # replay.job spans, when OTEL_TRACES_EXPORTER asks for them
        worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        counts = asyncio.run(
            run_worker(
                worker_id=worker_id,
                region=region,
                engine_url=engine_url,
                model_revision=model_revision,
                bootstrap_servers=bootstrap_servers,
                region_url=region_url,
                api_key=api_key,
                capacity_tokens_per_s=capacity_tokens_per_s,
                concurrency=concurrency,
                cache_salt_key=bytes.fromhex(cache_salt_key),
                bus_secret=bytes.fromhex(bus_secret),
                security=security,
                session_timeout_s=session_timeout_s,
                priority_declared=declare_priority_scheduling,
            )
        )
        typer.echo(f"worker {worker_id} stopped: {counts}")

    kafka = typer.Typer(help="A local Kafka broker (KRaft, one node) for development and tests.")

    @kafka.command("up")
    def kafka_up(
        state_dir: str = typer.Option(".state/kafka", help="Broker data and logs."),
        cache_dir: str = typer.Option(".cache/kafka", help="Where the jars are cached."),
        host: str = typer.Option(
            "127.0.0.1",
            help="An IPv4 address of this machine for other hosts: a SASL-over-TLS listener "
            "there, with a user, password and CA written to <state-dir>/client.json.",
        ),
    ) -> None:
        """Start a broker, print its bootstrap servers, and keep it up until Ctrl-C."""
        import secrets
        from pathlib import Path

        from services.cli.signals import stop_on_signals
        from services.local.host import HarnessError, local_address
        from services.local.kafka import BrokerSecurity, ensure_kafka_jars, start_broker
        from services.local.plane import write_private_json

        try:
            host = local_address(host)
            security = None
            if host != "127.0.0.1":
                security = BrokerSecurity({"convplane": secrets.token_urlsafe(24)}, tls=True)
            broker = start_broker(
                state_dir, lib_dir=ensure_kafka_jars(cache_dir), host=host, security=security
            )
        except HarnessError as exc:
            typer.echo(f"kafka not started: {exc}", err=True)
            raise typer.Exit(1) from None
        if security is None:
            typer.echo(broker.bootstrap_servers, err=False)
        else:
            assert broker.tls is not None
            client_file = Path(state_dir) / "client.json"
            write_private_json(client_file, {
                "bootstrap_servers": broker.sasl_ssl_bootstrap_servers,
                "security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                "sasl_username": "convplane", "sasl_password": security.sasl_users["convplane"],
                "ssl_cafile": str(broker.tls.ca_cert),
            })  # fmt: skip
            typer.echo(broker.sasl_ssl_bootstrap_servers, err=False)
            typer.echo(f"SASL over TLS: user, password and CA in {client_file}", err=True)
        typer.echo(
            f"kafka up in {broker.start_duration_s:.1f}s (pid {broker.pid}, log {broker.log_path})",
            err=True,
        )
        # SIGINT and SIGTERM both stop the broker in order: a supervisor's SIGTERM, and a
        # SIGINT that a shell running this in the background would have made ignored
        stop = stop_on_signals()
        try:
            while not stop.is_set() and broker.is_running():
                stop.wait(0.5)
        finally:
            typer.echo("stopping kafka", err=True)
            broker.stop()

    app.add_typer(kafka, name="kafka")
