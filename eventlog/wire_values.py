"""What a value from a client must be before it may enter the log. Pure.

Everything a client sends ends up as JSON text in a replica's ``body`` column and, for a few
fields (ids, keys, ``attempt_id``), in indexed text columns of every replica store. A value that
one store cannot hold fails that store's whole group commit; a value that the stores hold but
cannot hand back (a lone surrogate is stored as a ``\\ud800`` escape and read back as a ``str``
that no encoder accepts) makes every later read of the conversation fail. So the log admits only
what every store and every reader round-trips exactly:

* strings of Unicode scalar values: no lone surrogates (U+D800..U+DFFF), anywhere, keys included;
* no NUL (U+0000) in a string that becomes a column of its own (PostgreSQL ``text`` cannot hold
  it; inside the JSON body it is an escape and harmless);
* finite numbers: ``1e400`` parses as ``inf`` and would be stored as ``Infinity`` (not JSON) or
  read back as ``null``;
* JSON types only (dict with string keys, list, str, int, float, bool, None).

``check_value`` walks iteratively, so a deep value cannot exhaust the stack; the API bounds depth
and size before this runs.
"""

from __future__ import annotations

import math
import re
from typing import Any

from eventlog.errors import InvalidRequest

_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(text: str, where: str, *, column: bool = False) -> None:
    """A string the log may store: scalar values only; no NUL when it becomes a column."""
    if _SURROGATE.search(text):
        raise InvalidRequest(f"{where}: a lone surrogate is not a Unicode character")
    if column and "\x00" in text:
        raise InvalidRequest(f"{where}: NUL characters are not allowed")


def check_value(value: Any, where: str) -> None:
    """A JSON value the log may store (see the module docstring)."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            check_text(node, path)
        elif isinstance(node, bool) or node is None or isinstance(node, int):
            continue
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise InvalidRequest(f"{path}: numbers must be finite")
        elif isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise InvalidRequest(f"{path}: object keys must be strings")
                check_text(key, f"{path} (a key)")
                stack.append((child, f"{path}.{key}"))
        elif isinstance(node, list | tuple):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node))
        else:
            raise InvalidRequest(f"{path}: {type(node).__name__} is not a JSON value")
