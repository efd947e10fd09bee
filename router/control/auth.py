"""Client API keys: who is calling, what they may use, and how fast.

Keys come from the config as an environment variable, a file or a SHA-256 hex digest; only
digests are kept in memory, never the key itself, and nothing here logs or captures one.
A presented key is hashed and compared against every known digest with
:func:`hmac.compare_digest`, without stopping at the first match, so the time taken does not
depend on which key (if any) matched.

Per key: allowed models (403 otherwise), a class and a policy that apply unless the request
says otherwise, a requests-per-minute and a tokens-per-minute token bucket and a cap on
concurrent requests (429 with ``Retry-After``). Tokens are charged up front at the request's
estimate (prompt plus output budget) and settled with the engine's usage when it ends.

When ``require_api_key`` is off, unknown or missing keys pass (a known key still gets its
class, policy and limits); when it is on, they get 401 and ``/switchyard/*`` needs a key
marked ``admin``.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from policies.types import RequestInfo
from router.config.model import ApiKeySpec, ConfigError
from router.server.errors import RouterError, error_response

Clock = Callable[[], float]
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class TokenBucket:
    """``per_minute`` tokens, refilled continuously; starts full."""

    __slots__ = ("_clock", "_rate", "_stamp", "capacity", "level")

    def __init__(self, per_minute: int, clock: Clock) -> None:
        self.capacity = float(per_minute)
        self.level = self.capacity
        self._rate = per_minute / 60.0
        self._clock = clock
        self._stamp = clock()

    def _refill(self) -> None:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._stamp) * self._rate)
        self._stamp = now

    def wait_for(self, n: float) -> float:
        """Seconds until ``n`` tokens are there (0 when they are now); takes nothing.

        A request larger than the whole bucket needs a full bucket, so it is slow, not
        impossible.
        """
        self._refill()
        need = min(n, self.capacity) - self.level
        return 0.0 if need <= 0 else need / self._rate

    def take(self, n: float) -> None:
        """Remove ``n`` tokens; the level may go negative (a debt later refills repay)."""
        self.level -= n

    def give(self, n: float) -> None:
        self.level = min(self.capacity, self.level + n)


class Tenant:
    """One configured key's live state: its buckets and its requests in flight."""

    __slots__ = ("capture_id", "digest", "inflight", "requests", "spec", "tokens")

    def __init__(self, spec: ApiKeySpec, digest: bytes, clock: Clock) -> None:
        self.spec = spec
        self.digest = digest
        # What a capture line names the tenant by: a hash keyed by the key's digest, so it is
        # stable across restarts and replicas yet reveals neither the key, its digest nor its
        # configured name.
        self.capture_id = hmac.new(digest, b"switchyard-tenant", hashlib.sha256).hexdigest()[:16]
        self.inflight = 0
        rpm, tpm = spec.requests_per_minute, spec.tokens_per_minute
        self.requests = TokenBucket(rpm, clock) if rpm else None
        self.tokens = TokenBucket(tpm, clock) if tpm else None


class Lease:
    """An admitted request's hold on its tenant; :meth:`release` exactly once."""

    __slots__ = ("_charged", "_tenant")

    def __init__(self, tenant: Tenant, charged: int) -> None:
        self._tenant = tenant
        self._charged = charged

    def release(self, used_tokens: int | None) -> None:
        """Free the concurrency slot; settle the token charge with ``used_tokens`` (what the
        engine reported using), if known (otherwise the estimate stands)."""
        self._tenant.inflight -= 1
        bucket = self._tenant.tokens
        if bucket is not None and used_tokens is not None:
            refund = self._charged - used_tokens
            if refund >= 0:
                bucket.give(refund)
            else:
                bucket.take(-refund)


def _too_many(message: str, wait: float) -> RouterError:
    retry = str(max(1, math.ceil(wait)))
    return RouterError(429, message, code="rate_limit_exceeded", headers={"Retry-After": retry})


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The bearer token of ``Authorization``, if any."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() != "bearer ":
        return None
    return auth[7:].strip() or None


