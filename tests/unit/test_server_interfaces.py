"""The product uses only the public interface of the HTTP server libraries it runs on.

A node's hot path once hung on a subclass of uvicorn's private ``HttpToolsProtocol``
(``uvicorn.protocols``); the node now runs its own server on public interfaces
(``services.listeners``). uvicorn's public interface is its top-level package (``uvicorn.run``,
``uvicorn.Config``, ``uvicorn.Server``), which the product's small side servers still use; any
import below it (``uvicorn.protocols``, ``uvicorn.server``, ``uvicorn._types``, ...) reaches into
its internals. import-linter sees external packages only as a whole (``pyproject.toml``'s
contract keeps uvicorn out of the node's server altogether), so this walks the source itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import eventlog
import regions
import replay
import services

PRODUCT_PACKAGES = (eventlog, regions, replay, services)
#: uvicorn's documented interface: the top-level package, nothing below it
PUBLIC_UVICORN = "uvicorn"


def imported_modules(source: str) -> list[str]:
    """Every module an ``import`` or ``from ... import`` of ``source`` names (absolute only)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.append(node.module)
    return names


def private_uvicorn_imports(source: str) -> list[str]:
    return [name for name in imported_modules(source) if name.startswith(PUBLIC_UVICORN + ".")]


def product_sources() -> list[Path]:
    files: list[Path] = []
    for package in PRODUCT_PACKAGES:
        assert package.__file__ is not None
        files += sorted(Path(package.__file__).parent.rglob("*.py"))
    return files


def test_no_product_module_imports_a_private_uvicorn_module() -> None:
    sources = product_sources()
    assert any(path.name == "listeners.py" for path in sources)  # the walk found the product
    offenders = {
        str(path): found
        for path in sources
        if (found := private_uvicorn_imports(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


@pytest.mark.parametrize(
    ("source", "private"),
    [
        ("from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol", True),
        ("import uvicorn.protocols.http.httptools_impl", True),
        ("from uvicorn.server import ServerState", True),
        ("def f():\n    from uvicorn._types import ASGIApp\n", True),
        ("import uvicorn", False),
        ("from uvicorn import Config, Server", False),
        ("from .uvicorn import x", False),  # a module of our own, relative
    ],
)
def test_the_walk_tells_private_from_public(source: str, private: bool) -> None:
    assert bool(private_uvicorn_imports(source)) is private
