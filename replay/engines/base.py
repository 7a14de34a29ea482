"""The inference-engine port: what replay workers and the capacity controller need from a GPU
server, whatever it is (vLLM over HTTP, or the simulator).

Errors an engine raises (all ``ConvplaneError``; lower-level errors are translated once, in the
adapter, with ``raise ... from exc``)::

    EngineUnavailable      (Unavailable, 503, retryable)  unreachable, timed out, 5xx, 429, or
                                                          the engine's own queue is full
    EngineRejectedRequest  (InvalidRequest, 400)          the engine refused the request (4xx)
    ModelRevisionMismatch  (Conflict, 409)                the engine does not serve the revision
                                                          the conversation is pinned to; KV built
                                                          for another revision is useless
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from eventlog.errors import Conflict, InvalidRequest, Unavailable
from replay.model import EngineFitness, EngineMetrics, PrefillOutcome, PrefillRequest

#: the ``tool_choice`` replay sends with a conversation's ``tools``: a prefill never calls a
#: tool, and vLLM refuses the default (``"auto"``) unless started with
#: ``--enable-auto-tool-choice --tool-call-parser ...``. vLLM still hands the tools to the chat
#: template under ``"none"`` (unless ``--exclude-tools-when-tool-choice-none``, which the
#: self-check catches), so the prompt renders as the live turn's does.
REPLAY_TOOL_CHOICE = "none"


class EngineUnavailable(Unavailable):
    code = "engine_unavailable"


class EngineRejectedRequest(InvalidRequest):
    code = "engine_rejected_request"


class ModelRevisionMismatch(Conflict):
    code = "model_revision_mismatch"


class InferenceEngine(ABC):
    """One inference server (one vLLM replica, or one simulated engine)."""

    @property
    @abstractmethod
    def engine_id(self) -> str:
        """Stable name of this engine (used in replay results and KV-affinity routing)."""

    @property
    @abstractmethod
    def model_revision(self) -> str:
        """The exact model revision this engine serves; KV is only reusable for it."""

    @abstractmethod
    async def prefill(self, request: PrefillRequest) -> PrefillOutcome:
        """Run a prefill-only request (``max_tokens=1``) so the prompt's KV lands in the
        engine's prefix cache. Raises the errors listed in the module docstring."""

    @abstractmethod
    async def metrics(self) -> EngineMetrics:
        """A snapshot of the engine's own counters (vLLM's Prometheus names)."""

    async def self_check(
        self, replay_priority: int, *, priority_declared: bool = False
    ) -> EngineFitness:
        """Whether replay on this engine pays off (``replay.engines.vllm_check``: one verdict
        per check; fit when none failed): it must serve the pinned revision, export its
        metrics, take replay's tool-using and stored-template requests, cache prefixes and
        report cached tokens; and schedule by priority (replay runs at ``replay_priority``:
        seen by a queue probe, or ``priority_declared`` where the probe cannot tell).
        Engines that cannot be probed (test fakes) report no checks."""
        return EngineFitness(())

    @abstractmethod
    async def aclose(self) -> None:
        """Release connections / stop background tasks. Idempotent."""
