"""The OpenAPI document says what the server does: built in-process over the fake log."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from eventlog.errors import ConvplaneError
from eventlog.model import EVENT_TYPES
from services.api.errors import ERROR_CODES
from tests.unit.api_fakes import (
    KEY_A,
    conversation_led_by,
    lone_node_client,
)

AUTH = {"Authorization": f"Bearer {KEY_A}"}
API_FACING_MODULES = ("eventlog.", "services.api.", "services.control.drills.driver")
MIDDLEWARE_CODES = {"invalid_request", "payload_too_large", "unsupported_media_type"}


@pytest.fixture
async def east() -> AsyncIterator[httpx.AsyncClient]:
    async with lone_node_client() as client:
        yield client


def _subclasses(cls: type[ConvplaneError]) -> set[type[ConvplaneError]]:
    found = set(cls.__subclasses__())
    return found.union(*(_subclasses(c) for c in found)) if found else found


def test_every_error_code_is_in_the_table() -> None:
    # errors a client can see: the log's and the API's (replay's own stay inside the worker)
    classes = {
        c for c in _subclasses(ConvplaneError) if c.__module__.startswith(API_FACING_MODULES)
    }
    assert {c.code for c in classes} | MIDDLEWARE_CODES <= set(ERROR_CODES)
    for cls in classes:
        assert ERROR_CODES[cls.code][0] == cls.http_status, cls


async def test_document_has_no_422_and_every_v1_operation_its_shared_errors(
    east: httpx.AsyncClient,
) -> None:
    doc = (await east.get("/openapi.json")).json()
    assert '"422"' not in json.dumps(doc) and "HTTPValidationError" not in json.dumps(doc)
    assert "## Error codes" in doc["info"]["description"]
    assert set(doc["components"]["securitySchemes"]) == {"apiKey"}
    # the client listener serves this document and answers /peer 404: none is listed
    assert not [path for path in doc["paths"] if path.startswith("/peer/")]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            responses = op["responses"]
            if path.startswith("/v1/"):
                assert {"400", "401", "429", "503", "504"} <= set(responses), (method, path)
                assert op["security"] == [{"apiKey": []}]
                assert op["tags"] in (["chat applications"], ["operators"])
                body = responses["400"]["content"]["application/json"]["schema"]
                assert body == {"$ref": "#/components/schemas/ErrorBody"}
            for status in ("429", "503"):
                if status in responses:
                    assert responses[status]["headers"]["Retry-After"]["required"] is True
            assert op["description"], (method, path)


async def test_append_body_is_one_model_per_event_type(east: httpx.AsyncClient) -> None:
    doc = (await east.get("/openapi.json")).json()
    append = doc["paths"]["/v1/conversations/{conversation_id}/events"]["post"]
    schema = append["requestBody"]["content"]["application/json"]["schema"]
    assert set(schema["discriminator"]["mapping"]) == set(EVENT_TYPES)
    read_back = doc["components"]["schemas"]["Event"]["properties"]["type"]
    assert set(read_back["enum"]) == set(EVENT_TYPES)
    assert set(append["requestBody"]["content"]["application/json"]["examples"]) == set(EVENT_TYPES)
    attempt = doc["components"]["schemas"]["ToolAttemptPayload"]
    assert set(attempt["required"]) == {"attempt_id", "tool", "argument_digest"}
    links = doc["paths"]["/v1/conversations"]["post"]["responses"]["201"]["links"]
    assert {"append_event", "list_events", "get_conversation"} <= set(links)
    replay = doc["paths"]["/v1/replays"]["post"]["requestBody"]["content"]["application/json"]
    assert len(replay["schema"]["oneOf"]) == 2


async def _create(east: httpx.AsyncClient) -> str:
    cid = conversation_led_by("east")
    assert (
        await east.post("/v1/conversations", json={"conversation_id": cid}, headers=AUTH)
    ).status_code == 201
    return cid


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"type": "tool.attempt"}, 400),
        ({"type": "tool.attempt", "payload": {"attempt_id": "a", "tool": "t"}}, 400),
        ({"type": "tool.effect", "payload": {"attempt_id": "a", "status": "done"}}, 400),
        ({"type": "note", "extra": 1}, 400),
        ({"type": "note", "token_count": "5"}, 400),
        ({"type": "note", "token_count": True}, 400),
        ({"type": "note", "token_count": 5.0, "payload": {"any": ["thing"]}}, 201),
        ({"type": "message.user"}, 400),  # a message the engine could not be sent
        ({"type": "message.user", "payload": {"content": "hi"}}, 201),
    ],
)
async def test_server_refuses_exactly_what_the_schema_refuses(
    east: httpx.AsyncClient, body: dict[str, Any], status: int
) -> None:
    cid = await _create(east)
    r = await east.post(f"/v1/conversations/{cid}/events", json=body, headers=AUTH)
    assert r.status_code == status, r.text


async def test_405_names_every_method_of_the_path(east: httpx.AsyncClient) -> None:
    for method in ("OPTIONS", "DELETE", "PUT"):
        r = await east.request(method, "/v1/conversations/c1/events", headers=AUTH)
        assert (r.status_code, r.headers["allow"]) == (405, "GET, POST")
        assert r.json()["error"]["code"] == "method_not_allowed"
    r = await east.request("PATCH", "/v1/replays", headers=AUTH)
    assert (r.status_code, r.headers["allow"]) == (405, "GET, POST")


async def test_payload_is_stored_as_sent(east: httpx.AsyncClient) -> None:
    cid = await _create(east)
    payload = {"z": [1, {"b": 2, "a": 1}], "tool": "t", "argument_digest": "d", "attempt_id": "a"}
    body = {"type": "tool.attempt", "payload": payload}
    r = await east.post(f"/v1/conversations/{cid}/events", json=body, headers=AUTH)
    assert r.status_code == 201, r.text
    page = (await east.get(f"/v1/conversations/{cid}/events", headers=AUTH)).json()
    stored = page["events"][0]["payload"]
    assert json.dumps(stored) == json.dumps(payload)  # same fields, same order


async def test_the_drill_schema_tells_the_truth(east: httpx.AsyncClient) -> None:
    """Guards take only the values the drill core accepts, and a started drill's 201 (a dry
    run's 200) and an unknown region's 404 are documented: schemathesis with an operator key
    found both lies."""
    doc = (await east.get("/openapi.json")).json()
    create = doc["paths"]["/v1/drills"]["post"]
    assert {"200", "201", "404", "409"} <= set(create["responses"])
    guards = doc["components"]["schemas"]["DrillGuards"]
    assert guards["additionalProperties"] is False

    def bounds(name: str) -> dict[str, Any]:
        (number,) = [s for s in guards["properties"][name]["anyOf"] if s.get("type") == "number"]
        return {k: v for k, v in number.items() if k != "type"}

    assert bounds("max_rto_s") == {"exclusiveMinimum": 0.0, "maximum": 3600.0}
    assert bounds("max_error_ratio") == {"minimum": 0.0, "maximum": 1.0}
    assert bounds("max_ack_p99_ms") == {"exclusiveMinimum": 0.0, "maximum": 600000.0}


async def test_docs_load_nothing_from_elsewhere(east: httpx.AsyncClient) -> None:
    """/docs was blank without internet: Swagger UI came from a CDN. Its page now names only
    the node's own URLs, its assets answer from the node, and its CSP allows nothing else."""
    page = await east.get("/docs")
    assert page.status_code == 200
    assert "http://" not in page.text and "https://" not in page.text, page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        r = await east.get(f"/docs/static/{asset}")
        assert r.status_code == 200 and len(r.content) > 10_000, asset
    assert (await east.get("/redoc")).status_code == 404
