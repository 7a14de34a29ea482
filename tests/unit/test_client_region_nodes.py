"""The client and regions of several nodes (``convplane up --nodes-per-region``): a node that
does not answer passes its region's traffic to the region's next node before the client gives
the region up for another; ``cluster.json``'s further nodes reach the client."""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx

from convplane_client import Client, ClientConfig
from convplane_client._cluster_file import read_cluster_file
from convplane_client._routing import RoutingTable
from tests.unit.test_client_fake_plane import FakePlane, VirtualClock


def table() -> RoutingTable:
    return RoutingTable(
        {"eu": ["http://eu0/", "http://eu1"], "us": "http://us"},
        routes_max=10,
        region_unreachable_s=2.0,
    )


def test_a_silent_node_hands_its_region_to_the_next_node() -> None:
    routing = table()
    assert (routing.region_for(None, 0.0), routing.urls["eu"]) == ("eu", "http://eu0")
    routing.learn("c1", "eu")
    routing.unreachable("eu", "c1", 0.0)
    assert routing.urls["eu"] == "http://eu1"
    assert routing.region_for("c1", 0.0) == "eu"  # still the route: its other node answers
    routing.answered("eu")
    routing.unreachable("eu", "c1", 1.0)  # one failure since an answer: the next node again
    assert routing.urls["eu"] == "http://eu0" and routing.region_for("c1", 1.0) == "eu"


def test_a_region_whose_every_node_failed_in_a_row_is_passed_over() -> None:
    routing = table()
    routing.unreachable("eu", None, 0.0)
    routing.unreachable("eu", None, 0.0)
    assert routing.region_for(None, 0.0) == "us"
    assert routing.region_for(None, 2.0) == "eu"  # after region_unreachable_s


def test_a_region_of_one_url_is_passed_over_at_its_first_failure() -> None:
    routing = table()
    routing.learn("c2", "us")
    routing.unreachable("us", "c2", 0.0)
    assert routing.urls["us"] == "http://us"
    assert routing.region_for("c2", 0.0) == "eu"


def test_the_client_tries_the_region_s_next_node_before_another_region() -> None:
    plane = FakePlane(leader="us-east", down={"us-east"})  # the region's first node is dead
    regions = {name: [url, url.replace(".test", "-n1.test")] for name, url in plane.urls.items()}
    client = Client(
        regions,
        "key",
        config=ClientConfig(),
        http_client=httpx.Client(transport=httpx.MockTransport(plane.handle)),
        clock=VirtualClock(),
        rng=random.Random(7),
    )
    with client:
        created = client.create_conversation("c1")
        client.append("c1", "note", {"n": 1})
    assert created.leader_region == "us-east"
    assert [region for region, _ in plane.sent] == ["us-east", "us-east-n1", "us-east-n1"]


def test_the_cluster_file_gives_every_node_of_a_region(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    regions = [
        {"name": "eu-west", "url": "http://a:1", "more_nodes": [{"index": 1, "url": "http://b:2"}]},
        {"name": "us-east", "url": "http://c:3"},
    ]
    path.write_text(json.dumps({"api_key": "k", "regions": regions}))
    assert read_cluster_file(path) == (
        {"eu-west": ["http://a:1", "http://b:2"], "us-east": ["http://c:3"]},
        "k",
    )
