"""The client's routing, retries, deadlines and errors, against the fake plane on virtual time
(``test_client_fake_plane``). The core is one set of plans driven by both clients; these tests
drive it with the blocking client, ``test_client_aio`` with the asyncio one."""

from __future__ import annotations

import httpx
import pytest

from convplane_client import (
    DEADLINE_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    ApiError,
    ClientConfig,
    DeadlineExceeded,
    NotFound,
    OutcomeUnknown,
    QuotaExceeded,
    SeqConflict,
    TransportFailed,
    Unavailable,
)
from tests.unit.test_client_fake_plane import FakePlane, VirtualClock, error


def appends(plane: FakePlane) -> list[tuple[str, httpx.Request]]:
    return [(region, r) for region, r in plane.sent if r.url.path.endswith("/events")]


def test_a_conversation_goes_to_the_region_its_route_names() -> None:
    plane = FakePlane(leader="eu-west")
    plane.events["c1"] = []  # created by someone else: the client does not know its region
    with plane.client(VirtualClock()) as client:
        client.append("c1", "note", {"n": 1})
        client.append("c1", "note", {"n": 2})
        assert client.routed_region("c1") == "eu-west"
    assert plane.paths() == [
        ("us-east", "GET /v1/conversations/c1/route"),  # asked once, at any region
        ("eu-west", "POST /v1/conversations/c1/events"),
        ("eu-west", "POST /v1/conversations/c1/events"),
    ]


def test_served_by_moves_the_route_after_a_failover() -> None:
    plane = FakePlane()
    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")  # the create's answer names the leader: no /route
        client.append("c1", "note", {"n": 1})
        plane.leader = "ap-south"  # the shard failed over; us-east forwards the next one
        assert client.append("c1", "note", {"n": 2}).served_by == "ap-south"
        client.append("c1", "note", {"n": 3})
    assert [region for region, _ in plane.sent] == ["us-east", "us-east", "us-east", "ap-south"]


def test_an_unreachable_region_is_passed_over_for_another() -> None:
    plane = FakePlane(leader="eu-west", down={"us-east"})
    clock = VirtualClock()
    with plane.client(clock) as client:
        created = client.create_conversation("c1")
        plane.down = {"eu-west"}  # now the routed region stops answering
        appended = client.append("c1", "note", {"n": 1})
    assert created.leader_region == "eu-west" and appended.seq == 1
    # us-east refused the create a moment ago, so the append passes it over too
    assert [region for region, _ in plane.sent] == ["us-east", "eu-west", "eu-west", "ap-south"]
    assert clock.sleeps == []  # another region takes a refused request at once


def test_a_lost_answer_is_retried_with_the_same_key_and_replayed() -> None:
    plane = FakePlane()
    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        plane.faults.append(plane.lose_answer())
        appended = client.append("c1", "note", {"n": 1})
    keys = [r.headers[IDEMPOTENCY_KEY_HEADER] for _, r in appends(plane)]
    assert len(keys) == 2 and keys[0] == keys[1] == appended.idempotency_key
    assert appended.replayed and appended.seq == 1
    assert [e["payload"] for e in plane.events["c1"]] == [{"n": 1}]  # applied once


def test_outcome_unknown_is_resolved_by_the_retry() -> None:
    plane = FakePlane()
    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        plane.faults.append(plane.answer_after_applying(error(503, "outcome_unknown", True)))
        plane.faults.append(lambda r, region: error(503, "no_quorum", True, **{"Retry-After": "1"}))
        appended = client.append("c1", "note", {"n": 1}, idempotency_key="mine")
    assert appended.replayed and appended.idempotency_key == "mine"
    assert [r.headers[IDEMPOTENCY_KEY_HEADER] for _, r in appends(plane)] == ["mine"] * 3
    assert len(plane.events["c1"]) == 1


def test_each_append_gets_its_own_key() -> None:
    plane = FakePlane()
    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        a, b = (client.append("c1", "note", {"n": 1}) for _ in range(2))
    assert a.idempotency_key != b.idempotency_key and (a.seq, b.seq) == (1, 2)


def test_retry_after_is_honoured() -> None:
    plane = FakePlane()
    clock = VirtualClock()
    with plane.client(clock, backoff_base_s=0.01) as client:
        client.create_conversation("c1")
        plane.faults.append(
            lambda r, region: error(429, "quota_exceeded", True, **{"Retry-After": "3"})
        )
        client.append("c1", "note", {"n": 1})
    assert clock.sleeps == [3.0]


def test_backoff_is_exponential_jittered_and_capped() -> None:
    plane = FakePlane()
    clock = VirtualClock()
    with plane.client(clock, attempts_max=7, backoff_base_s=0.1, backoff_max_s=1.0) as client:
        client.create_conversation("c1")
        plane.faults.extend([lambda r, region: error(503, "overloaded", True)] * 6)
        client.append("c1", "note", {"n": 1})
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert len(clock.sleeps) == 6
    for slept, ceiling in zip(clock.sleeps, ceilings, strict=True):
        assert ceiling / 2 <= slept <= ceiling
    assert len(set(clock.sleeps)) == 6  # jittered, not a fixed schedule


def test_the_retry_budget_is_bounded() -> None:
    plane = FakePlane()
    with plane.client(VirtualClock(), attempts_max=4) as client:
        client.create_conversation("c1")
        plane.faults.extend([lambda r, region: error(503, "no_quorum", True)] * 10)
        with pytest.raises(Unavailable) as raised:
            client.append("c1", "note", {"n": 1}, idempotency_key="k1")
    assert len(appends(plane)) == 4
    assert (raised.value.attempts, raised.value.idempotency_key) == (4, "k1")
    assert raised.value.code == "no_quorum" and raised.value.retryable


def test_the_deadline_stops_retries_and_travels_with_each_request() -> None:
    plane = FakePlane()
    clock = VirtualClock()
    with plane.client(clock, attempts_max=100) as client:
        client.create_conversation("c1")
        plane.faults.extend(
            [lambda r, region: error(503, "overloaded", True, **{"Retry-After": "1"})] * 100
        )
        started_s = clock.now_s
        with pytest.raises(Unavailable) as raised:
            client.append("c1", "note", {"n": 1}, deadline_s=2.5)
    assert clock.now_s - started_s <= 2.5  # never slept past the deadline
    budgets = [int(r.headers[DEADLINE_HEADER]) for _, r in appends(plane)]
    assert budgets == [2500, 1500, 500] and raised.value.attempts == 3


def test_a_call_whose_deadline_already_passed_sends_nothing() -> None:
    plane = FakePlane()
    with plane.client(VirtualClock()) as client:
        with pytest.raises(DeadlineExceeded) as raised:
            client.create_conversation("c1", deadline_s=0)
    assert plane.sent == [] and raised.value.status is None


def test_errors_are_typed_and_only_retryable_ones_retried() -> None:
    plane = FakePlane()
    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        client.append("c1", "note", {"n": 1})
        with pytest.raises(SeqConflict) as conflict:
            client.append("c1", "note", {"n": 2}, expected_seq=0)
        with pytest.raises(NotFound):
            client.get_conversation("nope")
        plane.faults.append(lambda r, region: httpx.Response(502, text="bad gateway"))
        assert client.append("c1", "note", {"n": 3}).seq == 2  # a proxy's 502: retryable
        plane.faults.extend(
            [lambda r, region: error(429, "quota_exceeded", True, **{"Retry-After": "2"})] * 8
        )
        with pytest.raises(QuotaExceeded) as quota:
            client.get_conversation("c1")
    error_ = conflict.value
    assert (error_.code, error_.status, error_.retryable, error_.attempts) == (
        "seq_conflict", 409, False, 1,
    )  # fmt: skip
    assert isinstance(error_, ApiError) and error_.served_by is None
    assert (quota.value.status, quota.value.retry_after_s) == (429, 2.0)


def test_not_leader_teaches_the_leader() -> None:
    plane = FakePlane()
    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        hint = {"error": {"code": "not_leader", "message": "m", "retryable": True,
                          "leader_region": "ap-south"}}  # fmt: skip
        plane.faults.append(lambda r, region: httpx.Response(503, json=hint))
        plane.leader = "ap-south"
        client.append("c1", "note", {"n": 1})
    assert [region for region, _ in appends(plane)] == ["us-east", "ap-south"]


def test_outcome_unknown_error_carries_the_key_to_retry_with() -> None:
    plane = FakePlane()
    with plane.client(VirtualClock(), attempts_max=2) as client:
        client.create_conversation("c1")
        plane.faults.append(plane.answer_after_applying(error(503, "outcome_unknown", True)))
        plane.faults.append(lambda r, region: error(503, "outcome_unknown", True))
        with pytest.raises(OutcomeUnknown) as unknown:
            client.append("c1", "note", {"n": 1})
        later = client.append("c1", "note", {"n": 1}, idempotency_key=unknown.value.idempotency_key)
    assert later.replayed and later.seq == 1 and len(plane.events["c1"]) == 1


def test_no_region_answering_ends_in_transport_failed_after_backoff() -> None:
    plane = FakePlane(down={"us-east", "eu-west", "ap-south"})
    clock = VirtualClock()
    with plane.client(clock, attempts_max=5) as client:
        with pytest.raises(TransportFailed) as failed:
            client.create_conversation("c1")
    assert failed.value.retryable and failed.value.attempts == 5
    assert [region for region, _ in plane.sent][:3] == ["us-east", "eu-west", "ap-south"]
    assert len(clock.sleeps) == 2  # once every region failed, retries wait


def test_a_create_retried_after_a_lost_answer_is_one_conversation() -> None:
    plane = FakePlane()
    with plane.client(VirtualClock()) as client:
        plane.faults.append(plane.lose_answer(httpx.RemoteProtocolError))
        created = client.create_conversation(metadata={"a": 1})
    bodies = [r.content for _, r in plane.sent]
    assert len(bodies) == 2 and bodies[0] == bodies[1]  # the generated id went both times
    assert list(plane.events) == [created.conversation_id]


def test_transcript_reads_every_page() -> None:
    plane = FakePlane()
    with plane.client(VirtualClock(), page_events_max=2) as client:
        client.create_conversation("c1")
        for n in range(5):
            client.append("c1", "message.user", {"content": str(n)})
        events = client.transcript("c1")
        route = client.route("c1")
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert events[0].payload == {"content": "0"} and route.region == "us-east"


def test_an_expected_seq_append_whose_answer_was_lost_is_replayed_not_refused() -> None:
    """The retry finds its key before its expected_seq is checked (as the plane's log does),
    so a conditional append that landed is not reported as a seq_conflict."""
    plane = FakePlane()
    with plane.client(VirtualClock()) as client:
        client.create_conversation("c1")
        plane.faults.append(plane.lose_answer())
        appended = client.append("c1", "note", {"n": 1}, expected_seq=0)
    assert (appended.seq, appended.replayed) == (1, True)


@pytest.mark.parametrize(
    "limits",
    [{"attempts_max": 0}, {"deadline_s": 0}, {"backoff_base_s": 3.0}, {"page_events_max": 1001}],
)
def test_a_config_that_cannot_work_is_refused(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ClientConfig(**limits)  # type: ignore[arg-type]
