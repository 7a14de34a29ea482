"""The replay self-check of a vLLM server (``VllmHttpEngine.self_check``).

Replay on an engine only pays off, and only stays out of live traffic's way, when the server

1. serves the conversation's pinned revision: ``GET /v1/models`` lists it as a served model
   name (vLLM does not expose the weights revision, so deployments start vLLM with
   ``--served-model-name name@revision --revision <commit>``; a 404 on a request means the same);
2. schedules by priority (``--scheduling-policy priority``): a request at replay's priority is
   sent; a server that refuses ``priority`` (vLLM's "Priority scheduling is not enabled") fails.
   A server that silently ignores it cannot be told apart from outside: that flag stays the
   operator's to set (docker-compose.yml sets it);
3. caches prefixes and reports cached tokens (``--enable-prompt-tokens-details``): the same
   prompt of many blocks is sent twice under a fresh random salt (no tenant's cache is
   touched); the second must report cached tokens.

The probes are prefill-only (one output token) and small (a few hundred tokens).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

from replay.chat import ChatPrompt
from replay.engines.base import EngineRejectedRequest, EngineUnavailable, ModelRevisionMismatch
from replay.model import EngineProblem, PrefillOutcome, PrefillRequest

PROBE_WORDS = 400  # many blocks at any block size vLLM supports up to 16 .. 128 tokens


async def run_self_check(
    model_revision: str,
    served_models: Callable[[], Awaitable[list[str]]],
    prefill: Callable[[PrefillRequest], Awaitable[PrefillOutcome]],
    replay_priority: int,
) -> list[EngineProblem]:
    try:
        served = await served_models()
    except EngineUnavailable as exc:
        return [EngineProblem("engine_unavailable", exc.message)]
    if model_revision not in served:
        return [EngineProblem("model_revision_mismatch",
                              f"serves {served}, not the pinned revision {model_revision!r}: "
                              "start it with --served-model-name <name>@<revision>")]  # fmt: skip
    salt = secrets.token_hex(32)
    words = " ".join(f"probe{secrets.randbelow(10**9)}" for _ in range(PROBE_WORDS))
    prompt = ChatPrompt(({"role": "user", "content": words},))
    problems: list[EngineProblem] = []
    try:
        first = await prefill(
            PrefillRequest(model_revision, prompt, salt, replay_priority, "check-1")
        )
        second = await prefill(
            PrefillRequest(model_revision, prompt, salt, replay_priority, "check-2")
        )
    except ModelRevisionMismatch as exc:
        return [EngineProblem("model_revision_mismatch", exc.message)]
    except EngineRejectedRequest as exc:
        if "priority" in exc.message.lower():
            return [EngineProblem("priority_scheduling_off",
                                  "refuses request priorities: start it with "
                                  f"--scheduling-policy priority ({exc.message[:200]})")]  # fmt: skip
        return [EngineProblem("engine_rejected_probe", exc.message)]
    except EngineUnavailable as exc:
        return [EngineProblem("engine_unavailable", exc.message)]
    if not second.cached_reported:
        problems.append(EngineProblem("prompt_tokens_details_off",
                                      "does not report cached tokens: start it with "
                                      "--enable-prompt-tokens-details"))  # fmt: skip
    elif (
        second.cached_prompt_tokens <= 0 or second.cached_prompt_tokens < first.cached_prompt_tokens
    ):
        problems.append(EngineProblem("prefix_caching_off",
                                      f"a repeated {second.prompt_tokens}-token prompt hit no "
                                      "cache: start it with --enable-prefix-caching"))  # fmt: skip
    return problems
