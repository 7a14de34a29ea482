"""Signal handling shared by the long-running commands (``up``, ``kafka up``)."""

from __future__ import annotations

import signal
import threading


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM (handlers installed even where the shell that started
    this process made SIGINT ignored)."""
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop
