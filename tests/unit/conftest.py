"""The unit tier is pure: every async test runs on virtual time (``eventlog.sim.loop``), and a
test that reaches for a real socket or the system clock fails. What needs real I/O (a database
file, a listener, a subprocess) lives in tests/integration or above."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import pytest

from eventlog.clock import SystemClock
from eventlog.sim.loop import VirtualTimeLoop


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, Any]:
    return {"virtual_time": VirtualTimeLoop}


class _RealIoInUnitTier(AssertionError):
    """A unit test reached a real socket or the wall clock: it belongs to the integration tier."""


def _refuse(what: str) -> Any:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise _RealIoInUnitTier(f"tests/unit is pure: {what} (use virtual time and fakes)")

    return refuse


@pytest.fixture(autouse=True)
def _pure(monkeypatch: pytest.MonkeyPatch) -> None:
    """No real sockets and no system clock in the unit tier (the loop is virtual, see above)."""
    for name in ("bind", "connect", "connect_ex", "listen"):
        monkeypatch.setattr(socket.socket, name, _refuse(f"socket.{name}"))
    monkeypatch.setattr(SystemClock, "monotonic", _refuse("SystemClock.monotonic"))
    monkeypatch.setattr(SystemClock, "wall_ms", _refuse("SystemClock.wall_ms"))
    monkeypatch.setattr(SystemClock, "sleep", _refuse("SystemClock.sleep"))
