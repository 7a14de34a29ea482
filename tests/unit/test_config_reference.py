"""docs/configuration.md is generated from the settings models; this fails when it is stale
(regenerate: ``convplane config-reference --write docs/configuration.md``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from services.config import NodeSettings
from services.deploy.config_reference import render

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


def test_every_setting_says_what_it_does() -> None:
    from services.deploy.config_reference import _cluster_models, _field_comments

    models: list[type[BaseModel]] = [m for _, m in _cluster_models()] + [NodeSettings]
    for model in models:
        comments = _field_comments(model)
        for name, field in model.model_fields.items():
            assert field.description or comments.get(name), f"{model.__name__}.{name}"
