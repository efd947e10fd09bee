"""Talking to backends: header hygiene, per-class timeouts and connect-with-failover.

Failover happens only before the upstream's response headers, i.e. before any byte can have
reached the client: a refused connection, a timeout while waiting for the headers, or a
5xx/429 answer moves on to the next backend of the policy's ranked list (bounded attempts,
exponential backoff). Once :func:`open_upstream` has returned, the caller never retries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from policies.types import RequestInfo
from router.backends import BackendState
from router.config import ClassTimeouts, FailoverSettings

# Hop-by-hop headers (RFC 9110 7.6.1) plus what the router sets itself or must not pass on.
_DROP_UPSTREAM = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        # The client's credential is for the router; a backend gets its own key (api_key_env).
        "authorization",
        "cookie",
        # The router meters the bytes it forwards, so it asks for them uncompressed.
        "accept-encoding",
        "x-request-id",
        "x-switchyard-policy",
        "x-request-class",
    }
)
_DROP_DOWNSTREAM = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "date",
        "server",
        "x-request-id",
    }
)
_MAX_ERROR_BODY = 64 * 1024


def _connection_tokens(headers: Mapping[str, str]) -> frozenset[str]:
    """Headers named in ``Connection`` are hop-by-hop too (RFC 9110 7.6.1)."""
    value = headers.get("Connection") or headers.get("connection")
    if not value:
        return frozenset()
    return frozenset(t.strip().lower() for t in value.split(",") if t.strip())


def upstream_headers(
    client: Mapping[str, str], request_id: str, api_key: str | None
) -> dict[str, str]:
    """The headers sent to a backend: the client's end-to-end headers plus id and key."""
    drop = _DROP_UPSTREAM | _connection_tokens(client)
    out = {k: v for k, v in client.items() if k.lower() not in drop}
    out["X-Request-Id"] = request_id
    out["Content-Type"] = "application/json"
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def downstream_headers(upstream: Mapping[str, str], extra: Mapping[str, str]) -> CIMultiDict[str]:
    """The upstream response's end-to-end headers plus the router's own."""
    drop = _DROP_DOWNSTREAM | _connection_tokens(upstream)
    out = CIMultiDict((k, v) for k, v in upstream.items() if k.lower() not in drop)
    out.update(extra)
    return out


@dataclass(frozen=True, slots=True)
class Target:
    """One attempt's destination: a backend and the exact body bytes it gets."""

    backend: BackendState
    url: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Failure:
    """Why an attempt failed. ``status``/``body`` are set when the backend answered."""

    backend: str
    message: str
    status: int | None = None
    body: bytes | None = None
    content_type: str | None = None
    timeout: bool = False


