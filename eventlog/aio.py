"""Deadlines that do not wait for the loser.

``asyncio.wait_for`` cancels the awaited call on timeout and then *waits until the cancellation
has finished*. A database driver cancelling a statement on a black-holed link (a partition) may
take its own connect timeout to do that, so one unreachable replica would stall the caller far
past its deadline. ``bounded`` returns at the deadline and leaves the straggler to finish its
cancellation in the background (its outcome is consumed, never raised). Every call here is
idempotent at the replica, so an abandoned call that still lands is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


def consume(task: asyncio.Future[Any]) -> None:
    """A done callback that retrieves ``task``'s error, so that a task nobody awaits any more
    is never reported as an error never retrieved."""
    if not task.cancelled():
        task.exception()


def abandon(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` without waiting for it; its result or error is dropped."""
    task.cancel()
    task.add_done_callback(consume)


async def bounded(call: Awaitable[T], timeout_s: float) -> T:
    """``call``'s result, or TimeoutError after ``timeout_s`` (the call is abandoned).

    What ``asyncio.wait({task}, timeout=...)`` does, without its checks on every call (whether
    the task is a coroutine: an ABC ``isinstance`` miss each time, ~6 % of a leader's CPU under
    ``bench/append.py``, which calls this once per replica call)."""
    task = asyncio.ensure_future(call)
    loop = asyncio.get_running_loop()
    woken = loop.create_future()

    def wake(_: object = None) -> None:
        if not woken.done():
            woken.set_result(None)

    timer = loop.call_later(max(timeout_s, 0.0), wake)
    task.add_done_callback(wake)
    try:
        await woken
    except asyncio.CancelledError:
        abandon(task)
        raise
    finally:
        timer.cancel()
        task.remove_done_callback(wake)
    if not task.done():
        abandon(task)
        raise TimeoutError(f"no answer within {timeout_s:.3f}s")
    return task.result()


async def cancel_quietly(task: asyncio.Task[Any]) -> None:
    """Cancel a task and wait for it (a crashed worker, in tests and the CLI)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
