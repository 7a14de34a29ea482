"""Node wiring that needs no I/O: the cluster file's rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from services.config import ClusterConfig, NodeSettings, load_cluster, write_cluster
from tests.unit.api_fakes import cluster_config


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


def test_a_peer_connection_cap_too_small_for_the_cluster_is_refused() -> None:
    """Each peer region's probes and forwards need a connection of their own at this node's
    peer listener; a cap below two per peer region would have them close each other's (at a cap
    of 1 in a 3-region plane, /route answered 503)."""
    cluster = cluster_config()  # east and west: one peer region each
    assert NodeSettings(region="west", cluster=cluster, peer_connections_max=2).load_cluster()
    with pytest.raises(ValueError, match="peer_connections_max 1 is below 2, two per peer"):
        NodeSettings(region="west", cluster=cluster, peer_connections_max=1).load_cluster()
    three = cluster.model_copy(
        update={"regions": [*cluster.regions, cluster.regions[0].model_copy(update={"name": "ap"})]}
    )
    with pytest.raises(ValueError, match="below 4"):
        NodeSettings(region="west", cluster=three, peer_connections_max=3).load_cluster()
