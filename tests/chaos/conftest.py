"""Fixtures of the chaos tier."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.chaos import FAST_ENV


@pytest.fixture
def chaos_dir() -> Iterator[Path]:
    """A state dir the postgres user can traverse (pytest's tmp dirs are 0700)."""
    base = tempfile.mkdtemp(prefix="convplane-chaos-")
    os.chmod(base, 0o711)
    try:
        yield Path(base)
    finally:
        if not os.environ.get("CONVPLANE_CHAOS_KEEP"):
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def fast_failover(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node of a chaos plane detects, fails over and fails back fast (``FAST_ENV``)."""
    for name, value in FAST_ENV.items():
        monkeypatch.setenv(name, value)
