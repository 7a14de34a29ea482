"""docs/configuration.md is generated from the settings models; this fails when it is stale
(regenerate: ``convplane config-reference --write docs/configuration.md``)."""

from __future__ import annotations

from pathlib import Path

from services.config import NodeSettings
from services.config_reference import render

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_reference_is_current() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/configuration.md is stale: run `convplane config-reference --write "
        "docs/configuration.md`"
    )


def test_every_node_setting_is_listed_with_its_environment_variable() -> None:
    page = render()
    for name in NodeSettings.model_fields:
        assert f"| `{name}` | `CONVPLANE_{name.upper()}` |" in page, name
