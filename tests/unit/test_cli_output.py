"""The CLI's one error line and exit codes, its --json, and the human lines of status/regions."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from services.cli import drill as cli
from services.cli.main import build_app
from services.cli.output import EXIT_REFUSED, EXIT_UNAVAILABLE, fail_from_answer
from services.cli.status import status_lines

REGIONS = {
    "observer": "us-east",
    "regions": [
        {"name": "us-east", "url": "http://a", "status": "up", "capacity_weight": 1.0,
         "suspected_by": [], "evacuated": False, "shards_assigned": 3, "unhealthy_loops": []},
        {"name": "eu-west", "url": "http://b", "status": "down", "capacity_weight": 1.0,
         "suspected_by": ["us-east"], "evacuated": False, "shards_assigned": 0,
         "unhealthy_loops": []},
    ],
}  # fmt: skip
PLACEMENT = {"version": 4, "reason": "eu-west down", "control_leader": "us-east",
             "down": ["eu-west"], "evacuated": [], "assignment": {}}  # fmt: skip


def test_a_refusal_is_one_line_with_code_message_and_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    body = json.dumps({"error": {"code": "forbidden", "message": "needs operator", "retryable": 0}})
    exit_ = fail_from_answer("POST /v1/drills", 403, body)
    assert exit_.exit_code == EXIT_REFUSED
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: forbidden: POST /v1/drills: needs operator (HTTP 403)")
    assert "(hint: " in line


def test_a_server_error_without_a_json_body_is_unavailable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert fail_from_answer("GET /v1/regions", 502, "bad gateway").exit_code == EXIT_UNAVAILABLE
    assert capsys.readouterr().err.startswith("error: http_502: GET /v1/regions: bad gateway")


def test_status_lines_name_what_is_wrong() -> None:
    lines = status_lines({"regions": REGIONS, "placement": PLACEMENT,
                          "halt": {"on": True, "reason": "incident 7"}, "drills": []})  # fmt: skip
    text = "\n".join(lines)
    assert "eu-west" in text and "suspected by us-east" in text
    assert "control shard led by us-east" in text and "down: eu-west" in text
    assert "halt on: incident 7" in text


def test_a_missing_local_plane_is_a_usage_error(tmp_path: object) -> None:
    result = CliRunner().invoke(build_app(), ["status", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "error: no_plane:" in result.output


def test_version() -> None:
    result = CliRunner().invoke(build_app(), ["--version"])
    assert result.exit_code == 0 and result.output.startswith("convplane ")


def test_every_reading_command_takes_json() -> None:
    app = build_app()
    for args in (["status"], ["regions"], ["drill", "plan"], ["drill", "status"],
                 ["drill", "list"], ["drill", "report"], ["halt", "on"], ["halt", "off"],
                 ["halt", "show"]):  # fmt: skip
        result = CliRunner().invoke(app, [*args, "--help"])
        assert result.exit_code == 0 and "--json" in result.output, args


def test_api_for_refuses_a_url_without_a_key() -> None:
    with pytest.raises(typer.Exit) as raised:
        cli.api_for(cli.DEFAULT_STATE_DIR, "http://remote.test", None)
    assert raised.value.exit_code == 2