def digest_of(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class Gate:
    """Authentication and per-key limits for one router configuration."""

    def __init__(
        self,
        specs: Sequence[ApiKeySpec],
        *,
        required: bool,
        protect_metrics: bool = False,
        clock: Clock = time.monotonic,
    ) -> None:
        """Resolve every key to its digest; raises ConfigError naming each unusable key."""
        self.required = required
        self._protect_metrics = protect_metrics
        self._tenants: list[Tenant] = []
        errors: list[tuple[str, str]] = []
        for i, spec in enumerate(specs):
            try:
                digest = _resolve(spec)
            except ValueError as exc:
                errors.append((f"api_keys[{i}]", str(exc)))
                continue
            if digest is not None:
                self._tenants.append(Tenant(spec, digest, clock))
        if errors:
            raise ConfigError(errors)

    def identify(self, headers: Mapping[str, str]) -> Tenant | None:
        """The caller's tenant; None for an unknown caller when keys are optional; else 401.

        Required keys whose variables are all unset let nobody in (the CLI warns at start).
        """
        if not self._tenants and not self.required:
            return None
        key = presented_key(headers)
        found: Tenant | None = None
        if key is not None:
            digest = digest_of(key)
            for tenant in self._tenants:  # no early exit: constant in which key matched
                if hmac.compare_digest(digest, tenant.digest):
                    found = tenant
        if found is None and self.required:
            raise RouterError(401, "invalid or missing API key", code="invalid_api_key")
        return found

    def needs_admin(self, path: str) -> bool:
        """Whether ``path`` is an admin endpoint under this configuration."""
        return path.startswith("/switchyard/") or (self._protect_metrics and path == "/metrics")

    def check_admin(self, headers: Mapping[str, str]) -> None:
        """401/403 unless keys are off or the caller holds an admin key."""
        if not self.required:
            return
        tenant = self.identify(headers)
        if tenant is None or not tenant.spec.admin:
            raise RouterError(403, "this endpoint needs an admin API key", code="forbidden")

    def admit(self, tenant: Tenant | None, info: RequestInfo) -> Lease | None:
        """Check the tenant's model list and limits; take a slot and charge the buckets."""
        if tenant is None:
            return None
        spec = tenant.spec
        if spec.models and info.model not in spec.models:
            raise RouterError(
                403,
                f"API key '{spec.name}' may not use model '{info.model}'",
                "model",
                "model_not_allowed",
            )
        if spec.max_concurrency is not None and tenant.inflight >= spec.max_concurrency:
            raise _too_many(f"API key '{spec.name}' has {tenant.inflight} requests open", 1.0)
        charge = info.prompt_tokens + info.expected_output_tokens
        wait_req = tenant.requests.wait_for(1) if tenant.requests is not None else 0.0
        wait_tok = tenant.tokens.wait_for(charge) if tenant.tokens is not None else 0.0
        if wait_req > 0:
            raise _too_many(f"API key '{spec.name}' is over its requests per minute", wait_req)
        if wait_tok > 0:
            raise _too_many(f"API key '{spec.name}' is over its tokens per minute", wait_tok)
        if tenant.requests is not None:
            tenant.requests.take(1)
        if tenant.tokens is not None:
            tenant.tokens.take(charge)
        tenant.inflight += 1
        return Lease(tenant, charge)


def _resolve(spec: ApiKeySpec) -> bytes | None:
    """The key's SHA-256 digest; None when its environment variable is unset."""
    if spec.sha256 is not None:
        return bytes.fromhex(spec.sha256)
    if spec.file is not None:
        try:
            key = Path(spec.file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"cannot read key file {spec.file}: {exc.strerror}") from None
        if not key:
            raise ValueError(f"key file {spec.file} is empty")
        return digest_of(key)
    value = os.environ.get(spec.env or "")
    return digest_of(value) if value else None


def admin_only(gate: Callable[[], Gate]) -> Middleware:
    """Middleware: admin endpoints (:meth:`Gate.needs_admin`) need an admin key when keys are
    required.

    ``gate`` is called per request because a reload swaps the gate.
    """

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if gate().needs_admin(request.path):
            try:
                gate().check_admin(request.headers)
            except RouterError as exc:
                return error_response(exc)
        return await handler(request)

    return check


def exposure_warning(host: str, required: bool) -> str | None:
    """The startup warning for a router reachable beyond loopback without keys."""
    if required or host in LOOPBACK or host.startswith("127."):
        return None
    return f"listening on {host} without require_api_key: anyone who can reach it can use it"
