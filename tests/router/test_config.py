"""Config loading: the embedded default is valid; every error is reported with its path."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.cli import check_config, default_config_path, load_checked
from router.config.model import ConfigError
from router.config.parse import parse_config
from tests.router.harness import base_config, write_config

GOOD = base_config([("a", "vllm", "http://127.0.0.1:1"), ("b", "deepinfer", "http://127.0.0.1:2")])


def errors_of(doc: Any) -> dict[str, str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(doc)
    return dict(exc.value.errors)


def test_embedded_default_is_valid() -> None:
    config = load_checked(default_config_path())
    assert config.default_policy == "adaptive"
    assert {p.name for p in config.policies} >= {
        "adaptive", "class-split", "round-robin", "least-outstanding", "vllm-only", "deepinfer-only"
    }  # fmt: skip
    assert {b.emulator.profile for b in config.backends if b.emulator} == {"vllm", "deepinfer"}
    assert (config.listen.host, config.listen.port) == ("127.0.0.1", 8080)


def test_good_config_round_trips_values() -> None:
    doc = dict(GOOD, timeouts={"batch": {"first_byte": 9, "idle": None}})
    config = parse_config(doc)
    assert [b.url for b in config.backends] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert config.timeouts_for("batch").first_byte == 9.0
    assert config.timeouts_for("batch").idle is None
    assert config.timeouts_for("interactive").first_byte == 60.0


def test_every_error_reported_with_its_path() -> None:
    doc = {
        "listen": {"port": 70000, "hots": "x"},
        "backends": [
            {"name": "a", "engine": "vllm", "url": "ftp://x"},
            {"name": "a", "engine": "vllm", "max_inflight": 0},
            {"engine": 3, "url": "http://h:1", "emulator": {"profile": "vllm"}},
        ],
        "aliases": {"m": {"zzz": "model"}},
        "classification": {
            "default": "urgent",
            "rules": [{"class": "batch"}, {"class": "x", "stream": 1}],
        },
        "policies": {"p": {"params": {}}},
        "default_policy": "q",
        "timeouts": {"interactive": {"connect": -1}, "other": {}},
        "capture": {"sample_rate": 2, "headers": ["Authorization"]},
        "surprise": 1,
    }
    errs = errors_of(doc)
    expected = [
        "listen.port",
        "listen.hots",
        "backends[0].url",
        "backends[1].name",
        "backends[1].url",
        "backends[1].max_inflight",
        "backends[2]",
        "backends[2].name",
        "backends[2].engine",
        "aliases.m.zzz",
        "classification.default",
        "classification.rules[0]",
        "classification.rules[1].class",
        "classification.rules[1].stream",
        "policies.p.type",
        "default_policy",
        "timeouts.interactive.connect",
        "timeouts.other",
        "capture.path",
        "capture.sample_rate",
        "capture.headers[0]",
        "surprise",
    ]
    assert sorted(errs) == sorted(expected)
    assert "unknown key" in errs["surprise"]
    assert "duplicate" in errs["backends[1].name"]


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        (None, "backends"),
        ([], ""),
        ({"backends": [], "policies": {}, "default_policy": "x"}, "backends"),
        ({"policies": {}, "default_policy": "x"}, "backends"),
        (dict(GOOD, failover={"max_attempts": 0}), "failover.max_attempts"),
        (dict(GOOD, health={"interval": "fast"}), "health.interval"),
        (dict(GOOD, require_api_key="yes"), "require_api_key"),
        (dict(GOOD, api_keys=[{"name": "k"}]), "api_keys[0].env"),
    ],
)
def test_single_errors(doc: Any, path: str) -> None:
    assert path in errors_of(doc)


def test_policy_errors_come_from_the_registry_with_full_paths(tmp_path: Path) -> None:
    doc = dict(GOOD)
    doc["policies"] = {
        **GOOD["policies"],
        "bad-split": {"type": "class-split", "params": {"interactive": ["nope"]}},
        "bad-type": {"type": "least-qeue"},
    }
    path = write_config(tmp_path, doc)
    with pytest.raises(ConfigError) as exc:
        load_checked(path)
    paths = [p for p, _ in exc.value.errors]
    assert "policies.bad-split.params.interactive[0]" in paths
    assert "policies.bad-split.params.batch" in paths
    assert "policies.bad-type.type" in paths


def test_check_config_cli_exit_codes(tmp_path: Path) -> None:
    good = write_config(tmp_path, GOOD, "good.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"backends": [{"name": "a"}], "policies": {}}))
    argv = [sys.executable, "-m", "turnout", "check-config"]
    ok = subprocess.run([*argv, str(good)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    res = subprocess.run([*argv, str(bad)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "backends[0].engine: is required" in res.stderr
    assert "backends[0].url: is required (or give emulator or discover)" in res.stderr
    assert "default_policy: is required" in res.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("backends: [\n")
    res = subprocess.run([*argv, str(broken)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "not valid YAML" in res.stderr


@pytest.mark.parametrize(
    "path", sorted((default_config_path().parent / "examples").glob("*.yaml")), ids=lambda p: p.name
)
def test_examples_are_valid(path: Path) -> None:
    config = load_checked(path)
    assert config.backends and config.default_policy in {p.name for p in config.policies}


def test_check_config_warns_about_unset_key_variables(tmp_path: Path) -> None:
    doc = base_config([("a", "vllm", "http://127.0.0.1:1")])
    doc["backends"][0]["api_key_env"] = "SY_TEST_UNSET_BACKEND_KEY"
    doc["api_keys"] = [{"name": "k", "env": "SY_TEST_UNSET_CLIENT_KEY"}]
    path = write_config(tmp_path, doc)
    argv = [sys.executable, "-m", "turnout", "check-config", str(path)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    assert "warning: backends[0].api_key_env: $SY_TEST_UNSET_BACKEND_KEY is not set" in res.stderr
    assert "warning: api_keys[0].env: $SY_TEST_UNSET_CLIENT_KEY" in res.stderr


def test_top_level_policy_and_key_errors_come_together(tmp_path: Path) -> None:
    # They used to come one stage at a time: policy and key errors only once the rest was fixed.
    doc = dict(GOOD, listen={"port": 70000})
    doc["policies"] = {**GOOD["policies"], "bad": {"type": "pinned", "params": {"backend": "z"}}}
    doc["api_keys"] = [{"name": "k", "file": str(tmp_path / "no-such-key")}]
    with pytest.raises(ConfigError) as exc:
        load_checked(write_config(tmp_path, doc))
    assert [p for p, _ in exc.value.errors] == [
        "listen.port",
        "policies.bad.params.backend",
        "api_keys[0].file",
    ]


def test_unknown_keys_are_reported_in_every_section(tmp_path: Path) -> None:
    typo = {"typo": 1}
    doc = dict(
        GOOD,
        listen={**GOOD["listen"], **typo},
        backends=[
            {**GOOD["backends"][0], **typo},
            {"name": "e", "engine": "vllm", "emulator": {"profile": "vllm", **typo}},
        ],
        api_keys=[{"name": "k", "env": "SY_TEST_KEY", **typo}],
        classification={"rules": [{"class": "batch", "stream": False, **typo}], **typo},
        policies={
            **GOOD["policies"],
            "entry": {"type": "round-robin", **typo},
            "params": {"type": "round-robin", "params": typo},
            "plugin": {"type": "pipeline", "params": {"scorers": [{"type": "kv-cache", **typo}]}},
        },
        timeouts={"batch": {"idle": 1, **typo}},
        failover=typo,
        health=typo,
        capture={"path": str(tmp_path / "c.jsonl"), **typo},
        admission={"batch": {"queue_size": 1, **typo}, **typo},
        shadow={"round-robin": {"backend": "a", **typo}, "class-split": None},
        limits=typo,
        shutdown=typo,
        **typo,
    )
    with pytest.raises(ConfigError) as exc:
        load_checked(write_config(tmp_path, doc))
    unknown = {p for p, m in exc.value.errors if m.startswith("unknown key")}
    assert unknown == {"typo"} | {
        f"{section}.typo"
        for section in (
            "listen",
            "backends[0]",
            "backends[1].emulator",
            "api_keys[0]",
            "classification",
            "classification.rules[0]",
            "policies.entry",
            "policies.params.params",
            "policies.plugin.params.scorers[0]",
            "timeouts.batch",
            "failover",
            "health",
            "capture",
            "admission",
            "admission.batch",
            "shadow.round-robin",
            "limits",
            "shutdown",
        )
    }
    assert ("shadow.class-split", "is required") in exc.value.errors


def test_check_config_refuses_a_factory_that_builds_no_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # It used to print "ok", and at serve time requests naming the policy got a 500.
    module = types.ModuleType("sy_test_no_policy")
    module.make = lambda name, params, backends: object()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    doc = dict(GOOD, policies={**GOOD["policies"], "custom": {"type": f"{module.__name__}:make"}})
    assert check_config(write_config(tmp_path, doc)) == 2
    err = capsys.readouterr().err
    assert f"policies.custom.type: '{module.__name__}:make' did not return a Policy" in err


def test_check_config_suggests_the_key_a_typo_meant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = base_config([("a", "vllm", "http://127.0.0.1:1")])
    doc["backends"][0]["max_inflihgt"] = 4
    doc["helth"] = {"interval": 1}
    assert check_config(write_config(tmp_path, doc)) == 2
    err = capsys.readouterr().err.splitlines()
    typo = "unknown key 'max_inflihgt' (did you mean 'max_inflight'?)"
    assert f"backends[0].max_inflihgt: {typo}" in err
    assert "helth: unknown key 'helth' (did you mean 'health'?)" in err


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000/v1", "http://10.0.0.5:8000/v1/"])
def test_a_backend_url_ending_in_v1_is_refused_with_the_path_it_would_call(url: str) -> None:
    errs = errors_of(base_config([("a", "vllm", url)]))
    assert errs == {
        "backends[0].url": "ends in /v1, which the router adds itself: it would call "
        "/v1/v1/chat/completions; drop the /v1"
    }
    prefixed = errors_of(base_config([("a", "vllm", "https://gw.internal/team-a/v1")]))
    assert "/team-a/v1/v1/chat/completions" in prefixed["backends[0].url"]
    assert "gw.internal" not in prefixed["backends[0].url"]  # the path only, never the host
    # A /v1 that is not the last segment is someone's prefix, not a doubled /v1.
    assert parse_config(base_config([("a", "vllm", "http://h:1/v1/team")])).backends[0].url
