"""The OpenAPI document is the contract, checked against a real 3-region plane: a client
generated from it (openapi-python-client) creates a conversation, appends every event type,
pages the transcript and reads a tool attempt; schemathesis (every check, every phase, stateful
links from ``POST /v1/conversations`` into the conversation's operations) finds 0 failures with
each kind of key the plane has.

Declared choices (``CONFIG`` in ``tests/e2e/openapi_contract_run.py``): 503 and 504 are documented, retryable answers, so
``not_a_server_error`` accepts them and still fails on any 500; unknown headers are no error.
``CONVPLANE_SCHEMATHESIS_EXAMPLES`` raises the examples per operation (15: ~1,200 cases, under
a minute on 2 cores), ``CONVPLANE_SCHEMATHESIS_SEED`` changes the seed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.openapi_contract_run import assert_all_passed, run_schemathesis
from tests.e2e.plane import Plane, convplane_env, start_plane, stop_plane

RUN_TIMEOUT_S = 600
GENERATE_CLIENT = [
    sys.executable, "-c", "from openapi_python_client.cli import app; app()",
]  # fmt: skip


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    proc, plane = start_plane(tmp_path_factory.mktemp("plane"), "--sim-engines", "1")
    try:
        yield plane
    finally:
        output = stop_plane(proc)
        assert proc.returncode == 0, output


def test_a_client_generated_from_the_document_uses_the_api(plane: Plane, tmp_path: Path) -> None:
    document = tmp_path / "openapi.json"
    document.write_text(httpx.get(plane.urls["eu-west"] + "/openapi.json", timeout=20).text)
    env = {
        **convplane_env(),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    subprocess.run(
        [*GENERATE_CLIENT, "generate", "--path", str(document), "--meta", "none",
         "--output-path", str(tmp_path / "cpclient")],
        cwd=tmp_path, env=env, check=True, capture_output=True, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    sys.path.insert(0, str(tmp_path))
    try:
        _use_generated_client(plane.urls["eu-west"], plane.info["api_key"])
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "cpclient" or m.startswith("cpclient.")]:
            del sys.modules[name]


def _use_generated_client(url: str, key: str) -> None:
    from cpclient import AuthenticatedClient

    with AuthenticatedClient(base_url=url, token=key, raise_on_unexpected_status=True) as client:
        _create_append_page_read(client)


def _create_append_page_read(client: Any) -> None:
    from cpclient.api.chat_applications import (
        append_event,
        create_conversation,
        list_events,
        tool_attempt,
    )
    from cpclient.models import (
        AssistantMessageEvent,
        AssistantMessagePayload,
        ConversationCreated,
        CreateConversationRequest,
        EventAppended,
        EventPage,
        NoteEvent,
        PromptSettingsEvent,
        PromptSettingsPayload,
        SystemMessageEvent,
        SystemMessagePayload,
        ToolAttempt,
        ToolAttemptEvent,
        ToolAttemptPayload,
        ToolEffectEvent,
        ToolEffectPayload,
        ToolEffectPayloadStatus,
        ToolMessageEvent,
        ToolMessagePayload,
        UserMessageEvent,
        UserMessagePayload,
    )

    created = create_conversation.sync(
        client=client, body=CreateConversationRequest(model_revision="rev-generated")
    )
    assert isinstance(created, ConversationCreated), created
    cid = created.conversation_id
    weather_tool = {"type": "function", "function": {"name": "weather", "parameters": {}}}
    call = {"id": "call-1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    events = [
        SystemMessageEvent(
            type_="message.system", payload=SystemMessagePayload.from_dict({"content": "brief"})
        ),
        PromptSettingsEvent(
            type_="prompt.settings",
            payload=PromptSettingsPayload.from_dict({"tools": [weather_tool]}),
        ),
        UserMessageEvent(
            type_="message.user", payload=UserMessagePayload.from_dict({"content": "weather?"})
        ),
        AssistantMessageEvent(
            type_="message.assistant",
            payload=AssistantMessagePayload.from_dict({"tool_calls": [call]}),
            token_count=2,
        ),
        ToolAttemptEvent(
            type_="tool.attempt",
            payload=ToolAttemptPayload(attempt_id="att-1", tool="weather", argument_digest="9f"),
        ),
        ToolEffectEvent(
            type_="tool.effect",
            payload=ToolEffectPayload(attempt_id="att-1", status=ToolEffectPayloadStatus.COMMITTED),
        ),
        ToolMessageEvent(
            type_="message.tool",
            payload=ToolMessagePayload.from_dict({"tool_call_id": "call-1", "content": "sunny"}),
        ),
        NoteEvent.from_dict({"type": "note", "payload": {"text": "done"}}),
    ]
    for seq, event in enumerate(events, start=1):
        appended = append_event.sync(cid, client=client, body=event, idempotency_key=f"k-{seq}")
        assert isinstance(appended, EventAppended) and appended.seq == seq, appended
    pages: list[list[tuple[int, str]]] = []
    after_seq = 0
    while True:
        page = list_events.sync(cid, client=client, after_seq=after_seq, limit=4)
        assert isinstance(page, EventPage), page
        if not page.events:
            break
        pages.append([(e.seq, e.type_.value) for e in page.events])
        after_seq = page.next_after_seq
    assert pages == [
        [(1, "message.system"), (2, "prompt.settings"), (3, "message.user"),
         (4, "message.assistant")],
        [(5, "tool.attempt"), (6, "tool.effect"), (7, "message.tool"), (8, "note")],
    ]  # fmt: skip
    status = tool_attempt.sync(cid, "att-1", client=client)
    assert isinstance(status, ToolAttempt) and status.state.value == "committed", status
    assert [e.type_.value for e in status.events] == ["tool.attempt", "tool.effect"]


def test_schemathesis_finds_no_failure_with_a_tenant_key(plane: Plane, tmp_path: Path) -> None:
    # Operator moves have their own run, last (below): they change the placement under the
    # other operations, and one of them can hit a controller bug that this run should not hide.
    output = run_schemathesis(
        plane, plane.info["api_key"], tmp_path, "--exclude-operation-id", "region_action"
    )
    assert_all_passed(output, "Examples", "Coverage", "Fuzzing", "Stateful")
    links = re.search(r"API Links:\s+(\d+) covered", output)
    assert links is not None and int(links[1]) >= 5, output[-5000:]  # create -> its operations


def test_schemathesis_finds_no_failure_in_replays_with_an_operator_key(
    plane: Plane, tmp_path: Path
) -> None:
    """Queuing replays is an operator's act (a replay worker key may not: security issue 39)."""
    output = run_schemathesis(
        plane,
        plane.info["operator_api_key"],
        tmp_path,
        "--include-path-regex",
        "^/v1/replays",
        "--phases",
        "examples,coverage,fuzzing",
    )
    assert_all_passed(output, "Examples", "Coverage", "Fuzzing")


