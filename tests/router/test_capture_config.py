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


CREDENTIAL_HEADERS = (
    "Authorization", "proxy-authorization", "cookie", "Set-Cookie", "api-key", "x-api-key",
    "x-session-token", "x-goog-api-key", "ocp-apim-subscription-key", "x-auth-token",
    "x-amz-security-token", "x-amzn-oidc-accesstoken", "x-csrf-token", "x-client-secret",
    "x-admin-password", "x-forwarded-authorization",
)  # fmt: skip


def test_headers_that_may_carry_a_credential_are_refused_each_by_its_path(
    tmp_path: Path,
) -> None:
    harmless = ["x-request-class", "x-session-id", "x-turnout-batch", "user-agent"]
    errors = _errors(_doc(tmp_path, headers=[*harmless, *CREDENTIAL_HEADERS]))
    assert list(errors) == [f"capture.headers[{i}]" for i in range(4, 4 + len(CREDENTIAL_HEADERS))]
    assert all("may carry a credential" in m for m in errors.values())
    capture = parse_config(_doc(tmp_path, headers=harmless)).capture
    assert capture is not None and capture.headers == tuple(harmless)


def test_the_queue_bound_in_bytes_is_configurable(tmp_path: Path) -> None:
    capture = parse_config(_doc(tmp_path)).capture
    assert capture is not None and capture.queue_bytes == 64 * 1024 * 1024
    capture = parse_config(_doc(tmp_path, queue_bytes=1000)).capture
    assert capture is not None and capture.queue_bytes == 1000
    assert "capture.queue_bytes" in _errors(_doc(tmp_path, queue_bytes=0))
