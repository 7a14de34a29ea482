"""Simulated inference engines for a local plane (``convplane up --sim-engines N``).

N ``convplane sim-engine serve`` processes per region: real HTTP, vLLM-shaped API, simulated
prefill timing and prefix cache. **A simulator** (no GPU, no model): it lets a laptop run the
whole replay path. The plane's cluster file then lists them as the regions' engines, with a
fresh service key (in clear in cluster.json: a local development plane).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.config import api_key_sha256
from services.local.host import HarnessError, convplane_command, free_port
from services.replay.config import EngineConfig, ReplayConfig

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


class SimEnginesError(HarnessError):
    """A simulated engine did not come up."""


@dataclass
class SimEngineProcess:
    region: str
    engine_id: str
    url: str
    log_path: Path
    process: subprocess.Popen[bytes]


@dataclass
class SimEngines:
    per_region: int
    state_dir: Path
    host: str = "127.0.0.1"
    model_revision: str = "default"
    prefill_tokens_per_s: float = 20_000.0
    service_key: str = field(default_factory=lambda: "cps_" + secrets.token_urlsafe(24))
    engines: list[SimEngineProcess] = field(default_factory=list)

    def start(self, regions: list[str]) -> None:
        """Spawn the engines and wait until each answers /health (stops them all on failure)."""
        try:
            for region in regions:
                for index in range(self.per_region):
                    self.engines.append(self._spawn(region, f"{region}-sim{index}"))
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def replay_config(self) -> ReplayConfig:
        engines: dict[str, list[EngineConfig]] = {}
        for e in self.engines:
            engines.setdefault(e.region, []).append(
                EngineConfig(
                    url=e.url,
                    model_revision=self.model_revision,
                    capacity_tokens_per_s=self.prefill_tokens_per_s,
                    engine_id=e.engine_id,
                )
            )
        return ReplayConfig(
            engines=engines, service_api_key_sha256=api_key_sha256(self.service_key)
        )

    def info(self) -> dict[str, Any]:
        return {
            "service_api_key": self.service_key,
            "sim_engines": [
                {
                    "region": e.region,
                    "engine_id": e.engine_id,
                    "url": e.url,
                    "pid": e.process.pid,
                    "log": str(e.log_path),
                    "simulated": True,
                }
                for e in self.engines
            ],
        }

    def stop(self) -> None:
        running = [e.process for e in self.engines if e.process.poll() is None]
        for proc in running:
            _signal(proc.pid, signal.SIGTERM)
        deadline_s = time.monotonic() + STOP_TIMEOUT_S
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(proc.pid, signal.SIGKILL)
                proc.wait(timeout=STOP_TIMEOUT_S)

    def _spawn(self, region: str, engine_id: str) -> SimEngineProcess:
        port = free_port(self.host)
        log_path = self.state_dir / region / f"{engine_id}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [
            *convplane_command(),
            "sim-engine", "serve", "--host", self.host, "--port", str(port),
            "--model", self.model_revision, "--engine-id", engine_id,
            "--prefill-tokens-per-s", str(self.prefill_tokens_per_s),
        ]  # fmt: skip
        with log_path.open("ab") as log_file:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return SimEngineProcess(region, engine_id, f"http://{self.host}:{port}", log_path, process)

    def _wait_healthy(self) -> None:
        deadline_s = time.monotonic() + READY_TIMEOUT_S
        pending = list(self.engines)
        with httpx.Client(timeout=1.0, trust_env=False) as client:
            while pending:
                for engine in list(pending):
                    if engine.process.poll() is not None:
                        raise SimEnginesError(
                            f"simulated engine {engine.engine_id} exited (log {engine.log_path})"
                        )
                    try:
                        if client.get(engine.url + "/health").status_code == 200:
                            pending.remove(engine)
                    except httpx.HTTPError:
                        pass
                if pending and time.monotonic() > deadline_s:
                    raise SimEnginesError(f"simulated engines not up after {READY_TIMEOUT_S:g}s")
                time.sleep(0.1)


def stop_engines_from_info(info: dict[str, Any]) -> list[str]:
    """SIGTERM the simulated engines a detached plane's cluster.json lists."""
    stopped = []
    for engine in info.get("sim_engines", []):
        if isinstance(engine.get("pid"), int) and _signal(engine["pid"], signal.SIGTERM):
            stopped.append(f"{engine['engine_id']} sim engine {engine['pid']}")
    return stopped


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True
