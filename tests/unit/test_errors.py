from __future__ import annotations

from eventlog.errors import NoQuorum, NotLeader


def test_not_leader_names_the_leader_region_when_known() -> None:
    body = NotLeader("moved", shard=7, leader_region="eu-west", retry_after_s=0.5).to_body()
    assert body == {
        "error": {
            "code": "not_leader",
            "message": "moved",
            "retryable": True,
            "shard": 7,
            "leader_region": "eu-west",
        }
    }
    assert NotLeader("?", shard=1).to_body()["error"]["leader_region"] is None  # type: ignore[index]


def test_plain_errors_keep_the_three_fields() -> None:
    assert NoQuorum("none").to_body() == {
        "error": {"code": "no_quorum", "message": "none", "retryable": True}
    }
