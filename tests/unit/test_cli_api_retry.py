"""The drill CLI's REST client: a read that every region answers 503 (the control shard between
leaders) is asked again; a write's 503 is shown, never repeated (its outcome may be unknown)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import typer

from services.cli import drill as cli

URLS = ["http://a.test", "http://b.test"]


def api(answers: list[int]) -> tuple[cli.Api, list[str]]:
    asked: list[str] = []

    def reply(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.method} {request.url.host}")
        status = answers.pop(0) if answers else 200
        return httpx.Response(status, headers={"retry-after": "0"}, json={"status": status})

    client = cli.Api(URLS, "key")
    client._client = httpx.Client(transport=httpx.MockTransport(reply))
    return client, asked


def test_a_read_every_region_refuses_with_503_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli, "POLL_S", 0.0)
    client, asked = api([503, 503, 503, 200])
    assert client.call("GET", "/v1/drills/d1") == {"status": 200}
    assert asked == ["GET a.test", "GET b.test", "GET a.test", "GET b.test"]


def test_a_write_answered_503_is_not_repeated() -> None:
    client, asked = api([503, 503])
    with pytest.raises(typer.Exit):
        client.call("POST", "/v1/drills", {"kind": "region-loss"})
    assert asked == ["POST a.test"]


def test_url_never_falls_back_to_the_local_planes_regions_or_key(tmp_path: Path) -> None:
    """A drill meant for the plane at --url must not go to the local plane's regions (nor carry
    its operator key there) when that URL does not answer."""
    (tmp_path / "cluster.json").write_text(
        json.dumps({"regions": [{"url": "http://local.test"}], "operator_api_key": "local"})
    )
    client = cli.api_for(tmp_path, "http://remote.test", "remote-key")
    assert client._urls == ["http://remote.test"]
    with pytest.raises(typer.Exit):
        cli.api_for(tmp_path, "http://remote.test", None)


def test_without_url_the_local_plane_answers(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(
        json.dumps({"regions": [{"url": "http://local.test"}], "operator_api_key": "local"})
    )
    assert cli.api_for(tmp_path, None, None)._urls == ["http://local.test"]
    with pytest.raises(typer.Exit):
        cli.api_for(tmp_path / "absent", None, None)
