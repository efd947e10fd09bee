"""Client API keys: who is calling, what they may use, and how fast.

Keys come from the config as an environment variable, a file or a SHA-256 hex digest; only
digests are kept in memory, never the key itself, and nothing here logs or captures one.
A presented key is hashed and its digest looked up among the known ones (one lookup however
many keys there are): the caller controls the key, not its digest, so how long the lookup
takes tells it nothing of any known key.

Per key: allowed models (403 otherwise), a class and a policy that win over the request's
headers unless the key allows overrides, a requests-per-minute and a tokens-per-minute token
bucket and a cap on concurrent requests (429 with ``Retry-After``, never past the minute).
Where the quota alone decides (a window already spent, every slot taken), the request is
refused before its body is read (:meth:`Gate.refuse_early`). Tokens are charged up front at
the request's budget (prompt plus output, bounded by the context length of each choice) and
settled when it ends (router.proxy.exchange). Usage is kept in a store (router.control.quota):
the router's own memory, shared by its workers, or Redis, shared by every replica
(router.control.redis_quota). A reload's new gate keeps the old one's store, so nobody's
usage resets. Error messages never name a key.

When ``require_api_key`` is off, unknown or missing keys pass, under the ``anonymous`` limits
if configured (a known key still gets its class, policy and limits), and ``/turnout/*``
answers loopback clients only; when it is on, they get 401 and ``/turnout/*`` needs a key
marked ``admin``. ``/turnout/policies`` is the exception: it answers every caller the request
path accepts, to whom that path names them all anyway (an unknown ``X-Turnout-Policy`` is a
400 listing them); ``replay`` checks its ``--policy`` names there before sending.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from policies.types import RequestInfo
from router.config.model import AnonymousLimits, ApiKeySpec, ConfigError
from router.control.fair import Share
from router.control.quota import WINDOW_SECONDS, Limits, QuotaStore, QuotaTable, Refusal, Settler
from router.server.errors import RouterError, error_response

LOOPBACK = ("127.0.0.1", "::1", "localhost")
STORE_DOWN_CODE = "limits_unavailable"
"""The 503 of a request whose limits could not be checked (limits.store.on_error: deny)."""
ANONYMOUS = "anonymous"
"""The quota of callers without a configured key (a tenant id is 16 hex digits: no clash)."""


class Tenant:
    """One configured key: its spec, and the quota its requests count against."""

    __slots__ = ("capture_id", "digest", "limits", "share", "spec")

    def __init__(self, spec: ApiKeySpec, digest: bytes) -> None:
        self.spec = spec
        self.digest = digest
        self.capture_id = tenant_id(digest)
        self.limits = Limits(spec.requests_per_minute, spec.tokens_per_minute, spec.max_concurrency)
        self.share = Share(self.capture_id, spec.priority, spec.weight)
        """Its place in the admission queues (router.control.fair)."""

    def overrides(self, configured: object) -> bool:
        """Whether a request header may override a setting the key configures as ``configured``."""
        return configured is None or self.spec.allow_overrides


class QuotaHold:
    """An admitted request's hold on its quota; :meth:`release` exactly once."""

    __slots__ = ("_ceiling", "_charged", "_limits", "_quota", "_store")

    def __init__(
        self, store: Settler, quota: str, limits: Limits, charged: int, ceiling: int
    ) -> None:
        self._store = store
        self._quota = quota
        self._limits = limits
        self._charged = charged
        self._ceiling = ceiling

    @property
    def charged(self) -> int:
        """The tokens taken up front."""
        return self._charged

    def release(self, used_tokens: int) -> None:
        """Free the concurrency slot and settle the token charge with ``used_tokens``
        (bounded by the request's ceiling, its choices times the context length: a usage
        figure past it is a backend's lie)."""
        refund = self._charged - min(max(used_tokens, 0), self._ceiling)
        self._store.settle(self._quota, self._limits, refund)


def _refused(who: str, refusal: Refusal) -> RouterError:
    if refusal.kind == "open":
        return _too_many(f"{who} has {refusal.held} requests open", 1.0)
    if refusal.kind == "store":
        return RouterError(
            503,
            "the limits store is unreachable",
            code=STORE_DOWN_CODE,
            headers={"Retry-After": "1"},
        )
    return _too_many(f"{who} is over its {refusal.kind} per minute", refusal.wait)


