"""The region node's controller: failure detection, control leadership, placement, reconciliation.

Four loops, all bounded and under timeouts, around the pure cores in ``regions``:

* **probe** (every ``probe_interval_s``): every peer's health through the ``PeerProber`` port
  (``GET /peer/health`` over the pooled client in production); replies (with each peer's suspect set and led shards) feed ``regions.membership``.
* **learn + reconcile** (every ``placement_poll_s``): read newly committed records of the control
  shard and apply them (``regions.control.ControlState``), then make this node's leadership match
  the assignment: lead the shards assigned here (bounded concurrency, jittered retries), resign
  the ones assigned elsewhere, and point leader hints at the new owners so forwarding follows.
* **control** (same period): the alive region with the lowest name (by this node's view), a
  region-loss drill's target excepted until its drill ends (``control_excluded``), leads the
  control shard; while it does, it commits what ``PlacementDecider`` decides. A region deferred
  to that is not heard leading within ``control_handoff_wait_s`` is passed over
  (``regions.control_succession``).

Learning reads the control shard's committed entries straight from the replicas (the one with
the highest commit hint among those reachable, up to that hint; between reads of all, at least
every ``LEARN_READ_ALL_EVERY_S``, its own region's alone), not from the control leader over
HTTP: entries at or below a replica's commit hint are committed, the read needs no particular
node to be up, and a node that can reach no replica learns nothing new, which is right because
it can commit nothing either. The control leader itself reads through its own leader, and
applies a record only once a write quorum of replicas' commit hints covers it (it pushes them
first): what the leader acts on, every node that reaches a majority of replicas can learn. A
region-loss drill of the leader's own region cuts the leader off as soon as its fold applies
the drill's record, and the next leader is chosen by exactly what the nodes have learned; a
record the leader applied but nobody else could learn left the control shard with no leader.

Handing the control shard over obeys the same rule: the leader pushes its commit position and
resigns only once a write quorum's hints hold all of it; otherwise it keeps leading and tries
again at the next tick (a push lost to a network blip must not hand over what nobody learned).

A planned handoff lets the old leader stop first: before leading a shard that moved from a region
that is up, this node waits (at most ``handoff_wait_s``) until that region's health reply no
longer lists the shard. Fencing keeps it safe either way; the wait only avoids failed appends.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from eventlog.aio import bounded
from eventlog.backoff import Backoff, jittered
from eventlog.clock import Clock
from eventlog.errors import ConvplaneError, LeadershipChanged, NotLeader
from eventlog.leader import ShardLeader
from eventlog.model import LogEntry
from eventlog.node import LogNode
from eventlog.replica import ReplicaStore
from eventlog.stores.region_lease import RegionLease
from regions.control import (
    PLACEMENT_RECORD,
    ControlConfig,
    ControlState,
    OperatorAction,
    Placement,
    PlacementDecider,
)
from regions.control_succession import ControlSuccession
from regions.membership import Membership, MembershipConfig, statuses
from regions.ops_state import AUDIT_KEY
from services.config import ClusterConfig, NodeSettings
from services.control.node_slots import NodeSlots, reply_slots
from services.control.peer_probe import PeerProber
from services.control.region_nodes import RegionNodes, node_target
from services.supervisor import Supervisor

log = logging.getLogger("convplane.controller")

#: most control entries read per poll
CONTROL_READ_MAX = 256
#: how often the replicas' identities are swept (eventlog.identity): a wiped replica is
#: quarantined within this long (a leader's prepare re-reads voters' identities anyway)
VERIFY_REPLICAS_EVERY_S = 2.0
#: the most one read of new control records may take: far above its bounded calls (a
#: leadership check and a log read of a replica call's timeout each), so a read that takes
#: longer is stuck somewhere below, and it must not keep the fold's lock (the node would
#: never learn another control record)
LEARN_READ_DEADLINE_S = 10.0
#: a node that is not the control leader learns from its own region's replica alone (one
#: status read a poll, on its own host) and asks every replica at least this often: the
#: leader applies a record once a write quorum's commit hints hold it, which the node's own
#: replica almost always is part of; the read of all catches up a replica that was not
LEARN_READ_ALL_EVERY_S = 1.0


class Controller:
    def __init__(
        self,
        *,
        settings: NodeSettings,
        cluster: ClusterConfig,
        node: LogNode,
        replicas: Mapping[str, ReplicaStore],
        prober: PeerProber,
        clock: Clock,
        rng: random.Random,
        leases: Sequence[RegionLease] = (),
    ) -> None:
        self.region = settings.region
        self.settings = settings
        self.cluster = cluster
        self.node = node
        self.replicas = dict(replicas)
        self.control_shard = cluster.shard_count
        self._prober = prober
        #: where each region's nodes listen and which one leads it (``region_nodes``)
        self.nodes = RegionNodes(
            cluster, self.region, lost_after_s=settings.detection_s, now_s=clock.monotonic
        )
        #: which of the region's node slots this node leads (``node_slots``); a region of one
        #: node has one slot, always led by its node
        self.slots = NodeSlots(
            region=self.region,
            node_index=settings.node_index,
            leases=leases,
            slot_map=self.nodes.slot_map,
            detection_s=settings.detection_s,
            # a sibling handed its slot takes it within a lease poll or two
            handback_wait_s=5 * settings.region_lease_poll_s,
            clock=clock,
        )
        self._clock = clock
        self._rng = rng
        weights = cluster.weights()
        self.membership = Membership(
            self_region=self.region,
            regions=weights,
            config=MembershipConfig(settings.detection_s, settings.never_seen_grace_s),
            started_s=clock.monotonic(),
        )
        self.state = ControlState(shard_count=cluster.shard_count, regions=weights)
        self.decider = PlacementDecider(
            config=ControlConfig(
                failback_hysteresis_s=settings.failback_hysteresis_s,
                failback_shards_per_step=settings.failback_shards_per_step,
                failback_step_interval_s=settings.failback_step_interval_s,
            ),
            weights=weights,
        )
        self._lead_gate = asyncio.Semaphore(settings.lead_concurrency_max)
        self._leading: dict[int, asyncio.Task[None]] = {}
        self._control_leading: asyncio.Task[None] | None = None
        self._propose_lock = asyncio.Lock()
        self._learn_lock = asyncio.Lock()
        #: when learning last asked every replica (``LEARN_READ_ALL_EVERY_S``)
        self._learned_from_all_s = float("-inf")
        #: shard -> (previous owner, monotonic time the move was learned)
        self._moved: dict[int, tuple[str, float]] = {}
        self.supervisor = Supervisor(clock=clock, rng=rng)
        #: what each peer's last health reply said of its own background loops
        self._peer_unhealthy_loops: dict[str, list[str]] = {}
        #: the control leader each peer's last health reply named
        self._peer_control_leader: dict[str, str] = {}
        self.succession = ControlSuccession(self.region, settings.control_handoff_wait_s)
        #: called with every committed control entry, in lsn order, after the placement saw it,
        #: and whether the entry took effect as the new placement (services.control.drills.driver
        #: folds drill, halt and audit records, and the audit entries placement records carry, so)
        self.record_listeners: list[Callable[[LogEntry, bool], None]] = []
        #: regions that must not lead the control shard now, whatever their names: a
        #: region-loss drill's target until the drill ends (``OpsState.region_loss_targets``).
        #: The target learns that its black-hole lifted from the control shard itself, so the
        #: shard must stay with a survivor that keeps committing (and so publishing) the
        #: drill's records; handed to the target while it still believes itself cut off, it
        #: would be led by nobody until the drill's deadline
        self.control_excluded: Callable[[], frozenset[str]] = frozenset

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._reconcile_hints()
        self.supervisor.start("probe", self._probe_all, self.settings.probe_interval_s)
        if self.nodes.node_count(self.region) > 1:
            # apart from the peers' probes: a dead sibling's timeouts must not slow them
            self.supervisor.start(
                "probe-siblings", self._probe_siblings, self.settings.probe_interval_s
            )
        self.supervisor.start("learn-reconcile", self._tick, self.settings.placement_poll_s)
        self.supervisor.start("control", self._control, self.settings.placement_poll_s)
        self.supervisor.start("verify-replicas", self._verify_replicas, VERIFY_REPLICAS_EVERY_S)
        if self.slots.shared:
            self.supervisor.start(
                "region-lease", self._keep_slots, self.settings.region_lease_poll_s
            )

    async def close(self) -> None:
        await self.supervisor.close()
        tasks = list(self._leading.values())
        if self._control_leading is not None:
            tasks.append(self._control_leading)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- views for the API ----------------------------------------------------------------

    def placement(self) -> Placement:
        return self.state.effective()

    @property
    def leads_region(self) -> bool:
        """Whether this node leads any of its region's node slots."""
        return bool(self.slots.held)

    def readiness(self) -> tuple[int, int]:
        """(shards this node should lead, shards it leads): those of its region's shards in the
        slots it holds (a node holding none should lead none)."""
        mine = [s for s in self.placement().shards_of(self.region) if self.slots.leads(s)]
        return len(mine), sum(1 for s in mine if self.node.leads(s))

    def control_leader(self) -> str:
        """Who should lead the control shard, by this node's view: the alive region with the
        lowest name that is neither excluded (``control_excluded``) nor passed over
        (``regions.control_succession``)."""
        alive = self.membership.alive(self._clock.monotonic())
        return self.succession.choose(alive, self.control_excluded())

    def _heard_of(self, region: str) -> tuple[bool, str | None]:
        """Whether ``region`` last said it leads the control shard, and whom it named."""
        leads = self.control_shard in self.membership.led_shards_of(region)
        return leads, self._peer_control_leader.get(region)

    def health_reply(self) -> dict[str, Any]:
        now_s = self._clock.monotonic()
        led_shards = self.node.led_shards()
        region_slots, region_led_shards = self.slots.region_view(led_shards)
        return {
            "region": self.region,
            "node": self.settings.node_index,
            "leads_region": self.leads_region,
            "slots": sorted(self.slots.held),
            "wants_own_slot": self.slots.wants_own_slot(),
            "region_slots": region_slots,
            "region_led_shards": region_led_shards,
            "suspects": sorted(self.membership.suspects(now_s)),
            "led_shards": led_shards,
            "placement_version": self.state.version,
            "control_leader": self.control_leader(),
            "unhealthy_loops": self.supervisor.unhealthy(),
        }

    def _replica_state(self, region: str) -> str:
        verdict = self.node.identity.verdicts.get(region)
        return verdict.state if verdict is not None else "unknown"

    def unhealthy_loops(self, region: str) -> list[str]:
        """Background loops of ``region``'s node that stopped or crash-loop (as last heard)."""
        if region == self.region:
            return self.supervisor.unhealthy()
        return self._peer_unhealthy_loops.get(region, [])

    def regions_view(self) -> list[dict[str, Any]]:
        view = self.membership.view(self._clock.monotonic())
        placement = self.placement()
        return [
            {
                "name": r.name,
                "url": r.url,
                "status": view[r.name].status,
                "capacity_weight": r.capacity_weight,
                "suspected_by": list(view[r.name].suspected_by),
                "evacuated": r.name in placement.evacuated,
                "shards_assigned": len(placement.shards_of(r.name)),
                "unhealthy_loops": self.unhealthy_loops(r.name),
                "replica": self._replica_state(r.name),
            }
            for r in self.cluster.regions
        ]

    async def operator(
        self, action: OperatorAction, region: str, audit: Mapping[str, Any] | None = None
    ) -> Placement:
        """Evacuate or restore ``region``; only the control leader commits (else NotLeader with
        the control leader as hint, so the API forwards it there). ``audit``: the action's
        audit entry (``regions.ops_state.audit_body``), committed inside the placement record,
        so the move and its audit entry commit together or not at all."""
        if not self.node.leads(self.control_shard):
            raise NotLeader(
                f"{self.region} does not lead the control shard",
                shard=self.control_shard,
                leader_region=self.control_leader(),
                retry_after_s=0.5,
            )
        async with self._propose_lock:
            await self._catch_up()
            now_s = self._clock.monotonic()
            views = statuses(self.membership.view(now_s))
            placement = self.decider.operator(self.state, action, region, now_s, views)
            await self._commit(placement, audit)
        return self.placement()

    # --- probing --------------------------------------------------------------------------

    async def _probe_all(self) -> None:
        peers = [r for r in self.membership.regions if r != self.region]
        await asyncio.gather(*(self._probe(r) for r in peers))

    async def _ask(self, region: str, index: int) -> dict[str, Any] | None:
        """Node ``index`` of ``region``'s health reply, or None (no answer, or not that
        region's)."""
        try:
            body = await bounded(
                self._prober.health(node_target(region, index)), self.settings.probe_timeout_s
            )
        except TimeoutError:
            return None
        return body if isinstance(body, dict) and body.get("region") == region else None

    async def _probe(self, region: str) -> None:
        """Ask every node of ``region`` at once: it is up while any answers. Each reply says
        which slots its node holds and, as it knows them, which node holds each of its
        region's slots and what its nodes lead (so a node that did not answer this time is
        still placed); forwards of each shard go to the node heard holding its slot; what the
        node leading the control shard's slot says counts (suspects, control leader, loops),
        else the first that answered. Asking only that node would halve the answers a lossy
        link lets through: the simulator saw a region of two running nodes declared down."""
        count = self.nodes.node_count(region)
        replies = await self._ask_nodes(region, list(range(count)))
        answered = {i: body for i, body in replies.items() if body is not None}
        for index, body in replies.items():
            self.nodes.answering(region, index, body is not None)
        now_s = self._clock.monotonic()
        if not answered:
            self.membership.probe_failed(region, now_s)
            return
        led_shards: list[Any] = []
        for index, reply in answered.items():
            view = reply.get("region_slots")
            for slot, holder in enumerate(view if isinstance(view, list) else ()):
                if isinstance(holder, int):
                    self.nodes.heard(region, holder, [slot])
            self.nodes.heard(region, index, reply_slots(reply, count))
            shards = reply.get("region_led_shards", reply.get("led_shards", ()))
            led_shards.extend(shards if isinstance(shards, list) else ())
        body = answered.get(self.nodes.leading_node(region), next(iter(answered.values())))
        self.membership.probe_ok(
            region, now_s, suspects=body.get("suspects", ()), led_shards=led_shards
        )
        named = body.get("control_leader")
        if isinstance(named, str) and named in self.membership.regions:
            self._peer_control_leader[region] = named
        loops = body.get("unhealthy_loops", [])
        if isinstance(loops, list):
            self._peer_unhealthy_loops[region] = [str(x)[:64] for x in loops[:16]]

    async def node_answers(self, region: str, index: int) -> bool:
        """Whether node ``index`` of ``region`` answers a health probe now (within the probe
        timeout): a drill that kills one node asks that node itself, since its region keeps
        answering through its other nodes."""
        return await self._ask(region, index) is not None

    async def _ask_nodes(self, region: str, indices: list[int]) -> dict[int, dict[str, Any] | None]:
        replies = await asyncio.gather(*(self._ask(region, i) for i in indices))
        return dict(zip(indices, replies, strict=True))

    async def _probe_siblings(self) -> None:
        """Which slots this region's other nodes hold (where what this node is sent for them
        goes), and which of them ask for their own slot back (``node_slots``)."""
        own = self.settings.node_index
        self.nodes.heard(self.region, own, self.slots.held)
        siblings = [i for i in range(self.nodes.node_count(self.region)) if i != own]
        replies = await self._ask_nodes(self.region, siblings)
        for index, body in replies.items():
            if body is not None:
                self.nodes.heard(self.region, index, self.slots.heard_sibling(index, body))

    def answers_probes(self) -> bool:
        """Whether peers may count this node's region up on its word (``node_slots``)."""
        return self.slots.answers_probes()

    async def _keep_slots(self) -> None:
        """Keep this node's slot leases (``node_slots``), and lead the shards of slots taken."""
        if await self.slots.keep(self._resign_slot):
            self.nodes.heard(self.region, self.settings.node_index, self.slots.held)
            await self._reconcile()

    async def _resign_slot(self, slot: int) -> None:
        for shard in self.node.led_shards():
            if self.slots.slot_of(shard) == slot:
                await self.node.resign_shard(shard)

    async def _verify_replicas(self) -> None:
        for region in await self.node.verify_replicas():
            verdict = self.node.identity.verdicts[region]
            log.error(
                "replica %s QUARANTINED: its identity %s is not the one the cluster knows (%s); "
                "it neither votes nor acks until `convplane replica rebuild --region %s`",
                region,
                verdict.found,
                verdict.expected.store_id if verdict.expected else "contested",
                region,
            )

    # --- learn, reconcile, lead the control shard -----------------------------------------

    async def _tick(self) -> None:
        await self._learn()
        await self._reconcile()

    async def _learn(self) -> None:
        async with self._learn_lock:
            before = self.state.effective()
            async with asyncio.timeout(LEARN_READ_DEADLINE_S):
                entries = await self._read_control()
            for entry in entries:
                if entry.lsn > self.state.applied_lsn:  # a concurrent learn may have applied it
                    skipped = self.state.skipped_records
                    applied = self.state.apply(entry.lsn, entry.event_type, entry.body)
                    if self.state.skipped_records > skipped:
                        log.warning("control record skipped: %s", self.state.last_skipped[-1])
                    for listener in self.record_listeners:
                        listener(entry, applied)
            after = self.state.effective()
        if after.version != before.version:
            now_s = self._clock.monotonic()
            for shard, owner in after.assignment.items():
                if owner == self.region and before.assignment.get(shard) not in (None, owner):
                    self._moved[shard] = (before.assignment[shard], now_s)
            log.warning("placement v%d: %s", after.version, after.reason)

    async def _read_control(self) -> list[LogEntry]:
        shard = self.control_shard
        if self.node.leads(shard):
            entries = await self.node.read_committed(
                shard, self.state.applied_lsn, CONTROL_READ_MAX
            )
            leader = self.node.leader(shard)
            if not entries or leader is None:
                return []
            published_lsn = await self._publish_control(leader, entries[-1].lsn)
            return [e for e in entries if e.lsn <= published_lsn]
        now_s = self._clock.monotonic()
        suspects = self.membership.suspects(now_s)
        sources = [r for r in self.replicas if r not in suspects]
        if now_s - self._learned_from_all_s < LEARN_READ_ALL_EVERY_S and self._own_replica_counts():
            sources = [self.region]
        else:
            self._learned_from_all_s = now_s
        timeout_s = self.settings.control_read_timeout_s
        replies = await asyncio.gather(
            *(bounded(self.replicas[r].status(shard), timeout_s) for r in sources),
            return_exceptions=True,
        )
        hints = [
            (s.commit_lsn, r)
            for r, s in zip(sources, replies, strict=True)
            if not isinstance(s, BaseException)
        ]
        if not hints:
            self._learned_from_all_s = float("-inf")  # ask them all next time
            return []
        commit_lsn, best = max(hints)
        after = self.state.applied_lsn
        if commit_lsn <= after:
            return []
        entries = await bounded(
            self.replicas[best].read_log(shard, after, min(CONTROL_READ_MAX, commit_lsn - after)),
            timeout_s,
        )
        return [e for e in entries if e.lsn <= commit_lsn]

    def _own_replica_counts(self) -> bool:
        return self.region in self.replicas and self.node.identity.counts(self.region)

    async def _publish_control(self, leader: ShardLeader, lsn: int) -> int:
        """Push the control leader's commit position (``ShardLeader.publish_commit``) and
        return the highest lsn that a write quorum of counted replicas' commit hints holds now,
        asking them if the push alone does not show ``lsn`` there."""
        shard = self.control_shard
        if leader.serving:
            await leader.publish_commit(self.node.config.replica_call_timeout_s)
        counted = [r for r in self.replicas if self.node.identity.counts(r)]
        timeout_s = self.settings.control_read_timeout_s
        replies = await asyncio.gather(
            *(bounded(self.replicas[r].status(shard), timeout_s) for r in counted),
            return_exceptions=True,
        )
        hints = sorted(
            (s.commit_lsn for s in replies if not isinstance(s, BaseException)), reverse=True
        )
        quorum = self.node.config.quorum(len(self.replicas))
        published_lsn = hints[quorum - 1] if len(hints) >= quorum else 0
        if published_lsn < lsn:
            log.warning("control shard: lsn %d not yet at a quorum of commit hints", lsn)
        return published_lsn

    def _reconcile_hints(self) -> None:
        for shard, owner in self.placement().assignment.items():
            if owner != self.region:
                self.node.set_leader_hint(shard, owner)

    async def _reconcile(self) -> None:
        """Start leading every shard assigned here (all at once, before anything below
        awaits: a request for one waits for its lead under way, ``await_lead_here``), then
        resign the others and point their hints at their owners."""
        assignment = sorted(self.placement().assignment.items())
        for shard, owner in assignment:
            if owner == self.region and self.slots.leads(shard):
                self._start_lead(shard)
        for shard, owner in assignment:
            if owner == self.region and self.slots.leads(shard):
                continue
            if self.node.leader(shard) is not None:
                now = owner if owner != self.region else "another node of this region"
                log.warning("shard %d: resigning, now led by %s", shard, now)
                await self.node.resign_shard(shard)
            self.node.set_leader_hint(shard, owner)

    def _start_lead(self, shard: int) -> asyncio.Task[None] | None:
        """The lead of ``shard`` under way here, started now if it was not (None: this node
        leads it already)."""
        if self.node.leads(shard):
            return None
        task = self._leading.get(shard)
        if task is None:
            task = self._leading[shard] = asyncio.create_task(
                self._lead(shard), name=f"lead-{shard}"
            )
            task.add_done_callback(functools.partial(self._lead_done, shard))
        return task

    def _lead_done(self, shard: int, _task: asyncio.Task[None]) -> None:
        self._leading.pop(shard, None)

    async def await_lead_here(self, shard: int, timeout_s: float) -> bool:
        """Whether this node leads ``shard`` once the lead of it under way here has ended,
        waiting at most ``timeout_s``. A node that has just taken a dead sibling's slot (or
        just started) is preparing the slot's shards: a request for one of them waits for its
        leader rather than being told to come back later (503 not_leader)."""
        if timeout_s > 0 and self._assigned_here(shard):
            # started here if the slot was taken a moment ago and the loop that leads its
            # shards has not come to this one yet
            task = self._start_lead(shard)
            if task is not None:
                await asyncio.wait({task}, timeout=timeout_s)  # never cancels the lead
        return self.node.leads(shard)

    def _assigned_here(self, shard: int) -> bool:
        return self.slots.leads(shard) and self.placement().assignment.get(shard) == self.region

    async def _lead(self, shard: int) -> None:
        """Lead an assigned shard; retry with jittered, doubling backoff under
        ``lead_attempts_max`` while it stays assigned here."""
        await self._await_handoff(shard)
        backoff = Backoff(
            self.settings.lead_backoff_min_s, self.settings.lead_backoff_max_s, self._rng
        )
        for attempt in range(1, self.settings.lead_attempts_max + 1):
            if not self._assigned_here(shard):
                return
            try:
                async with self._lead_gate:
                    epoch = await self.node.lead_shard(shard)
                log.info("shard %d: leading at epoch %d", shard, epoch)
                if not self._assigned_here(shard):
                    await self.node.resign_shard(shard)
                return
            except ConvplaneError as exc:
                if attempt == 1 or attempt % 20 == 0:
                    log.warning("shard %d: lead attempt %d failed: %s", shard, attempt, exc)
            await self._clock.sleep(backoff.next_s())

    async def _await_handoff(self, shard: int) -> None:
        moved = self._moved.pop(shard, None)
        if moved is None:
            return
        previous, learned_s = moved
        deadline_s = learned_s + self.settings.handoff_wait_s
        while self._clock.monotonic() < deadline_s:
            now_s = self._clock.monotonic()
            if self.membership.status(previous, now_s) != "up":
                return  # failover: the old leader is gone, nobody to wait for
            if self.membership.heard_since(
                previous, learned_s
            ) and shard not in self.membership.led_shards_of(previous):
                return  # the old leader stopped
            await self._clock.sleep(self.settings.probe_interval_s / 2)

    async def _control(self) -> None:
        shard = self.control_shard
        now_s = self._clock.monotonic()
        passed_over = set(self.succession.passed_over)
        self.succession.observe(
            now_s, self.membership.alive(now_s), self.control_excluded(), self._heard_of
        )
        for region in sorted(self.succession.passed_over.keys() - passed_over):
            log.error(
                "control shard: %s was chosen but has not led it for %.0fs; passed over",
                region,
                self.succession.wait_s,
            )
        leader = self.control_leader()
        if leader != self.region or not self.slots.leads(shard):
            self.node.set_leader_hint(shard, leader)
            await self._hand_over_control(leader)
            return
        if not self.node.leads(shard):
            if self._control_leading is None or self._control_leading.done():
                self._control_leading = asyncio.create_task(
                    self._lead_control(), name="lead-control"
                )
            return
        if self._propose_lock.locked():
            return
        async with self._propose_lock:
            await self._catch_up()
            views = statuses(self.membership.view(now_s))
            placement = self.decider.next_placement(self.state, now_s, views)
            if placement is not None:
                await self._commit(placement)

    async def _hand_over_control(self, successor: str) -> None:
        """Resign the control shard in favour of ``successor``, once a write quorum's commit
        hints hold everything this leader committed: the successor learns from those hints,
        and one that has not learned the records that made it the successor defers back to
        this region. A push that does not land keeps this node leading until the next tick.
        A leader that no longer serves (fenced, stopped) has nothing left to publish."""
        shard = self.control_shard
        leader = self.node.leader(shard)
        if leader is None:
            return
        if leader.serving:
            published_lsn = await self._publish_control(leader, leader.commit_lsn)
            if published_lsn < leader.commit_lsn:
                log.warning("control shard: not handed to %s yet: commit not published", successor)
                return
            if self.node.leader(shard) is not leader:
                return  # re-led or resigned meanwhile: not this call's to stop
        log.warning("control shard: resigning in favour of %s", successor)
        await self.node.resign_shard(shard)

    async def _lead_control(self) -> None:
        try:
            epoch = await self.node.lead_shard(self.control_shard)
            log.warning("control shard: leading at epoch %d", epoch)
        except ConvplaneError as exc:
            log.warning("control shard: lead failed: %s", exc)
            await self._clock.sleep(
                jittered(self.settings.lead_backoff_min_s, self._rng, low=1.0, width=1.0)
            )

    async def read_barrier(self) -> None:
        """A linearizable point for reads of what the control shard holds (drills, halt,
        audit): at the control leader, leadership is confirmed (``eventlog.read_index``) and
        every record committed before this call is applied, so a read after it sees every
        operator action acknowledged before the read began, wherever that action entered.
        Elsewhere NotLeader names the control leader (the API forwards the read there): a
        follower's fold trails the leader by a poll and cannot promise that."""
        shard = self.control_shard
        leader = self.node.leader(shard)
        if leader is None or not self.node.leads(shard):
            raise NotLeader(
                f"{self.region} does not lead the control shard",
                shard=shard,
                leader_region=self.control_leader(),
                retry_after_s=0.5,
            )
        await leader.confirm_leadership()
        target_lsn = leader.commit_lsn
        while self.state.applied_lsn < target_lsn:
            applied_lsn = self.state.applied_lsn
            await self._learn()
            if self.state.applied_lsn == applied_lsn:
                raise LeadershipChanged(
                    f"control shard: could not apply up to lsn {target_lsn}; retry",
                    retry_after_s=0.5,
                )

    async def _catch_up(self) -> None:
        """Apply every committed control record before deciding anything."""
        leader = self.node.leader(self.control_shard)
        while leader is not None and self.state.applied_lsn < leader.commit_lsn:
            applied_lsn = self.state.applied_lsn
            await self._learn()
            if self.state.applied_lsn == applied_lsn:
                return

    async def _commit(self, placement: Placement, audit: Mapping[str, Any] | None = None) -> None:
        body = placement.to_body()
        if audit is not None:
            body[AUDIT_KEY] = dict(audit)
        lsn = await self.node.append_record(self.control_shard, PLACEMENT_RECORD, body)
        log.warning(
            "committed placement v%d at lsn %d: %s", placement.version, lsn, placement.reason
        )
        await self._learn()
