"""Fixtures of the lab tier: hosts on one machine (``tests.harness.lab``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.chaos.conftest import chaos_dir, fast_failover  # noqa: F401 - the chaos tier's
from tests.harness.lab import Lab


@pytest.fixture
def lab() -> Iterator[Lab]:
    """A started lab, removed after the test whatever happens in it."""
    with Lab() as started:
        yield started
