"""The configuration reference (``docs/configuration.md``), generated from the models themselves.

Every setting a user can give is a field of a pydantic model: the cluster file
(``ClusterConfig`` and the models inside it) and a node's own settings (``NodeSettings``, also
from ``CONVPLANE_*`` environment variables). Each field's text is its ``description`` or, as
this codebase writes them, the ``#:`` comment lines just above it. ``convplane config-reference
--write docs/configuration.md`` regenerates the page; ``tests/unit/test_config_reference.py``
fails when the page is stale, so the reference cannot drift from the code.
"""

from __future__ import annotations

import inspect
import re
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from services.config import ClusterConfig, NodeSettings

HEADER = """# Configuration reference

Generated from the code by `convplane config-reference --write docs/configuration.md`; a test
fails when this page is stale. Two sources:

- **The cluster file** (JSON, `ClusterConfig`): shared by every node of a plane; `convplane up`
  writes one (`.state/plane/cluster-config.json`).
- **A node's own settings** (`NodeSettings`): command-line options of `convplane node`, or
  `CONVPLANE_<NAME>` environment variables.
"""


def render() -> str:
    sections = [HEADER]
    for title, model in _cluster_models():
        sections.append(_section(title, model, env_prefix=None))
    sections.append(_section("Node settings (`NodeSettings`)", NodeSettings, "CONVPLANE_"))
    return "\n".join(sections).rstrip() + "\n"


def _cluster_models() -> list[tuple[str, type[BaseModel]]]:
    """The cluster file's model and every model nested in it, in the order first met."""
    found: list[tuple[str, type[BaseModel]]] = []
    pending: list[tuple[str, type[BaseModel]]] = [("the cluster file", ClusterConfig)]
    while pending:
        where, model = pending.pop(0)
        if any(m is model for _, m in found):
            continue
        found.append((f"`{model.__name__}`: {where}", model))
        for name, field in model.model_fields.items():
            for nested in _nested_models(field.annotation):
                pending.append((f"`{model.__name__}.{name}`", nested))
    return found


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _nested_models(arg)]


def _section(title: str, model: type[BaseModel], env_prefix: str | None) -> str:
    comments = _field_comments(model)
    head = (
        "| setting | environment | type | default | what |"
        if env_prefix
        else ("| key | type | default | what |")
    )
    rule = "|---|---|---|---|---|" if env_prefix else "|---|---|---|---|"
    rows = [f"## {title}", "", head, rule]
    for name, field in model.model_fields.items():
        text = field.description or comments.get(name, "")
        cells = [f"`{name}`", _type(field.annotation), _default(field), _cell(text)]
        if env_prefix:
            cells.insert(1, f"`{env_prefix}{name.upper()}`")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _field_comments(model: type[BaseModel]) -> dict[str, str]:
    """Each field's ``#:`` comment block. A field without one takes the nearest block above it
    that names it (one block often describes a group: ``admission_limit_initial ... ``)."""
    comments: dict[str, str] = {}
    blocks: list[str] = []
    block: list[str] = []
    for line in inspect.getsource(model).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            block.append(stripped[2:].strip())
            continue
        match = re.match(r"(\w+)\s*:", stripped)
        if match and match.group(1) in model.model_fields:
            name = match.group(1)
            if block:
                blocks.append(" ".join(block))
                comments[name] = blocks[-1]
            else:
                naming = [b for b in blocks if re.search(rf"\b{name}\b", b)]
                comments[name] = naming[-1] if naming else ""
        block = []
    return comments


def _type(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation)
    text = re.sub(r"typing\.|pathlib\.|services\.[\w.]+\.|Annotated\[(\w+), [^\]]*\]", r"\1", text)
    return f"`{text.replace('|', 'or')}`"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "its defaults (below)"
        return f"`{value!r}`"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{field.default!r}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
