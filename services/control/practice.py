"""Practice runs: the control leader starts scheduled drills, behind blocking conditions and
approvals, and records every decision in the control shard.

Every node folds ``control.practice`` records into a ``PracticeState``; only the node leading
the control shard acts. Each ``step`` (a supervised loop, every ``practice_tick_s``) it asks
``regions.practice.decide`` about every schedule; a start is first checked against the
blocking conditions (``blocking``), then either asks for approval (``awaiting_approval``) or
starts the drill through ``DrillDriver.create``, the path an operator's ``POST /v1/drills``
takes (preflight, canaries, the drill's own guards, its audit entry). Approved runs start at
the next step. Each start, skip and request is one calendar entry with its reason.

Outcome conditions end a practice drill early (``_abort_on_outcome_alarms``): a firing
operator alert, a crash-looping loop or the plane's error budget burning too fast
(``regions.error_budget``) aborts it, besides the drill's own guards.

Blocking conditions: the halt switch; an operator-set alert that is firing; a background loop
of this node crash-looping (what ``convplane_background_loop_crash_looping`` alerts on); a
placement change (a failover, failback or evacuation) within ``practice_failover_quiet_s``;
the error budget burning faster than ``practice_burn_rate_max``; any active drill; and the
drill's own preflight (capacity, every region up).

The burn is measured on the plane's own counters: while this node leads the control shard it
samples the plane's live appends answered 2xx and 5xx (``plane_load``, what a drill's report
and preflight read) every tick, and keeps the samples of the burn window (a new leader starts
with none, so it judges no burn until enough appends ended under it).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from eventlog.clock import Clock
from eventlog.errors import Conflict, Forbidden, NotFound
from regions.drill_kinds import DrillKind
from regions.drills import DrillSpec, Guards
from regions.error_budget import Burn, BurnPolicy, LoadSample, burning
from regions.ops_state import AUDIT_KEY, PRACTICE_RECORD
from regions.practice import Conditions, Schedule, Scope, decide
from regions.practice_state import Alert, PracticeState, Run
from services.control.drills.driver import APPLY_WAIT_S, DrillDriver, PreflightFailed
from services.control.readiness import LoadSampler

log = logging.getLogger("convplane.practice")
#: the role a scheduled start is audited with (the schedule's author was an operator)
PRACTICE_ROLE = "operator"
#: an approved run whose preflight refuses (a region just failed back, a canary shard not
#: writable yet) is tried again every tick for this long after its approval, then skipped
APPROVED_START_WINDOW_S = 120.0
#: a run awaiting approval longer than this is closed as skipped (its schedule goes on)
APPROVAL_WAIT_MAX_S = 86_400.0
#: load samples kept for the error-budget burn, at most (one per tick inside its window)
BURN_SAMPLES_MAX = 100_000


class SelfApproval(Forbidden):
    code = "self_approval"


class OutsideBlastRadius(Forbidden):
    code = "outside_blast_radius"


class ApprovalRequired(Conflict):
    code = "approval_required"


class PracticeRunner:
    def __init__(
        self,
        *,
        driver: DrillDriver,
        state: PracticeState,
        clock: Clock,
        failover_quiet_s: float,
        seed: int,
        sample_load: LoadSampler | None = None,
        burn_policy: BurnPolicy | None = None,
        run_token: Callable[[], str] = lambda: secrets.token_hex(4),
    ) -> None:
        self.driver = driver
        self.state = state
        self._clock = clock
        self._failover_quiet_s = failover_quiet_s
        self._seed = seed
        self._run_token = run_token
        self._lock = asyncio.Lock()
        #: the placement version last seen and when it was first seen (monotonic s)
        self._placement_seen: tuple[int, float] | None = None
        self._sample_load = sample_load
        self._burn_policy = burn_policy
        #: the plane's live append outcomes, sampled every tick while this node leads control
        self._load_samples: deque[LoadSample] = deque(maxlen=BURN_SAMPLES_MAX)

    # --- the loop -------------------------------------------------------------------------

    async def step(self) -> None:
        self._watch_placement()
        if not self.driver.leads_control:
            self._load_samples.clear()  # the next leadership measures from its own start
            return
        await self._sample_burn()
        state, unhealthy = self.state, self.driver.controller.supervisor.unhealthy()
        if not (
            state.schedules
            or state.open_runs()
            or state.firing_alerts()
            or unhealthy
            or self.burning()
        ):
            return  # nothing to decide (what a new leader has not folded yet: next tick)
        await self.driver.read_barrier()
        await self._abort_on_outcome_alarms()
        for run in state.unapproved_past(self._clock.wall_ms(), APPROVAL_WAIT_MAX_S):
            why = f"not approved within {APPROVAL_WAIT_MAX_S:g} s"
            await self._decided(run.schedule_id, run, "skipped", why)
        for run in [r for r in self.state.open_runs() if r.status == "approved"]:
            approved_ms = run.approved_at_ms or run.requested_at_ms
            retry = self._clock.wall_ms() - approved_ms < APPROVED_START_WINDOW_S * 1000
            await self._start(run.schedule_id, run, f"approved by {run.approved_by}", retry)
        for schedule in list(self.state.schedules.values()):
            await self._consider(schedule)

    async def _consider(self, schedule: Schedule) -> None:
        now_ms = self._clock.wall_ms()
        busy = any(d.spec.region == schedule.region for d in self.driver.ops.active_drills())
        history = self.state.history(schedule.schedule_id, busy)
        decision = decide(schedule, now_ms, history, Conditions(), self._seed)
        if decision.action == "start":
            blocking = await self.blocking(schedule.kind, schedule.region, schedule.hold_s)
            decision = decide(schedule, now_ms, history, Conditions(blocking), self._seed)
        if decision.action == "wait":
            return
        if decision.action == "skip":
            await self._decided(schedule.schedule_id, None, "skipped", decision.reason)
            return
        reason = f"practice run of schedule {schedule.schedule_id}"
        # the schedule's author asks: a second operator's key approves
        author = schedule.by or f"schedule:{schedule.schedule_id}"
        run = self._new_run(schedule.schedule_id, schedule.kind, schedule.region,
                            schedule.hold_s, reason, author, schedule.guards)  # fmt: skip
        if self.state.needs_approval(schedule.region, schedule.kind, schedule):
            await self._request(run, by=run.requested_by, role=PRACTICE_ROLE)
            return
        await self._start(schedule.schedule_id, run, decision.reason)

    async def _abort_on_outcome_alarms(self) -> None:
        """Outcome conditions: a practice drill still injecting or holding is aborted (its
        target restored at once) while an operator alert fires or a background loop
        crash-loops or the error budget burns over its maximum; the drill's own guards (RTO,
        canary errors, ack p99) run as for any."""
        alarms = [f"alert {a.name!r} firing: {a.reason}" for a in self.state.firing_alerts()]
        alarms += [
            f"background loop {name!r} crash-looping"
            for name in self.driver.controller.supervisor.unhealthy()
        ]
        alarms += self._burn_reasons()
        if not alarms:
            return
        practice_drills = {e.drill_id for e in self.state.calendar if e.outcome == "ran"}
        for drill in self.driver.ops.active_drills():
            if drill.drill_id in practice_drills and drill.phase in ("injecting", "holding"):
                reason = "outcome alarm: " + "; ".join(alarms)
                await self.driver.abort(
                    drill.drill_id, by="practice", role=PRACTICE_ROLE, reason=reason[:500]
                )

    def _watch_placement(self) -> None:
        version = self.driver.controller.placement().version
        now_s = self._clock.monotonic()
        if self._placement_seen is None or self._placement_seen[0] == 0:
            # what the plane started with (or, version 0, before this node learned the
            # placement at all) is no failover
            self._placement_seen = (version, now_s - self._failover_quiet_s)
        elif version != self._placement_seen[0]:
            self._placement_seen = (version, now_s)

    async def _sample_burn(self) -> None:
        if self._sample_load is None or self._burn_policy is None:
            return
        load = await self._sample_load()
        now_s = self._clock.monotonic()
        self._load_samples.append(
            LoadSample(now_s, load.live_succeeded_per_s, load.live_errors_per_s)
        )
        while (
            self._load_samples and self._load_samples[0].at_s < now_s - self._burn_policy.window_s
        ):
            self._load_samples.popleft()

    def burning(self) -> Burn | None:
        """The plane's error-budget burn when it is over the maximum, else None."""
        if self._burn_policy is None:
            return None
        return burning(self._load_samples, self._clock.monotonic(), self._burn_policy)

    def _burn_reasons(self) -> list[str]:
        found = self.burning()
        return (
            [] if found is None or self._burn_policy is None else [found.reason(self._burn_policy)]
        )

    async def blocking(self, kind: DrillKind, region: str, hold_s: float) -> list[str]:
        """What holds a practice run of ``kind`` on ``region`` back now, each with its reason."""
        reasons = [f"alert {a.name!r} firing: {a.reason}" for a in self.state.firing_alerts()]
        if self.driver.ops.halt.on:
            reasons.append(f"halt switch on: {self.driver.ops.halt.reason}")
        reasons += [
            f"background loop {name!r} crash-looping"
            for name in self.driver.controller.supervisor.unhealthy()
        ]
        if self._placement_seen is not None:
            since_s = self._clock.monotonic() - self._placement_seen[1]
            if since_s < self._failover_quiet_s:
                reasons.append(
                    f"placement changed {since_s:.0f} s ago (a failover or evacuation; "
                    f"quiet for {self._failover_quiet_s:g} s first)"
                )
        reasons += self._burn_reasons()
        if self.driver.ops.active_drills():
            reasons.append("a drill is active")
        if not reasons:
            plan = await self.driver.plan(_spec(kind, region, hold_s, "practice preflight", ""))
            reasons += [f"preflight: {f}" for f in plan.failures]
        return reasons

    async def _start(self, schedule_id: str | None, run: Run, why: str, retry: bool = False) -> Run:
        """Start the run's drill; a refused preflight is a skip, or with ``retry`` nothing
        (tried again next tick). Returns the run as it now stands."""
        spec = _spec(run.kind, run.region, run.hold_s, run.reason, run.requested_by, run.guards)
        try:
            by = f"practice:{run.requested_by}"
            drill, _ = await self.driver.create(spec, by=by, role=PRACTICE_ROLE)
        except PreflightFailed as exc:
            if retry:
                log.info("practice run %s: %s; tried again", run.run_id, exc.message)
                return run
            await self._decided(schedule_id, run, "skipped", exc.message)
            return replace(run, status="skipped")
        await self._decided(schedule_id, run, "ran", why, drill.drill_id)
        return replace(run, status="ran", drill_id=drill.drill_id)

    # --- operator actions (the API calls these; the control leader commits) ----------------

    def check_scope(self, key_name: str, kind: str, region: str) -> None:
        if not self.state.scope_of(key_name).allows(region, kind):
            raise OutsideBlastRadius(
                f"key {key_name!r} may not drill {kind} of {region}: outside its blast radius "
                f"{self.state.scope_of(key_name).to_body()}"
            )

    def check_manual_drill(self, key_name: str, kind: str, region: str) -> None:
        """``POST /v1/drills``: the key's blast radius, then the approval policy."""
        self.check_scope(key_name, kind, region)
        if self.state.needs_approval(region, kind):
            raise ApprovalRequired(
                f"drills of {kind} on {region} need a second operator's approval: ask with "
                "POST /v1/practice/runs"
            )

    async def request_run(
        self,
        kind: DrillKind,
        region: str,
        hold_s: float,
        reason: str,
        *,
        key_name: str,
        by: str,
        role: str,
        guards: Guards | None = None,
    ) -> Run:
        """A run asked for by hand: waits for approval where the policy says so, else starts."""
        await self.driver.read_barrier()
        self.check_scope(key_name, kind, region)
        run = self._new_run(None, kind, region, hold_s, reason, key_name, guards or Guards())
        if not self.state.needs_approval(region, kind):
            return await self._start(None, run, f"asked for by {key_name}")
        await self._request(run, by=by, role=role)
        return self.state.runs[run.run_id]

    async def approve(self, run_id: str, *, key_name: str, by: str, role: str) -> Run:
        await self.driver.read_barrier()
        run = self.state.runs.get(run_id)
        if run is None:
            raise NotFound(f"no practice run {run_id!r}")
        if run.requested_by == key_name:
            raise SelfApproval(
                f"key {key_name!r} asked for run {run_id}; a second operator's key must approve"
            )
        if self.driver.ops.keys.may_share_a_holder(run.requested_by, key_name):
            raise SelfApproval(
                f"keys {key_name!r} and {run.requested_by!r} (which asked for run {run_id}) are "
                "in one line of descent, one created or rotated from the other, so one operator "
                "may hold both; a key that did not come from the requester's, nor it from yours, "
                "must approve"
            )
        if run.status != "awaiting_approval":
            raise Conflict(f"run {run_id} is {run.status}, not awaiting approval")
        self.check_scope(key_name, run.kind, run.region)
        audit = self.driver.audit_entry(by, role, "practice.approve", run.region, f"approve run {run_id}",
                            {"run_id": run_id, "key": key_name, "requested_by": run.requested_by})  # fmt: skip
        await self._append({"op": "run.approve", "run_id": run_id, "approved_by": key_name,
                            "at_ms": self._clock.wall_ms(), AUDIT_KEY: audit})  # fmt: skip
        return self.state.runs[run_id]

    async def put_schedule(self, schedule: Schedule, *, by: str, role: str) -> Schedule:
        await self.driver.read_barrier()
        self.check_scope(schedule.by, schedule.kind, schedule.region)
        audit = self.driver.audit_entry(by, role, "practice.schedule", schedule.region,
                            f"schedule {schedule.schedule_id}", schedule.to_body())  # fmt: skip
        await self._append({"op": "schedule.put", "schedule": schedule.to_body(),
                            AUDIT_KEY: audit})  # fmt: skip
        return self.state.schedules[schedule.schedule_id]

    async def delete_schedule(self, schedule_id: str, *, by: str, role: str) -> None:
        await self.driver.read_barrier()
        schedule = self.state.schedules.get(schedule_id)
        if schedule is None:
            raise NotFound(f"no schedule {schedule_id!r}")
        audit = self.driver.audit_entry(by, role, "practice.unschedule", schedule.region,
                            f"delete schedule {schedule_id}")  # fmt: skip
        await self._append({"op": "schedule.delete", "schedule_id": schedule_id,
                            AUDIT_KEY: audit})  # fmt: skip

    async def set_alert(self, name: str, firing: bool, reason: str, *, by: str, role: str) -> Alert:
        await self.driver.read_barrier()
        action = "practice.alert.fire" if firing else "practice.alert.clear"
        audit = self.driver.audit_entry(by, role, action, name, reason)
        await self._append({"op": "alert.set", "name": name, "firing": firing, "reason": reason,
                            "by": by, "at_ms": self._clock.wall_ms(), AUDIT_KEY: audit})  # fmt: skip
        return self.state.alerts[name]

    def check_unscoped(self, key_name: str) -> None:
        """Only a key without a blast radius changes scopes and the approval policy: a scoped
        key could otherwise widen its own."""
        if key_name in self.state.scopes:
            raise OutsideBlastRadius(
                f"key {key_name!r} has a blast radius: it may not change scopes or the "
                "approval policy"
            )

    async def set_policy(self, scope: Scope, *, key_name: str, by: str, role: str) -> Scope:
        await self.driver.read_barrier()
        self.check_unscoped(key_name)
        audit = self.driver.audit_entry(
            by, role, "practice.policy", "*", "approval policy", scope.to_body()
        )
        await self._append({"op": "policy.set", **scope.to_body(), AUDIT_KEY: audit})
        return self.state.approval_policy

    async def set_scope(
        self, key_name: str, scope: Scope, *, caller: str, by: str, role: str
    ) -> Scope:
        await self.driver.read_barrier()
        self.check_unscoped(caller)
        audit = self.driver.audit_entry(by, role, "practice.scope", key_name, "blast radius",
                            scope.to_body())  # fmt: skip
        await self._append({"op": "scope.set", "key_name": key_name, **scope.to_body(),
                            AUDIT_KEY: audit})  # fmt: skip
        return self.state.scope_of(key_name)

    # --- records --------------------------------------------------------------------------

    def _new_run(
        self,
        schedule_id: str | None,
        kind: DrillKind,
        region: str,
        hold_s: float,
        reason: str,
        requested_by: str,
        guards: Guards,
    ) -> Run:
        return Run(
            run_id=f"r{self._clock.wall_ms()}-{self._run_token()}",
            schedule_id=schedule_id,
            kind=kind,
            region=region,
            hold_s=hold_s,
            reason=reason,
            requested_by=requested_by,
            requested_at_ms=self._clock.wall_ms(),
            guards=guards,
        )

    async def _request(self, run: Run, *, by: str, role: str) -> None:
        audit = self.driver.audit_entry(by, role, "practice.request", run.region,
                            run.reason, {"run_id": run.run_id, "kind": run.kind})  # fmt: skip
        await self._append({"op": "run.request", "run": run.to_body(), AUDIT_KEY: audit})
        await self._decided(run.schedule_id, run, "awaiting_approval", "needs approval")

    async def _decided(
        self,
        schedule_id: str | None,
        run: Run | None,
        outcome: str,
        reason: str,
        drill_id: str | None = None,
    ) -> None:
        log.info("practice %s: %s (%s)", schedule_id or (run and run.run_id), outcome, reason)
        await self._append(
            {
                "op": "decision",
                "schedule_id": schedule_id,
                "run_id": None if run is None else run.run_id,
                "at_ms": self._clock.wall_ms(),
                "outcome": outcome,
                "reason": reason[:500],
                "drill_id": drill_id,
            }
        )

    async def _append(self, body: dict[str, Any]) -> None:
        """Commit a practice record and wait until this node folded it."""
        async with self._lock:
            shard = self.driver.controller.control_shard
            lsn = await self.driver.node.append_record(shard, PRACTICE_RECORD, body)
            deadline_s = self._clock.monotonic() + APPLY_WAIT_S
            while self.state.applied_lsn < lsn:
                if self._clock.monotonic() > deadline_s:
                    raise TimeoutError(f"practice record {lsn} not applied in {APPLY_WAIT_S}s")
                await self._clock.sleep(0.02)


def _spec(
    kind: DrillKind, region: str, hold_s: float, reason: str, by: str, guards: Guards | None = None
) -> DrillSpec:
    return DrillSpec(kind=kind, region=region, hold_s=hold_s, reason=reason, requested_by=by,
                     guards=guards or Guards())  # fmt: skip
