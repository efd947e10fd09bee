"""``capture.hash_key_env`` / ``hash_key_file``: the secret that keys hashing and sampling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.config.model import ConfigError
from router.config.parse import parse_config
from tests.router.harness import base_config

SECRET = "0123456789abcdef-capture-secret"


def _doc(tmp_path: Path, **capture: Any) -> dict[str, Any]:
    doc = base_config([("a", "vllm", "http://127.0.0.1:1")])
    doc["capture"] = {"path": str(tmp_path / "c.jsonl"), "redaction": "hash", **capture}
    return doc


def _errors(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(doc)
    assert SECRET not in str(exc.value)  # messages name where the key is, never the key
    return dict(exc.value.errors)


def test_the_key_comes_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "capture.key"
    key_file.write_text(SECRET + "\n")
    capture = parse_config(_doc(tmp_path, hash_key_file=str(key_file))).capture
    assert capture is not None and capture.hash_key == SECRET.encode()
    assert SECRET not in repr(capture)
    monkeypatch.setenv("CAPTURE_KEY", SECRET)
    capture = parse_config(_doc(tmp_path, hash_key_env="CAPTURE_KEY")).capture
    assert capture is not None and capture.hash_key == SECRET.encode()
    capture = parse_config(_doc(tmp_path)).capture
    assert capture is not None and capture.hash_key is None  # a random key per process


def test_a_key_that_cannot_be_had_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_SUCH_CAPTURE_KEY", raising=False)
    assert (
        "is not set"
        in _errors(_doc(tmp_path, hash_key_env="NO_SUCH_CAPTURE_KEY"))["capture.hash_key_env"]
    )
    missing = str(tmp_path / "missing.key")
    assert "cannot read" in _errors(_doc(tmp_path, hash_key_file=missing))["capture.hash_key_file"]
    short = tmp_path / "short.key"
    short.write_text(SECRET[:8])
    assert (
        "at least 16 bytes"
        in _errors(_doc(tmp_path, hash_key_file=str(short)))["capture.hash_key_file"]
    )
    monkeypatch.setenv("CAPTURE_KEY", SECRET)
    both = _doc(tmp_path, hash_key_env="CAPTURE_KEY", hash_key_file=str(short))
    assert "only one of" in _errors(both)["capture"]
