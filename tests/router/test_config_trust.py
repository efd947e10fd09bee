"""Config keys of the trust boundary: the ejection cap and the headers a backend may get."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from router.config.model import ConfigError
from router.config.parse import parse_config
from tests.router.harness import base_config

GOOD = base_config([("a", "vllm", "http://127.0.0.1:1"), ("b", "deepinfer", "http://127.0.0.1:2")])


def errors_of(doc: Any) -> dict[str, str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(doc)
    return dict(exc.value.errors)


def test_defaults_cap_ejection_at_half_and_forward_nothing_extra() -> None:
    config = parse_config(GOOD)
    assert config.health.max_ejected_fraction == 0.5
    assert all(b.forward_headers == () for b in config.backends)


def test_values_are_read_and_header_names_lower_cased() -> None:
    doc = copy.deepcopy(GOOD)
    doc["health"]["max_ejected_fraction"] = 0.25
    doc["backends"][0]["forward_headers"] = ["X-Emulator-Fault", "traceparent"]
    config = parse_config(doc)
    assert config.health.max_ejected_fraction == 0.25
    assert config.backends[0].forward_headers == ("x-emulator-fault", "traceparent")


def test_wrong_values_are_reported_with_their_paths() -> None:
    doc = copy.deepcopy(GOOD)
    doc["health"]["max_ejected_fraction"] = 1.5
    doc["backends"][0]["forward_headers"] = ["Host", "content-length", "X Bad", "Authorization"]
    doc["backends"][1]["forward_headers"] = "X-Api-Key"
    errors = errors_of(doc)
    assert set(errors) == {
        "health.max_ejected_fraction",
        "backends[0].forward_headers[0]",
        "backends[0].forward_headers[1]",
        "backends[0].forward_headers[2]",
        "backends[0].forward_headers[3]",
        "backends[1].forward_headers",
    }
    assert "router sets or drops" in errors["backends[0].forward_headers[0]"]
    assert "header name" in errors["backends[0].forward_headers[2]"]
