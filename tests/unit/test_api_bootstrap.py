"""Node wiring that needs no I/O: the cluster file's rules and leading shards with retries."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from eventlog.clock import Clock
from eventlog.errors import NoQuorum
from services.bootstrap import lead_shards, lead_with_retries
from services.config import ClusterConfig, NodeSettings, load_cluster, write_cluster
from tests.unit.test_api_fakes import cluster_config


class VirtualClock(Clock):
    def __init__(self) -> None:
        self.now_s = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now_s

    def wall_ms(self) -> int:
        return int(self.now_s * 1000)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now_s += seconds


class FlakyLeader:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.led: set[int] = set()
        self.calls = 0

    async def lead_shard(self, shard: int) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise NoQuorum("not yet")
        self.led.add(shard)
        return 7

    def leads(self, shard: int) -> bool:
        return shard in self.led


def settings(**limits: Any) -> NodeSettings:
    return NodeSettings(region="east", cluster=cluster_config(), **limits)


async def test_leading_retries_with_growing_capped_jittered_backoff() -> None:
    clock, node = VirtualClock(), FlakyLeader(failures=8)
    s = settings(lead_backoff_min_s=0.1, lead_backoff_max_s=1.0)
    epoch = await lead_with_retries(node, 3, settings=s, clock=clock, rng=random.Random(1))
    assert epoch == 7 and node.leads(3)
    assert len(clock.sleeps) == 8
    assert 0.05 <= clock.sleeps[0] <= 0.15  # 0.1 with +-50% jitter
    assert max(clock.sleeps) <= 1.5  # capped at 1.0 before jitter
    assert clock.sleeps[3] > clock.sleeps[0]


async def test_leading_gives_up_after_its_budget() -> None:
    clock, node = VirtualClock(), FlakyLeader(failures=100)
    s = settings(lead_attempts_max=5)
    assert await lead_with_retries(node, 1, settings=s, clock=clock, rng=random.Random(1)) is None
    assert node.calls == 5


async def test_lead_shards_leads_every_shard() -> None:
    node = FlakyLeader(failures=3)
    await lead_shards(node, [0, 2, 4], settings=settings(), clock=VirtualClock(),
                      rng=random.Random(2))  # fmt: skip
    assert node.led == {0, 2, 4}


def test_cluster_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    write_cluster(path, cluster_config())
    assert load_cluster(path) == cluster_config()
    loaded = NodeSettings(region="west", cluster_file=path).load_cluster()
    assert loaded.weights() == {"east": 1.0, "west": 1.0}


def test_cluster_file_rules() -> None:
    base = cluster_config().model_dump()
    with pytest.raises(ValidationError, match="unique"):
        ClusterConfig.model_validate({**base, "regions": base["regions"] * 2})
    with pytest.raises(ValidationError, match="write_quorum"):
        ClusterConfig.model_validate({**base, "write_quorum": 3})
    with pytest.raises(ValidationError):
        ClusterConfig.model_validate(
            {**base, "tenants": [{"tenant_id": "x", "api_key_sha256": "no"}]}
        )
    with pytest.raises(ValueError, match="not in the cluster file"):
        NodeSettings(region="north", cluster=cluster_config()).load_cluster()