class AttemptFailed(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@dataclass(frozen=True, slots=True)
class Opened:
    """An upstream that answered with headers (any status below 500 other than 429)."""

    target: Target
    response: aiohttp.ClientResponse
    failovers: int


class UpstreamFailed(Exception):
    """Every attempt failed; ``last`` is the final one, ``failovers`` how many moved on."""

    def __init__(self, last: Failure, failovers: int) -> None:
        super().__init__(last.message)
        self.last = last
        self.failovers = failovers


def client_timeout(t: ClassTimeouts) -> aiohttp.ClientTimeout:
    # No sock_read: aiohttp would re-arm a timer on every chunk. Streams get an IdleWatch;
    # a non-streamed answer arrives whole after the generation, so only `total` bounds it.
    return aiohttp.ClientTimeout(total=t.total, sock_connect=t.connect)


class IdleWatch:
    """Closes a streaming response when nothing arrived for ``idle`` seconds.

    The relay loop only stores the time of each chunk in :attr:`last`; the timer re-arms
    itself lazily, so there is one timer per idle period rather than one per chunk.
    """

    __slots__ = ("_handle", "_idle", "_loop", "_response", "fired", "last")

    def __init__(self, response: aiohttp.ClientResponse, idle: float) -> None:
        self.last = time.monotonic()
        self.fired = False
        self._idle = idle
        self._response = response
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(idle, self._check)

    def _check(self) -> None:
        left = self.last + self._idle - time.monotonic()
        if left > 0:
            self._handle = self._loop.call_later(left, self._check)
            return
        self.fired = True
        self._response.close()

    def cancel(self) -> None:
        self._handle.cancel()


async def open_upstream(
    session: aiohttp.ClientSession,
    targets: Sequence[Target],
    *,
    req: RequestInfo,
    headers: Mapping[str, str],
    timeouts: ClassTimeouts,
    failover: FailoverSettings,
    on_failover: Callable[[str], None],
) -> Opened:
    """Send to ``targets`` in order until one answers; see the module docstring.

    Each attempt counts in its backend's in-flight figures while it is open; the returned
    backend stays counted until the caller calls ``backend.finish(req)``.
    """
    timeout = client_timeout(timeouts)
    first_byte = timeouts.first_byte if req.stream else None
    try:  # the common case, without the retry machinery's per-request cost
        response = await _attempt(session, targets[0], req, headers, timeout, first_byte)
        return Opened(targets[0], response, 0)
    except AttemptFailed as exc:
        attempts = min(failover.max_attempts, len(targets))
        if attempts < 2:
            raise UpstreamFailed(exc.failure, 0) from None
        on_failover(targets[0].backend.name)
    retrying = AsyncRetrying(
        stop=stop_after_attempt(attempts - 1),
        wait=wait_exponential(multiplier=failover.backoff_initial, max=failover.backoff_max),
        retry=retry_if_exception_type(AttemptFailed),
        reraise=True,
    )
    index = 1
    try:
        async for attempt in retrying:
            with attempt:
                if index > 1:
                    on_failover(targets[index - 1].backend.name)
                target = targets[index]
                index += 1
                response = await _attempt(session, target, req, headers, timeout, first_byte)
                return Opened(target, response, index - 1)
    except AttemptFailed as exc:
        raise UpstreamFailed(exc.failure, index - 1) from None
    raise AssertionError("unreachable: tenacity either returns or re-raises")


async def _attempt(
    session: aiohttp.ClientSession,
    target: Target,
    req: RequestInfo,
    client_headers: Mapping[str, str],
    timeout: aiohttp.ClientTimeout,
    first_byte: float | None,
) -> aiohttp.ClientResponse:
    backend = target.backend
    headers = upstream_headers(client_headers, req.request_id, backend.api_key)
    backend.start(req)
    try:
        async with asyncio.timeout(first_byte):
            response = await session.post(
                target.url, data=target.body, headers=headers, timeout=timeout
            )
    except TimeoutError:
        backend.finish(req)
        backend.request_failed()
        raise AttemptFailed(
            Failure(backend.name, f"backend {backend.name} timed out", timeout=True)
        ) from None
    except (aiohttp.ClientError, OSError) as exc:
        backend.finish(req)
        backend.request_failed()
        timed_out = isinstance(exc, aiohttp.ServerTimeoutError)
        message = f"backend {backend.name} unreachable: {exc.__class__.__name__}"
        raise AttemptFailed(Failure(backend.name, message, timeout=timed_out)) from None
    except BaseException:
        backend.finish(req)
        raise
    if response.status >= 500 or response.status == 429:
        try:
            body = await response.content.read(_MAX_ERROR_BODY)
        except (aiohttp.ClientError, OSError, TimeoutError):
            body = b""
        finally:
            response.close()
            backend.finish(req)
        if response.status >= 500:
            backend.request_failed()
        raise AttemptFailed(
            Failure(
                backend.name,
                f"backend {backend.name} answered {response.status}",
                status=response.status,
                body=body,
                content_type=response.headers.get("Content-Type"),
            )
        )
    backend.request_ok()
    return response