def test_schemathesis_finds_no_failure_in_operator_region_moves(
    plane: Plane, tmp_path: Path
) -> None:
    """Evacuate and restore with an operator key, with the real region names (links inferred
    from GET /v1/regions). When first written it failed about one run in three: a restore
    answered 500 (``InvariantViolation: placement version N follows N``): two placement records
    of one version had committed (a move cancelled mid-append by a short deadline, then the
    next one). Placement records are conditional now (issue 7, bug 1): the second is a no-op."""
    output = run_schemathesis(
        plane,
        plane.info["operator_api_key"],
        tmp_path,
        "--include-path-regex",
        "^/v1/(admin/regions|regions)",
    )
    assert_all_passed(output, "Examples", "Coverage", "Fuzzing", "Stateful")


def test_schemathesis_finds_no_failure_in_what_operators_read(plane: Plane, tmp_path: Path) -> None:
    """Drills, their reports, the halt switch, the audit log, readiness and the console's node
    view, read with an operator key (starting drills and halting are left to
    tests/e2e/test_drills.py: they change the plane under every other operation)."""
    output = run_schemathesis(
        plane,
        plane.info["operator_api_key"],
        tmp_path,
        *(
            arg
            for operation in (
                "list_drills",
                "get_drill",
                "drill_report",
                "get_halt",
                "audit",
                "console_node",
                "get_readiness",
            )
            for arg in ("--include-operation-id", operation)
        ),
        "--phases",
        "examples,coverage,fuzzing",
    )
    assert_all_passed(output, "Examples", "Coverage", "Fuzzing")


def test_schemathesis_finds_no_failure_with_a_viewer_key(plane: Plane, tmp_path: Path) -> None:
    """A viewer key on every operator-facing operation: it reads regions, placement, drills,
    reports, halt, audit, readiness and the console's node view, and every change it tries is a
    documented 403."""
    output = run_schemathesis(
        plane,
        plane.info["viewer_api_key"],
        tmp_path,
        "--include-path-regex",
        "^/v1/(regions|placement|drills|audit|admin|console|readiness)",
        "--phases",
        "examples,coverage,fuzzing",
    )
    assert_all_passed(output, "Examples", "Coverage", "Fuzzing")
