"""The router's configuration as frozen value objects (parsed and validated in parse.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from policies.types import Endpoint, RequestClass
from router.config.batch import BatchSettings
from router.config.tail import TailSettings

ENDPOINTS: tuple[Endpoint, ...] = ("chat", "completions", "embeddings", "responses")
Redaction = Literal["none", "hash", "drop"]
REDACTIONS: tuple[Redaction, ...] = ("none", "hash", "drop")
DEFAULT_CAPTURE_HEADERS = ("x-request-class", "x-turnout-policy", "x-request-id", "user-agent")
# What marks a request header as carrying a credential (never captured, refused in
# capture.headers): a part of its name (split at - _ .) that is one of these words, or that
# contains one of the stems (``x-amzn-oidc-accesstoken``, ``x-session-token``, ``api-key``,
# ``ocp-apim-subscription-key``, ``proxy-authorization``, ``set-cookie``, ``x-csrf-token``).
_CREDENTIAL_PARTS = frozenset({"key", "jwt", "bearer", "sig", "signature", "oidc"})
_CREDENTIAL_STEMS = ("auth", "cookie", "token", "secret", "passw", "apikey", "credential")
# Request headers a backend's ``forward_headers`` cannot name: hop-by-hop ones (RFC 9110
# 7.6.1), the ones the router sets itself for the body and backend it sends, and its own.
ROUTER_HEADERS = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", "content-type",
    "content-encoding", "expect", "accept-encoding", "authorization", "x-request-id",
    "x-turnout-policy", "x-request-class"})  # fmt: skip


def credential_header(name: str) -> bool:
    """Whether the request header ``name`` may carry a credential (by its name alone)."""
    parts = re.split(r"[-_.]", name.lower())
    return any(p in _CREDENTIAL_PARTS or any(s in p for s in _CREDENTIAL_STEMS) for p in parts)


class ConfigError(Exception):
    """A configuration with problems; ``errors`` holds every ``(key path, message)``."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        super().__init__("\n".join(f"{p}: {m}" if p else m for p, m in errors))
        self.errors = errors


@dataclass(frozen=True, slots=True)
class ListenSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 8 * 1024 * 1024
    """Larger request bodies get 413."""


@dataclass(frozen=True, slots=True)
class EmulatorSpec:
    """An emulator the router starts as a child process and uses as the backend's URL."""

    profile: str
    time_scale: float = 1.0
    seed: int = 0
    model: str | None = None
    role: str = "both"
    """Disaggregated serving: ``prefill``, ``decode`` or ``both`` (the profile key)."""
    overrides: tuple[tuple[str, str | int | float | bool], ...] = ()
    """Further profile keys (the emulator's ``--set KEY=VALUE``), from ``set:``."""

    def profile_overrides(self) -> dict[str, object]:
        """Every profile key this block sets, ``role`` included."""
        out: dict[str, object] = dict(self.overrides)
        out.setdefault("role", self.role)
        return out


@dataclass(frozen=True, slots=True)
class UpstreamTls:
    """How the router talks TLS to one ``https`` backend (files are PEM, read when it is added)."""

    ca_file: str | None = None
    """CA bundle that verifies the backend's certificate; None: the system's trust store."""
    cert_file: str | None = None
    """Client certificate (chain) for mutual TLS; given together with ``key_file``."""
    key_file: str | None = None
    server_name: str | None = None
    """Name sent as SNI and checked against the certificate; None: the URL's host."""
    verify: bool = True
    """False: accept any certificate (test setups only; the traffic is then unauthenticated)."""


@dataclass(frozen=True, slots=True)
class DnsDiscovery:
    """Every address a DNS name resolves to is one backend (a Kubernetes headless Service)."""

    dns: str
    port: int
    scheme: Literal["http", "https"] = "http"
    interval: float = 10.0
    """Seconds between lookups."""


@dataclass(frozen=True, slots=True)
class BackendSpec:
    name: str
    engine: str
    url: str = ""
    """Base URL without ``/v1``; empty until the CLI starts the backend's emulator."""
    models: tuple[str, ...] = ()
    """Models served; empty means: whatever the backend's /v1/models lists (or anything)."""
    api_key_env: str | None = None
    """Environment variable holding the key sent upstream as ``Authorization: Bearer``."""
    max_inflight: int | None = None
    priority_capable: bool = False
    emulator: EmulatorSpec | None = None
    forward_headers: tuple[str, ...] = ()
    """Client headers (lower case) passed to this backend besides the standard ones (content
    negotiation, trace context, User-Agent; see router.proxy.upstream)."""
    tls: UpstreamTls | None = None
    """TLS settings of an ``https`` backend; None: verify against the system's trust store."""
    discover: DnsDiscovery | None = None
    """Set: this entry stands for the replicas found behind a DNS name, each a backend of its
    own named ``<name>@<address>`` (see router.backends.fleet); ``url`` is then empty."""


