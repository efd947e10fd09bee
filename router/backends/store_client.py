"""The one way a router process opens its client of the shared store (``limits.store.redis``):
the limits store, the placement feed and the fleet load exchange each hold one."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

TIMEOUT = 0.5
"""Seconds a Redis call may take before Redis counts as unreachable."""


def store_client(url: str) -> Redis:
    """A client whose calls fail within :data:`TIMEOUT`.

    A call that finds its pooled connection dropped (a restarted server closed it) is sent
    again at once on a new one: without that, each connection the pool kept through an
    outage failed one call after Redis was back, and each failure reported a new outage.
    A timeout is not sent again: the server may have run the call (a reservation taken
    twice), and an outage should cost a request one :data:`TIMEOUT`, not two.
    """
    return Redis.from_url(
        url,
        socket_timeout=TIMEOUT,
        socket_connect_timeout=TIMEOUT,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )
