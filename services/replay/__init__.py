"""The region node's replay service: rebuilds the KV of conversations whose shards moved here,
in spare prefill capacity.

Public: ``config`` (``ReplayConfig``, part of the cluster file), ``service.ReplayService``,
``routes.replay_router`` and ``routes.affinity_body`` (the ``worker`` of ``/route``). The
service is wired by ``services.bootstrap.replay`` (``build_replay_service``,
``install_replay``). This
``__init__`` imports only the config, so ``services.config`` stays cheap to import.
"""

from services.replay.config import EngineConfig, ReplayConfig

__all__ = ["EngineConfig", "ReplayConfig"]
