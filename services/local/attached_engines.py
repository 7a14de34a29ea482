"""Real inference engines attached to a local plane (``convplane up --engine REGION=URL``).

Each ``--engine`` names a region of the plane and the base URL of an OpenAI-compatible server
(vLLM) that serves one model. Before anything starts, ``check_engines`` asks each server for its
model (``GET /v1/models``) and runs the replay self-check on it (``replay.engines.vllm_check``,
as ``convplane worker --check``); one unreachable or unfit engine refuses the whole plane, with
each failed check's reason. A malformed option or a region the plane does not have is refused
before any engine is asked.

The plane's cluster file then lists the engines under ``replay.engines``. Without Kafka every
node runs one in-process worker per engine of its region (it runs the self-check again before
it takes a job). With ``--kafka-bootstrap-servers`` replay jobs go through that broker and the
plane starts one ``convplane worker`` process per engine, with its region's worker key, bus
secret and the cluster's cache-salt key (in its environment, not its command line).

A worker holds no state of its own (its jobs wait in Kafka), so one that exits is started again
(``supervise_workers``, from the ``up`` supervisor's loop): after ``WORKER_RESTART_DELAY_S``,
doubled for each restart in the last ``WORKER_RESTART_WINDOW_S`` up to
``WORKER_RESTART_DELAY_MAX_S``; after ``WORKER_RESTARTS_MAX`` restarts in that window it is
crash-looping, and it stays down with its log named (``restart-region`` of its region, once
fixed, starts it again).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from services.config import api_key_sha256
from services.local.host import HarnessError, convplane_command
from services.local.plane_state import SavedEngines
from services.replay.config import EngineConfig, ReplayConfig

#: the whole self-check of one engine, every probe (``WorkerConfig.check_timeout_s``)
CHECK_TIMEOUT_S = 60.0
#: an exited worker is started again after this ...
WORKER_RESTART_DELAY_S = 1.0
#: ... doubled per restart in the window, at most this
WORKER_RESTART_DELAY_MAX_S = 60.0
#: restarts in the window past which a worker is crash-looping and stays down
WORKER_RESTARTS_MAX = 5
WORKER_RESTART_WINDOW_S = 600.0
_OPTION = re.compile(r"(?P<region>[^=]+)=(?P<url>.+)")


class EngineRefused(HarnessError):
    """An ``--engine`` the plane will not start with: malformed, an unknown region, an engine
    that cannot be reached or that the self-check finds unfit (the message says which check
    and why)."""


@dataclass(frozen=True, slots=True)
class EngineOption:
    """One ``--engine REGION=URL``, validated."""

    region: str
    url: str  # no trailing slash


@dataclass(frozen=True, slots=True)
class AttachedEngine:
    region: str
    url: str
    engine_id: str
    model_revision: str
    #: the self-check's verdict per check, and why for each one not passed
    checks: dict[str, str]
    reasons: dict[str, str]


def parse_engine_options(values: Sequence[str], regions: Sequence[str]) -> list[EngineOption]:
    """``REGION=URL`` options; ``EngineRefused`` naming the bad one and what was expected."""
    options: list[EngineOption] = []
    for value in values:
        match = _OPTION.fullmatch(value.strip())
        if match is None:
            raise EngineRefused(
                f"--engine {value!r}: expected REGION=URL, e.g. {regions[0]}=http://127.0.0.1:8000"
            )
        region, url = match["region"].strip(), match["url"].strip().rstrip("/")
        if region not in regions:
            raise EngineRefused(
                f"--engine {value!r}: no region {region!r} in this plane "
                f"(its regions: {', '.join(regions)})"
            )
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EngineRefused(
                f"--engine {value!r}: {url!r} is not an http(s) URL with a host "
                "(the engine's base URL, e.g. http://127.0.0.1:8000)"
            )
        if parts.query or parts.fragment:
            raise EngineRefused(f"--engine {value!r}: a base URL takes no query or fragment")
        option = EngineOption(region, url)
        if option in options:
            raise EngineRefused(f"--engine {value!r} is given twice")
        options.append(option)
    return options


def check_engines(
    options: Sequence[EngineOption], *, priority_declared: bool
) -> list[AttachedEngine]:
    """Each engine's model and self-check; ``EngineRefused`` at the first that is unreachable,
    serves other than exactly one model, or is unfit."""
    return asyncio.run(_check_all(options, priority_declared))


async def _check_all(
    options: Sequence[EngineOption], priority_declared: bool
) -> list[AttachedEngine]:
    attached: list[AttachedEngine] = []
    for option in options:
        index = sum(1 for e in attached if e.region == option.region)
        attached.append(
            await _check_one(option, f"{option.region}-engine{index}", priority_declared)
        )
    return attached


async def _check_one(
    option: EngineOption, engine_id: str, priority_declared: bool
) -> AttachedEngine:
    from replay.engines.base import EngineUnavailable
    from replay.engines.vllm_http import VllmHttpEngine
    from replay.worker import WorkerConfig

    where = f"engine {option.url} (--engine {option.region}=...)"
    probe = VllmHttpEngine(engine_id, option.url, "")
    try:
        models = await probe.served_models()
    except EngineUnavailable as exc:
        raise EngineRefused(f"{where} cannot be reached: {exc}") from exc
    finally:
        await probe.aclose()
    if len(models) != 1:
        raise EngineRefused(
            f"{where} serves {len(models)} models ({', '.join(models) or '-'}); "
            "a plane attaches engines that serve exactly one"
        )
    (model_revision,) = models
    engine = VllmHttpEngine(engine_id, option.url, model_revision)
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            fitness = await engine.self_check(
                WorkerConfig().replay_priority, priority_declared=priority_declared
            )
    except TimeoutError as exc:
        raise EngineRefused(f"{where}: its self-check took over {CHECK_TIMEOUT_S:g}s") from exc
    finally:
        await engine.aclose()
    if not fitness.fit:
        failed = "; ".join(f"{p.code}: {p.message}" for p in fitness.problems)
        raise EngineRefused(f"{where} is unfit for replay of {model_revision!r}: {failed}")
    return AttachedEngine(
        option.region,
        option.url,
        engine_id,
        model_revision,
        dict(fitness.verdicts()),
        fitness.reasons(),
    )


@dataclass
class AttachedEngines:
    """The checked engines of a plane, and (with Kafka) their worker processes."""

    engines: list[AttachedEngine]
    state_dir: Path
    priority_declared: bool = False
    kafka_bootstrap_servers: str | None = None
    capacity_tokens_per_s: float = 20_000.0
    worker_concurrency: int = 2
    worker_keys: dict[str, str] = field(default_factory=dict)  # region -> its workers' key
    bus_secrets: dict[str, str] = field(default_factory=dict)  # region -> 64 hex
    cache_salt_key: str = field(default_factory=lambda: secrets.token_hex(32))
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # engine id ->
    region_urls: dict[str, str] = field(default_factory=dict)  # the API each region's workers use
    #: engine id -> monotonic seconds of its restarts in the window
    _restarts: dict[str, deque[float]] = field(default_factory=dict)
    #: engine id -> when its exit was seen (not started again yet)
    _exited_at: dict[str, float] = field(default_factory=dict)
    _given_up: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        """Secrets for regions that have none yet (a resumed plane keeps its own)."""
        for region in {e.region for e in self.engines}:
            self.worker_keys.setdefault(region, "cpw_" + secrets.token_urlsafe(24))
            self.bus_secrets.setdefault(region, secrets.token_hex(32))

    def replay_config(self) -> ReplayConfig:
        engines: dict[str, list[EngineConfig]] = {}
        for e in self.engines:
            engines.setdefault(e.region, []).append(
                EngineConfig(
                    url=e.url,
                    model_revision=e.model_revision,
                    engine_id=e.engine_id,
                    capacity_tokens_per_s=self.capacity_tokens_per_s,
                    priority_scheduling_declared=self.priority_declared,
                )
            )
        kafka: dict[str, Any] = {}
        if self.kafka_bootstrap_servers:
            kafka = {
                "kafka_bootstrap_servers": self.kafka_bootstrap_servers,
                "bus_secrets": self.bus_secrets,
                "worker_keys_sha256": {r: api_key_sha256(k) for r, k in self.worker_keys.items()},
            }
        return ReplayConfig(
            engines=engines,
            worker_concurrency=self.worker_concurrency,
            cache_salt_key=self.cache_salt_key,
            **kafka,
        )

    def start_workers(self, region_urls: dict[str, str]) -> None:
        """With Kafka: one ``convplane worker`` per engine, against its region's API."""
        if not self.kafka_bootstrap_servers:
            return
        self.region_urls = dict(region_urls)
        for e in self.engines:
            self._spawn(e)

    def _spawn(self, e: AttachedEngine) -> None:
        assert self.kafka_bootstrap_servers is not None
        command = convplane_command(
            "worker", "--region", e.region, "--engine-url", e.url,
            "--bootstrap-servers", self.kafka_bootstrap_servers,
            "--region-url", self.region_urls[e.region], "--model-revision", e.model_revision,
            "--worker-id", e.engine_id, "--concurrency", str(self.worker_concurrency),
            "--capacity-tokens-per-s", str(self.capacity_tokens_per_s),
            *(["--declare-priority-scheduling"] if self.priority_declared else []),
        )  # fmt: skip
        env = {
            **os.environ,
            "CONVPLANE_WORKER_API_KEY": self.worker_keys[e.region],
            "CONVPLANE_REPLAY_BUS_SECRET": self.bus_secrets[e.region],
            "CONVPLANE_CACHE_SALT_KEY": self.cache_salt_key,
        }
        with self.worker_log(e).open("ab") as log_file:
            self.workers[e.engine_id] = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def supervise_workers(self, now_s: float) -> list[str]:
        """Start again each worker that exited, once its delay has passed; leave one that
        crash-loops down. What happened, one line per event, for the operator."""
        said: list[str] = []
        for e in self.engines:
            worker = self.workers.get(e.engine_id)
            code = None if worker is None else worker.poll()
            if code is None or e.engine_id in self._given_up:
                continue
            restarts = self._restarts.setdefault(e.engine_id, deque())
            while restarts and restarts[0] < now_s - WORKER_RESTART_WINDOW_S:
                restarts.popleft()
            delay_s = min(WORKER_RESTART_DELAY_S * 2 ** len(restarts), WORKER_RESTART_DELAY_MAX_S)
            if e.engine_id not in self._exited_at:
                self._exited_at[e.engine_id] = now_s
                if len(restarts) >= WORKER_RESTARTS_MAX:
                    self._given_up.add(e.engine_id)
                    said.append(
                        f"replay worker {e.engine_id} exited with code {code}, its "
                        f"{len(restarts) + 1}th exit in {WORKER_RESTART_WINDOW_S:g} s: left "
                        f"down (see {self.worker_log(e)}; once fixed, convplane "
                        f"restart-region {e.region} starts it again)"
                    )
                    continue
                said.append(
                    f"replay worker {e.engine_id} exited with code {code}; starting it again "
                    f"in {delay_s:g} s (log: {self.worker_log(e)})"
                )
            if now_s - self._exited_at[e.engine_id] >= delay_s:
                del self._exited_at[e.engine_id]
                restarts.append(now_s)
                self._spawn(e)
                said.append(f"replay worker {e.engine_id} started again")
        return said

    def restart_region_workers(self, region: str) -> None:
        """``restart-region``: the region's workers started afresh (a crash-looping one too),
        against the region's node, which may have a new address."""
        for e in self.engines:
            if e.region != region or not self.kafka_bootstrap_servers:
                continue
            worker = self.workers.get(e.engine_id)
            if worker is not None and worker.poll() is None:
                continue  # running: its jobs wait in Kafka, its API calls are retried
            self._given_up.discard(e.engine_id)
            self._exited_at.pop(e.engine_id, None)
            self._restarts.pop(e.engine_id, None)
            self._spawn(e)

    def worker_log(self, engine: AttachedEngine) -> Path:
        return self.state_dir / engine.region / f"worker-{engine.engine_id}.log"

    def keep_secrets(self, saved: SavedEngines) -> None:
        """A resumed plane's workers' keys, bus secrets and cache-salt key: jobs still in Kafka
        stay verifiable, caches replayed before the stop stay reachable."""
        regions = {e.region for e in self.engines}
        self.worker_keys.update({r: k for r, k in saved.worker_keys.items() if r in regions})
        self.bus_secrets.update({r: k for r, k in saved.bus_secrets.items() if r in regions})
        self.cache_salt_key = saved.cache_salt_key

    def saved(self) -> SavedEngines:
        """What a plain ``up`` attaches again (``plane_state``)."""
        return SavedEngines(
            tuple(f"{e.region}={e.url}" for e in self.engines),
            self.priority_declared,
            self.kafka_bootstrap_servers or "",
            dict(self.worker_keys),
            dict(self.bus_secrets),
            self.cache_salt_key,
        )

    def info(self) -> dict[str, Any]:
        return {
            "engines": [
                {
                    "region": e.region,
                    "engine_id": e.engine_id,
                    "url": e.url,
                    "model_revision": e.model_revision,
                    "checks": e.checks,
                    "reasons": e.reasons,
                    "worker": "kafka" if self.kafka_bootstrap_servers else "in-process",
                    **(
                        {
                            "worker_pid": self.workers[e.engine_id].pid,
                            "worker_log": str(self.worker_log(e)),
                        }
                        if e.engine_id in self.workers
                        else {}
                    ),
                }
                for e in self.engines
            ],
        }
