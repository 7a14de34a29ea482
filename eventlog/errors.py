"""Errors of convplane, in one hierarchy.

Expected failures are typed exceptions with a stable ``code``; the REST layer maps every
``ConvplaneError`` to ``http_status`` and the JSON body
``{"error": {"code": ..., "message": ..., "retryable": ...}}`` (plus ``Retry-After`` when
``retry_after_s`` is set). Lower-level errors (asyncpg, aiosqlite, httpx, aiokafka) are translated
once, at the adapter boundary, with ``raise ... from exc``.

    ConvplaneError
    ├── InvalidRequest           400  the request is malformed or breaks a rule of the log
    │   ├── PlanInputError            bad input to the capacity arithmetic (regions.capacity_arithmetic)
    │   ├── EngineRejectedRequest     an engine refused a replay prompt (replay.engines.base)
    │   ├── MalformedMessage          a job-bus record failed validation (replay.bus.port)
    │   │   ├── UnauthenticatedMessage    its MAC is missing or wrong (replay.bus.port)
    │   │   └── ForeignRegionRecord       it names another region (replay.bus.codec)
    │   └── FaultRuleError            a bad fault-proxy rule (services.local.faultproxy)
    ├── Unauthorized             401  missing or unknown API key
    ├── Forbidden                403  the key's role may not do this (operator, viewer, tenant)
    │   ├── SelfApproval              a key approving the practice run it asked for, or
    │   │                             one in its line of descent (services.control.practice)
    │   └── OutsideBlastRadius        a drill of a region or kind outside the key's scope (idem)
    ├── NotFound                 404  no such conversation (or another tenant's)
    ├── Conflict                 409
    │   ├── SeqConflict               expected_seq is not the conversation's last seq
    │   ├── EffectConflict            a different tool.effect is already recorded for the attempt
    │   ├── IdempotencyKeyReused      same Idempotency-Key, different request body
    │   ├── ConversationExists        the id is taken (eventlog.conversation_state)
    │   ├── UnknownAttempt            an effect for an attempt never started (idem)
    │   ├── ModelRevisionMismatch     the engine serves another model (replay.engines.base)
    │   ├── PreflightFailed           a drill's preflight refused it (services.control.drills.driver)
    │   └── ApprovalRequired          a drill that needs a second operator's approval
    │                                 (services.control.practice)
    ├── PayloadTooLarge          413
    ├── QuotaExceeded            429  tenant over its rate (retryable)
    ├── Unavailable              503  retryable; outcome of a write may be unknown
    │   ├── NoQuorum                  fewer than W replicas answered; nothing new acknowledged
    │   ├── NotLeader                 this region does not lead the shard (carries a leader hint)
    │   ├── LeadershipChanged         the shard was re-led during the call; nothing written
    │   ├── Fenced                    a higher epoch took the shard; this leader stopped
    │   ├── Overloaded                admission control shed the request
    │   │   └── JobBusFull                the replay job bus is full (replay.bus.port)
    │   ├── ReplicaUnavailable        one replica store could not be reached (adapter level)
    │   ├── OutcomeUnknown            a forward lost its answer: the write may have landed
    │   │                             (services.api.errors)
    │   ├── ForwardFailed             the leading region could not be reached (idem)
    │   ├── JobBusUnavailable         the replay job bus cannot be reached (replay.bus.port)
    │   ├── TranscriptUnavailable     a replay worker could not read a transcript (replay.worker)
    │   └── EngineUnavailable         an inference engine cannot be reached (replay.engines.base)
    │       └── EngineMetricsMissing      its /metrics lack what replay needs
    │                                     (replay.engines.prometheus_text)
    └── DeadlineExceeded         504  the caller's deadline passed (outcome may be unknown)
        └── ReplayCapacityTimeout     no spare prefill in time for a replay (replay.capacity)

Classes live next to what raises them; this tree names every one (``tests/unit/test_error_tree.py``
fails on one it does not name).

Outside it, the product's other exceptions: none is an API error or reaches a client as one. They
stop a process or a harness, with a message that says why, or are translated into an API error
where they are caught (the builtin each derives from shown first; classes named with a leading
underscore are private control flow and not listed):

    Exception
    ├── BatchNotSent              a forward batch never left (services.api.forward_exchange): the
    │                             batcher sends it again or answers ForwardFailed
    ├── BatchLost                 a forward batch's answer did not come back whole (idem): its
    │                             unanswered items are sent again if the leader answers a
    │                             repeat with the first result (an Idempotency-Key or a tool
    │                             event), else OutcomeUnknown
    ├── LifespanFailed            the app refused to start or failed while starting; the node
    │                             stops (services.asgi_lifespan)
    ├── AssertionError
    │   └── InvariantViolation        a protocol invariant does not hold: a bug (here)
    ├── ValueError
    │   ├── AdmissionConfigError      admission limits that cannot work: the node refuses to start
    │   │                             (services.api.admission_control)
    │   └── DemoSecretRefused         the cluster file carries a secret published in the repository
    │                                 (services.deploy.compose_secrets)
    └── RuntimeError
        ├── SimulationDeadlock        nothing runnable, nothing scheduled: the simulated system
        │                             hangs (eventlog.sim.loop)
        └── HarnessError              a local harness could not provide what was asked
            │                         (services.local.host)
            ├── PgHarnessError            a PostgreSQL instance (services.local.postgres)
            ├── KafkaHarnessError         the Kafka broker (services.local.kafka)
            ├── SimEnginesError           a simulated inference engine (services.local.engines)
            ├── EngineRefused             an engine `up --engine` will not start with
            │                             (services.local.attached_engines)
            └── PlaneError                a whole local plane (services.local.plane)

``InvariantViolation`` marks a bug: it crashes the task that hit it and is never caught.
"""

