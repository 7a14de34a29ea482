"""A replica's shard status reads, many shards to a query.

Read-index rounds (``eventlog.read_index``) ask every replica for a shard's status, one round
per shard under way at a time; under reads spread over many shards a replica got one query per
shard per round, each a round trip and a statement at the server, on a pooled connection when
the kept one was busy. ``StatusReads`` sends one query at a time for all the shards asked for
meanwhile, as group commit does for writes.

A read is always sent after its call began: a call that arrives while a query is under way
waits for the next one (the one under way may have been answered before the call began, and a
read-index round may count a replica's answer only if it was given after the round started).
Calls for the same shard share one read. A caller that stops waiting does not cancel the query
(a statement cancelled midway leaves its connection's state unknown, and the connection had to
be dropped: a reconnect per abandoned read), and the queries never outnumber one in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from eventlog.aio import consume
from eventlog.errors import ReplicaUnavailable
from eventlog.model import ShardStatus

#: reads the statuses of the given shards (every one of them in its answer)
ReadMany = Callable[[list[int]], Awaitable[dict[int, ShardStatus]]]


class StatusReads:
    def __init__(self, region: str, read_many: ReadMany) -> None:
        self._region = region
        self._read_many = read_many
        #: shards asked for since the query under way was sent, and their callers' answer
        self._waiting: dict[int, asyncio.Future[ShardStatus]] = {}
        self._sender: asyncio.Task[None] | None = None
        self._closed = False

    async def status(self, shard: int) -> ShardStatus:
        if self._closed:
            raise self._closed_error()
        answer = self._waiting.get(shard)
        if answer is None:
            answer = asyncio.get_running_loop().create_future()
            answer.add_done_callback(consume)
            self._waiting[shard] = answer
            if self._sender is None:
                self._sender = asyncio.ensure_future(self._send())
        return await asyncio.shield(answer)

    async def _send(self) -> None:
        try:
            while self._waiting:
                asked, self._waiting = self._waiting, {}
                try:
                    statuses = await self._read_many(sorted(asked))
                except BaseException as error:  # every caller of this query gets it
                    failure = error if isinstance(error, Exception) else self._closed_error()
                    for answer in asked.values():
                        if not answer.done():
                            answer.set_exception(failure)
                    if not isinstance(error, Exception):  # cancelled: the store closes
                        raise
                    continue
                for shard, answer in asked.items():
                    if not answer.done():
                        answer.set_result(statuses[shard])
        finally:
            self._sender = None

    async def close(self, wait_s: float) -> None:
        """Fail the calls still waiting; wait at most ``wait_s`` for the query under way,
        then cancel it."""
        self._closed = True
        for answer in self._waiting.values():
            if not answer.done():
                answer.set_exception(self._closed_error())
        self._waiting.clear()
        sender = self._sender
        if sender is not None:
            _, pending = await asyncio.wait({sender}, timeout=wait_s)
            for task in pending:
                task.cancel()

    def _closed_error(self) -> ReplicaUnavailable:
        return ReplicaUnavailable(f"replica {self._region}: the store is closed")
