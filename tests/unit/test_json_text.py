"""An entry body's JSON text reads back as the value, whichever encoder wrote it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from eventlog.json_text import compact_json


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value",
    [
        {"content": "héllo \u2028 wörld 🙂", "n": 3, "f": 0.1, "ok": True, "none": None},
        {"big": 2**70, "negative": -(2**64)},  # past 64 bits: orjson refuses, json writes it
        {"deep": nested(300)},  # past orjson's 255 levels
        {"nul": "a\x00b", "floats": [1e16, 5e-324, -0.0]},
    ],
)
def test_the_text_reads_back_as_the_value(value: dict[str, Any]) -> None:
    text = compact_json(value)
    assert json.loads(text) == value
    assert ": " not in text and ", " not in text  # compact


def test_non_ascii_is_written_as_itself_by_both_encoders() -> None:
    assert compact_json({"s": "é"}) == '{"s":"é"}'
    assert compact_json({"s": "é", "n": 2**70}) == '{"s":"é","n":1180591620717411303424}'
