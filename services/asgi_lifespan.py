"""The app's lifespan, run as the ASGI lifespan spec says (``lifespan.startup`` before the
listeners open, ``lifespan.shutdown`` after they closed): the node's own server
(``services.listeners``) has no framework to do it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.types import ASGIApp, Message

log = logging.getLogger("convplane.lifespan")


class LifespanFailed(Exception):
    """The app refused to start (``lifespan.startup.failed``) or failed while starting."""


class Lifespan:
    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        #: the app's lifespan state, copied into every request's scope
        self.state: dict[str, Any] = {}
        self._to_app: asyncio.Queue[Message] = asyncio.Queue(maxsize=1)
        self._from_app: asyncio.Queue[Message] = asyncio.Queue(maxsize=1)
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        self._task = asyncio.create_task(self._run(), name="lifespan")
        await self._to_app.put({"type": "lifespan.startup"})
        answer = await self._answer()
        if answer["type"] != "lifespan.startup.complete":
            raise LifespanFailed(answer.get("message") or "the app did not start")

    async def shutdown(self) -> None:
        if self._task is None or self._task.done():
            return
        await self._to_app.put({"type": "lifespan.shutdown"})
        answer = await self._answer()
        if answer["type"] != "lifespan.shutdown.complete":
            log.error("the app's shutdown failed: %s", answer.get("message", ""))
        await self._task

    async def _answer(self) -> Message:
        """The app's next message; a lifespan that ended without one failed."""
        assert self._task is not None
        answer = asyncio.ensure_future(self._from_app.get())
        await asyncio.wait([answer, self._task], return_when=asyncio.FIRST_COMPLETED)
        if answer.done():
            return answer.result()
        answer.cancel()
        return {"type": "lifespan.failed", "message": "the app's lifespan ended"}

    async def _run(self) -> None:
        scope = {
            "type": "lifespan",
            "asgi": {"version": "3.0", "spec_version": "2.0"},
            "state": self.state,
        }
        try:
            await self._app(scope, self._to_app.get, self._from_app.put)
        except Exception:
            log.exception("the app's lifespan failed")
