"""The region node's public REST API: ``create_app(settings)`` is the one public entry point.

It is imported on first use (module ``__getattr__``), so importing a submodule (the schemas, the
forwarder) does not build the whole app module, which imports ``services.bootstrap``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from services.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
