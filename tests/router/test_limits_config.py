"""Config of the hardening sections: api_keys, limits, shutdown, health.cooldown_max."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.cli import load_checked
from router.config.model import ConfigError, LimitSettings, LimitStore, ShutdownSettings
from router.config.parse import parse_config
from tests.router.harness import base_config, write_config

GOOD = base_config([("a", "vllm", "http://127.0.0.1:1")])
DIGEST = "ab" * 32


def errors_of(doc: Any) -> dict[str, str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(doc)
    return dict(exc.value.errors)


def test_defaults() -> None:
    config = parse_config(GOOD)
    assert config.limits == LimitSettings()
    assert config.shutdown == ShutdownSettings(drain_seconds=30.0)
    assert config.health.cooldown_max == 300.0


def test_values_round_trip() -> None:
    doc = dict(
        GOOD,
        limits={
            "max_connections": 7,
            "idle_seconds": 2,
            "write_timeout": 3,
            "body_seconds": 4,
            "upstream_idle_seconds": 60,
        },
        shutdown={"drain_seconds": 5},
        api_keys=[
            {
                "name": "k",
                "sha256": DIGEST,
                "models": ["m"],
                "policy": "round-robin",
                "class": "batch",
                "requests_per_minute": 6,
                "tokens_per_minute": 7,
                "max_concurrency": 8,
                "admin": True,
            },
        ],
    )
    config = parse_config(doc)
    assert (config.limits.max_connections, config.limits.body_seconds) == (7, 4.0)
    assert config.limits.upstream_idle_seconds == 60.0
    assert config.shutdown.drain_seconds == 5.0
    key = config.api_keys[0]
    assert (key.sha256, key.models, key.policy, key.request_class) == (
        DIGEST,
        ("m",),
        "round-robin",
        "batch",
    )
    assert (key.requests_per_minute, key.tokens_per_minute, key.max_concurrency) == (6, 7, 8)
    assert key.admin


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ({"limits": {"max_conections": 1}}, "limits.max_conections"),
        ({"limits": {"max_connections": 0}}, "limits.max_connections"),
        ({"limits": {"idle_seconds": "soon"}}, "limits.idle_seconds"),
        ({"limits": {"upstream_idle_seconds": 0}}, "limits.upstream_idle_seconds"),
        ({"limits": {"min_context_tokens": 0}}, "limits.min_context_tokens"),
        (
            {"limits": {"min_context_tokens": 4096, "max_context_tokens": 2048}},
            "limits.max_context_tokens",
        ),
        ({"shutdown": {"drain_seconds": -1}}, "shutdown.drain_seconds"),
        ({"shutdown": {"grace": 1}}, "shutdown.grace"),
        ({"api_keys": [{"name": "k", "env": "A", "sha256": DIGEST}]}, "api_keys[0]"),
        ({"api_keys": [{"name": "k", "sha256": "abc"}]}, "api_keys[0].sha256"),
        ({"api_keys": [{"name": "k", "env": "A", "policy": "nope"}]}, "api_keys[0].policy"),
        (
            {"api_keys": [{"name": "k", "env": "A", "requests_per_minute": 0}]},
            "api_keys[0].requests_per_minute",
        ),
        ({"api_keys": [{"name": "k", "env": "A", "admin": "yes"}]}, "api_keys[0].admin"),
        ({"api_keys": [{"name": "k", "env": "A", "models": "m"}]}, "api_keys[0].models"),
    ],
)
def test_errors_have_paths(extra: dict[str, Any], path: str) -> None:
    assert path in errors_of({**GOOD, **extra})


def test_a_reported_context_length_is_taken_within_the_configured_bounds() -> None:
    limits = parse_config(
        dict(GOOD, limits={"min_context_tokens": 4096, "max_context_tokens": 200_000})
    ).limits
    assert [limits.context_tokens(n) for n in (1, 8192, 10**12)] == [4096, 8192, 200_000]
    assert LimitSettings().context_tokens(1) == 32768  # the default floor


def test_unreadable_key_file_fails_check_config(tmp_path: Path) -> None:
    doc = {**GOOD, "api_keys": [{"name": "k", "file": str(tmp_path / "missing")}]}
    with pytest.raises(ConfigError) as exc:
        load_checked(write_config(tmp_path, doc))
    assert dict(exc.value.errors)["api_keys[0].file"].startswith("cannot read key file")


def test_the_limits_store() -> None:
    assert parse_config(GOOD).limits.store == LimitStore()  # the router's own memory
    store = {"redis": {"url": "redis://:pw@127.0.0.1:6379/2"}, "on_error": "deny"}
    config = parse_config(dict(GOOD, limits={"store": store}))
    assert config.limits.store == LimitStore("redis://:pw@127.0.0.1:6379/2", "deny")
    bad = {"redis": {"url": "http://x", "db": 1}, "on_error": "maybe", "size": 3}
    errors = errors_of(dict(GOOD, limits={"store": bad}))
    assert set(errors) == {
        "limits.store.redis.url",
        "limits.store.redis.db",
        "limits.store.on_error",
        "limits.store.size",
    }
    assert "limits.store.redis.url" in errors_of(dict(GOOD, limits={"store": {"redis": {}}}))


def test_a_keys_band_and_weight() -> None:
    key = {"name": "k", "sha256": DIGEST, "priority": -2, "weight": 3}
    spec = parse_config(dict(GOOD, api_keys=[key])).api_keys[0]
    assert (spec.priority, spec.weight) == (-2, 3.0)
    bad = {"name": "k", "sha256": DIGEST, "priority": 1.5, "weight": 0}
    assert set(errors_of(dict(GOOD, api_keys=[bad]))) == {
        "api_keys[0].priority",
        "api_keys[0].weight",
    }