def _too_many(message: str, wait: float) -> RouterError:
    # A bucket refills whole within its minute; a debt (usage past the charge) may take
    # longer, but the client is told no more than the window and simply asks again.
    retry = str(min(WINDOW_SECONDS, max(1, math.ceil(wait))))
    return RouterError(429, message, code="rate_limit_exceeded", headers={"Retry-After": retry})


def tenant_id(digest: bytes) -> str:
    """What a capture line (and the Batch API's ownership) names a key by: a hash keyed by
    the key's digest, so it is stable across restarts and replicas yet reveals neither the
    key, its digest nor a configured name."""
    return hmac.new(digest, b"turnout-tenant", hashlib.sha256).hexdigest()[:16]


def tenant_shares(specs: Sequence[ApiKeySpec]) -> dict[str, Share]:
    """Each configured key's tenant id -> its place in the admission queues (its ``weight``
    and ``priority`` band), for every key whose digest can be had here: all ``sha256`` keys,
    and ``env`` or ``file`` keys whose variable is set or file readable (the others are left
    out). ``replay simulate`` maps a capture's tenants by it: a tenant id is derived from the
    key's digest alone (:func:`tenant_id`), not from the capture's hash key."""
    shares: dict[str, Share] = {}
    for spec in specs:  # a key listed twice: its last entry, as the gate has it
        try:
            digest = _resolve(spec)
        except ValueError:
            continue
        if digest is not None:
            tenant = tenant_id(digest)
            shares[tenant] = Share(tenant, spec.priority, spec.weight)
    return shares


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The bearer token of ``Authorization``, if any."""
    auth = headers.get("Authorization", "")
    if auth[:7].lower() != "bearer ":
        return None
    return auth[7:].strip() or None


def digest_of(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


POLICIES_PATH = "/turnout/policies"
"""The policy list: not an admin endpoint (see the module's docstring)."""


class Gate:
    """Authentication and per-key limits for one router configuration."""

    def __init__(
        self,
        specs: Sequence[ApiKeySpec],
        *,
        required: bool,
        protect_metrics: bool = False,
        anonymous: AnonymousLimits | None = None,
        store: QuotaStore | None = None,
    ) -> None:
        """Resolve every key to its digest; raises ConfigError naming each unusable key.

        ``anonymous``: the limits shared by callers without a configured key (keys optional).
        ``store``: where usage is kept (router.control.quota; by default this process's own
        memory); a reload's new gate is given its predecessor's, so nobody's usage resets.
        """
        self.required = required
        self._protect_metrics = protect_metrics
        self.store: QuotaStore = store if store is not None else QuotaTable.private()
        self._anonymous = (
            None
            if anonymous is None
            else Limits(
                anonymous.requests_per_minute,
                anonymous.tokens_per_minute,
                anonymous.max_concurrency,
            )
        )
        self._tenants: list[Tenant] = []
        errors: list[tuple[str, str]] = []
        for i, spec in enumerate(specs):
            try:
                digest = _resolve(spec)
            except ValueError as exc:
                where = "file" if spec.file is not None else "sha256" if spec.sha256 else "env"
                errors.append((f"api_keys[{i}].{where}", str(exc)))
                continue
            if digest is not None:
                self._tenants.append(Tenant(spec, digest))
        if errors:
            raise ConfigError(errors)
        # By digest (a key listed twice: its last entry, as before). Looking a digest up
        # tells a caller nothing of any key: what it controls is the key, and the digest
        # of a wrong one is unrelated to every right one's.
        self._by_digest = {t.digest: t for t in self._tenants}

    @property
    def keyless(self) -> bool:
        """No key is known and none is required: no key can be told right or wrong."""
        return not self._tenants and not self.required

    def identify(self, headers: Mapping[str, str]) -> Tenant | None:
        """The caller's tenant; None for an unknown caller when keys are optional; else 401.

        Required keys whose variables are all unset let nobody in (the CLI warns at start).
        """
        if self.keyless:
            return None
        key = presented_key(headers)
        found = self._by_digest.get(digest_of(key)) if key is not None else None
        if found is None and self.required:
            raise RouterError(401, "invalid or missing API key", code="invalid_api_key")
        return found

    def tenant(self, capture_id: str) -> Tenant | None:
        """The configured key whose tenant id is ``capture_id`` (a batch's creator)."""
        return next((t for t in self._tenants if t.capture_id == capture_id), None)

    def needs_admin(self, path: str) -> bool:
        """Whether ``path`` is an admin endpoint under this configuration."""
        if path == POLICIES_PATH:
            return False
        return path.startswith("/turnout/") or (self._protect_metrics and path == "/metrics")

    def check_admin(self, headers: Mapping[str, str], remote: str | None) -> None:
        """403 unless the caller holds an admin key (keys required) or is on loopback
        (keys optional: nobody has proven who they are, so only the host itself may)."""
        if not self.required:
            if remote is None or not is_loopback(remote):
                raise RouterError(
                    403, "this endpoint answers only loopback clients", code="forbidden"
                )
            return
        tenant = self.identify(headers)
        if tenant is None or not tenant.spec.admin:
            raise RouterError(403, "this endpoint needs an admin API key", code="forbidden")

    def _quota(self, tenant: Tenant | None) -> tuple[str, Limits, str] | None:
        """The quota a caller's requests count against, its limits, and how errors name it."""
        if tenant is not None:
            return tenant.capture_id, tenant.limits, "this API key"
        if self._anonymous is not None:
            return ANONYMOUS, self._anonymous, "anonymous traffic"
        return None

    def refuse_early(self, tenant: Tenant | None, *, tokens: bool = True) -> None:
        """429 now if the caller's quota alone refuses any request: every concurrent slot
        taken, or the requests window (or, with ``tokens``, the token window) spent, as far
        as this process knows without asking the store. Called before the body is read, so
        a caller over its quota costs no reading nor parsing; :meth:`admit` reserves, with
        the request's own charge."""
        found = self._quota(tenant)
        if found is not None:
            quota, limits, who = found
            refusal = self.store.check(quota, limits, 1 if tokens else 0)
            if refusal is not None:
                raise _refused(who, refusal)

    async def admit(
        self, tenant: Tenant | None, info: RequestInfo, context_tokens: int
    ) -> QuotaHold | None:
        """Check the caller's model list and limits; take a slot and charge the buckets.

        The charge is the request's budget (prompt plus output of every choice), never more
        than ``context_tokens`` a choice (no engine can use more) nor than the token bucket
        holds; a request charged nothing (a tokenizer call) needs no tokens.
        """
        if tenant is not None:
            spec = tenant.spec
            if spec.models and info.model not in spec.models:
                raise RouterError(
                    403,
                    f"this API key may not use model '{info.model}'",
                    "model",
                    "model_not_allowed",
                )
        found = self._quota(tenant)
        if found is None:
            return None
        ceiling = info.choices * context_tokens
        charge = min(info.prompt_tokens + info.expected_output_tokens, ceiling)
        if found[1].tokens_per_minute is not None:
            charge = min(charge, found[1].tokens_per_minute)
        return await self._reserve(found, charge, ceiling)

    async def admit_call(self, tenant: Tenant | None) -> QuotaHold | None:
        """:meth:`admit` for a call that names no model and spends no tokens (the Batch
        API's): one of the caller's requests per minute and a concurrency slot, or 429."""
        found = self._quota(tenant)
        return None if found is None else await self._reserve(found, 0, 0)

    async def _reserve(
        self, found: tuple[str, Limits, str], charge: int, ceiling: int
    ) -> QuotaHold:
        quota, limits, who = found
        got = await self.store.reserve(quota, limits, charge)
        if isinstance(got, Refusal):
            raise _refused(who, got)
        return QuotaHold(got, quota, limits, charge, ceiling)


def _resolve(spec: ApiKeySpec) -> bytes | None:
    """The key's SHA-256 digest; None when its environment variable is unset."""
    if spec.sha256 is not None:
        return bytes.fromhex(spec.sha256)
    if spec.file is not None:
        try:
            key = Path(spec.file).read_bytes().decode("utf-8").strip()
        except OSError as exc:
            raise ValueError(f"cannot read key file {spec.file}: {exc.strerror}") from None
        except UnicodeDecodeError:  # Python's message would quote a byte of the key
            raise ValueError(f"key file {spec.file} is not UTF-8 text") from None
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
                gate().check_admin(request.headers, request.remote)
            except RouterError as exc:
                return error_response(exc)
        return await handler(request)

    return check


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.") or host == "::ffff:127.0.0.1"


def exposure_warning(host: str, required: bool) -> str | None:
    """The startup warning for a router reachable beyond loopback without keys."""
    if required or is_loopback(host):
        return None
    return f"listening on {host} without require_api_key: anyone who can reach it can use it"
