"""The plane's live load as a drill measures it: acknowledged appends at the leaders, and how
the live appends ended at their entry nodes, summed over every region that answers."""

from __future__ import annotations

import httpx

from services.control.drills.load import LOAD_PATH, LoadMeter, plane_load
from services.control.region_nodes import fixed_peer_urls
from tests.unit.clocks import ManualClock


async def test_live_outcomes_are_summed_over_the_regions_that_answer() -> None:
    def peer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == LOAD_PATH
        if request.url.host == "west":
            return httpx.Response(200, json={"append_rate_per_s": 5.0, "live_succeeded_per_s": 10.0,
                                             "live_errors_per_s": 0.0, "replay": None})  # fmt: skip
        raise httpx.ConnectError("down", request=request)

    own = LoadMeter(ManualClock())
    assert own.entry_rates() == (0.0, 0.0)  # before the API's lifespan attaches its outcomes
    own.entry_outcomes = lambda: (8.0, 2.0)
    async with httpx.AsyncClient(transport=httpx.MockTransport(peer)) as client:
        load = await plane_load(
            client,
            fixed_peer_urls({r: f"http://{r}" for r in ("east", "west", "south")}),
            ["east", "west", "south"],
            "east",
            {},
            own,
            None,
        )
    assert (load.live_succeeded_per_s, load.live_errors_per_s) == (18.0, 2.0)
    assert load.live_error_ratio() == 0.1
    assert load.append_rate_per_s == 5.0  # east's own meter saw no acknowledged append


async def test_no_ended_append_is_no_ratio() -> None:
    own = LoadMeter(ManualClock())
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(503))) as c:
        urls = fixed_peer_urls({"east": "http://east", "west": "http://west"})
        load = await plane_load(c, urls, ["east", "west"], "east", {}, own, None)
    assert load.live_error_ratio() is None
