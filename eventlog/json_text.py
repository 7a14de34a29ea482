"""Compact JSON text of an entry's body, written on every append.

orjson (C) encodes what it can, several times faster than ``json``: the encoding was ~4 % of a
leader's CPU per append (py-spy, ``bench/append.py``). It refuses integers past 64 bits and
values nested past 255 levels, which the log admits (``eventlog.wire_values``); those go through
``json``. Both write non-ASCII characters as themselves (UTF-8 in the stores), so the text of a
body does not depend on which encoder wrote it, except for how a float is spelled (both spell
the shortest text that reads back as the same float). Readers parse it with ``json.loads``.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def compact_json(value: Any) -> str:
    """``value`` (already checked by ``wire_values.check_value``) as compact JSON text."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