from __future__ import annotations


class InvariantViolation(AssertionError):
    """A protocol invariant does not hold. This is a bug; never catch it."""


def error_body(code: str, message: str, *, retryable: bool = False) -> dict[str, object]:
    """The JSON body of every refusal, wherever it is answered (the app, the edge, the
    listeners' gates): ``{"error": {"code", "message", "retryable"}}``."""
    return {"error": {"code": code, "message": message, "retryable": retryable}}


class ConvplaneError(Exception):
    code = "internal"
    http_status = 500
    retryable = False

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s

    def to_body(self) -> dict[str, object]:
        return error_body(self.code, self.message, retryable=self.retryable)


class InvalidRequest(ConvplaneError):
    code = "invalid_request"
    http_status = 400


class Unauthorized(ConvplaneError):
    code = "unauthorized"
    http_status = 401


class NotFound(ConvplaneError):
    code = "not_found"
    http_status = 404


class Forbidden(ConvplaneError):
    code = "forbidden"
    http_status = 403


class Conflict(ConvplaneError):
    code = "conflict"
    http_status = 409


class SeqConflict(Conflict):
    code = "seq_conflict"

    def __init__(self, message: str, *, last_seq: int) -> None:
        super().__init__(message)
        self.last_seq = last_seq


class EffectConflict(Conflict):
    code = "effect_conflict"


class IdempotencyKeyReused(Conflict):
    code = "idempotency_key_reused"


class PayloadTooLarge(ConvplaneError):
    code = "payload_too_large"
    http_status = 413


class QuotaExceeded(ConvplaneError):
    code = "quota_exceeded"
    http_status = 429
    retryable = True


class Unavailable(ConvplaneError):
    code = "unavailable"
    http_status = 503
    retryable = True


class NoQuorum(Unavailable):
    code = "no_quorum"


class NotLeader(Unavailable):
    code = "not_leader"

    def __init__(
        self,
        message: str,
        *,
        shard: int,
        leader_region: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.shard = shard
        self.leader_region = leader_region

    def to_body(self) -> dict[str, object]:
        body = super().to_body()
        error = body["error"]
        assert isinstance(error, dict)
        error["shard"] = self.shard
        error["leader_region"] = self.leader_region  # null when not known yet
        return body


class LeadershipChanged(Unavailable):
    """The shard was re-led while the call read the log: its answer would belong to the old
    leader. Nothing was written; retry."""

    code = "leadership_changed"


class Fenced(Unavailable):
    code = "fenced"

    def __init__(self, message: str, *, shard: int, promised_epoch: int) -> None:
        super().__init__(message, retry_after_s=1.0)
        self.shard = shard
        self.promised_epoch = promised_epoch


class Overloaded(Unavailable):
    code = "overloaded"


class ReplicaUnavailable(Unavailable):
    code = "replica_unavailable"


class DeadlineExceeded(ConvplaneError):
    code = "deadline_exceeded"
    http_status = 504
    retryable = True
