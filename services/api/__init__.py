"""The region node's public REST API: ``create_app(settings)`` is the one public entry point."""

from services.api.app import create_app

__all__ = ["create_app"]