@dataclass(frozen=True, slots=True)
class ApiKeySpec:
    """A client API key, given by exactly one of ``env``, ``file`` or ``sha256``."""

    name: str
    env: str | None = None
    file: str | None = None
    sha256: str | None = None
    request_class: RequestClass | None = None
    models: tuple[str, ...] = ()
    """Models this key may use; empty means all."""
    policy: str | None = None
    """Policy for this key's requests unless the request names one."""
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrency: int | None = None
    admin: bool = False
    """May call ``/turnout/*`` when keys are required."""
    allow_overrides: bool = False
    """Whether ``X-Request-Class`` and ``X-Turnout-Policy`` may override the key's own
    class and policy (by default the key's win: a batch key cannot claim interactive)."""
    priority: int = 0
    """Its band in the admission queues: higher first; the lowest band is shed first
    (router.control.fair). Callers without a key are band 0."""
    weight: float = 1.0
    """Its share against other keys of its band in a queue (2: twice one of weight 1)."""


@dataclass(frozen=True, slots=True)
class AnonymousLimits:
    """Limits shared by every caller without a configured key (when keys are optional)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrency: int | None = None


StoreOnError = Literal["allow", "deny"]
STORE_ON_ERROR: tuple[StoreOnError, ...] = ("allow", "deny")


@dataclass(frozen=True, slots=True)
class LimitStore:
    """Where API-key and anonymous usage is kept (router.control.quota): in the router's own
    memory (shared by its workers), or with ``redis_url`` in Redis, shared by every replica."""

    redis_url: str | None = None
    """``redis://HOST:PORT/DB``; it may hold a password, so it is never logged."""
    on_error: StoreOnError = "allow"
    """Redis unreachable: ``allow`` decides on the router's own buckets, ``deny`` answers 503."""


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """Connection-level limits of the listening socket (see router.server.site), and how much
    of a backend's answer the router holds at once (see router.proxy.relay)."""

    max_connections: int = 10000
    idle_seconds: float = 75.0
    """A connection with no request in progress (or only part of one) is closed after this."""
    max_headers: int = 100
    max_header_bytes: int = 8190
    """Longest request line or single header field."""
    write_timeout: float = 60.0
    """A client that reads nothing of its answer for this long is disconnected."""
    body_seconds: float = 30.0
    """Longest time a request body may take to arrive (408 after)."""
    max_upstream_event_bytes: int = 1 << 20
    """Largest SSE event a backend may send; a larger one ends the stream with an error event
    and counts as the backend's failure."""
    max_upstream_body_bytes: int = 64 << 20
    """Largest non-streamed answer a backend may send; a larger one gets the client a 502 and
    counts as the backend's failure."""
    upstream_idle_seconds: float = 4.0
    """How long an unused upstream connection is kept for the next request: under the
    engines' keep-alive (uvicorn's, and so vLLM's, is 5 s), so the router does not write a
    request into a connection the engine is just closing."""
    min_context_tokens: int = 32768
    max_context_tokens: int = 1 << 20
    """The bounds a backend's reported context length (vLLM's ``max_model_len``) is taken
    within, for the quota charge: a backend reporting 1 would make every answer nearly
    free, one reporting 10^12 would let its usage figures put a key in endless debt."""
    store: LimitStore = LimitStore()

    def context_tokens(self, reported: int) -> int:
        """``reported`` within [:attr:`min_context_tokens`, :attr:`max_context_tokens`]."""
        return min(max(reported, self.min_context_tokens), self.max_context_tokens)


@dataclass(frozen=True, slots=True)
class AccessLogSettings:
    """One JSON line per finished request on stdout (router.observe.access)."""

    enabled: bool = True
    sample: float = 1.0
    """Share of requests logged, drawn at random per request."""


@dataclass(frozen=True, slots=True)
class ShutdownSettings:
    drain_seconds: float = 30.0
    """On SIGTERM, how long in-flight requests may take to finish before being cut."""


@dataclass(frozen=True, slots=True)
class Rule:
    """A classification rule; every condition given must hold. First matching rule wins."""

    request_class: RequestClass
    endpoint: Endpoint | None = None
    stream: bool | None = None
    max_tokens_at_least: int | None = None
    max_tokens_below: int | None = None
    prompt_tokens_at_least: int | None = None
    prompt_tokens_below: int | None = None


@dataclass(frozen=True, slots=True)
class ClassificationSettings:
    default: RequestClass = "interactive"
    honor_header: bool = True
    flex_is_batch: bool = True
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    type: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClassTimeouts:
    """Seconds; ``None`` disables that bound."""

    connect: float | None = 5.0
    first_byte: float | None = 60.0
    """From sending the request to the upstream's response headers."""
    idle: float | None = 60.0
    """Longest gap between two chunks of a streamed response."""
    total: float | None = None
    """From sending the request to the response's last byte."""
    non_stream_total: float | None = 600.0
    """The same for a non-streamed request, which has no first-byte or idle bound of its own
    (a hung backend would hold it forever); ``total`` applies too when it is smaller."""

    def deadline(self, stream: bool) -> float | None:
        """Seconds from sending a request to its response's last byte (None: unbounded)."""
        if stream or self.non_stream_total is None:
            return self.total
        if self.total is None:
            return self.non_stream_total
        return min(self.total, self.non_stream_total)


