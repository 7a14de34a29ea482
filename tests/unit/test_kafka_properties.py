"""The local broker's configuration (``services.local.kafka.server_properties``): whatever
address its SASL-over-TLS listener takes, its PLAINTEXT listener and its controller stay on
loopback, so nothing unauthenticated listens where other hosts reach."""

from __future__ import annotations

from pathlib import Path

from services.local import kafka


def properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_only_the_given_listeners_leave_loopback(tmp_path: Path) -> None:
    extra = ["SASL_PLAINTEXT://127.0.0.1:9402", "SASL_SSL://10.213.4.1:9400"]
    settings = properties(kafka.server_properties(tmp_path, 9300, 9301, extra, {}))
    assert settings["listeners"] == (
        "PLAINTEXT://127.0.0.1:9300,SASL_PLAINTEXT://127.0.0.1:9402,"
        "SASL_SSL://10.213.4.1:9400,CONTROLLER://127.0.0.1:9301"
    )
    assert settings["advertised.listeners"] == (
        "PLAINTEXT://127.0.0.1:9300,SASL_PLAINTEXT://127.0.0.1:9402,SASL_SSL://10.213.4.1:9400"
    )
    assert settings["controller.quorum.voters"] == "1@127.0.0.1:9301"
