"""A request for a shard whose leader is being prepared on this very node (it has just taken a
dead sibling's slot, or it is starting) waits for that leader instead of answering 503
not_leader (``services.api.context.RequestContext.run``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from eventlog.clock import LoopClock
from eventlog.errors import NotLeader
from services.api.context import ApiState, RequestContext
from services.api.errors import ForwardFailed

DEADLINE_S = 10.0


class DeadSibling:
    """A forwarder whose hop to the sibling holding the shard's slot finds it dead."""

    async def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise ForwardFailed("leader region a unreachable")


def context(waits: list[float], led_after_wait: bool, *, led_only_after: int = 0) -> RequestContext:
    """A request context whose node leads the shard after waiting (``led_after_wait``) from
    its ``led_only_after``-th wait on; with ``led_only_after``, a sibling held the slot."""

    async def await_lead_here(shard: int, timeout_s: float) -> bool:
        waits.append(timeout_s)
        return led_after_wait and len(waits) > led_only_after

    clock = LoopClock()
    api = SimpleNamespace(
        region="a",
        clock=clock,
        settings=SimpleNamespace(retry_after_default_s=1.0),
        await_lead_here=await_lead_here,
        led_by_sibling=lambda shard: led_only_after > 0,
        forwarder=DeadSibling(),
    )
    deadline_s = clock.monotonic() + DEADLINE_S
    return RequestContext(cast(ApiState, api), cast(Any, None), cast(Any, None), deadline_s, False)


class Leader:
    """Not leading on the first call; leading (answers "ok") from the second."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls == 1:
            raise NotLeader("region a does not lead shard 3", shard=3)
        return "ok"


async def test_a_request_waits_for_a_leader_prepared_here_then_is_served() -> None:
    waits: list[float] = []
    call = Leader()
    assert await context(waits, led_after_wait=True).run(call, is_write=True) == "ok"
    assert call.calls == 2
    assert waits == [1.0]  # as long as a 503 would tell the client to wait, at most


async def test_without_a_leader_prepared_here_the_request_is_refused_at_once() -> None:
    waits: list[float] = []
    call = Leader()
    with pytest.raises(NotLeader) as refused:
        await context(waits, led_after_wait=False).run(call, is_write=True)
    assert call.calls == 1
    assert refused.value.retry_after_s == 1.0


async def test_a_shard_another_region_leads_is_not_waited_for() -> None:
    waits: list[float] = []

    async def elsewhere() -> str:
        raise NotLeader("region a does not lead shard 3", shard=3, leader_region="b")

    ctx = context(waits, led_after_wait=True)
    ctx.forwarded = True  # a forwarded request is not forwarded on to region b
    with pytest.raises(Exception, match="not forwarding twice"):
        await ctx.run(elsewhere, is_write=True)
    assert waits == []


async def test_a_request_sent_to_a_dead_sibling_waits_for_the_slot_taken_here_since() -> None:
    waits: list[float] = []
    call = Leader()
    ctx = context(waits, led_after_wait=True, led_only_after=1)
    assert await ctx.run(call, is_write=True) == "ok"
    assert call.calls == 2 and len(waits) == 2  # none at first; the hop failed; then led here


async def test_a_dead_siblings_slot_nobody_here_took_is_answered_forward_failed() -> None:
    waits: list[float] = []
    call = Leader()
    with pytest.raises(ForwardFailed):
        await context(waits, led_after_wait=False, led_only_after=1).run(call, is_write=True)
    assert call.calls == 1
