"""Conversation ids are namespaced by tenant: two tenants use one id as two conversations, and
no answer tells a tenant whether another tenant's conversation exists.

Over the real LogNode (in-memory replicas) behind the real API, with the replay service of
``test_replay_service`` (so transcripts read by replay, jobs and affinity are covered too)."""

from __future__ import annotations

import random
from typing import Any

import httpx

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.memory_replica import MemoryReplica
from eventlog.node import LogNode
from regions.drills import DRILL_TENANT
from services.control.drills.canary import append_canary, read_canary
from tests.unit.replay_world import (
    PEER_SECRET,
    REVISION,
    SERVICE_KEY,
    SHARD,
    TENANT_KEY,
    SteppedClock,
    api,
    bearer,
    ids_on_shard,
    move_shard,
    result_of,
    world,
)

T1 = bearer(TENANT_KEY)
T2 = bearer("other-key-0000")  # tenant t2 of ``test_replay_service.api``


async def _post(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], auth: dict[str, str], **hdr: str
) -> httpx.Response:
    return await client.post(url, json=body, headers={**auth, **hdr})


async def test_two_tenants_use_one_id_independently() -> None:
    async with world() as w, api(w) as client:
        await move_shard(w)  # b (the API's node) leads the shard
        [cid] = ids_on_shard("same", 1)
        base = f"/v1/conversations/{cid}"
        for auth, who in ((T1, "t1"), (T2, "t2")):
            body = {"conversation_id": cid, "metadata": {"who": who}}
            r = await _post(client, "/v1/conversations", body, auth)
            assert r.status_code == 201, r.text  # not 409: t2's id is its own
            assert r.json()["conversation_id"] == cid
        for n in range(2):
            r = await _post(client, base + "/events", {"type": "note", "payload": {"n": n}}, T1,
                            **{"Idempotency-Key": f"k{n}"})  # fmt: skip
            assert r.status_code == 201 and r.json()["seq"] == n + 1, r.text
        attempt = {"attempt_id": "a1", "tool": "search", "argument_digest": "d"}
        r = await _post(client, base + "/events", {"type": "tool.attempt", "payload": attempt}, T1)
        assert r.status_code == 201 and r.json()["seq"] == 3
        # t2's own sequence, its own idempotency keys (t1's k0 is not a retry of t2's)
        r = await _post(client, base + "/events", {"type": "note", "payload": {"from": "t2"}}, T2,
                        **{"Idempotency-Key": "k0"})  # fmt: skip
        assert r.status_code == 201 and r.json()["seq"] == 1, r.text

        one = (await client.get(base, headers=T1)).json()
        two = (await client.get(base, headers=T2)).json()
        assert (one["metadata"], one["last_seq"]) == ({"who": "t1"}, 3)
        assert (two["metadata"], two["last_seq"]) == ({"who": "t2"}, 1)
        events = (await client.get(base + "/events", headers=T2)).json()["events"]
        assert [(e["seq"], e["payload"]) for e in events] == [(1, {"from": "t2"})]
        assert (await client.get(base + "/tool-attempts/a1", headers=T1)).status_code == 200
        r = await client.get(base + "/tool-attempts/a1", headers=T2)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        for auth in (T1, T2):
            r = await client.get(base + "/affinity", headers=auth)
            assert r.status_code == 200 and r.json()["shard"] == SHARD, r.text


def _shape(r: httpx.Response, cid: str) -> tuple[int, Any]:
    """Status and body with the id the caller asked for blanked out of messages."""
    return r.status_code, r.text.replace(cid, "<id>")


async def test_no_answer_tells_whether_another_tenant_has_the_id() -> None:
    async with world() as w, api(w) as client:
        await move_shard(w)
        taken, fresh = ids_on_shard("oracle", 2)
        r = await _post(client, "/v1/conversations", {"conversation_id": taken}, T1)
        assert r.status_code == 201
        append = {"type": "note", "payload": {}}
        for suffix in ("", "/events", "/tool-attempts/a1", "/affinity"):
            answers = [
                _shape(await client.get(f"/v1/conversations/{cid}{suffix}", headers=T2), cid)
                for cid in (taken, fresh)
            ]
            assert answers[0] == answers[1] and answers[0][0] == 404, (suffix, answers)
        answers = [
            _shape(await _post(client, f"/v1/conversations/{cid}/events", append, T2), cid)
            for cid in (taken, fresh)
        ]
        assert answers[0] == answers[1] and answers[0][0] == 404
        # creating t1's id (with other metadata) is what creating a fresh id is: 201
        for cid in (taken, fresh):
            body = {"conversation_id": cid, "metadata": {"other": True}}
            r = await _post(client, "/v1/conversations", body, T2)
            assert r.status_code == 201 and r.json()["conversation_id"] == cid, r.text
        # within one's own namespace the rule is unchanged: other metadata is 409
        r = await _post(client, "/v1/conversations", {"conversation_id": taken}, T2)
        assert r.status_code == 409 and r.json()["error"]["code"] == "conversation_exists"


