"""Talking to backends: per-class timeouts, connect-with-failover, and which answers may
reach the client (the headers both ways are router.proxy.headers').

Failover happens only before the upstream's response headers, i.e. before any byte can have
reached the client: a refused connection, a timeout while waiting for the headers, or a
5xx/429 answer moves on to the next backend of the policy's ranked list that is below its
``max_inflight`` (bounded attempts, exponential backoff; when every one left is full, the
request waits in its admission queue). Once :func:`open_upstream` has returned, the caller
never retries.

Which failures count against a backend (its breaker, through the lease) is decided by
evidence, since a client can craft a request that makes every engine fail:

- a refused or reset connection, a connect timeout and a gateway status (502, 503, 504) are
  the backend's (or what stands in front of it), and count at once;
- a timeout waiting for the answer and any other 5xx are held as suspect until failover ends
  (:func:`settle`): they count only if another backend then answered the same request
  properly (below 400). A request that every backend tried times out or fails on (a long
  generation past the deadline, a prompt that crashes engines), or that another backend
  refuses with a 4xx, blames none of them;
- a 4xx is the client's and counts as a working backend; a 429 (busy, not broken) counts
  neither way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import orjson

from policies.types import RequestInfo
from router.backends.pool import BackendLease, BackendState
from router.config.model import AdmissionSettings, ClassTimeouts, FailoverSettings
from router.control.admission import Admission
from router.observe.outcomes import Reason, answer_reason
from router.observe.tracing import NO_TRACE, RequestTrace
from router.proxy.connection import (
    Connection,
    ConnectTimeout,
    ProtocolError,
    ResponseHead,
    UpstreamError,
)
from router.proxy.headers import upstream_headers
from router.proxy.keepalive import ConnectionPool
from router.proxy.origin import request_head, split_url
from router.server.errors import RouterError

# A 5xx that says the backend (or a proxy in front of it) cannot serve now, whatever was asked.
_GATEWAY = frozenset({502, 503, 504})
_MAX_MESSAGE = 1000  # characters of an engine's own error message passed on
log = logging.getLogger("router")
_MAX_ERROR_BODY = 64 * 1024
_ERROR_BODY_SECONDS = 5.0  # an error answer whose body never ends must not hold failover up


class UpstreamFault(RouterError):
    """What the client gets instead of a backend's answer that must not reach it as sent
    (none of that answer has reached it yet).

    ``kind`` names the protocol error it was, for ``turnout_upstream_protocol_errors_total``;
    ``failed`` says whether it counts as the backend's failure; ``reason`` is the request's
    outcome for ``turnout_requests_total`` (an error answer, or one that broke off).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        kind: str | None = None,
        failed: bool = True,
        reason: Reason = "upstream_error",
    ) -> None:
        super().__init__(status, message, code=code)
        self.kind = kind
        self.failed = failed
        self.reason = reason


