"""A fake plane behind ``httpx.MockTransport`` for the client's unit tests, and tests that hold
it to the server's rules it imitates (idempotent appends, one effect per tool attempt).

Every region answers every request (as the real plane's forwarding does) and marks the answer
with the leader's name in ``X-Convplane-Served-By``. Faults are queued per request: a fault may
answer in the plane's place, raise a transport error before the request is applied, or let the
request apply and then lose its answer (``lose_answer``): the outcome-unknown case.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from convplane_client import Client, ClientConfig

REGIONS = ("us-east", "eu-west", "ap-south")
TIME = "2026-01-01T00:00:00.000Z"

#: a fault sees the request and the region it reached; it answers, raises, or returns None to
#: let the plane serve it
Fault = Callable[[httpx.Request, str], "httpx.Response | None"]


class VirtualClock:
    """The client's clock on virtual time: sleeping moves it (sync and async alike)."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now_s += seconds

    async def sleep_async(self, seconds: float) -> None:
        self.sleep(seconds)


def error(status: int, code: str, retryable: bool, **headers: str) -> httpx.Response:
    body = {"error": {"code": code, "message": f"{code} (fake)", "retryable": retryable}}
    return httpx.Response(status, json=body, headers=headers)


@dataclass
class FakePlane:
    leader: str = "us-east"
    down: set[str] = field(default_factory=set)
    faults: list[Fault] = field(default_factory=list)
    sent: list[tuple[str, httpx.Request]] = field(default_factory=list)
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    keys: dict[tuple[str, str], tuple[str, dict[str, Any]]] = field(default_factory=dict)
    attempts: dict[tuple[str, str], dict[str, dict[str, Any] | None]] = field(default_factory=dict)

    @property
    def urls(self) -> dict[str, str]:
        return {name: f"http://{name}.test" for name in REGIONS}

    def client(self, clock: VirtualClock, **config: Any) -> Client:
        return Client(
            self.urls,
            "key",
            config=ClientConfig(**config),
            http_client=httpx.Client(transport=httpx.MockTransport(self.handle)),
            clock=clock,
            rng=random.Random(7),
        )

    def lose_answer(self, exc: type[httpx.TransportError] = httpx.ReadTimeout) -> Fault:
        """Apply the request, then lose its answer."""

        def fault(request: httpx.Request, region: str) -> httpx.Response | None:
            self.serve(request)
            raise exc("answer lost", request=request)

        return fault

    def answer_after_applying(self, response: httpx.Response) -> Fault:
        """Apply the request, then answer ``response`` (503 outcome_unknown after a commit)."""

        def fault(request: httpx.Request, region: str) -> httpx.Response | None:
            self.serve(request)
            return response

        return fault

    def handle(self, request: httpx.Request) -> httpx.Response:
        region = request.url.host.split(".")[0]
        self.sent.append((region, request))
        if region in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.faults:
            answer = self.faults.pop(0)(request, region)
            if answer is not None:
                return answer
        return self.serve(request)

    def paths(self) -> list[tuple[str, str]]:
        return [(region, f"{r.method} {r.url.path}") for region, r in self.sent]

    # --- the plane's rules ----------------------------------------------------------------------

    def serve(self, request: httpx.Request) -> httpx.Response:
        parts = request.url.path.strip("/").split("/")[2:]  # after /v1/conversations
        headers = {"X-Convplane-Served-By": self.leader}
        if not parts:
            body = json.loads(request.content)
            cid = body["conversation_id"]
            self.events.setdefault(cid, [])
            created = {"conversation_id": cid, "leader_region": self.leader,
                       "home_region": self.leader, "model_revision": "m@1", "created_at": TIME}  # fmt: skip
            return httpx.Response(201, json=created, headers=headers)
        cid = parts[0]
        if cid not in self.events:
            return error(404, "not_found", False)
        rest = parts[1:]
        if rest == ["events"] and request.method == "POST":
            return self._append(cid, request, headers)
        if rest == ["events"]:
            after, limit = (int(request.url.params[k]) for k in ("after_seq", "limit"))
            page = [e for e in self.events[cid] if e["seq"] > after][:limit]
            nxt = page[-1]["seq"] if page else after
            return httpx.Response(
                200, json={"events": page, "next_after_seq": nxt}, headers=headers
            )
        if rest == ["route"]:
            route = {"conversation_id": cid, "region": self.leader, "shard": 1, "epoch": 1,
                     "placement_version": 1, "worker": None}  # fmt: skip
            return httpx.Response(200, json=route, headers=headers)
        if rest[:1] == ["tool-attempts"]:
            found = self.attempts.get((cid, rest[1]))
            if found is None:
                return error(404, "not_found", False)
            effect = found["effect"]
            state = "pending" if effect is None else effect["payload"]["status"]
            recorded = [e for e in (found["attempt"], effect) if e is not None]
            body = {"attempt_id": rest[1], "state": state, "events": recorded}
            return httpx.Response(200, json=body, headers=headers)
        conversation = {"conversation_id": cid, "last_seq": len(self.events[cid]),
                        "leader_region": self.leader, "home_region": self.leader, "epoch": 1,
                        "model_revision": "m@1", "metadata": {}, "created_at": TIME}  # fmt: skip
        return httpx.Response(200, json=conversation, headers=headers)

    def _append(self, cid: str, request: httpx.Request, headers: dict[str, str]) -> httpx.Response:
        body = json.loads(request.content)
        fingerprint = json.dumps(body, sort_keys=True)
        key = request.headers.get("Idempotency-Key")
        earlier = self._earlier(cid, key, body, fingerprint)
        if isinstance(earlier, httpx.Response):
            return earlier
        if earlier is not None:
            return httpx.Response(
                200, json=_result(earlier), headers={**headers, "Idempotent-Replayed": "true"}
            )
        expected = body.get("expected_seq")
        if expected is not None and expected != len(self.events[cid]):
            return error(409, "seq_conflict", False)
        seq = len(self.events[cid]) + 1
        event = {"event_id": f"e-{cid}-{seq}", "seq": seq, "type": body["type"],
                 "payload": body["payload"], "token_count": 0, "created_at": TIME,
                 "fingerprint": fingerprint}  # fmt: skip
        self.events[cid].append(event)
        if key is not None:
            self.keys[(cid, key)] = (fingerprint, event)
        attempt_id = body["payload"].get("attempt_id")
        if body["type"] == "tool.attempt":
            self.attempts[(cid, attempt_id)] = {"attempt": event, "effect": None}
        elif body["type"] == "tool.effect":
            self.attempts[(cid, attempt_id)]["effect"] = event
        return httpx.Response(201, json=_result(event), headers=headers)

    def _earlier(
        self, cid: str, key: str | None, body: dict[str, Any], fingerprint: str
    ) -> dict[str, Any] | httpx.Response | None:
        """``existing_result`` of ``eventlog.conversation_state``: the earlier identical
        entry, a conflict, or None for a new request."""
        if key is not None and (cid, key) in self.keys:
            first, event = self.keys[(cid, key)]
            return event if first == fingerprint else error(409, "idempotency_key_reused", False)
        if not body["type"].startswith("tool."):
            return None
        found = self.attempts.get((cid, body["payload"]["attempt_id"]))
        if body["type"] == "tool.attempt":
            if found is None:
                return None
            attempt = found["attempt"]
            assert attempt is not None
            return (
                attempt if attempt["fingerprint"] == fingerprint else error(409, "conflict", False)
            )
        if found is None:
            return error(409, "unknown_attempt", False)
        effect = found["effect"]
        if effect is None:
            return None
        return (
            effect if effect["fingerprint"] == fingerprint else error(409, "effect_conflict", False)
        )


