"""The ``api_keys``, ``anonymous`` and ``limits`` sections: who may call and how much, and the
connection-level limits (their objects are in :mod:`router.config.model`)."""

from __future__ import annotations

import re

from policies.types import REQUEST_CLASSES
from router.config.model import (
    STORE_ON_ERROR,
    AnonymousLimits,
    ApiKeySpec,
    LimitSettings,
    LimitStore,
)
from turnout.common.schema import Reader, unknown


def read_api_keys(top: Reader, policies: list[str]) -> tuple[ApiKeySpec, ...]:
    out = []
    for path, item in top.entries("api_keys"):
        before = len(top.errors)
        m = Reader.of(item, path, top.errors, required=True)
        sources = [k for k in ("env", "file", "sha256") if m.raw_value(k) is not None]
        if m.raw and not sources:
            m.error("env", "is required (or give file or sha256)")
        elif len(sources) > 1:
            m.error(None, "give only one of env, file or sha256")
        digest = m.string("sha256")
        if digest is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
            m.error("sha256", "expected 64 hex digits (the key's SHA-256)")
        policy = m.string("policy")
        if policy is not None and policies and policy not in policies:
            m.error("policy", unknown(policy, policies, "policy"))
        spec = ApiKeySpec(
            name=m.string("name", "", required=True),
            env=m.string("env"),
            file=m.string("file"),
            sha256=digest,
            request_class=m.choice("class", REQUEST_CLASSES, None),
            models=tuple(m.string_list("models") or ()),
            policy=policy,
            requests_per_minute=m.integer("requests_per_minute", None, low=1),
            tokens_per_minute=m.integer("tokens_per_minute", None, low=1),
            max_concurrency=m.integer("max_concurrency", None, low=1),
            admin=m.flag("admin", False),
            allow_overrides=m.flag("allow_overrides", False),
            priority=m.integer("priority", 0, low=-100, high=100),
            weight=m.number("weight", 1.0, low=0.01, high=100.0),
        )
        m.done()
        if len(top.errors) == before:  # a broken key is not resolved (that would only add noise)
            out.append(spec)
    return tuple(out)


def read_limits(m: Reader) -> LimitSettings:
    d = LimitSettings()
    out = LimitSettings(
        max_connections=m.integer("max_connections", d.max_connections, low=1),
        idle_seconds=m.number("idle_seconds", d.idle_seconds, low=0.01),
        max_headers=m.integer("max_headers", d.max_headers, low=1),
        max_header_bytes=m.integer("max_header_bytes", d.max_header_bytes, low=64),
        write_timeout=m.number("write_timeout", d.write_timeout, low=0.01),
        body_seconds=m.number("body_seconds", d.body_seconds, low=0.01),
        max_upstream_event_bytes=m.integer(
            "max_upstream_event_bytes", d.max_upstream_event_bytes, low=1024
        ),
        max_upstream_body_bytes=m.integer(
            "max_upstream_body_bytes", d.max_upstream_body_bytes, low=1024
        ),
        upstream_idle_seconds=m.number("upstream_idle_seconds", d.upstream_idle_seconds, low=0.01),
        min_context_tokens=m.integer("min_context_tokens", d.min_context_tokens, low=1),
        max_context_tokens=m.integer("max_context_tokens", d.max_context_tokens, low=1),
        store=_limit_store(m.child("store")),
    )
    if out.max_context_tokens < out.min_context_tokens:
        m.error("max_context_tokens", "must be at least min_context_tokens")
    m.done()
    return out


def _limit_store(m: Reader) -> LimitStore:
    url: str | None = None
    if m.has("redis"):
        redis = m.child("redis", required=True)
        url = redis.string("url", required=True)
        if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
            redis.error("url", "must be a redis://, rediss:// or unix:// URL")
        redis.done()
    out = LimitStore(redis_url=url, on_error=m.choice("on_error", STORE_ON_ERROR, "allow"))
    m.done()
    return out


def read_anonymous(m: Reader) -> AnonymousLimits:
    out = AnonymousLimits(
        requests_per_minute=m.integer("requests_per_minute", None, low=1),
        tokens_per_minute=m.integer("tokens_per_minute", None, low=1),
        max_concurrency=m.integer("max_concurrency", None, low=1),
    )
    m.done()
    return out