@dataclass(frozen=True, slots=True)
class FailoverSettings:
    max_attempts: int = 3
    backoff_initial: float = 0.02
    backoff_max: float = 0.5


@dataclass(frozen=True, slots=True)
class HealthSettings:
    interval: float = 2.0
    timeout: float = 1.0
    failures_to_eject: int = 3
    """Consecutive failures (probes or requests) that mark a backend down."""
    cooldown: float = 10.0
    """Seconds a passively ejected backend stays out first; doubles after a failed probe."""
    cooldown_max: float = 300.0
    max_ejected_fraction: float = 0.5
    """Share of all backends passive ejection may hold out at once (rounded down): a breaker
    that would pass it stays closed. Backends that fail their probes do not count."""
    models_refresh: float = 30.0
    scrape_metrics: bool = True
    scrape_interval: float = 1.0
    scrape_stale_after: float = 5.0


@dataclass(frozen=True, slots=True)
class CaptureSettings:
    path: str
    sample_rate: float = 1.0
    redaction: Redaction = "none"
    rotate_bytes: int | None = None
    headers: tuple[str, ...] = DEFAULT_CAPTURE_HEADERS
    queue_size: int = 10000
    """Requests that may wait for the writer; more are dropped (``queue_full``)."""
    queue_bytes: int = 64 * 1024 * 1024
    """Bytes of request bodies and headers that may wait for the writer; more are dropped
    (``queue_bytes``)."""
    hash_key: bytes | None = field(default=None, repr=False)
    """The secret (from ``hash_key_env`` or ``hash_key_file``) that keys the ``hash`` filler
    and the sample; None: a random one per process (see router.observe.capture)."""


@dataclass(frozen=True, slots=True)
class ClassAdmission:
    queue_size: int = 0
    """Requests of the class that may wait for a backend slot; 0: answer 429 at once."""
    max_wait: float = 30.0
    """Seconds a request may wait before it gets 429."""
    reserve: int = 0
    """A backend's last free slots that, while tenants share the class, go only to one
    holding less than its weighted share of the class's slots (router.control.fair)."""
    active_window: float = 30.0
    """Seconds a tenant still shares the class after its last request there left."""


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """Bounded per-class waiting when every eligible backend is at ``max_inflight``."""

    classes: Mapping[str, ClassAdmission] = field(default_factory=dict)
    retry_after: float = 1.0
    """Seconds sent in ``Retry-After`` with an admission 429."""

    def for_class(self, request_class: str) -> ClassAdmission:
        return self.classes.get(request_class) or ClassAdmission()


@dataclass(frozen=True, slots=True)
class ShadowSettings:
    """Mirror a sampled share of one policy's requests to a shadow backend or policy."""

    backend: str | None = None
    policy: str | None = None
    sample: float = 1.0
    request_class: RequestClass | None = None
    """Only this class is mirrored; None: every class."""
    max_concurrency: int = 16
    """Shadow requests open at once; more are dropped (and counted)."""
    timeout: float = 120.0


@dataclass(frozen=True, slots=True)
class RouterConfig:
    backends: tuple[BackendSpec, ...]
    policies: tuple[PolicySpec, ...]
    default_policy: str
    listen: ListenSettings = ListenSettings()
    honor_policy_header: bool = True
    aliases: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Client model name -> backend name -> that backend's model name."""
    api_keys: tuple[ApiKeySpec, ...] = ()
    require_api_key: bool = False
    anonymous: AnonymousLimits | None = None
    metrics_require_admin: bool = False
    """With ``require_api_key``, ``/metrics`` also needs an admin key."""
    classification: ClassificationSettings = ClassificationSettings()
    timeouts: Mapping[str, ClassTimeouts] = field(default_factory=dict)
    failover: FailoverSettings = FailoverSettings()
    health: HealthSettings = HealthSettings()
    capture: CaptureSettings | None = None
    access_log: AccessLogSettings = AccessLogSettings()
    limits: LimitSettings = LimitSettings()
    shutdown: ShutdownSettings = ShutdownSettings()
    admission: AdmissionSettings = AdmissionSettings()
    shadow: Mapping[str, ShadowSettings] = field(default_factory=dict)
    """Served policy name -> where its mirrored requests go."""
    batch: BatchSettings | None = None
    """The Batch API; None: its endpoints answer 404."""
    pricing: Mapping[str, float] = field(default_factory=dict)
    """Backend name -> what it costs, USD an hour (``/turnout/pricing``, replay's cost)."""
    tail: Mapping[str, TailSettings] = field(default_factory=dict)
    """Request class -> its first-token deadline and hedging (router.config.tail)."""

    def timeouts_for(self, request_class: str) -> ClassTimeouts:
        return self.timeouts.get(request_class) or ClassTimeouts()

    def backend(self, name: str) -> BackendSpec:
        return next(b for b in self.backends if b.name == name)