def _result(event: dict[str, Any]) -> dict[str, Any]:
    return {"event_id": event["event_id"], "seq": event["seq"],
            "acked_by": ["us-east", "eu-west"], "committed_at": TIME}  # fmt: skip


# --- the fake holds to the plane's rules --------------------------------------------------------


def test_fake_replays_a_keyed_append_and_refuses_a_reused_key() -> None:
    plane = FakePlane()
    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        first = client.append("c1", "note", {"n": 1}, idempotency_key="k")
        again = client.append("c1", "note", {"n": 1}, idempotency_key="k")
        assert (first.seq, first.replayed, again.seq, again.replayed) == (1, False, 1, True)
        assert [e["seq"] for e in plane.events["c1"]] == [1]
        other = plane.serve(
            httpx.Request(
                "POST",
                "http://us-east.test/v1/conversations/c1/events",
                json={"type": "note", "payload": {"n": 2}},
                headers={"Idempotency-Key": "k"},
            )
        )
        assert (
            other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
        )


def test_fake_keeps_one_effect_per_attempt() -> None:
    plane = FakePlane()
    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        client.record_tool_attempt("c1", "a1", "t", "d")
        assert client.record_tool_attempt("c1", "a1", "t", "d").replayed
        client.commit_tool_effect("c1", "a1", result=1)
        assert client.commit_tool_effect("c1", "a1", result=1).replayed
        assert client.tool_attempt("c1", "a1").state == "committed"
    assert [e["type"] for e in plane.events["c1"]] == ["tool.attempt", "tool.effect"]
