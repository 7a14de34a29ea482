"""The local broker's configuration on an address other than loopback
(``services.local.kafka.server_properties``): every listener, the advertised ones and the
controller quorum name that address, none names 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from services.local import kafka


def properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_every_listener_is_on_the_given_host(tmp_path: Path) -> None:
    extra = [f"SASL_SSL://10.213.4.1:{9400}"]
    settings = properties(
        kafka.server_properties(tmp_path, 9300, 9301, extra, {}, host="10.213.4.1")
    )
    assert settings["listeners"] == (
        "PLAINTEXT://10.213.4.1:9300,SASL_SSL://10.213.4.1:9400,CONTROLLER://10.213.4.1:9301"
    )
    assert settings["advertised.listeners"] == (
        "PLAINTEXT://10.213.4.1:9300,SASL_SSL://10.213.4.1:9400"
    )
    assert settings["controller.quorum.voters"] == "1@10.213.4.1:9301"
    assert not any("127.0.0.1" in value for value in settings.values())


def test_loopback_stays_the_default(tmp_path: Path) -> None:
    settings = properties(kafka.server_properties(tmp_path, 9300, 9301))
    assert settings["listeners"] == "PLAINTEXT://127.0.0.1:9300,CONTROLLER://127.0.0.1:9301"
