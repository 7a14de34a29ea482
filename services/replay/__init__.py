"""The region node's replay service: rebuilds the KV of conversations whose shards moved here,
in spare prefill capacity.

Public: ``config`` (``ReplayConfig``, part of the cluster file) and ``service.ReplayService``;
its routes are the edge's (``services.api.replay_routes``: ``replay_router``, and
``affinity_body``, the ``worker`` of ``/route``). The service is wired by
``services.bootstrap.replay`` (``build_replay_service``, ``watch_replay``). This ``__init__``
imports only the config, so ``services.config`` stays cheap to import. It imports nothing else
of ``services``.
"""

from services.replay.config import EngineConfig, ReplayConfig

__all__ = ["EngineConfig", "ReplayConfig"]
