"""The local broker's cluster id (services.local.kafka.random_cluster_id): Kafka's storage tool
reads an id that starts with "-" as an option and refuses to format, which failed one broker
start in 64 (a clean-clone CI run hit it)."""

from __future__ import annotations

import uuid

import pytest

from services.local import kafka


def test_an_id_that_would_start_with_a_dash_is_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=bytes(16))])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))
    assert kafka.random_cluster_id() == "A" * 22


def test_ids_are_22_url_safe_characters() -> None:
    for _ in range(200):
        cluster_id = kafka.random_cluster_id()
        assert len(cluster_id) == 22 and not cluster_id.startswith("-")
