"""Clients that record a history for the linearizability checker.

Each client owns one conversation's share of the work and runs operations one at a time
(a client is sequential, as Porcupine's clients are), each sent to an entry region picked by
a seeded rng, so forwards, reads at a cut-off region and reads during failovers all occur:

- ``append``: a ``note`` whose payload carries the operation's key, sent with that key as its
  ``Idempotency-Key``, retried (the next region, jittered doubling backoff) after a timeout, a
  transport error, a 5xx or a 429 until one attempt is acknowledged: one operation from the
  first call to that answer (see ``_append_until_known``).
- ``read``: the whole transcript (one page; a conversation is kept under a page's size).
- ``last``: ``GET /v1/conversations/{id}``'s ``last_seq``.
- ``append`` of a ``tool.attempt`` (named ``att:<attempt>``, retried like a note); then any
  client of the conversation may race a ``tool.effect`` (``committed`` or ``failed``, no
  Idempotency-Key: an identical effect is its own retry) for an acknowledged attempt, retried
  until answered: its seq, or 409 ``effect_conflict`` (another effect won); and ``status``
  reads an acknowledged attempt's ``GET .../tool-attempts/{id}``.

In reads an event is named as the checker names it: a note by its key, a tool.attempt
``att:<attempt>``, a tool.effect ``eff:<attempt>:<status>``.

A failed read changes nothing and has no output, so it is left out of the history. Any other
4xx is a bug in the plane or in these clients, and fails the run.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from eventlog.http_headers import DEADLINE_HEADER, IDEMPOTENCY_KEY_HEADER

ATTEMPT_TIMEOUT_S = 2.0
PAUSE_S = 0.02
RETRY_BACKOFF_MIN_S = 0.05
RETRY_BACKOFF_MAX_S = 0.4
#: appends per conversation at most: one transcript page (1,000 events) must hold it all
APPENDS_PER_CONVERSATION_MAX = 900
PAGE_LIMIT = 1000
UNKNOWN_STATUSES = frozenset({429}) | frozenset(range(500, 600))
KINDS = ("append", "read", "last", "attempt", "effect", "status")
KIND_WEIGHTS = (5, 3, 2, 1, 2, 2)


class UnexpectedAnswer(AssertionError):
    """The plane answered a well-formed request with a client error."""


@dataclass
class HistoryRecorder:
    urls: Mapping[str, str]
    api_key: str
    seed: int
    conversations: dict[str, int] = field(default_factory=dict)  # id -> last_seq at creation
    operations: list[dict[str, Any]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    #: conversation -> its acknowledged tool attempts (effects and status reads pick from them)
    attempts: dict[str, list[str]] = field(default_factory=dict)
    #: append attempts answered with a timeout, a transport error, a 5xx or a 429
    failed_attempts: int = 0
    _appends: dict[str, int] = field(default_factory=dict)

    async def create(self, client: httpx.AsyncClient, conversation_id: str) -> None:
        """Create a conversation (outside the history) and note its seq before any append."""
        url = next(iter(self.urls.values()))
        for _ in range(50):
            try:
                r = await client.post(
                    f"{url}/v1/conversations",
                    json={"conversation_id": conversation_id},
                    headers={IDEMPOTENCY_KEY_HEADER: f"create-{conversation_id}"},
                )
                if r.status_code in (200, 201):
                    got = await client.get(f"{url}/v1/conversations/{conversation_id}")
                    if got.status_code == 200:
                        self.conversations[conversation_id] = int(got.json()["last_seq"])
                        return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
        raise RuntimeError(f"could not create {conversation_id}")

    async def run_client(
        self, client: httpx.AsyncClient, client_id: int, conversation: str
    ) -> None:
        rng = random.Random(f"{self.seed}/{client_id}")
        regions = sorted(self.urls)
        n = 0
        while not self.stop.is_set():
            kind = rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
            acked_attempts = self.attempts.get(conversation, [])
            if kind in ("effect", "status") and not acked_attempts:
                kind = "attempt"
            if kind in ("append", "attempt", "effect"):  # each may add an event
                if self._appends.get(conversation, 0) >= APPENDS_PER_CONVERSATION_MAX:
                    kind = "read"
                else:
                    self._appends[conversation] = self._appends.get(conversation, 0) + 1
            n += 1
            region = rng.choice(regions)
            if kind == "append":
                key = f"c{client_id}-{n}"
                op = {"op": "append", "key": key}
                event = {"type": "note", "payload": {"key": key}}
                await self._write_until_known(client, rng, regions, region, client_id,
                                              conversation, op, event, key)  # fmt: skip
            elif kind == "attempt":
                attempt = f"c{client_id}-t{n}"
                op = {"op": "append", "key": f"att:{attempt}"}
                event = {"type": "tool.attempt", "payload": {
                    "attempt_id": attempt, "tool": "lookup", "argument_digest": "sha256:x"}}  # fmt: skip
                if await self._write_until_known(client, rng, regions, region, client_id,
                                                 conversation, op, event, f"att-{attempt}"):  # fmt: skip
                    self.attempts.setdefault(conversation, []).append(attempt)
            elif kind == "effect":
                attempt, status = rng.choice(acked_attempts), rng.choice(("committed", "failed"))
                op = {"op": "effect", "attempt": attempt, "status": status}
                event = {
                    "type": "tool.effect",
                    "payload": {"attempt_id": attempt, "status": status},
                }
                await self._write_until_known(client, rng, regions, region, client_id,
                                              conversation, op, event, None)  # fmt: skip
            elif kind == "status":
                await self._status(client, region, client_id, conversation,
                                   rng.choice(acked_attempts))  # fmt: skip
            else:
                await self._read(client, region, client_id, conversation, last=kind == "last")
            await asyncio.sleep(PAUSE_S)

    async def final_reads(self, client: httpx.AsyncClient) -> None:
        """Every region reads every conversation once more after the faults healed."""
        for conversation in self.conversations:
            for region in sorted(self.urls):
                for _ in range(20):
                    if await self._read(client, region, -1, conversation, last=False):
                        break
                    await asyncio.sleep(0.25)

    def write(self, path: Path) -> None:
        clients = sorted({op["client"] for op in self.operations})
        index = {c: i for i, c in enumerate(clients)}  # Porcupine's client ids are 0-based
        ops = [{**op, "client": index[op["client"]]} for op in self.operations]
        path.write_text(json.dumps({"conversations": self.conversations, "operations": ops}))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for op in self.operations:
            kind = op["op"] + ("_unknown" if op["return"] is None else "")
            out[kind] = out.get(kind, 0) + 1
        return out

    # --- one operation --------------------------------------------------------------------

    async def _write_until_known(
        self,
        client: httpx.AsyncClient,
        rng: random.Random,
        regions: list[str],
        region: str,
        client_id: int,
        conversation: str,
        op: dict[str, Any],
        event: dict[str, Any],
        idempotency_key: str | None,
    ) -> bool:
        """One write operation: the first attempt's call to the first definite answer.

        The client sends the same request again (same Idempotency-Key, or for an effect the
        same effect) until an attempt is answered, so the entry enters the log once, somewhere
        between the first call and that answer, at the seq the answer names (a retry that made
        a second entry shows as a duplicate in a read). A write never answered before the run
        stops stays open (no return): it may or may not have committed. True: acknowledged.
        """
        record = {"client": client_id, "conversation": conversation, **op,
                  "call": time.monotonic_ns(), "region": region}  # fmt: skip
        headers = {} if idempotency_key is None else {IDEMPOTENCY_KEY_HEADER: idempotency_key}
        backoff_s = RETRY_BACKOFF_MIN_S
        while True:
            status, body = await self._send(
                client,
                "POST",
                f"{self.urls[region]}/v1/conversations/{conversation}/events",
                json=event,
                headers=headers,
            )
            if status in (200, 201):
                self.operations.append(
                    {**record, "return": time.monotonic_ns(), "seq": body["seq"]}
                )
                return True
            if status == 409 and op["op"] == "effect" and _code(body) == "effect_conflict":
                self.operations.append({**record, "return": time.monotonic_ns(), "conflict": True})
                return False
            if status == 409 and op["op"] == "effect" and _code(body) == "unknown_attempt":
                # a definite answer too: the checker judges whether the attempt could be absent
                self.operations.append(
                    {**record, "return": time.monotonic_ns(), "no_attempt": True}
                )
                return False
            self._check_status(status, body, op["op"])
            self.failed_attempts += 1
            if self.stop.is_set():
                self.operations.append({**record, "return": None})
                return False
            region = regions[(regions.index(region) + 1) % len(regions)]
            await asyncio.sleep(backoff_s * (0.5 + rng.random()))
            backoff_s = min(backoff_s * 2, RETRY_BACKOFF_MAX_S)

    async def _status(
        self, client: httpx.AsyncClient, region: str, client_id: int, conversation: str,
        attempt: str,
    ) -> None:  # fmt: skip
        url = f"{self.urls[region]}/v1/conversations/{conversation}/tool-attempts/{attempt}"
        call = time.monotonic_ns()
        status, body = await self._send(client, "GET", url)
        ret = time.monotonic_ns()
        if status != 200:
            self._check_status(status, body, "status")
            return
        self.operations.append({"client": client_id, "conversation": conversation,
                                "op": "status", "attempt": attempt, "state": body["state"],
                                "call": call, "return": ret, "region": region})  # fmt: skip

    async def _read(
        self,
        client: httpx.AsyncClient,
        region: str,
        client_id: int,
        conversation: str,
        *,
        last: bool,
    ) -> bool:
        base = f"{self.urls[region]}/v1/conversations/{conversation}"
        call = time.monotonic_ns()
        if last:
            status, body = await self._send(client, "GET", base)
        else:
            status, body = await self._send(
                client, "GET", f"{base}/events", params={"after_seq": 0, "limit": PAGE_LIMIT}
            )
        ret = time.monotonic_ns()
        if status != 200:
            self._check_status(status, body, "read")
            return False
        op: dict[str, Any] = {"client": client_id, "conversation": conversation, "call": call,
                              "return": ret, "region": region}  # fmt: skip
        if last:
            self.operations.append({**op, "op": "last", "last_seq": int(body["last_seq"])})
        else:
            events = body["events"]
            if len(events) >= PAGE_LIMIT:
                raise UnexpectedAnswer(f"{conversation} outgrew one page; lower the appends")
            self.operations.append({
                **op, "op": "read", "seqs": [e["seq"] for e in events],
                "keys": [_name(e) for e in events],
            })  # fmt: skip
        return True

    async def _send(
        self, client: httpx.AsyncClient, method: str, url: str, **kwargs: Any
    ) -> tuple[int | None, Any]:
        headers = {DEADLINE_HEADER: str(int(ATTEMPT_TIMEOUT_S * 1000)), **kwargs.pop("headers", {})}
        try:
            r = await client.request(
                method, url, headers=headers, timeout=ATTEMPT_TIMEOUT_S, **kwargs
            )
        except httpx.HTTPError:
            return None, None
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text

    @staticmethod
    def _check_status(status: int | None, body: Any, what: str) -> None:
        if status is None or status in UNKNOWN_STATUSES:
            return
        raise UnexpectedAnswer(f"{what}: {status} {str(body)[:300]}")


def _name(event: dict[str, Any]) -> str:
    """An event as the checker names it (module docstring)."""
    payload = event["payload"]
    if event["type"] == "tool.attempt":
        return f"att:{payload['attempt_id']}"
    if event["type"] == "tool.effect":
        return f"eff:{payload['attempt_id']}:{payload['status']}"
    return str(payload["key"])


def _code(body: Any) -> str | None:
    try:
        return str(body["error"]["code"])
    except (KeyError, TypeError):
        return None
