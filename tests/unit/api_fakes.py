"""A fake ConversationLog (in memory, same port as LogNode), clusters (tenant keys, and operator
and viewer keys: ``cluster_with_roles``) and app builders for API tests.

It keeps the port's rules that the REST layer depends on: tenant scoping (another tenant's
conversation is NotFound), idempotent create, gapless seq with expected_seq, Idempotency-Key
replay and reuse, one effect per tool attempt, and NotLeader with a leader hint for shards it
does not lead.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from fastapi import FastAPI
from starlette.types import ASGIApp

from eventlog.clock import LoopClock
from eventlog.conversations import (
    AppendedEvent,
    ConversationInfo,
    ConversationLog,
    EventRecord,
    ToolAttemptState,
    ToolAttemptStatus,
)
from eventlog.errors import (
    Conflict,
    EffectConflict,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    NotLeader,
    SeqConflict,
)
from eventlog.sharding import shard_of
from services.bootstrap import NodeRuntime
from services.bootstrap.app import create_app
from services.bootstrap.listener_gates import PeerListenerGate
from services.config import ClusterConfig, NodeSettings, RegionConfig, TenantConfig, api_key_sha256

SHARDS = 8
KEY_A = "key-tenant-a"
KEY_B = "key-tenant-b"
OPERATOR_KEY = "key-operator"  # an operator-role key of cluster_with_roles
VIEWER_KEY = "key-viewer"  # a viewer-role key (reads operator state, never writes)


@dataclass
class _Conv:
    info: ConversationInfo
    events: list[EventRecord] = field(default_factory=list)
    by_key: dict[str, tuple[str, AppendedEvent]] = field(default_factory=dict)
    #: (event type, attempt_id) of each tool event: as in the real log, an identical repeat of
    #: one gets its first result (``ConversationState.existing_result``)
    by_attempt: dict[tuple[str, str], tuple[str, AppendedEvent]] = field(default_factory=dict)


class FakeLog(ConversationLog):
    def __init__(self, region: str, leaders: dict[int, str]) -> None:
        self.region = region
        self.leaders = leaders  # shard -> leading region (hint)
        #: (tenant_id, conversation_id) -> conversation: ids are namespaced by tenant, as in
        #: the real log (``eventlog.conversations``)
        self.convs: dict[tuple[str, str], _Conv] = {}
        self.stall = False  # appends and reads block forever (deadline tests)
        self.calls = 0
        self.now_ms = 1_767_225_600_000

    def _check(self, conversation_id: str) -> int:
        self.calls += 1
        shard = shard_of(conversation_id, SHARDS)
        if self.leaders[shard] != self.region:
            raise NotLeader("not leader", shard=shard, leader_region=self.leaders[shard])
        return shard

    async def _maybe_stall(self) -> None:
        if self.stall:
            await asyncio.Event().wait()

    def _conv(self, tenant_id: str, conversation_id: str) -> _Conv:
        conv = self.convs.get((tenant_id, conversation_id))
        if conv is None:
            raise NotFound(f"no conversation {conversation_id}")
        return conv

    async def create_conversation(
        self, tenant_id: str, conversation_id: str, model_revision: str, metadata: dict[str, Any]
    ) -> ConversationInfo:
        shard = self._check(conversation_id)
        await self._maybe_stall()
        old = self.convs.get((tenant_id, conversation_id))
        if old is not None:
            if (old.info.model_revision, old.info.metadata) != (model_revision, metadata):
                raise Conflict("conversation exists with other attributes")
            return old.info
        info = ConversationInfo(
            conversation_id,
            tenant_id,
            self.region,
            model_revision,
            metadata,
            self.now_ms,
            0,
            shard,
            1,
        )
        self.convs[(tenant_id, conversation_id)] = _Conv(info)
        return info

    async def append_event(
        self,
        tenant_id: str,
        conversation_id: str,
        event_type: str,
        payload: dict[str, Any],
        *,
        token_count: int | None = None,
        expected_seq: int | None = None,
        idempotency_key: str | None = None,
    ) -> AppendedEvent:
        shard = self._check(conversation_id)
        await self._maybe_stall()
        conv = self._conv(tenant_id, conversation_id)
        digest = json.dumps([event_type, payload, token_count], sort_keys=True)
        if idempotency_key is not None and idempotency_key in conv.by_key:
            old_digest, appended = conv.by_key[idempotency_key]
            if old_digest != digest:
                raise IdempotencyKeyReused("key reused with another body")
            return replace(appended, replayed=True)
        attempt_id = payload.get("attempt_id")
        attempt = (event_type, str(attempt_id)) if event_type.startswith("tool.") else None
        if attempt is not None and attempt in conv.by_attempt:
            old_digest, appended = conv.by_attempt[attempt]
            if old_digest != digest:  # as the real log words each
                if event_type == "tool.attempt":
                    raise Conflict("attempt recorded with other arguments")
                raise EffectConflict("attempt has another effect")
            return replace(appended, replayed=True)
        if expected_seq is not None and expected_seq != conv.info.last_seq:
            raise SeqConflict("seq conflict", last_seq=conv.info.last_seq)
        if event_type == "tool.effect":
            self._check_effect(conv, payload)
        seq = conv.info.last_seq + 1
        record = EventRecord(
            f"e-{conversation_id}-{seq}",
            conversation_id,
            seq,
            event_type,
            payload,
            token_count or 0,
            self.now_ms,
        )
        conv.events.append(record)
        conv.info = replace(conv.info, last_seq=seq)
        appended = AppendedEvent(
            record.event_id,
            conversation_id,
            seq,
            event_type,
            (self.region, "other"),
            self.now_ms,
            shard,
            1,
            seq,
            False,
        )
        if idempotency_key is not None:
            conv.by_key[idempotency_key] = (digest, appended)
        if attempt is not None:
            conv.by_attempt[attempt] = (digest, appended)
        return appended

    @staticmethod
    def _check_effect(conv: _Conv, payload: dict[str, Any]) -> None:
        attempt_id = payload.get("attempt_id")
        if not isinstance(attempt_id, str):
            raise InvalidRequest("tool.effect needs attempt_id")
        for e in conv.events:
            if e.event_type == "tool.effect" and e.payload.get("attempt_id") == attempt_id:
                raise EffectConflict("effect already recorded")

    async def get_conversation(self, tenant_id: str, conversation_id: str) -> ConversationInfo:
        self._check(conversation_id)
        await self._maybe_stall()
        return self._conv(tenant_id, conversation_id).info

    async def list_events(
        self, tenant_id: str, conversation_id: str, after_seq: int, limit: int
    ) -> list[EventRecord]:
        self._check(conversation_id)
        await self._maybe_stall()
        events = self._conv(tenant_id, conversation_id).events
        return [e for e in events if e.seq > after_seq][:limit]

    async def tool_attempt(
        self, tenant_id: str, conversation_id: str, attempt_id: str
    ) -> ToolAttemptStatus:
        self._check(conversation_id)
        conv = self._conv(tenant_id, conversation_id)
        events = tuple(e for e in conv.events if e.payload.get("attempt_id") == attempt_id)
        if not events:
            raise NotFound(f"no tool attempt {attempt_id}")
        committed = any(e.event_type == "tool.effect" for e in events)
        state: ToolAttemptState = "committed" if committed else "pending"
        return ToolAttemptStatus(attempt_id, state, events)


class HostRouting(httpx.AsyncBaseTransport):
    """Peer transport: routes by host to in-process ASGI apps (no network)."""

    def __init__(self) -> None:
        self.apps: dict[str, httpx.ASGITransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        transport = self.apps.get(request.url.host)
        if transport is None:
            raise httpx.ConnectError("connection refused", request=request)
        return await transport.handle_async_request(request)


def peer_listener(app: ASGIApp, cluster: ClusterConfig) -> httpx.ASGITransport:
    """``app`` as a node's peer listener serves it, for ``HostRouting`` (without TLS: the
    peer secret and the claimed region; ``services.bootstrap.listener_gates``)."""
    if cluster.peer_secret is None:
        return httpx.ASGITransport(app=app)
    regions = [r.name for r in cluster.regions]
    gate = PeerListenerGate(app, peer_secret=cluster.peer_secret, regions=regions, tls=False)
    return httpx.ASGITransport(app=gate)


#: the peer secret of ``cluster_with_peer_secret``
PEER_SECRET = "p" * 40


def cluster_with_peer_secret() -> ClusterConfig:
    """``cluster_config`` with a peer secret: nodes whose peer listeners (``peer_listener``)
    take each other's forwards, as every cluster of several regions does."""
    return cluster_config().model_copy(update={"peer_secret": PEER_SECRET})


