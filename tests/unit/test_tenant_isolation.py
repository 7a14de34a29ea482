"""A tenant learns nothing about another tenant's conversations from ``/affinity`` (404, as
every read): the replay service's world from ``test_replay_service`` behind the node's API.
(``/route``, which needs the controller, is checked on a real plane in
``tests/e2e/test_hostile_clients.py``.)"""

from __future__ import annotations

from tests.unit.replay_world import (
    TENANT_KEY,
    api,
    bearer,
    ids_on_shard,
    move_shard,
    world,
    write_conversations,
)

OTHER_TENANT_KEY = "other-key-0000"  # tenant t2 of test_replay_service.api


async def test_affinity_is_404_for_another_tenants_and_for_unknown_conversations() -> None:
    async with world() as w, api(w) as client:
        (cid,) = ids_on_shard("iso", 1)
        await write_conversations(w.home, [cid], words=10)
        await move_shard(w)
        url = f"/v1/conversations/{cid}/affinity"
        own = await client.get(url, headers=bearer(TENANT_KEY))
        assert own.status_code == 200, own.text
        other = await client.get(url, headers=bearer(OTHER_TENANT_KEY))
        assert other.status_code == 404, other.text
        (unknown,) = ids_on_shard("never-written", 1)
        missing = await client.get(
            f"/v1/conversations/{unknown}/affinity", headers=bearer(TENANT_KEY)
        )
        assert missing.status_code == 404, missing.text
        assert other.json()["error"]["code"] == missing.json()["error"]["code"] == "not_found"
