"""Which failed attempts count against a backend: decided by evidence across the failover.

Each case sends one request through ``open_upstream`` to raw loopback backends answering a
scripted status (``None``: nothing listens, the connection is refused; :data:`HANG`: the
backend reads the request and never answers), with breakers that open on one failure and no
ejection cap, and reads which breakers opened.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Sequence
from contextlib import closing

import pytest

from policies.types import RequestInfo
from router.backends.pool import Pool
from router.config.model import (
    BackendSpec,
    ClassTimeouts,
    FailoverSettings,
    HealthSettings,
    LimitSettings,
)
from router.proxy.keepalive import ConnectionPool
from router.proxy.upstream import Opened, Target, UpstreamFailed, open_upstream
from tests.router.rawserver import BODY, Backend, Peer, answer_each

IDLE = LimitSettings().upstream_idle_seconds  # the default `limits` keeps an upstream idle

HEALTH = HealthSettings(failures_to_eject=1, cooldown=60.0, max_ejected_fraction=1.0)
REQ = RequestInfo("r", "completions", "m", "interactive", prompt_tokens=1)
HANG = 0
"""A backend that takes the request and answers nothing before the deadline."""
DEADLINE = 0.3


async def hang(peer: Peer) -> None:
    await peer.request()
    await peer.client_gone()


def answer(status: int) -> bytes:
    body = b'{"error":{"message":"no"}}'
    return b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


def refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def attempt(
    statuses: Sequence[int | None], max_attempts: int = 3
) -> tuple[list[str], Opened | UpstreamFailed]:
    """Which backends' breakers opened, and what open_upstream gave."""
    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for status in statuses:
            if status is None:
                urls.append(refused_url())
                continue
            script = hang if status == HANG else answer_each(answer(status))
            backend = await stack.enter_async_context(Backend(script))
            urls.append(f"http://127.0.0.1:{backend.origin.port}")
        specs = [BackendSpec(f"b{i}", "vllm", url) for i, url in enumerate(urls)]
        pool = Pool(specs, {}, HEALTH)
        targets = [Target(b, b.spec.url + "/v1/completions", BODY) for b in pool.backends]
        with closing(ConnectionPool(IDLE)) as connections:
            result: Opened | UpstreamFailed
            try:
                result = await open_upstream(
                    connections,
                    targets,
                    req=REQ,
                    headers={},
                    timeouts=ClassTimeouts(connect=1.0, non_stream_total=DEADLINE),
                    failover=FailoverSettings(max_attempts, 0.0, 0.0),
                    on_failover=lambda name: None,
                )
                result.conn.abort()
                result.lease.release()
            except UpstreamFailed as exc:
                result = exc
        return [b.name for b in pool.backends if b.breaker.ejected], result


@pytest.mark.parametrize(
    ("statuses", "ejected"),
    [
        ([500, 200], ["b0"]),  # another backend served it: the 500 was b0's own
        ([500, 501, 200], ["b0", "b1"]),
        ([500, 500, 500], []),  # every backend fails it the same way: the request's fault
        ([500, 501], []),  # nobody showed it servable
        ([500, 400], []),  # the request was wrong; b0 failing on it says nothing of b0
        ([503, 500], ["b0"]),  # a gateway status is the backend's at once
        ([500, 502, 504], ["b1", "b2"]),
        ([None, 500], ["b0"]),  # a refused connection too
        ([429, 200], []),  # busy is not broken
        ([HANG, HANG, HANG], []),  # a generation longer than the deadline on every engine
        ([HANG, HANG], []),
        ([HANG, 500], []),  # nobody showed it servable
        ([HANG, 400], []),
        ([HANG, 200], ["b0"]),  # another backend answered in time: b0's wait was its own
        ([HANG, HANG, 200], ["b0", "b1"]),
        ([None, HANG], ["b0"]),  # the refusal is b0's whatever the request
    ],
)
async def test_a_5xx_or_timeout_counts_only_when_another_backend_served_the_request(
    statuses: list[int | None], ejected: list[str]
) -> None:
    opened, result = await attempt(statuses)
    assert opened == ejected
    if statuses[-1] == 200:
        assert isinstance(result, Opened) and result.target.backend.name == f"b{len(statuses) - 1}"
    elif statuses[-1] == HANG:
        assert isinstance(result, UpstreamFailed) and result.last.timeout


async def test_a_lone_timeout_without_failover_counts_against_nobody() -> None:
    opened, result = await attempt([HANG, 200], max_attempts=1)
    assert opened == [] and isinstance(result, UpstreamFailed) and result.last.timeout


async def test_a_lone_500_without_failover_counts_against_nobody() -> None:
    opened, result = await attempt([500, 200], max_attempts=1)
    assert opened == [] and isinstance(result, UpstreamFailed) and result.last.status == 500
