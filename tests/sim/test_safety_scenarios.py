"""The five safety bugs of issue 7, each as a deterministic scenario named by the behaviour it
guards. Each ran (as a script in shared/repro) against the code before its fix and showed the
bug; here each asserts the fixed behaviour, on the simulator's virtual-time loop where time
matters, so no test depends on this machine's speed."""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from eventlog.clock import LoopClock
from eventlog.config import LogConfig
from eventlog.conversation_state import UnknownAttempt
from eventlog.errors import (
    ConvplaneError,
    Fenced,
    InvalidRequest,
    LeadershipChanged,
    NoQuorum,
    ReplicaUnavailable,
)
from eventlog.memory_replica import MemoryReplica
from eventlog.node import LogNode
from eventlog.rebuild import rebuild_replica
from eventlog.sim.checker import History, check_final_log
from eventlog.sim.loop import run_on_virtual_time
from eventlog.sim.network import SimNetwork
from regions.control import PLACEMENT_RECORD, ControlState
from services.config import ClusterConfig, NodeSettings, RegionConfig
from services.control.controller import Controller

T = TypeVar("T")


def run(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return run_on_virtual_time(scenario())


def nodes_on(net: SimNetwork, regions: str, shard_count: int = 4) -> dict[str, LogNode]:
    config = LogConfig(shard_count=shard_count)
    return {
        r: LogNode(
            region=r,
            replicas={d: net.link(r, d) for d in regions},
            config=config,
            clock=LoopClock(),
            rng=random.Random(ord(r)),
        )
        for r in regions
    }


# --- bug 1: the control plane cannot brick itself -------------------------------------------


PORT_CALLS = (
    "prepare",
    "append",
    "status",
    "read_log",
    "read_conversation",
    "read_page_snapshot",
    "list_conversations",
    "identity",
    "registry",
    "record_identity",
    "positions",
)


class StallingReplica:
    """A replica port over a MemoryReplica that can be dead or have a stalling database."""

    def __init__(self, inner: MemoryReplica, rng: random.Random) -> None:
        self.inner, self.region, self.rng = inner, inner.region, rng
        self.dead = False
        self.slow = False

    async def _call(self, name: str, *args: Any) -> Any:
        await asyncio.sleep(0.002)
        if self.dead:
            raise ReplicaUnavailable(f"{self.region} down")
        if self.slow and name == "append":
            await asyncio.sleep(self.rng.uniform(0.2, 1.5))
        return await getattr(self.inner, name)(*args)

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        if name in PORT_CALLS:
            return lambda *args: self._call(name, *args)
        raise AttributeError(name)

    async def close(self) -> None:
        return None


class NoPeers:
    """The scenario feeds membership itself (below); the controller's own probes find nobody."""

    async def health(self, region: str) -> None:
        return None


async def control_leader_dies_while_a_database_stalls(seed: int) -> dict[str, Any]:
    """Region a (the control leader) dies; b takes the control shard while c's database stalls,
    so b's first proposals time out (NoQuorum) and are proposed again while the first may still
    commit. Before the fix two records of one version committed and every learner died."""
    rng = random.Random(seed)
    replicas = {r: StallingReplica(MemoryReplica(r), random.Random(rng.random())) for r in "abc"}
    cluster = ClusterConfig(
        shard_count=8,
        regions=[
            RegionConfig(name=r, url=f"http://{r}.invalid", dsn=f"sqlite+aiosqlite:///{r}.db")
            for r in "abc"
        ],
    )
    clock = LoopClock()
    controllers: dict[str, Controller] = {}
    for r in "ab":
        node = LogNode(
            region=r,
            replicas=replicas,  # type: ignore[arg-type]
            config=LogConfig(shard_count=8),
            clock=clock,
            rng=random.Random(rng.random()),
        )
        controllers[r] = Controller(
            settings=NodeSettings(region=r, cluster=cluster),
            cluster=cluster,
            node=node,
            replicas=replicas,  # type: ignore[arg-type]
            prober=NoPeers(),
            clock=clock,
            rng=random.Random(rng.random()),
        )
    a_dead_at: list[float | None] = [None]

    async def probes() -> None:  # GET /peer/health between a, b and a c that answers
        while True:
            now = clock.monotonic()
            dead_since = a_dead_at[0]
            c_suspects = ["a"] if dead_since is not None and now - dead_since >= 1.0 else []
            for me, ctl in controllers.items():
                if me == "a" and dead_since is not None:
                    continue
                ctl.membership.probe_ok("c", now, suspects=c_suspects)
                other = "b" if me == "a" else "a"
                if other == "a" and dead_since is not None:
                    continue
                reply = controllers[other].health_reply()
                ctl.membership.probe_ok(
                    other, now, suspects=reply["suspects"], led_shards=reply["led_shards"]
                )
            await asyncio.sleep(0.2)

    prober = asyncio.ensure_future(probes())
    for ctl in controllers.values():
        period_s = ctl.settings.placement_poll_s
        ctl.supervisor.start("learn-reconcile", ctl._tick, period_s)
        ctl.supervisor.start("control", ctl._control, period_s)
    await asyncio.sleep(10)  # steady state: a leads the control shard
    a_dead_at[0] = clock.monotonic()
    await controllers["a"].supervisor.close()
    replicas["a"].dead = True
    await controllers["a"].node.close()
    replicas["c"].slow = True  # c's database stalls under the failover burst
    await asyncio.sleep(30)
    replicas["c"].slow = False
    await asyncio.sleep(10)
    b = controllers["b"]
    control_log = await replicas["b"].inner.read_log(cluster.shard_count, 0, 1000)
    fresh = ControlState(shard_count=cluster.shard_count, regions=cluster.weights())
    for entry in control_log:
        fresh.apply(entry.lsn, entry.event_type, entry.body)  # must not raise
    versions = [
        json.loads(e.body)["version"] for e in control_log if e.event_type == PLACEMENT_RECORD
    ]
    mine = b.placement().shards_of("b")
    result = {
        "unhealthy": b.supervisor.unhealthy(),
        "versions": versions,
        "fresh_version": fresh.version,
        "b_version": b.state.version,
        "assigned_to_b": len(mine),
        "led_by_b": sum(1 for s in mine if b.node.leads(s)),
        "a_down": "a" in b.placement().down,
    }
    prober.cancel()
    await b.supervisor.close()
    await b.node.close()
    return result


@pytest.mark.parametrize("seed", range(6))
def test_a_retried_placement_that_commits_twice_is_a_no_op_and_every_loop_lives(
    seed: int,
) -> None:
    """Until issue 32 some of these seeds committed one placement version twice (a proposal
    retried after NoQuorum that had also committed), which killed the learners before bug 1's
    fix. Since the control leader acts only on records a write quorum's commit hints hold
    (issue 32, bugs 2 and 3), none of seeds 0-59 proposes a version twice any more, so the
    learners' handling of a duplicate is held by
    ``tests/unit/test_control.py::test_stale_duplicate_and_malformed_records_apply_as_recorded_no_ops``;
    this scenario still holds the failover under a stalled database to its outcome."""
    result = run(lambda: control_leader_dies_while_a_database_stalls(seed))
    assert result["unhealthy"] == []
    assert result["a_down"], result
    assert result["fresh_version"] == result["b_version"] == max(result["versions"])
    assert result["assigned_to_b"] > 0 and result["led_by_b"] == result["assigned_to_b"]


# --- bug 2: a load that straddles a re-lead never re-creates a conversation -----------------


class GatedReads(MemoryReplica):
    """A replica whose conversation reads can be held (a big history, a busy database)."""

    gate: asyncio.Event

    async def read_conversation(self, *args: Any) -> Any:
        await self.gate.wait()
        return await super().read_conversation(*args)


async def create_retry_straddles_relead() -> tuple[list[tuple[int, str]], type[Exception]]:
    gate = asyncio.Event()
    gate.set()
    replicas = {r: GatedReads(r) for r in "abc"}
    for replica in replicas.values():
        replica.gate = gate
    node = LogNode(
        region="a",
        replicas=replicas,
        config=LogConfig(shard_count=4),
        clock=LoopClock(),
        rng=random.Random(1),
    )
    shard = node.shard_of("X")
    await node.lead_shard(shard)
    await node.create_conversation("t", "X", "m@1", {})
    await node.append_event("t", "X", "message.user", {"content": "one"}, idempotency_key="k1")
    await node.lead_shard(shard)  # re-led (e.g. after a fence): the cache is empty
    gate.clear()
    retry = asyncio.ensure_future(node.create_conversation("t", "X", "m@1", {}))
    await asyncio.sleep(0.01)
    await node.lead_shard(shard)  # another re-lead completes while the load is in flight
    gate.set()
    error: type[Exception] = type(None)  # type: ignore[assignment]
    try:
        await retry
    except ConvplaneError as exc:
        error = type(exc)
    again = await node.append_event(
        "t", "X", "message.user", {"content": "one"}, idempotency_key="k1"
    )
    assert again.replayed and again.seq == 1
    log = await replicas["a"].read_log(shard, 0, 100)
    await node.close()
    assert check_final_log(shard, log, History()) == []
    return [(e.seq, e.event_type) for e in log if e.conversation_id == "X"], error


def test_a_create_whose_load_straddles_a_relead_fails_retryable_and_writes_nothing() -> None:
    entries, error = run(create_retry_straddles_relead)
    assert error is LeadershipChanged and LeadershipChanged.retryable
    assert entries == [(0, "conversation.created"), (1, "message.user")]


# --- bug 3: a deposed leader answers no read ------------------------------------------------


async def reads_at_a_cut_off_leader() -> dict[str, Any]:
    replicas = {r: MemoryReplica(r) for r in "abc"}
    net = SimNetwork(random.Random(7), replicas)
    nodes = nodes_on(net, "abc")
    a, b = nodes["a"], nodes["b"]
    shard = a.shard_of("X")
    await a.lead_shard(shard)
    await a.create_conversation("t", "X", "m@1", {})
    await a.append_event("t", "X", "message.user", {"content": "hi"})
    attempt = {"attempt_id": "att1", "tool": "pay", "argument_digest": "d"}
    await a.append_event("t", "X", "tool.attempt", attempt)
    net.partition("a")  # region a is cut off, node and database
    with pytest.raises(ConvplaneError):
        await a.append_event("t", "X", "message.user", {"content": "never acked"})
    await b.lead_shard(shard)
    await b.append_event("t", "X", "tool.effect", {"attempt_id": "att1", "status": "committed"})
    await asyncio.sleep(30)  # 30 s later a still believes it leads
    outcomes: dict[str, Any] = {"a_leads": a.leads(shard)}
    reads: dict[str, Callable[[LogNode], Awaitable[Any]]] = {
        "get": lambda n: n.get_conversation("t", "X"),
        "events": lambda n: n.list_events("t", "X", 0, 100),
        "attempt": lambda n: n.tool_attempt("t", "X", "att1"),
    }
    for name, read in reads.items():
        try:
            outcomes[name] = await read(a)
        except (NoQuorum, Fenced) as exc:
            outcomes[name] = type(exc)
    outcomes["b_last_seq"] = (await b.get_conversation("t", "X")).last_seq
    outcomes["b_attempt"] = (await b.tool_attempt("t", "X", "att1")).state
    for node in nodes.values():
        await node.close()
    await net.close()
    return outcomes


def test_a_cut_off_leader_refuses_every_read_and_the_new_leader_answers_them() -> None:
    outcomes = run(reads_at_a_cut_off_leader)
    assert outcomes["a_leads"]  # it still thinks it leads: the reads must not trust that
    assert {outcomes[k] for k in ("get", "events", "attempt")} <= {NoQuorum, Fenced}
    assert outcomes["b_last_seq"] == 3 and outcomes["b_attempt"] == "committed"


async def refusals_at_a_cut_off_leader() -> dict[str, Any]:
    """A new leader commits what the old one never saw: a tool attempt and its effect. Asked
    for writes that its memory would refuse, the cut-off old leader must
    not refuse them from that memory (Porcupine caught a 409 ``unknown_attempt`` for an
    acknowledged attempt from a partitioned region)."""
    replicas = {r: MemoryReplica(r) for r in "abc"}
    net = SimNetwork(random.Random(7), replicas)
    nodes = nodes_on(net, "abc")
    a, b = nodes["a"], nodes["b"]
    shard = a.shard_of("X")
    await a.lead_shard(shard)
    await a.create_conversation("t", "X", "m@1", {})
    net.partition("a")
    await b.lead_shard(shard)
    await b.append_event("t", "X", "tool.attempt",
                         {"attempt_id": "att2", "tool": "pay", "argument_digest": "d"})  # fmt: skip
    await b.append_event("t", "X", "tool.effect", {"attempt_id": "att2", "status": "committed"})
    await asyncio.sleep(30)
    outcomes: dict[str, Any] = {"a_leads": a.leads(shard)}
    writes: dict[str, Callable[[LogNode], Awaitable[Any]]] = {
        # a knows no att2: it would answer 409 unknown_attempt
        "effect_of_unknown_attempt": lambda n: n.append_event(
            "t", "X", "tool.effect", {"attempt_id": "att3", "status": "failed"}),
        # a knows att2 without an effect: it would take a different one (then fail to commit)
        "expected_seq": lambda n: n.append_event(
            "t", "X", "message.user", {"content": "x"}, expected_seq=7),
        "created_with_other_metadata": lambda n: n.create_conversation(
            "t", "X", "m@2", {"other": True}),
    }  # fmt: skip
    for name, write in writes.items():
        try:
            outcomes[name] = await write(a)
        except ConvplaneError as exc:
            outcomes[name] = type(exc)
    with pytest.raises(UnknownAttempt):  # the new leader refuses what it knows is absent
        await b.append_event("t", "X", "tool.effect", {"attempt_id": "att3", "status": "failed"})
    for node in nodes.values():
        await node.close()
    await net.close()
    return outcomes


def test_a_cut_off_leader_refuses_no_write_from_its_own_memory() -> None:
    outcomes = run(refusals_at_a_cut_off_leader)
    assert outcomes["a_leads"]  # it still believes it leads
    for name in ("effect_of_unknown_attempt", "expected_seq", "created_with_other_metadata"):
        assert outcomes[name] in {NoQuorum, Fenced}, (name, outcomes[name])


class HeldReads(MemoryReplica):
    """A replica whose conversation reads wait for ``gate`` (a slow history load)."""

    gate: asyncio.Event

    async def read_conversation(self, *args: Any) -> Any:
        await self.gate.wait()
        return await super().read_conversation(*args)


async def loads_after_a_cancelled_load() -> list[int]:
    """Caller 1 loads a conversation's history (slow), caller 2 waits for that load, caller 1
    is cancelled (its deadline): caller 3, arriving then, must wait for caller 2's load, not
    start a second one beside it; two states of one conversation decide two entries with one
    seq. Found by the whole-plane simulation (seed 1935) once refusals confirmed leadership."""
    replicas = {r: HeldReads(r) for r in "abc"}
    for replica in replicas.values():
        replica.gate = asyncio.Event()
        replica.gate.set()
    a, b = (
        LogNode(region=r, replicas=replicas, config=LogConfig(shard_count=4), clock=LoopClock(),
                rng=random.Random(i))
        for i, r in enumerate("ab")
    )  # fmt: skip
    shard = a.shard_of("X")
    await a.lead_shard(shard)
    await a.create_conversation("t", "X", "m@1", {})
    await b.lead_shard(shard)  # b knows nothing of X yet: its first callers load the history
    for replica in replicas.values():
        replica.gate.clear()
    first = asyncio.ensure_future(b.append_event("t", "X", "note", {"n": 1}))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(b.append_event("t", "X", "note", {"n": 2}))
    await asyncio.sleep(0.01)
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    third = asyncio.ensure_future(b.append_event("t", "X", "note", {"n": 3}))
    await asyncio.sleep(0.01)
    for replica in replicas.values():
        replica.gate.set()
    seqs = sorted(r.seq for r in await asyncio.gather(second, third))
    for node in (a, b):
        await node.close()
    return seqs


def test_a_cancelled_history_load_never_lets_two_loads_of_one_conversation_run() -> None:
    assert run(loads_after_a_cancelled_load) == [1, 2]


class HeldAppends(MemoryReplica):
    """A replica that answers status reads but holds appends (a slow disk, a long fsync)."""

    held: asyncio.Event

    async def append(self, *args: Any) -> Any:
        await self.held.wait()
        return await super().append(*args)


async def last_seq_while_an_append_is_in_flight() -> tuple[int, int]:
    released = asyncio.Event()
    released.set()
    replicas = {r: HeldAppends(r) for r in "abc"}
    for replica in replicas.values():
        replica.held = released
    a = LogNode(
        region="a",
        replicas=replicas,
        config=LogConfig(shard_count=4),
        clock=LoopClock(),
        rng=random.Random(1),
    )
    shard = a.shard_of("X")
    await a.lead_shard(shard)
    await a.create_conversation("t", "X", "m@1", {})
    released.clear()  # the append below cannot commit until released
    pending = asyncio.ensure_future(a.append_event("t", "X", "message.user", {"content": "x"}))
    await asyncio.sleep(0.01)
    seen_during = (await a.get_conversation("t", "X")).last_seq
    released.set()
    await pending
    after = (await a.get_conversation("t", "X")).last_seq
    await a.close()
    return seen_during, after


def test_last_seq_shows_committed_entries_only() -> None:
    during, after = run(last_seq_while_an_append_is_in_flight)
    assert (during, after) == (0, 1)


# --- bug 4: one client's payload cannot take down other tenants' shards --------------------


@pytest.mark.parametrize(
    "payload",
    [
        {"attempt_id": "a\ud800", "tool": "t", "argument_digest": "d"},
        {"attempt_id": "a\x00b", "tool": "t", "argument_digest": "d"},
        {"attempt_id": "a", "tool": "t\udfff", "argument_digest": "d"},
        {"attempt_id": "a", "tool": "t", "argument_digest": "d", "n": float("inf")},
        {"attempt_id": "a", "tool": "t", "argument_digest": "d", "x\ud800": 1},
    ],
)
def test_values_no_store_round_trips_are_refused_at_the_edge(payload: dict[str, Any]) -> None:
    async def scenario() -> None:
        replicas = {r: MemoryReplica(r) for r in "abc"}
        node = LogNode(
            region="a",
            replicas=replicas,
            config=LogConfig(shard_count=2),
            clock=LoopClock(),
            rng=random.Random(1),
        )
        await node.lead_shard(node.shard_of("X"))
        await node.create_conversation("t", "X", "m@1", {})
        with pytest.raises(InvalidRequest):
            await node.append_event("t", "X", "tool.attempt", payload)
        if "\x00" not in payload["attempt_id"]:  # a NUL inside JSON text is storable
            with pytest.raises(InvalidRequest):
                await node.create_conversation("t", "Y", "m@1", {"bad": payload})
        else:
            await node.create_conversation("t", "Y", "m@1", {"nul": payload})
        with pytest.raises(InvalidRequest):
            await node.get_conversation("t", "X\ud800")
        assert (await node.append_event("t", "X", "note", {"ok": 1})).seq == 1
        await node.close()

    run(scenario)


# --- bug 5: a wiped replica neither votes nor acks until rebuilt and re-admitted --------------


async def wiped_replica_then_failover(sweep_after_wipe: bool) -> dict[str, Any]:
    replicas = {r: MemoryReplica(r) for r in "abc"}
    net = SimNetwork(random.Random(7), replicas)
    nodes = nodes_on(net, "abc")
    for node in nodes.values():
        await node.verify_replicas()  # a running cluster: every node has swept
    a, c = nodes["a"], nodes["c"]
    shard = a.shard_of("X")
    await a.lead_shard(shard)
    await a.create_conversation("t", "X", "m@1", {})
    net.crashed.add("c")
    acked = await a.append_event("t", "X", "message.user", {"content": "acked by a and b"})
    net.crashed.clear()
    net.partition("a")  # the leader region is cut off
    replicas["b"].wipe()  # b's database comes back empty
    outcome: dict[str, Any] = {"acked_by": acked.acked_by}
    if sweep_after_wipe:
        outcome["quarantined"] = await c.verify_replicas()
    try:
        await c.lead_shard(shard)  # a prepare quorum would need b's vote
        outcome["lead_while_cut_off"] = "led"
    except NoQuorum:
        outcome["lead_while_cut_off"] = "no quorum"
    outcome["b_counts_at_c"] = c.identity.counts("b")
    net.heal()
    await c.lead_shard(shard)  # through {a, c}
    events = await c.list_events("t", "X", 0, 100)
    outcome["events_at_c"] = [e.event_id for e in events]
    outcome["acked_event"] = acked.event_id
    links = {r: net.link("c", r) for r in "abc"}
    report = await rebuild_replica(links, "b", range(c.config.shard_count + 1), c.config)
    outcome["generation"] = report.generation
    await c.verify_replicas()
    outcome["b_counts_after_rebuild"] = c.identity.counts("b")
    b_log = await replicas["b"].read_log(shard, 0, 100)
    outcome["b_holds_acked"] = any(
        json.loads(e.body).get("event_id") == acked.event_id for e in b_log
    )
    for node in nodes.values():
        await node.close()
    await net.close()
    return outcome


@pytest.mark.parametrize("sweep_after_wipe", [True, False])
def test_a_wiped_replica_cannot_vote_an_acked_event_away(sweep_after_wipe: bool) -> None:
    """Acked by {a, b}; b wiped; a cut off: c must not take over through {b, c}. With a sweep
    b is quarantined at once; without one the prepare's identity re-read refuses b's vote."""
    outcome = run(lambda: wiped_replica_then_failover(sweep_after_wipe))
    assert outcome["acked_by"] == ("a", "b")
    if sweep_after_wipe:
        assert outcome["quarantined"] == ["b"]
        assert outcome["b_counts_at_c"] is False
    assert outcome["lead_while_cut_off"] == "no quorum"
    assert outcome["acked_event"] in outcome["events_at_c"]
    assert outcome["generation"] == 1
    assert outcome["b_counts_after_rebuild"] is True
    assert outcome["b_holds_acked"]


async def reads_after_the_leaders_own_replica_is_wiped() -> dict[str, Any]:
    """The leader's own region's database is wiped while it leads, before any identity sweep:
    its reads (which prefer that replica) must not come back short."""
    replicas = {r: MemoryReplica(r) for r in "abc"}
    net = SimNetwork(random.Random(5), replicas)
    nodes = nodes_on(net, "abc")
    a = nodes["a"]
    shard = a.shard_of("X")
    await a.lead_shard(shard)
    await a.create_conversation("t", "X", "m@1", {})
    acked = [
        (await a.append_event("t", "X", "message.user", {"content": f"m{i}"})).event_id
        for i in range(3)
    ]
    replicas["a"].wipe()
    events = await a.list_events("t", "X", 0, 100)
    info = await a.get_conversation("t", "X")
    leader = a.leader(shard)
    assert leader is not None
    outcome = {
        "acked": acked,
        "read": [e.event_id for e in events],
        "last_seq": info.last_seq,
        # the wiped store refuses the appends that name its old identity (issue 32)
        "noticed": leader.replicas_gone_backwards + leader.identity_refusals,
    }
    for node in nodes.values():
        await node.close()
    await net.close()
    return outcome


def test_a_replica_wiped_under_a_serving_leader_serves_no_short_read() -> None:
    """Found by the whole-plane simulation (seeds 2195, 2548, ... on PLANE_SIM_VERSION 1): the
    leader kept reading from its own, freshly wiped replica until the next identity sweep."""
    outcome = run(reads_after_the_leaders_own_replica_is_wiped)
    assert outcome["read"] == outcome["acked"]
    assert outcome["last_seq"] == 3
    assert outcome["noticed"] >= 1


class RestoredUnderTheRead(MemoryReplica):
    """A database restored from a physical copy (which keeps its identity: the migration's
    store id and the database's oid come back with it) just as a conversation read runs, and
    refilled by its leader right after, before anything else the reader asks it."""

    backup: dict[int, Any] | None = None
    restores = 0

    def take_backup(self) -> None:
        self.backup = copy.deepcopy(self._shards)

    async def read_conversation(self, *args: Any) -> Any:
        if self.backup is None:
            return await super().read_conversation(*args)
        current, self._shards, self.backup = self._shards, self.backup, None
        self.restores += 1
        page = await super().read_conversation(*args)
        asyncio.get_running_loop().call_soon(setattr, self, "_shards", current)  # the refill
        return page


async def reads_from_a_replica_restored_under_the_read() -> dict[str, Any]:
    replicas: dict[str, MemoryReplica] = {
        "a": RestoredUnderTheRead("a"),
        **{r: MemoryReplica(r) for r in "bc"},
    }
    net = SimNetwork(random.Random(6), replicas)
    nodes = nodes_on(net, "abc")
    a = nodes["a"]
    shard = a.shard_of("X")
    await a.lead_shard(shard)
    await a.create_conversation("t", "X", "m@1", {})
    restored = replicas["a"]
    assert isinstance(restored, RestoredUnderTheRead)
    restored.take_backup()  # the copy holds the creation only
    acked = [
        (await a.append_event("t", "X", "message.user", {"content": f"m{i}"})).event_id
        for i in range(3)
    ]
    events = await a.list_events("t", "X", 0, 100)
    leader = a.leader(shard)
    assert leader is not None
    outcome = {
        "acked": acked,
        "read": [e.event_id for e in events],
        "restores": restored.restores,
        "noticed": leader.replicas_gone_backwards,
    }
    for node in nodes.values():
        await node.close()
    await net.close()
    return outcome


def test_a_replica_restored_under_a_read_and_refilled_serves_no_short_read() -> None:
    """The source's identity and status are read in the page's own snapshot
    (``read_page_snapshot``). Asked after the read, they passed: the same identity, and a
    status that the refill had already made whole, so the read answered the creation alone."""
    outcome = run(reads_from_a_replica_restored_under_the_read)
    assert outcome["restores"] == 1  # the read did go to the restored replica first
    assert outcome["read"] == outcome["acked"]
    assert outcome["noticed"] >= 1


# --- issue 32: a wiped or rolled-back replica neither acks nor confirms reads -----------------


async def sweep_forever(node: LogNode, period_s: float) -> None:
    """The Controller's identity sweep, every ``period_s``."""
    while True:
        await node.verify_replicas()
        await asyncio.sleep(period_s)


async def deposed_leader_writes_through_a_wiped_replica(effect: bool) -> dict[str, Any]:
    """``shared/repro/turn3/wiped_ack.py``: A leads at epoch 1; under a partial partition
    (node a cannot reach database b, node c cannot reach database a) C takes over through
    {b, c} and acks seq 2; database c loses its disk; within the sweep period A appends its
    own seq 2 and reads. ``effect``: the two seq 2 are two ``tool.effect`` of one attempt."""
    replicas = {r: MemoryReplica(r) for r in "abc"}
    net = SimNetwork(random.Random(1), replicas)
    nodes = nodes_on(net, "abc")
    sweeps = [asyncio.ensure_future(sweep_forever(n, 2.0)) for n in nodes.values()]
    await asyncio.sleep(0.1)
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    shard = a.shard_of("X")
    await a.lead_shard(shard)
    await a.create_conversation("t", "X", "m@1", {})
    await a.append_event("t", "X", "message.user", {"content": "m1"})
    if effect:
        attempt = {"attempt_id": "att1", "tool": "pay", "argument_digest": "d"}
        await a.append_event("t", "X", "tool.attempt", attempt)
    await asyncio.sleep(2.05)  # just after every node's sweep
    net.link_cut |= {("a", "b"), ("c", "a")}
    await c.lead_shard(shard)
    kind, payload = (
        ("tool.effect", {"attempt_id": "att1", "status": "committed"})
        if effect
        else ("message.user", {"content": "m2 by C"})
    )
    by_c = await c.append_event("t", "X", kind, payload)
    replicas["c"].wipe()  # database c loses its disk
    outcome: dict[str, Any] = {"by_c": by_c.event_id, "a_still_leads": a.leads(shard)}
    payload = {"attempt_id": "att1", "status": "failed"} if effect else {"content": "m2' by A"}
    reads: list[Callable[[], Awaitable[Any]]] = [
        lambda: a.append_event("t", "X", kind, payload),
        lambda: a.get_conversation("t", "X"),
    ]
    if effect:
        reads.append(lambda: a.tool_attempt("t", "X", "att1"))
    outcome["at_a"] = []
    for call in reads:
        try:
            await call()
            outcome["at_a"].append("answered")
        except ConvplaneError as exc:
            outcome["at_a"].append(exc.code)
    outcome["c_counts_at_a"] = a.identity.counts("c")
    await asyncio.sleep(6)
    net.heal()
    await asyncio.sleep(1)
    await b.lead_shard(shard)
    events = await b.list_events("t", "X", 0, 100)
    outcome["final"] = [e.event_id for e in events]
    for task in sweeps:
        task.cancel()
    for node in nodes.values():
        await node.close()
    await net.close()
    return outcome


@pytest.mark.parametrize("effect", [False, True], ids=["message", "tool_effect"])
def test_a_wiped_replica_never_counts_toward_a_deposed_leaders_acks_or_reads(
    effect: bool,
) -> None:
    """Before the fix the wiped store adopted A's epoch 1 on its first append, was refilled
    and acked A's seq 2 (with ``effect``: a second effect for a committed attempt), A's read
    confirmed through it, and the next leader stopped on ``would truncate committed lsn``.
    Every append now names the store the sweep vouched for; the wiped one refuses it."""
    outcome = run(lambda: deposed_leader_writes_through_a_wiped_replica(effect))
    assert outcome["a_still_leads"]  # A was never fenced: only the identity check stops it
    assert all(answer == "no_quorum" for answer in outcome["at_a"]), outcome["at_a"]
    assert outcome["c_counts_at_a"] is False  # quarantined by the refusal, before any sweep
    assert outcome["by_c"] in outcome["final"]


async def handoff_to_a_region_restored_from_its_own_backup(lagging: bool) -> dict[str, Any]:
    """``shared/repro/turn3/physical_restore.py``: A acks 5 events; database b is restored from
    a physical copy taken before them (same identity); A resigns and B (near c, far from a)
    takes the shard over. ``lagging``: node a could not reach database c while it acked, so
    the events were on {a, b} alone, and B's fastest prepare quorum {b, c} holds none."""
    replicas = {r: MemoryReplica(r) for r in "abc"}
    net = SimNetwork(random.Random(2), replicas)
    nodes = nodes_on(net, "abc")
    for node in nodes.values():
        await node.verify_replicas()
    net.stalled_s = {"a": 0.08}  # region a is far: B's promises from b and c come first
    a, b = nodes["a"], nodes["b"]
    shard = a.shard_of("X")
    await a.lead_shard(shard)
    await a.create_conversation("t", "X", "m@1", {})
    await asyncio.sleep(1.5)  # every replica holds the creation and the commit hint
    backup = replicas["b"].physical_copy()
    if lagging:
        net.link_cut.add(("a", "c"))
    acked = [
        (await a.append_event("t", "X", "message.user", {"content": f"m{i}"})).event_id
        for i in range(5)
    ]
    await asyncio.sleep(0.5)
    replicas["b"].restore_physical_copy(backup)
    net.heal()
    await a.resign_shard(shard)  # planned handoff: placement moves the shard to b
    await b.lead_shard(shard)
    got = {e.event_id for e in await b.list_events("t", "X", 0, 100)}
    leader = b.leader(shard)
    assert leader is not None
    outcome: dict[str, Any] = {
        "lost": sum(1 for e in acked if e not in got),
        "rolled_back": leader.rolled_back,
        "b_counts_at_b": b.identity.counts("b"),
    }
    quarantined = {r: n.identity.counts("b") for r, n in nodes.items()}
    for node in nodes.values():
        await node.verify_replicas()  # every node's next sweep reads the registries
    outcome["b_counts_after_sweeps"] = {r: n.identity.counts("b") for r, n in nodes.items()}
    outcome["b_counts_before_sweeps"] = quarantined
    links = {r: net.link("c", r) for r in "abc"}
    await rebuild_replica(links, "b", range(b.config.shard_count + 1), b.config)
    for node in nodes.values():
        await node.verify_replicas()
    outcome["b_counts_after_rebuild"] = all(n.identity.counts("b") for n in nodes.values())
    b_log = await replicas["b"].read_log(shard, 0, 100)
    outcome["b_holds_acked"] = sum(
        1 for e in b_log if json.loads(e.body).get("event_id") in set(acked)
    )
    for node in nodes.values():
        await node.close()
    await net.close()
    return outcome


@pytest.mark.parametrize("lagging", [False, True], ids=["caught_up", "lagging"])
def test_a_replica_restored_from_its_own_backup_loses_no_acked_event(lagging: bool) -> None:
    """Before the fix the lagging case lost 5 of 5 acked events: B recovered from {b, c},
    neither holding them, and b's restored copy passed every identity check. The other stores
    keep the position b had acknowledged; B finds b below it, leads through a's promise
    instead, and quarantines b everywhere until it is rebuilt and re-admitted."""
    outcome = run(lambda: handoff_to_a_region_restored_from_its_own_backup(lagging))
    assert outcome["lost"] == 0
    assert outcome["rolled_back"] == ["b"]
    assert outcome["b_counts_at_b"] is False
    assert outcome["b_counts_after_sweeps"] == {"a": False, "b": False, "c": False}
    assert outcome["b_counts_after_rebuild"] is True
    assert outcome["b_holds_acked"] == 5
