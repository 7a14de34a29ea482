"""The region node's replay service: rebuilds the KV of conversations whose shards moved here,
in spare prefill capacity.

Public: ``config`` (``ReplayConfig``, part of the cluster file), ``service.ReplayService``,
``wiring`` (``open_replay_service`` for bootstrap, ``install_replay`` for the app),
``routes.replay_router`` and ``routes.affinity_body`` (the ``worker`` of ``/route``). This
``__init__`` imports only the config, so ``services.config`` stays cheap to import.
"""

from services.replay.config import EngineConfig, ReplayConfig

__all__ = ["EngineConfig", "ReplayConfig"]
