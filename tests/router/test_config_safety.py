"""Config errors name the key path and never show a value; a file that is not YAML text is an
ordinary config error, for ``check-config`` (exit 2) and for a reload (400)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from router.app import build_app
from router.cli import check_config
from router.config.model import ConfigError
from router.config.parse import load_config
from tests.router.harness import base_config, write_config

SECRET = "hunter2"
GOOD = base_config([("a", "vllm", "http://127.0.0.1:1")])

NOT_YAML_TEXT = {
    "not UTF-8": b"backends: [\xff\xfe" + SECRET.encode() + b"]\n",
    "a NUL character": b"default_policy: " + SECRET.encode() + b"\x00\n",
    "an unclosed quote": f"api_keys: [{{name: k, env: '{SECRET}\n".encode(),
    "an undefined alias": f"default_policy: *{SECRET}\n".encode(),
    "an unknown tag": f"default_policy: !{SECRET} x\n".encode(),
    "a date that is none": b"default_policy: 2020-13-45\n",
    "an int that is none": f"default_policy: !!int {SECRET}\n".encode(),
    "nesting too deep": b"[" * 20000,
}


def _secrets_everywhere() -> dict[str, Any]:
    doc = dict(GOOD, listen={"port": SECRET}, health={"interval": SECRET})
    doc["backends"] = [
        {"name": "a", "engine": "vllm", "url": f"ftp://admin:{SECRET}@example.com"},
        {"name": "b", "engine": "vllm", "url": f"http://admin:{SECRET}@[::1"},
    ]
    doc["api_keys"] = [
        {"name": "k0", "sha256": f"sk-{SECRET}"},
        {"name": "k1", "env": [f"sk-{SECRET}"]},
        {"name": "k2", "env": "SY_TEST_KEY", "class": f"sk-{SECRET}"},
        {"name": 1234, "file": {SECRET: 1}},
    ]
    doc["capture"] = {"path": "c.jsonl", "redaction": SECRET}
    doc["policies"] = {**GOOD["policies"], "p": {"type": "pinned", "params": {"engine": [SECRET]}}}
    return doc


def test_errors_say_what_kind_was_found_never_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, _secrets_everywhere())
    assert check_config(path) == 2
    err = capsys.readouterr().err
    assert SECRET not in err
    for line in (
        "listen.port: expected an integer, got string",
        "health.interval: expected a number, got string",
        "backends[0].url: expected an http(s) URL with a host",
        "backends[1].url: expected an http(s) URL with a host",
        "api_keys[0].sha256: expected 64 hex digits",
        "api_keys[1].env: expected a non-empty string, got list",
        "api_keys[2].class: expected one of interactive, batch, got string",
        "api_keys[3].file: expected a non-empty string, got mapping",
        "api_keys[3].name: expected a non-empty string, got number",
        "capture.redaction: expected one of none, hash, drop, got string",
        "policies.p.params.engine: expected a non-empty string, got list",
    ):
        assert line in err


@pytest.mark.parametrize("content", NOT_YAML_TEXT.values(), ids=NOT_YAML_TEXT.keys())
def test_a_file_that_is_not_yaml_text_is_a_config_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "router.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    [(key, message)] = exc.value.errors
    assert key == "" and message.startswith("not ") and SECRET not in message


def test_unreadable_paths_are_config_errors(tmp_path: Path) -> None:
    for path in (tmp_path, tmp_path / "absent.yaml"):
        with pytest.raises(ConfigError) as exc:
            load_config(path)
        assert exc.value.errors[0][1].startswith(f"cannot read {path}")


def test_check_config_exits_2_for_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_bytes(NOT_YAML_TEXT["not UTF-8"])
    argv = [sys.executable, "-m", "turnout", "check-config", str(path)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "not UTF-8 text" in res.stderr and "Traceback" not in res.stderr


async def test_reload_answers_400_without_values_and_keeps_the_config(tmp_path: Path) -> None:
    path = write_config(tmp_path, GOOD)
    async with TestClient(TestServer(build_app(load_config(path), config_path=path))) as client:

        async def reload() -> tuple[int, str]:
            async with client.post("/turnout/reload") as reply:
                return reply.status, (await reply.json())["error"]["message"]

        path.write_bytes(NOT_YAML_TEXT["not UTF-8"])
        status, message = await reload()
        assert status == 400 and "not UTF-8 text" in message and SECRET not in message
        write_config(tmp_path, _secrets_everywhere())
        status, message = await reload()
        assert status == 400 and "api_keys[1].env" in message and SECRET not in message
        # every stage's errors in one answer: top level, a policy's params, an API key's file
        write_config(
            tmp_path,
            dict(
                GOOD,
                default_policy="nope",
                policies={**GOOD["policies"], "p": {"type": "pinned", "params": {}}},
                api_keys=[{"name": "k", "file": str(tmp_path / "absent")}],
            ),
        )
        status, message = await reload()
        assert status == 400
        for key in ("default_policy:", "policies.p.params.backend:", "api_keys[0].file:"):
            assert key in message
        async with client.get("/turnout/policies") as reply:
            assert {p["name"] for p in await reply.json()} == set(GOOD["policies"])
