"""The one config reader's messages: an unknown key or name comes with its likely fix."""

from __future__ import annotations

import pytest

from turnout.common.schema import Errors, Reader, nearest, unknown


def read(raw: dict[str, object], *keys: str) -> Errors:
    errors: Errors = []
    r = Reader.of(raw, "backends[0]", errors)
    for key in keys:
        r.raw_value(key)
    r.done()
    return errors


def test_a_misspelt_key_is_reported_with_the_key_it_resembles() -> None:
    errors = read({"name": "a", "max_inflihgt": 4}, "name", "max_inflight", "priority_capable")
    assert errors == [
        ("backends[0].max_inflihgt", "unknown key 'max_inflihgt' (did you mean 'max_inflight'?)")
    ]


def test_a_key_like_none_known_lists_them_all() -> None:
    errors = read({"zzz": 1}, "url", "name")
    assert errors == [("backends[0].zzz", "unknown key 'zzz' (known: name, url)")]
    assert read({"zzz": 1}) == [("backends[0].zzz", "unknown key 'zzz' (known: none)")]


@pytest.mark.parametrize(
    ("name", "known", "want"),
    [
        ("adaptve", ["class-split", "adaptive", "pinned"], "adaptive"),
        ("Round-Robin", ["round-robin", "pinned"], "round-robin"),  # case aside
        ("vlm", ["vllm", "deepinfer"], "vllm"),
        ("sglang", ["vllm", "deepinfer"], None),
        ("x", [], None),
    ],
)
def test_nearest(name: str, known: list[str], want: str | None) -> None:
    assert nearest(name, known) == want


def test_unknown_names_the_kind_of_name() -> None:
    assert unknown("vlm", ["vllm"], "backend") == "unknown backend 'vlm' (did you mean 'vllm'?)"
    assert unknown("q", ["vllm", "deepinfer"], "engine") == (
        "unknown engine 'q' (known: vllm, deepinfer)"
    )