async def test_replay_keeps_one_id_of_two_tenants_apart() -> None:
    clock = SteppedClock()
    async with world(clock=clock) as w, api(w) as client:
        [cid] = ids_on_shard("shared", 1)
        for tenant in ("t1", "t2"):
            await w.home.create_conversation(tenant, cid, REVISION, {})
            for turn in range(1 if tenant == "t1" else 2):
                text = f"{tenant} says {turn}"
                await w.home.append_event(tenant, cid, "message.user", {"content": text})
        await move_shard(w)
        report = await w.service.replay_shard(SHARD)
        assert report.accepted == 2  # one job per tenant, neither superseding the other
        assert await w.service.capacity.poll_once() == 1
        clock.now_s += 1.0
        jobs = w.service.dispatch_once()
        assert sorted((j.tenant_id, j.through_seq) for j in jobs) == [("t1", 1), ("t2", 2)]
        assert len({j.job_id for j in jobs}) == 2
        url = f"/v1/conversations/{cid}/events"
        grants = {j.tenant_id: j.read_grant for j in jobs}
        for tenant, said in (("t1", ["t1 says 0"]), ("t2", ["t2 says 0", "t2 says 1"])):
            as_tenant = {"X-Convplane-Tenant": tenant, "X-Convplane-Replay-Grant": grants[tenant]}
            r = await client.get(url, headers=bearer(SERVICE_KEY, **as_tenant))
            assert r.status_code == 200, r.text
            assert [e["payload"]["content"] for e in r.json()["events"]] == said
            other = "t2" if tenant == "t1" else "t1"  # the other tenant's job grants nothing here
            crossed = {**as_tenant, "X-Convplane-Replay-Grant": grants[other]}
            assert (
                await client.get(url, headers=bearer(SERVICE_KEY, **crossed))
            ).status_code == 403
        t1_job = next(j for j in jobs if j.tenant_id == "t1")
        w.service.on_result(result_of(t1_job.job_id, cid))  # t1's replay finished on b-e0
        worker_1 = (await client.get(f"/v1/conversations/{cid}/affinity", headers=T1)).json()
        worker_2 = (await client.get(f"/v1/conversations/{cid}/affinity", headers=T2)).json()
        assert worker_1["worker"]["engine_id"] == "b-e0"
        assert worker_2["worker"] is None  # t1's warm KV is not t2's
        outcome = await w.service.replay_conversations("t2", [cid, "nobody-has-this"])
        assert outcome[cid] == "queued"


async def test_a_tenant_cannot_squat_a_drill_canary_id() -> None:
    replicas = {r: MemoryReplica(r) for r in ("a", "b", "c")}
    node = LogNode(region="a", replicas=replicas, config=LogConfig(shard_count=4),
                   clock=LoopClock(), rng=random.Random(1))  # fmt: skip
    try:
        canary = "drill-d1-s0-0"
        await node.lead_shard(node.shard_of(canary))
        await node.create_conversation("t1", canary, "other-rev", {"squat": True})
        await node.append_event("t1", canary, "note", {"mine": True})
        await append_canary(node, REVISION, canary, "canary-1", {"n": 1})
        assert await read_canary(node, canary, 0) == [{"seq": 1, "payload": {"n": 1}}]
        assert [e.payload for e in await node.list_events("t1", canary, 0, 10)] == [{"mine": True}]
        assert DRILL_TENANT != "t1"
    finally:
        await node.close()


async def test_the_peer_secret_does_not_lift_the_service_keys_scope() -> None:
    """Issue 39, finding 5: the service key with the peer secret and a forwarded header read
    any tenant's transcript (a trusted forward skipped the scope check). Sent where clients
    send, the forward is no peer's: the key reads only what replay dispatched."""
    async with world() as w, api(w) as client:
        [cid] = ids_on_shard("not-dispatched", 1)
        await w.home.create_conversation("t1", cid, REVISION, {})
        await w.home.append_event("t1", cid, "message.user", {"content": "private"})
        spoofed = bearer(
            SERVICE_KEY,
            **{
                "X-Convplane-Tenant": "t1",
                "X-Convplane-Forwarded": "1",
                "X-Convplane-Peer-Auth": PEER_SECRET,
                "X-Convplane-Source-Region": "a",
            },
        )
        r = await client.get(f"/v1/conversations/{cid}/events", headers=spoofed)
        assert r.status_code == 403, r.text