def replacement_error(status: int, body: bytes, backend: str) -> UpstreamFault | None:
    """What the client gets instead of a backend's error answer; None: ``body`` is OpenAI
    error JSON, which it gets as is.

    Otherwise an OpenAI error with the same status: an engine's JSON error of another shape
    (vLLM's and SGLang's ``{"object": "error", "message": ...}``, TGI's ``{"error": "..."}``)
    keeps its message; anything else (an HTML page from a proxy, which may name internal
    hosts or carry credentials) is never sent, and the warning it gets gives only its size:
    a log line is no safer a place for a secret than an answer.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return None
        message = doc.get("message") if doc.get("object") == "error" else err
        if isinstance(message, str):
            return UpstreamFault(
                status,
                message[:_MAX_MESSAGE],
                code="upstream_error",
                failed=False,
                reason=answer_reason(status),
            )
    if body:
        log.warning(
            "backend %s answered %d with %d bytes that are not OpenAI error JSON "
            "(neither passed on nor logged)",
            backend,
            status,
            len(body),
        )
    return UpstreamFault(
        status,
        f"backend {backend} answered {status}",
        code="upstream_error",
        kind="bad_error_body" if body else None,
        failed=False,
        reason=answer_reason(status),
    )


class Target:
    """One attempt's destination: a backend and the exact body bytes it gets.

    The body may be given as the function that makes it, called when the attempt first reads
    it: most requests are served by their first attempt, so they make one body however long
    their failover order is (it grows with the fleet up to ``max_attempts``).
    """

    __slots__ = ("_body", "_make", "backend", "url")

    def __init__(self, backend: BackendState, url: str, body: bytes | Callable[[], bytes]):
        self.backend = backend
        self.url = url
        self._body: bytes | None = body if isinstance(body, bytes) else None
        self._make: Callable[[], bytes] | None = None if isinstance(body, bytes) else body

    @property
    def body(self) -> bytes:
        if self._body is None:
            assert self._make is not None  # one of the two is set, always
            self._body, self._make = self._make(), None
        return self._body


@dataclass(frozen=True, slots=True)
class Failure:
    """Why an attempt failed. ``status``/``body`` are set when the backend answered with an
    error the client may get; ``kind``, when its answer broke the protocol (a
    ``turnout_upstream_protocol_errors_total`` kind)."""

    backend: str
    message: str
    status: int | None = None
    body: bytes | None = None
    content_type: str | None = None
    timeout: bool = False
    kind: str | None = None


class AttemptFailed(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@dataclass(frozen=True, slots=True)
class Opened:
    """An upstream that answered with headers (any status below 500 other than 429).

    The caller owns ``conn`` and ``lease`` from here: it hands ``conn`` back with
    ``ConnectionPool.release`` and releases ``lease`` when the answer is over.
    """

    target: Target
    conn: Connection
    head: ResponseHead
    lease: BackendLease
    failovers: int


class UpstreamFailed(Exception):
    """Every attempt failed; ``last`` is the final one, ``failovers`` how many moved on."""

    def __init__(self, last: Failure, failovers: int) -> None:
        super().__init__(last.message)
        self.last = last
        self.failovers = failovers


async def open_upstream(
    connections: ConnectionPool,
    targets: Sequence[Target],
    *,
    req: RequestInfo,
    headers: Mapping[str, str],
    timeouts: ClassTimeouts,
    failover: FailoverSettings,
    on_failover: Callable[[Failure], None],
    admission: Admission | None = None,
    trace: RequestTrace = NO_TRACE,
    confirm: bool = True,
) -> Opened:
    """Send to ``targets`` in order until one answers; see the module docstring.

    ``confirm=False``: the answering attempt's lease is not yet told it answered properly
    (:meth:`BackendLease.ok`): a held stream's caller does that at its first token
    (router.proxy.tail), so a first-token deadline missed after the headers can still count.

    Each attempt holds a lease on its backend's in-flight figures while it is open; a failed
    attempt's lease is released here, the answering one's is the caller's (:class:`Opened`).
    Failover passes over backends at their ``max_inflight``; when every one left is, the
    request waits in ``admission``'s queue for its class as it would have before its first
    attempt (:class:`router.control.admission.QueueRejected` when that runs out; without
    ``admission``, at once). ``trace`` gets a span per attempt, whose
    context each attempt sends upstream.
    """
    suspects: list[BackendLease] = []
    # On UpstreamFailed the suspects are dropped: no backend showed the request servable.
    try:  # the common case, without the failover loop
        opened = await _attempt(connections, targets[0], req, headers, timeouts, 0, suspects, trace)
    except AttemptFailed as exc:
        rest = list(targets[1:])
        opened = await _failover(
            connections, rest, exc.failure, req, headers, timeouts, failover, on_failover,
            admission, suspects, trace,
        )  # fmt: skip
    if suspects:
        settle(suspects, opened.head.status)
    if confirm:
        opened.lease.ok()
    return opened


def settle(suspects: Sequence[BackendLease], answered: int) -> None:
    """Blame the held timeouts and 5xx answers of a request that ``answered`` ended (see the
    module).

    Only another backend's proper answer shows that the request could be served; a 4xx says
    the request itself was wrong, so a backend that failed on it with a 500 is not blamed.
    """
    if answered < 400:
        for lease in suspects:
            lease.failed()


async def _failover(
    connections: ConnectionPool,
    rest: list[Target],
    failure: Failure,
    req: RequestInfo,
    headers: Mapping[str, str],
    timeouts: ClassTimeouts,
    failover: FailoverSettings,
    on_failover: Callable[[Failure], None],
    admission: Admission | None,
    suspects: list[BackendLease],
    trace: RequestTrace,
) -> Opened:
    """The attempts after the first failed with ``failure``, down ``rest`` (the ranking after
    the first target), as :func:`open_upstream` says; held leases go to ``suspects``.

    The first failover is immediate, each later one waits twice as long as the one before
    (from ``backoff_initial``, at most ``backoff_max``).
    """
    failovers = 0
    queue = admission if admission is not None else Admission(AdmissionSettings())
    while rest and failovers + 1 < failover.max_attempts:
        if failovers:
            backoff = failover.backoff_initial * 2 ** (failovers - 1)
            await asyncio.sleep(min(backoff, failover.backoff_max))
        # the attempt's lease is taken before the event loop runs anything else
        target = await queue.take(req.request_class, rest)
        on_failover(failure)
        failovers += 1
        try:
            return await _attempt(
                connections, target, req, headers, timeouts, failovers, suspects, trace
            )
        except AttemptFailed as exc:
            failure = exc.failure
            if admission is not None:
                admission.release()  # its backend's slot is free again: a waiter may go
    raise UpstreamFailed(failure, failovers)


async def _attempt(
    connections: ConnectionPool,
    target: Target,
    req: RequestInfo,
    client_headers: Mapping[str, str],
    timeouts: ClassTimeouts,
    failovers: int,
    suspects: list[BackendLease],
    trace: RequestTrace,
) -> Opened:
    """One attempt; a timeout waiting for the answer, or a 5xx answer other than a gateway
    status, adds its lease to ``suspects`` for :func:`settle` rather than failing it here."""
    backend = target.backend
    origin, path = split_url(target.url)
    headers = upstream_headers(
        client_headers, req.request_id, backend.api_key, backend.spec.forward_headers
    )
    trace.attempt(backend.name, target.url, headers)
    request = request_head(origin, path, headers, len(target.body))
    first_byte = timeouts.first_byte if req.stream else None
    lease = backend.lease(req)
    opening = connections.request(
        origin,
        request,
        target.body,
        connect_timeout=timeouts.connect,
        deadline=timeouts.deadline(req.stream),
        tls=backend.tls,
    )
    try:
        if first_byte is None:  # bounded by the deadline alone: no second timer to arm
            conn, head = await opening
        else:
            async with asyncio.timeout(first_byte):
                conn, head = await opening
    except (TimeoutError, UpstreamError) as exc:
        lease.release()
        if isinstance(exc, TimeoutError):
            failure = Failure(backend.name, f"backend {backend.name} timed out", timeout=True)
            if isinstance(exc, ConnectTimeout):
                lease.failed()
            else:  # the request reached the backend: the wait may be the request's own
                suspects.append(lease)
        elif isinstance(exc, ProtocolError):
            lease.failed()
            message = f"backend {backend.name} broke HTTP: {exc}"
            failure = Failure(backend.name, message, kind=exc.kind)
        else:
            lease.failed()
            failure = Failure(backend.name, f"backend {backend.name} unreachable: {exc}")
        trace.attempt_failed(None, failure.message, failure.timeout)
        raise AttemptFailed(failure) from None
    except BaseException:
        lease.release()
        raise
    if head.status >= 500 or head.status == 429:
        try:
            async with asyncio.timeout(_ERROR_BODY_SECONDS):
                body = await conn.read(_MAX_ERROR_BODY)
        except (UpstreamError, TimeoutError):
            body = b""
        finally:
            connections.release(conn)
            lease.release()
        if head.status in _GATEWAY:
            lease.failed()
        elif head.status >= 500:
            suspects.append(lease)
        trace.attempt_failed(head.status, f"backend {backend.name} answered {head.status}", False)
        raise AttemptFailed(
            Failure(
                backend.name,
                f"backend {backend.name} answered {head.status}",
                status=head.status,
                body=body,
                content_type=head.headers.get("Content-Type"),
            )
        )
    if 300 <= head.status < 400 or "Content-Encoding" in head.headers:
        unservable = _unservable(backend.name, head)
        if unservable is not None:
            connections.release(conn)  # unread, so closed
            lease.release()
            lease.failed()
            trace.attempt_failed(head.status, unservable.message, False)
            raise AttemptFailed(unservable)
    return Opened(target, conn, head, lease, failovers)


def _unservable(name: str, head: ResponseHead) -> Failure | None:
    """The failure of backend ``name``'s answer below 500 that must not reach the client as
    sent; None: it may.

    A redirect: no OpenAI endpoint redirects, so it comes from a misconfigured backend or
    something in front of it (a login page, a plain-HTTP listener sending to HTTPS), and its
    ``Location`` names an address of the router's side. Envoy passes an upstream 3xx on as
    it is, ``Location`` included, unless the route is configured to follow it internally;
    the router does neither: a redirect fails the attempt, and fails over. An encoded body:
    the router asks for ``identity`` (it meters the bytes it relays, and would relay an
    encoding under a header it does not keep) and decodes nothing.
    """
    status = head.status
    if 300 <= status < 400:
        return Failure(name, f"backend {name} answered {status}, a redirect", kind="redirect")
    coding = head.headers.get("Content-Encoding", "identity")
    if coding.strip().lower() != "identity":
        message = f"backend {name} answered in a Content-Encoding it was not asked for"
        return Failure(name, message, kind="bad_encoding")
    return None
