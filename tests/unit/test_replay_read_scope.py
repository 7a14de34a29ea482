"""Security issue 39, finding 3: the replay worker key reads a transcript only for a replay job
the plane scheduled, with that job's read grant (``replay.read_grant``), and a region's worker
key only for its own region's jobs. Queuing a replay is an operator's act, never a worker key's.
"""

from __future__ import annotations

from services.config import api_key_sha256
from tests.unit.replay_world import (
    A_WORKER_KEY,
    OPERATOR_KEY,
    SERVICE_KEY,
    TENANT_KEY,
    VIEWER_KEY,
    SteppedClock,
    api,
    bearer,
    ids_on_shard,
    move_shard,
    replay_config,
    world,
    write_conversations,
)


async def test_the_worker_key_cannot_queue_a_replay_and_then_read_the_transcript() -> None:
    clock = SteppedClock()
    async with world(clock=clock) as w, api(w) as client:
        [cid] = ids_on_shard("victim", 1)
        await write_conversations(w.home, [cid], words=10)
        await move_shard(w)
        queue = {"tenant_id": "t1", "conversation_ids": [cid]}
        r = await client.post("/v1/replays", json=queue, headers=bearer(SERVICE_KEY))
        assert r.status_code == 401, r.text
        # the plane schedules it (an operator asked): the key alone still reads nothing
        r = await client.post("/v1/replays", json=queue, headers=bearer(OPERATOR_KEY))
        assert r.status_code == 202, r.text
        assert await w.service.capacity.poll_once() == 1
        clock.now_s += 1.0
        [job] = w.service.dispatch_once()
        events = f"/v1/conversations/{cid}/events"
        as_t1 = bearer(SERVICE_KEY, **{"X-Convplane-Tenant": "t1"})
        assert (await client.get(events, headers=as_t1)).status_code == 403
        granted = {**as_t1, "X-Convplane-Replay-Grant": job.read_grant}
        assert (await client.get(events, headers=granted)).status_code == 200


async def test_a_regions_worker_key_reads_only_for_its_own_regions_jobs() -> None:
    clock = SteppedClock()
    keys = {"b": api_key_sha256(SERVICE_KEY), "a": api_key_sha256(A_WORKER_KEY)}
    config = replay_config(worker_keys_sha256=keys, service_api_key_sha256=None)
    async with world(clock=clock, config=config) as w, api(w, config) as client:
        [cid] = ids_on_shard("regional", 1)
        await write_conversations(w.home, [cid], words=10)
        await move_shard(w)
        r = await client.post("/v1/replays", json={"tenant_id": "t1", "conversation_ids": [cid]},
                              headers=bearer(OPERATOR_KEY))  # fmt: skip
        assert r.status_code == 202, r.text
        assert await w.service.capacity.poll_once() == 1
        clock.now_s += 1.0
        [job] = w.service.dispatch_once()
        assert job.region == "b"
        grant = {"X-Convplane-Tenant": "t1", "X-Convplane-Replay-Grant": job.read_grant}
        events = f"/v1/conversations/{cid}/events"
        r = await client.get(events, headers=bearer(A_WORKER_KEY, **grant))
        assert r.status_code == 403 and "not b's" in r.text, r.text
        assert (await client.get(events, headers=bearer(SERVICE_KEY, **grant))).status_code == 200


async def test_replay_status_shows_engines_and_workers_to_operators_and_viewers_only() -> None:
    async with world() as w, api(w) as client:
        assert (await client.get("/v1/replays", headers=bearer(TENANT_KEY))).status_code == 403
        assert (await client.get("/v1/replays", headers=bearer(SERVICE_KEY))).status_code == 401
        for key in (OPERATOR_KEY, VIEWER_KEY):
            r = await client.get("/v1/replays", headers=bearer(key))
            assert r.status_code == 200 and "engines" in r.json()