def cluster_config() -> ClusterConfig:
    return ClusterConfig(
        regions=[
            RegionConfig(name="east", url="http://east.test", dsn="memory://east"),
            RegionConfig(name="west", url="http://west.test", dsn="memory://west"),
        ],
        shard_count=SHARDS,
        tenants=[
            TenantConfig(tenant_id="a", api_key_sha256=api_key_sha256(KEY_A), burst=10_000),
            TenantConfig(
                tenant_id="b", api_key_sha256=api_key_sha256(KEY_B), requests_per_s=1, burst=3
            ),
        ],
        default_model_revision="m-1",
    )


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def cluster_with_roles() -> ClusterConfig:
    """``cluster_config`` plus an operator tenant (``sre``) and a viewer (``watch``)."""
    base = cluster_config()
    return base.model_copy(
        update={
            "tenants": [
                *base.tenants,
                TenantConfig(
                    tenant_id="sre", api_key_sha256=api_key_sha256(OPERATOR_KEY), role="operator"
                ),
                TenantConfig(
                    tenant_id="watch", api_key_sha256=api_key_sha256(VIEWER_KEY), role="viewer"
                ),
            ]
        }
    )


def leaders() -> dict[int, str]:
    return {s: ("east" if s % 2 == 0 else "west") for s in range(SHARDS)}


