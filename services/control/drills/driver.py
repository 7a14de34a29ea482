"""The drill driver: runs drills, the halt switch and the audit log from the control shard.

Every node runs one ``DrillDriver``; only the node that leads the control shard drives. Each
step (every ``DRIVER_TICK_S``) it reads the active drills from ``OpsState`` (learned from the
control shard), observes the world, asks ``regions.drills.advance`` for the next record and
commits it to the control shard; then it carries out what the phase asks (evacuate, restore,
canary rounds, the read-back). Because every decision starts from the committed record, a new
control leader (the old one crashed, was the drill's target, or lost an election) continues the
drill where the records left it; canary counts and RTOs so far are in the record too.

Only the control leader writes ``control.drill`` records, and on it one lock serializes them
(driver steps, operator aborts), so a record always names the revision it follows; a record of a
deposed leader names a stale revision and applies as a no-op (``OpsState``).

On every node the driver also fences the node when it is itself a region-loss target: it resigns
the shards it leads (its appends could not reach a quorum anyway, ``services.control.drills.faults``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx

from eventlog.backoff import Backoff
from eventlog.clock import Clock
from eventlog.errors import (
    Conflict,
    ConvplaneError,
    InvariantViolation,
    NotFound,
)
from eventlog.http_headers import PEER_AUTH_HEADER
from eventlog.node import LogNode
from eventlog.replica import ReplicaStore
from regions.control import OperatorAction
from regions.drill_kinds import rules_of
from regions.drill_llm_metrics import (
    first_takeover_ms,
    snapshots_of,
    warm_counts,
    warm_events_of,
)
from regions.drill_plan import DrillPlan, LiveLoad, preflight
from regions.drills import (
    SERIES_POINTS_MAX,
    Drill,
    DrillSpec,
    Measurements,
    Observation,
    advance,
    out_of_time,
    request_abort,
    shards_by_region,
    shards_taken,
    start,
    with_measurements,
)
from regions.membership import statuses
from regions.ops_state import (
    AUDIT_KEY,
    AUDIT_RECORD,
    DRILL_RECORD,
    HALT_RECORD,
    OpsState,
    audit_body,
)
from regions.placement import SlotMap
from services.control.controller import Controller
from services.control.drills.canary import CanaryFleet
from services.control.drills.load import LoadMeter, PlaneLoad, ReplayView, moved_load, plane_load
from services.control.region_nodes import PeerUrlOf, node_target

log = logging.getLogger("convplane.drills")

DRIVER_TICK_S = 0.2
#: preflight's canary write to every shard: attempts per shard before the drill is refused
PREFLIGHT_CANARY_ATTEMPTS = 3
#: a progress record (canary numbers) at most this often, and at most about this many per
#: drill (a long hold writes them further apart: the control shard stays small)
PROGRESS_EVERY_S = 2.0
PROGRESS_RECORDS_PER_DRILL_MAX = 120
#: a committed record shows up in OpsState within this long, or the step gives up
APPLY_WAIT_S = 2.0
#: one peer call of the driver (load, canary) and the dry run's replica reads
PEER_CALL_TIMEOUT_S = 1.0
#: a node is restarted by nobody: a crashed step is logged and the loop goes on, backing off
STEP_BACKOFF_MAX_S = 5.0


class PreflightFailed(Conflict):
    code = "preflight_failed"


class DrillDriver:
    def __init__(
        self,
        *,
        controller: Controller,
        node: LogNode,
        ops: OpsState,
        replicas: Mapping[str, ReplicaStore],
        peers: httpx.AsyncClient,
        peer_url: PeerUrlOf,
        peer_secret: str | None,
        load: LoadMeter,
        clock: Clock,
        region_append_capacity_per_s: float,
        replay_view: ReplayView | None = None,
        drill_token: Callable[[], str] = lambda: secrets.token_hex(4),
    ) -> None:
        """``drill_token``: the random part of a new drill's id (the simulator seeds it: canary
        conversations are named after the drill, so their shards follow from it)."""
        self.region = controller.region
        self.controller = controller
        self.node = node
        self.ops = ops
        self.load = load
        self._replicas = dict(replicas)
        self._peers = peers
        self._peer_url = peer_url  # read live: the node leading a shard may change
        self._peer_headers = {PEER_AUTH_HEADER: peer_secret} if peer_secret else {}
        self._clock = clock
        self._capacity_per_s = region_append_capacity_per_s
        self._replay_view = replay_view
        self._drill_token = drill_token
        self._shard_count = controller.cluster.shard_count
        self._slot_map = SlotMap(controller.cluster.shard_count, controller.cluster.weights())
        self._write_lock = asyncio.Lock()
        self._canaries = CanaryFleet(
            node=node,
            owners=self._owners,
            drill_of=self.ops.drills.get,
            peers=peers,
            peer_url=peer_url,
            peer_secret=peer_secret,
            peer_call_timeout_s=PEER_CALL_TIMEOUT_S,
            model_revision=controller.cluster.default_model_revision,
            shard_count=controller.cluster.shard_count,
            clock=clock,
            served_by=node_target(self.region, controller.settings.node_index),
        )
        self._progress_at_s: dict[str, float] = {}
        self._fenced_for: str | None = None
        self._loop: asyncio.Task[None] | None = None
        self.step_failures = 0
        self.last_step_error: str | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.create_task(self._forever(), name=f"drills-{self.region}")

    async def close(self) -> None:
        tasks = self._canaries.tasks()
        if self._loop is not None:
            tasks.append(self._loop)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _forever(self) -> None:
        # a step every tick; after failures twice the last wait, doubling up to the cap. Not
        # jittered (low=1, width=0): one driver per node, nothing to spread. Its draws never
        # change a wait; a rng of its own, seeded, keeps them out of every shared stream (the
        # simulator's seeds replay the same) and deterministic themselves
        backoff = Backoff(
            min(DRIVER_TICK_S * 2, STEP_BACKOFF_MAX_S),
            STEP_BACKOFF_MAX_S,
            random.Random(0),
            1.0,
            0.0,
        )
        while True:
            try:
                await self.step()
                backoff.reset()
                delay_s = DRIVER_TICK_S
            except InvariantViolation:
                raise  # a bug: never swallowed
            except (ConvplaneError, httpx.HTTPError, OSError, TimeoutError) as exc:
                self._step_failed(exc)
                delay_s = backoff.next_s()
            except Exception as exc:  # supervised: the loop goes on, the failure shows
                log.exception("drill step crashed")
                self._step_failed(exc)
                backoff.current_s = delay_s = STEP_BACKOFF_MAX_S
            await self._clock.sleep(delay_s)

    def _step_failed(self, exc: BaseException) -> None:
        log.warning("drill step: %r", exc)
        self.step_failures += 1
        self.last_step_error = repr(exc)[:500]

    def health(self) -> dict[str, Any]:
        """What ``GET /v1/drills`` shows of this node's driver."""
        return {
            "region": self.region,
            "leads_control": self.leads_control,
            "step_failures": self.step_failures,
            "last_step_error": self.last_step_error,
            "stale_records": self.ops.stale_records,
            "malformed_records": self.ops.malformed_records,
        }

    # --- the step -------------------------------------------------------------------------

    @property
    def leads_control(self) -> bool:
        return self.node.leads(self.controller.control_shard)

    async def step(self) -> None:
        await self._fence_if_target()
        if not self.leads_control:
            self._canaries.stop(keep=())
            return
        active = self.ops.active_drills()
        self._canaries.stop(keep=[d.drill_id for d in active])
        for drill in active:
            await self._drive(drill)

    async def _fence_if_target(self) -> None:
        holed = self.ops.black_holed(self._clock.wall_ms())
        if self.region not in holed:
            self._fenced_for = None
            return
        for shard in self.node.led_shards():
            await self.node.resign_shard(shard)
        if self._fenced_for is None:
            log.warning("%s is a region-loss drill target: fenced itself", self.region)
            self._fenced_for = self.region

    async def _drive(self, drill: Drill) -> None:
        runner = self._canaries.runner(drill)
        placement = self.controller.placement()
        region = drill.spec.region
        fault = rules_of(drill.spec.kind).fault
        if drill.phase == "injecting" and fault == "placement":
            if region not in placement.evacuated:
                try:
                    await self.controller.operator("evacuate", region)
                except Conflict as exc:
                    # the plane changed since preflight (other regions evacuated or down): the
                    # evacuation would leave no region to lead, now and on every retry. End the
                    # drill, as an abort does, instead of injecting forever.
                    aborted = request_abort(
                        drill, f"cannot inject: {exc.message}", self._clock.wall_ms()
                    )
                    if aborted is not None:
                        await self.commit_drill(aborted)
                    return
                placement = self.controller.placement()
        restored = False
        canary_lost = None
        read_back_failed = None
        if drill.phase == "restoring":
            late = out_of_time(drill, self._clock.wall_ms())
            restored = await self._restore(drill)
            # read back once the target is back and (a loss or a kill) every moved shard is
            # writable again (a placement fault's shards were writable all along), or at the deadline
            # whatever the target's state: the drill must end then
            if late or (
                restored
                and (
                    fault == "placement"
                    or all(s in runner.rto_s for s in drill.measurements.shards_moved)
                )
            ):
                await self._canaries.stop_writing(drill.drill_id)
                try:
                    canary_lost = await runner.read_back(self._owners())
                except (ConvplaneError, httpx.HTTPError, OSError, TimeoutError) as exc:
                    if not late:
                        raise  # retried next step, until the deadline
                    read_back_failed = repr(exc)[:200]
        error_ratio, ack_p99_ms = runner.window()
        obs = Observation(
            now_ms=self._clock.wall_ms(),
            halt_on=self.ops.halt.on,
            injected=drill.phase != "injecting" or await self._injected(drill),
            # region-loss and kill: the fault follows the first record (at once, or at the
            # supervisor's next poll), so RTO counts from it
            injected_at_ms=drill.created_at_ms if fault != "placement" else None,
            shards_moved=drill.measurements.shards_moved,
            error_ratio=error_ratio,
            ack_p99_ms=ack_p99_ms,
            restored=restored,
            canary_lost=canary_lost,
            read_back_failed=read_back_failed,
        )
        measured = runner.measurements(drill)
        key = "after" if drill.phase == "restoring" else "during"
        if placement.version > measured.placement_versions.get(key, 0):
            measured = replace(
                measured,
                placement_versions={**measured.placement_versions, key: placement.version},
                placement_shards={
                    **measured.placement_shards,
                    key: shards_by_region(placement.assignment),
                },
            )
        following = advance(replace(drill, measurements=measured), obs)
        now_s = self._clock.monotonic()
        if following is not None:
            if following.phase == "restoring" and drill.phase != "restoring":
                # what replay rebuilt while the region was out (not its failback's replays)
                following = await self._with_replay_figures(following, "restore")
            elif not following.active:
                following = await self._with_replay_figures(following, "end")
            await self.commit_drill(following)
            self._progress_at_s[drill.drill_id] = now_s
        elif now_s - self._progress_at_s.get(drill.drill_id, 0.0) >= _progress_every_s(drill):
            self._progress_at_s[drill.drill_id] = now_s
            load = await self._plane_load()
            t_s = (self._clock.wall_ms() - drill.created_at_ms) / 1000
            measured = replace(
                measured,
                live_appends=(
                    *measured.live_appends,
                    (t_s, load.append_rate_per_s, load.live_errors_per_s, load.live_error_ratio()),
                )[-SERIES_POINTS_MAX:],
                replay_latest=(load.replay_tally() if drill.phase != "restoring" else None)
                or measured.replay_latest,
            )
            await self.commit_drill(with_measurements(drill, measured))

    async def _plane_load(self) -> PlaneLoad:
        return await plane_load(
            self._peers,
            self._peer_url,
            [r.name for r in self.controller.cluster.regions],
            self.region,
            self._peer_headers,
            self.load,
            self._replay_view,
        )

    async def _with_replay_figures(self, drill: Drill, moment: str) -> Drill:
        """The drill with the engines' snapshots at ``moment``; as the fault ends
        (``"restore"``) also replay's counts and the cache-recovery curve so far."""
        m = drill.measurements
        if m.replay_before is None:
            return drill
        load = await self._plane_load()
        measured = replace(
            m, engine_snapshots={**m.engine_snapshots, moment: snapshots_of(load.replay)}
        )
        if moment == "restore":
            warm, takeover_s = m.warm_points, m.takeover_s
            injected_ms, target = drill.injected_at_ms, drill.spec.region
            if injected_ms is not None:
                events = warm_events_of(load.replay, excluding=target)
                warm = warm_counts(events, injected_ms, self._clock.wall_ms())
                took_ms = first_takeover_ms(load.replay, excluding=target, since_ms=injected_ms)
                takeover_s = None if took_ms is None else (took_ms - injected_ms) / 1000
            measured = replace(
                measured,
                replay_latest=load.replay_tally() or m.replay_latest,
                warm_points=warm,
                takeover_s=takeover_s,
            )
        return replace(drill, measurements=measured)

    async def _injected(self, drill: Drill) -> bool:
        fault = rules_of(drill.spec.kind).fault
        if fault == "placement":
            return drill.spec.region in self.controller.placement().evacuated
        if drill.spec.node is not None:  # one node killed: it stops answering, its region not
            return not await self.controller.node_answers(drill.spec.region, drill.spec.node)
        if fault == "process":  # the local supervisor killed it: nobody hears it
            now_s = self._clock.monotonic()
            return self.controller.membership.status(drill.spec.region, now_s) != "up"
        return True  # a black-hole: the committed injecting record is the fault

    async def _restore(self, drill: Drill) -> bool:
        """Give the target back; True once the placement no longer excludes it (and a killed
        node answers again). A failed restore is retried next step (until the drill's deadline
        ends it)."""
        region = drill.spec.region
        placement = self.controller.placement()
        now_s = self._clock.monotonic()
        if self.controller.membership.status(region, now_s) != "up":
            return False  # the black-hole is lifted (phase); wait until the region answers
        if region in placement.down | placement.evacuated:
            try:
                await self.controller.operator("restore", region)
            except (ConvplaneError, httpx.HTTPError, OSError, TimeoutError) as exc:
                self._step_failed(exc)
                return False
            placement = self.controller.placement()
        if region in placement.down | placement.evacuated:
            return False
        return drill.spec.node is None or await self.controller.node_answers(
            region, drill.spec.node
        )

    # --- canaries -------------------------------------------------------------------------

    def _owners(self) -> dict[int, str]:
        return dict(self.controller.placement().assignment)

    # --- operator actions (the API calls these on the control leader) ---------------------

    async def read_barrier(self) -> None:
        """Before a read of ``ops`` or an action decided on it: this node leads the control
        shard and has applied everything committed there (``Controller.read_barrier``; NotLeader
        elsewhere, which the API forwards)."""
        await self.controller.read_barrier()

    async def plan(self, spec: DrillSpec) -> DrillPlan:
        plan, _ = await self._plan(spec)
        return plan

    async def _plan(self, spec: DrillSpec) -> tuple[DrillPlan, PlaneLoad]:
        await self.read_barrier()
        now_s = self._clock.monotonic()
        placement = self.controller.placement()
        weights = self.controller.cluster.weights()
        node_count = self._node_count(spec.region)
        moved_shards = shards_taken(
            spec, placement.shards_of(spec.region), node_count, self._slot_map
        )
        load = await self._plane_load()
        plan = preflight(
            spec,
            statuses=statuses(self.controller.membership.view(now_s)),
            weights=weights,
            placement=placement,
            active=self.ops.active_drills(),
            halt=self.ops.halt,
            load=LiveLoad(
                load.append_rate_per_s,
                self._capacity_per_s,
                spare_prefill_tokens_per_s=load.spare_prefill_tokens_per_s(spec.region),
                live_prefill_tokens_per_s=load.live_prefill_tokens_per_s(),
                survivor_prefill_capacity_tokens_per_s=(
                    load.survivor_prefill_capacity_tokens_per_s(spec.region)
                ),
            ),
            moved_load=await moved_load(
                self._replicas.get(self.region),
                moved_shards,
                since_ms=self._clock.wall_ms()
                - int(self.controller.cluster.replay.replay_window_s * 1000),
            ),
            kill_supported=self.controller.cluster.local_supervisor,
            node_count=node_count,
        )
        return plan, load

    def _node_count(self, region: str) -> int:
        """How many nodes ``region`` runs (0: no such region, so it has no shards either)."""
        known = {r.name: r.node_count for r in self.controller.cluster.regions}
        return known.get(region, 0)

    async def create(self, spec: DrillSpec, *, by: str, role: str) -> tuple[Drill, DrillPlan]:
        """Preflight, then commit the drill's first record and an audit entry; raises
        ``PreflightFailed`` (nothing committed) when preflight refuses."""
        async with self._write_lock:
            plan, load = await self._plan(spec)
            if not plan.ok:
                raise PreflightFailed("preflight refused the drill: " + "; ".join(plan.failures))
            now_ms = self._clock.wall_ms()
            day = datetime.fromtimestamp(now_ms / 1000, tz=UTC).strftime("%Y%m%d")
            drill_id = f"d{day}-{self._drill_token()}"
            placement = self.controller.placement()
            region_shards = placement.shards_of(spec.region)
            measured = Measurements(
                shards_moved=tuple(
                    shards_taken(
                        spec,
                        region_shards,
                        self._node_count(spec.region),
                        self._slot_map,
                    )
                ),
                placement_versions={"before": placement.version},
                placement_shards={"before": shards_by_region(placement.assignment)},
                replay_before=load.replay_tally(),
                replay_time_min_s=plan.replay_time_min_s,
                replay_spare_tokens_per_s=load.spare_prefill_tokens_per_s(spec.region),
                engine_snapshots={"start": snapshots_of(load.replay)} if load.replay else {},
            )
            measured = await self._first_canaries(
                replace(start(drill_id, spec, now_ms), measurements=measured)
            )
            # the fault starts with the first record (a region-loss's injection time): stamp it
            # after the preflight writes, which may take a while
            drill = replace(start(drill_id, spec, self._clock.wall_ms()), measurements=measured)
            audit = self.audit_entry(
                by,
                role,
                "drill.start",
                spec.region,
                spec.reason,
                {
                    "drill_id": drill_id,
                    "kind": spec.kind,
                    "hold_s": spec.hold_s,
                    "force": spec.force,
                    **({} if spec.node is None else {"node": spec.node}),
                },
            )
            await self._commit_locked(drill, audit)
        return self.ops.drills.get(drill_id, drill), plan

    async def _first_canaries(self, drill: Drill) -> Measurements:
        """The last preflight check, before the fault: one canary write to every shard (it also
        creates the canary conversations, so the fault's measurements start from a baseline).
        A shard that cannot take one refuses the drill."""
        runner = self._canaries.new_runner(drill)
        failed = list(range(self._shard_count))
        for _ in range(PREFLIGHT_CANARY_ATTEMPTS):
            owners = self._owners()
            await asyncio.gather(*(runner.write(drill, s, owners[s]) for s in failed))
            failed = sorted(s for s, n in runner.acked.items() if n == 0)
            if not failed:
                break
        if failed:
            raise PreflightFailed(f"preflight refused the drill: shards not writable: {failed}")
        return runner.measurements(drill)

    async def abort(self, drill_id: str, *, by: str, role: str, reason: str) -> Drill:
        async with self._write_lock:
            await self.read_barrier()
            drill = self.ops.drills.get(drill_id)
            if drill is None:
                raise NotFound(f"no drill {drill_id!r}")
            audit = self.audit_entry(
                by, role, "drill.abort", drill.spec.region, reason, {"drill_id": drill_id}
            )
            aborted = request_abort(drill, f"aborted by {by}: {reason}", self._clock.wall_ms())
            if aborted is None:  # already restoring or over: the request alone is audited
                await self._append(AUDIT_RECORD, audit)
            else:
                await self._commit_locked(aborted, audit)
        return self.ops.drills[drill_id]

    async def set_halt(self, on: bool, *, by: str, role: str, reason: str) -> dict[str, Any]:
        async with self._write_lock:
            await self.read_barrier()
            now_ms = self._clock.wall_ms()
            audit = self.audit_entry(by, role, "halt.on" if on else "halt.off", "*", reason)
            body = {"on": on, "reason": reason, "by": by, "at_ms": now_ms, AUDIT_KEY: audit}
            await self._append(HALT_RECORD, body)
            if on:  # abort now rather than at the next step
                for drill in self.ops.active_drills():
                    aborted = request_abort(drill, f"halt switch on: {reason}", now_ms)
                    if aborted is not None:
                        await self._commit_locked(aborted)
        return self.ops.halt.to_body()

    async def audit(
        self, by: str, role: str, action: str, target: str, reason: str, detail: dict[str, Any]
    ) -> None:
        async with self._write_lock:
            await self.read_barrier()
            await self._append(
                AUDIT_RECORD, self.audit_entry(by, role, action, target, reason, detail)
            )

    async def move_region(
        self, action: OperatorAction, region: str, *, by: str, role: str, reason: str
    ) -> None:
        """An operator's evacuate or restore of ``region`` (``Controller.operator``), its
        audit entry inside the placement record that makes the move."""
        audit = self.audit_entry(by, role, f"region.{action}", region, reason)
        await self.controller.operator(action, region, audit)

    # --- writing records ------------------------------------------------------------------

    async def commit_drill(self, drill: Drill) -> None:
        async with self._write_lock:
            current = self.ops.drills.get(drill.drill_id)
            if current is not None and current.rev != drill.rev - 1:
                return  # an abort got in first: decide again at the next step
            await self._commit_locked(drill)

    async def _commit_locked(self, drill: Drill, audit: dict[str, Any] | None = None) -> None:
        body = drill.to_body()
        if audit is not None:
            body[AUDIT_KEY] = audit
        await self._append(DRILL_RECORD, body)

    def audit_entry(
        self,
        by: str,
        role: str,
        action: str,
        target: str,
        reason: str,
        detail: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """An operator's audit entry, stamped with this node's wall clock, for a record the
        control shard commits (drills, placement, halt, practice runs, keys)."""
        return audit_body(
            at_ms=self._clock.wall_ms(),
            by=by,
            role=role,
            action=action,
            target=target,
            reason=reason,
            detail=detail,
        )

    async def _append(self, record_type: str, body: dict[str, Any]) -> None:
        """Commit a record to the control shard and wait until this node applied it."""
        lsn = await self.node.append_record(self.controller.control_shard, record_type, body)
        deadline_s = self._clock.monotonic() + APPLY_WAIT_S
        while self.ops.applied_lsn < lsn:
            if self._clock.monotonic() > deadline_s:
                raise TimeoutError(f"control record {lsn} not applied within {APPLY_WAIT_S}s")
            await self._clock.sleep(0.02)


def _progress_every_s(drill: Drill) -> float:
    return max(PROGRESS_EVERY_S, drill.spec.hold_s / PROGRESS_RECORDS_PER_DRILL_MAX)


__all__ = ["DrillDriver", "PreflightFailed"]
