"""Hooks for the e2e tier: a test's outcome is kept on its item, so a fixture's teardown can
tell whether the test failed (and, e.g., print the plane's logs for its report)."""

from __future__ import annotations

from collections.abc import Generator

import pytest

CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
