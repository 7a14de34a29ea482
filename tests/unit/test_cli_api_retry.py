"""The drill CLI's REST client: a read that every region answers 503 (the control shard between
leaders) is asked again; a write's 503 is shown, never repeated (its outcome may be unknown)."""

from __future__ import annotations

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
