"""What the blocking and the asyncio client share: construction and the routing table's view.
Their API methods, each one line that drives a plan of ``_operations``, are in ``sync.py`` and
``aio.py``; all behaviour is in the plans."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Generic, Self, TypeVar

from convplane_client._cluster_file import read_cluster_file
from convplane_client._config import ClientConfig, Clock, SystemClock
from convplane_client._operations import Operations
from convplane_client._routing import RegionUrls

H = TypeVar("H")


class ClientBase(Generic[H]):
    """``regions``: ``{region name: base url}`` of the plane's nodes (any of them takes any
    request; a conversation's requests go to the region serving it while it answers), or
    ``{region name: [base url, ...]}`` for regions of several nodes (the next is tried when
    one does not answer).
    ``api_key``: a tenant key. ``http_client``, ``clock`` and ``rng`` are injectable (tests,
    proxies, TLS settings)."""

    def __init__(
        self,
        regions: Mapping[str, RegionUrls],
        api_key: str,
        *,
        config: ClientConfig | None = None,
        http_client: H | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._ops = Operations(
            regions,
            api_key,
            config=config or ClientConfig(),
            clock=clock or SystemClock(),
            rng=rng or random.Random(),
        )
        self._http: H = http_client if http_client is not None else self._default_http()

    def _default_http(self) -> H:
        raise NotImplementedError

    @classmethod
    def from_cluster_file(cls, path: Path | str, **kwargs: Any) -> Self:
        """A client of the local plane that ``convplane up`` describes in ``cluster.json``."""
        regions, api_key = read_cluster_file(Path(path))
        return cls(regions, api_key, **kwargs)

    @property
    def regions(self) -> Mapping[str, str]:
        """Base url per region name (of a region of several nodes: the one in use now)."""
        return self._ops.routing.urls

    def routed_region(self, conversation_id: str) -> str | None:
        """The region the client sends the conversation's requests to, when it knows one."""
        return self._ops.routing.routed(conversation_id)
