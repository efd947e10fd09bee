"""The router's configuration: parsed once from YAML into frozen, validated objects.

Validation reports every problem at once, each with its key path (``backends[1].url: ...``);
unknown keys are rejected. The policy entries are checked structurally here and semantically
by the policy registry (see :func:`router.app.build_policies`). The value objects live in
:mod:`router.config.model` and are importable from here.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from common.schema import Reader
from policies.types import REQUEST_CLASSES
from router.config.model import (
    DEFAULT_CAPTURE_HEADERS,
    ENDPOINTS,
    REDACTIONS,
    ApiKeySpec,
    BackendSpec,
    CaptureSettings,
    ClassificationSettings,
    ClassTimeouts,
    ConfigError,
    EmulatorSpec,
    FailoverSettings,
    HealthSettings,
    LimitSettings,
    ListenSettings,
    PolicySpec,
    RouterConfig,
    Rule,
    ShutdownSettings,
)
from router.config.traffic import admission_settings, shadow_settings

__all__ = [
    "DEFAULT_CAPTURE_HEADERS",
    "ENDPOINTS",
    "REDACTIONS",
    "ApiKeySpec",
    "BackendSpec",
    "CaptureSettings",
    "ClassTimeouts",
    "ClassificationSettings",
    "ConfigError",
    "EmulatorSpec",
    "FailoverSettings",
    "HealthSettings",
    "ListenSettings",
    "PolicySpec",
    "RouterConfig",
    "Rule",
    "load_config",
    "parse_config",
]

_TOP = [
    "listen",
    "backends",
    "aliases",
    "api_keys",
    "require_api_key",
    "metrics_require_admin",
    "classification",
    "policies",
    "default_policy",
    "honor_policy_header",
    "timeouts",
    "failover",
    "health",
    "capture",
    "admission",
    "shadow",
    "limits",
    "shutdown",
]


def load_config(path: str | Path) -> RouterConfig:
    """Read and validate a YAML file; raises :class:`ConfigError` with every problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([("", f"cannot read {path}: {exc.strerror}")]) from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([("", f"not valid YAML: {exc}")]) from exc
    return parse_config(doc)


def parse_config(doc: object) -> RouterConfig:
    """Validate a parsed YAML document into a :class:`RouterConfig`."""
    r = Reader()
    top = r.mapping(doc, "", _TOP)
    listen = _listen(r, top.get("listen"))
    backends = _backends(r, top.get("backends"))
    names = {b.name for b in backends}
    aliases = _aliases(r, top.get("aliases"), names)
    policies = _policies(r, top.get("policies"))
    default_policy = r.string(top, "default_policy", "", "", required=True)
    if default_policy and policies and default_policy not in {p.name for p in policies}:
        known = ", ".join(p.name for p in policies)
        r.add("default_policy", f"unknown policy '{default_policy}' (known: {known})")
    cfg = RouterConfig(
        backends=backends,
        policies=policies,
        default_policy=default_policy,
        listen=listen,
        honor_policy_header=r.boolean(top, "honor_policy_header", "", True),
        aliases=aliases,
        api_keys=_api_keys(r, top.get("api_keys"), {p.name for p in policies}),
        require_api_key=r.boolean(top, "require_api_key", "", False),
        metrics_require_admin=r.boolean(top, "metrics_require_admin", "", False),
        classification=_classification(r, top.get("classification")),
        timeouts=_timeouts(r, top.get("timeouts")),
        failover=_failover(r, top.get("failover")),
        health=_health(r, top.get("health")),
        capture=_capture(r, top.get("capture")),
        admission=admission_settings(r, top.get("admission")),
        limits=_limits(r, top.get("limits")),
        shutdown=_shutdown(r, top.get("shutdown")),
        shadow=shadow_settings(r, top.get("shadow"), names, {p.name for p in policies}),
    )
    if r.errors:
        raise ConfigError(r.errors)
    return cfg