def conversation_led_by(region: str, prefix: str = "conv") -> str:
    for i in range(1000):
        cid = f"{prefix}-{i}"
        if leaders()[shard_of(cid, SHARDS)] == region:
            return cid
    raise AssertionError("unreachable")


@dataclass
class Plane:
    """Two fake region nodes; east forwards to west over an in-process ASGI transport."""

    east: FastAPI
    west: FastAPI
    east_log: FakeLog
    west_log: FakeLog


def build_app(
    region: str,
    log: FakeLog,
    peers: httpx.AsyncClient,
    cluster: ClusterConfig | None = None,
    **limits: Any,
) -> FastAPI:
    settings = NodeSettings(region=region, cluster=cluster or cluster_config(), **limits)

    @asynccontextmanager
    async def runtime(s: NodeSettings) -> AsyncIterator[NodeRuntime]:
        yield NodeRuntime(
            region, s.load_cluster(), log, peers, LoopClock(), random.Random(7), lambda: (4, 4)
        )

    return create_app(settings, runtime_factory=runtime)


@asynccontextmanager
async def lone_node_client() -> AsyncIterator[httpx.AsyncClient]:
    """A client of region east's app in process, over a ``FakeLog`` that leads every shard and
    peers that answer 503: for tests of what one node's API says, not of forwarding."""
    async with AsyncExitStack() as stack:
        peers = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(503)))
        )
        app = build_app("east", FakeLog("east", leaders()), peers, forward_retries_max=0)
        await stack.enter_async_context(app.router.lifespan_context(app))
        yield await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://east.test")
        )