def _listen(r: Reader, v: object) -> ListenSettings:
    m = r.mapping(v, "listen", ["host", "port", "max_body_bytes"], optional=True)
    d = ListenSettings()
    return ListenSettings(
        host=r.string(m, "host", "listen", default=d.host),
        port=r.integer(m, "port", "listen", default=d.port, lo=0, hi=65535),
        max_body_bytes=r.integer(m, "max_body_bytes", "listen", default=d.max_body_bytes, lo=1),
    )


_BACKEND_KEYS = [
    "name",
    "url",
    "engine",
    "models",
    "api_key_env",
    "max_inflight",
    "priority_capable",
    "emulator",
]


def _backends(r: Reader, v: object) -> tuple[BackendSpec, ...]:
    items = r.sequence(v, "backends", required=True)
    if v is not None and not items:
        r.add("backends", "at least one backend is needed")
    out: list[BackendSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        p = f"backends[{i}]"
        m = r.mapping(item, p, _BACKEND_KEYS)
        name = r.string(m, "name", p, "", required=True)
        if name in seen:
            r.add(f"{p}.name", f"duplicate backend name '{name}'")
        seen.add(name)
        url = r.string(m, "url", p, default="")
        emulator = _emulator(r, m.get("emulator"), f"{p}.emulator")
        if url and emulator is not None:
            r.add(p, "give either url or emulator, not both")
        elif not url and emulator is None and m:
            r.add(f"{p}.url", "missing (or give emulator)")
        elif url:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                r.add(f"{p}.url", f"not an http(s) URL: '{url}'")
        max_inflight = r.integer(m, "max_inflight", p, default=None, lo=1)
        out.append(
            BackendSpec(
                name=name,
                engine=r.string(m, "engine", p, "", required=True),
                url=url.rstrip("/"),
                models=r.strings(m, "models", p),
                api_key_env=r.string(m, "api_key_env", p, default=None),
                max_inflight=max_inflight,
                priority_capable=r.boolean(m, "priority_capable", p, default=False),
                emulator=emulator,
            )
        )
    return tuple(out)


def _emulator(r: Reader, v: object, p: str) -> EmulatorSpec | None:
    if v is None:
        return None
    m = r.mapping(v, p, ["profile", "time_scale", "seed", "model"])
    return EmulatorSpec(
        profile=r.string(m, "profile", p, "", required=True),
        time_scale=r.number(m, "time_scale", p, default=1.0, lo=1e-6),
        seed=r.integer(m, "seed", p, default=0),
        model=r.string(m, "model", p, default=None),
    )


def _aliases(r: Reader, v: object, backends: set[str]) -> dict[str, dict[str, str]]:
    m = r.mapping(v, "aliases", None, optional=True)
    out: dict[str, dict[str, str]] = {}
    for alias, targets in m.items():
        p = f"aliases.{alias}"
        t = r.mapping(targets, p, None)
        if not t and isinstance(targets, dict):
            r.add(p, "maps no backend")
        for backend, model in t.items():
            if backend not in backends:
                r.add(f"{p}.{backend}", f"unknown backend '{backend}'")
            if not isinstance(model, str) or not model:
                r.add(f"{p}.{backend}", "expected a model name (string)")
        out[str(alias)] = {str(b): str(mod) for b, mod in t.items()}
    return out


_KEY_FIELDS = ["name", "env", "file", "sha256", "class", "models", "policy",
               "requests_per_minute", "tokens_per_minute", "max_concurrency", "admin"]  # fmt: skip


def _api_keys(r: Reader, v: object, policies: set[str]) -> tuple[ApiKeySpec, ...]:
    out = []
    for i, item in enumerate(r.sequence(v, "api_keys")):
        p = f"api_keys[{i}]"
        m = r.mapping(item, p, _KEY_FIELDS)
        sources = [k for k in ("env", "file", "sha256") if m.get(k) is not None]
        if m and not sources:
            r.add(f"{p}.env", "missing (or give file or sha256)")
        elif len(sources) > 1:
            r.add(p, "give only one of env, file or sha256")
        digest = r.string(m, "sha256", p, default=None)
        if digest is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
            r.add(f"{p}.sha256", "expected 64 hex digits (the key's SHA-256)")
        policy = r.string(m, "policy", p, default=None)
        if policy is not None and policies and policy not in policies:
            r.add(f"{p}.policy", f"unknown policy '{policy}'")
        out.append(
            ApiKeySpec(
                name=r.string(m, "name", p, "", required=True),
                env=r.string(m, "env", p, default=None),
                file=r.string(m, "file", p, default=None),
                sha256=digest,
                request_class=r.choice(m, "class", p, REQUEST_CLASSES, default=None),
                models=r.strings(m, "models", p),
                policy=policy,
                requests_per_minute=r.integer(m, "requests_per_minute", p, default=None, lo=1),
                tokens_per_minute=r.integer(m, "tokens_per_minute", p, default=None, lo=1),
                max_concurrency=r.integer(m, "max_concurrency", p, default=None, lo=1),
                admin=r.boolean(m, "admin", p, default=False),
            )
        )
    return tuple(out)


_RULE_INTS = (
    "max_tokens_at_least",
    "max_tokens_below",
    "prompt_tokens_at_least",
    "prompt_tokens_below",
)


def _classification(r: Reader, v: object) -> ClassificationSettings:
    p = "classification"
    m = r.mapping(v, p, ["default", "honor_header", "flex_is_batch", "rules"], optional=True)
    rules = []
    for i, item in enumerate(r.sequence(m.get("rules"), f"{p}.rules")):
        rp = f"{p}.rules[{i}]"
        rm = r.mapping(item, rp, ["class", "endpoint", "stream", *_RULE_INTS])
        ints = {k: r.integer(rm, k, rp, default=None, lo=0) for k in _RULE_INTS}
        if rm and len(rm) == 1:
            r.add(rp, "a rule needs at least one condition besides its class")
        rules.append(
            Rule(
                request_class=r.choice(
                    rm, "class", rp, REQUEST_CLASSES, "interactive", required=True
                ),
                endpoint=r.choice(rm, "endpoint", rp, ENDPOINTS, default=None),
                stream=r.boolean(rm, "stream", rp, default=None),
                **ints,
            )
        )
    return ClassificationSettings(
        default=r.choice(m, "default", p, REQUEST_CLASSES, default="interactive"),
        honor_header=r.boolean(m, "honor_header", p, default=True),
        flex_is_batch=r.boolean(m, "flex_is_batch", p, default=True),
        rules=tuple(rules),
    )


def _policies(r: Reader, v: object) -> tuple[PolicySpec, ...]:
    m = r.mapping(v, "policies", None)
    out = []
    for name, entry in m.items():
        p = f"policies.{name}"
        e = r.mapping(entry, p, ["type", "params"])
        params = r.mapping(e.get("params"), f"{p}.params", None, optional=True)
        out.append(
            PolicySpec(
                name=str(name), type=r.string(e, "type", p, "", required=True), params=params
            )
        )
    return tuple(out)


def _timeouts(r: Reader, v: object) -> dict[str, ClassTimeouts]:
    m = r.mapping(v, "timeouts", list(REQUEST_CLASSES), optional=True)
    out = {}
    d = ClassTimeouts()
    for cls, entry in m.items():
        p = f"timeouts.{cls}"
        t = r.mapping(entry, p, ["connect", "first_byte", "idle", "total"])
        out[cls] = ClassTimeouts(
            connect=r.bound(t, "connect", p, d.connect),
            first_byte=r.bound(t, "first_byte", p, d.first_byte),
            idle=r.bound(t, "idle", p, d.idle),
            total=r.bound(t, "total", p, d.total),
        )
    return out


def _failover(r: Reader, v: object) -> FailoverSettings:
    p = "failover"
    m = r.mapping(v, p, ["max_attempts", "backoff_initial", "backoff_max"], optional=True)
    d = FailoverSettings()
    return FailoverSettings(
        max_attempts=r.integer(m, "max_attempts", p, default=d.max_attempts, lo=1, hi=20),
        backoff_initial=r.number(m, "backoff_initial", p, default=d.backoff_initial, lo=0.0),
        backoff_max=r.number(m, "backoff_max", p, default=d.backoff_max, lo=0.0),
    )


def _health(r: Reader, v: object) -> HealthSettings:
    p = "health"
    d = HealthSettings()
    m = r.mapping(v, p, list(HealthSettings.__dataclass_fields__), optional=True)
    return HealthSettings(
        interval=r.number(m, "interval", p, default=d.interval, lo=0.01),
        timeout=r.number(m, "timeout", p, default=d.timeout, lo=0.01),
        failures_to_eject=r.integer(m, "failures_to_eject", p, default=d.failures_to_eject, lo=1),
        cooldown=r.number(m, "cooldown", p, default=d.cooldown, lo=0.0),
        cooldown_max=r.number(m, "cooldown_max", p, default=d.cooldown_max, lo=0.0),
        models_refresh=r.number(m, "models_refresh", p, default=d.models_refresh, lo=0.1),
        scrape_metrics=r.boolean(m, "scrape_metrics", p, default=d.scrape_metrics),
        scrape_interval=r.number(m, "scrape_interval", p, default=d.scrape_interval, lo=0.01),
        scrape_stale_after=r.number(
            m, "scrape_stale_after", p, default=d.scrape_stale_after, lo=0.01
        ),
    )


def _capture(r: Reader, v: object) -> CaptureSettings | None:
    if v is None:
        return None
    p = "capture"
    m = r.mapping(v, p, list(CaptureSettings.__dataclass_fields__))
    headers = r.strings(m, "headers", p, default=DEFAULT_CAPTURE_HEADERS)
    for h in headers:
        if h.lower() in ("authorization", "cookie", "set-cookie", "proxy-authorization"):
            r.add(f"{p}.headers", f"'{h}' is never captured")
    return CaptureSettings(
        path=r.string(m, "path", p, "", required=True),
        sample_rate=r.number(m, "sample_rate", p, default=1.0, lo=0.0, hi=1.0),
        redaction=r.choice(m, "redaction", p, REDACTIONS, default="none"),
        rotate_bytes=r.integer(m, "rotate_bytes", p, default=None, lo=1),
        headers=tuple(h.lower() for h in headers),
        queue_size=r.integer(m, "queue_size", p, default=10000, lo=1),
    )


def _limits(r: Reader, v: object) -> LimitSettings:
    p = "limits"
    d = LimitSettings()
    m = r.mapping(v, p, list(LimitSettings.__dataclass_fields__), optional=True)
    return LimitSettings(
        max_connections=r.integer(m, "max_connections", p, default=d.max_connections, lo=1),
        idle_seconds=r.number(m, "idle_seconds", p, default=d.idle_seconds, lo=0.01),
        max_headers=r.integer(m, "max_headers", p, default=d.max_headers, lo=1),
        max_header_bytes=r.integer(m, "max_header_bytes", p, default=d.max_header_bytes, lo=64),
        write_timeout=r.number(m, "write_timeout", p, default=d.write_timeout, lo=0.01),
        body_seconds=r.number(m, "body_seconds", p, default=d.body_seconds, lo=0.01),
    )


def _shutdown(r: Reader, v: object) -> ShutdownSettings:
    m = r.mapping(v, "shutdown", ["drain_seconds"], optional=True)
    d = ShutdownSettings()
    return ShutdownSettings(
        drain_seconds=r.number(m, "drain_seconds", "shutdown", default=d.drain_seconds, lo=0.0)
    )
