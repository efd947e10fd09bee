"""The access log in-process: one line per request, its sample and off switch (changed by a
reload), and a request id that is not UTF-8. The line's contents against real emulators, and
its absence of secrets, are checked in tests/integration/test_request_outcomes.py."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from router.app import RELOADER, STATE
from router.config.model import ConfigError
from router.config.parse import parse_config
from router.observe.access import AccessLog
from tests.router.fake_upstream import MODEL, InProcess, in_process_router
from tests.router.harness import base_config, write_config


def config(**overrides: Any) -> dict[str, Any]:
    doc = base_config([("fake", "vllm", "fake")], **overrides)
    doc["health"]["scrape_metrics"] = False
    return doc


def logged(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def send(ip: InProcess, count: int) -> None:
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    async with aiohttp.ClientSession() as s:
        for _ in range(count):
            async with s.post(f"{ip.url}/v1/chat/completions", data=body) as resp:
                assert resp.status == 200
                await resp.read()
    await asyncio.sleep(0.01)  # each handler's finally runs just after its answer


def reload(ip: InProcess, tmp_path: Path, access_log: dict[str, Any]) -> None:
    doc = config(access_log=access_log)
    doc["backends"][0]["url"] = ip.app[STATE].config.backends[0].url
    write_config(tmp_path, doc)
    assert ip.app[RELOADER].reload() == []


async def test_sample_and_off_switch_follow_the_live_config(tmp_path: Path) -> None:
    out = tmp_path / "access.jsonl"
    async with in_process_router(tmp_path, config()) as ip:
        with out.open("wb") as f:
            ip.app[STATE].access_log = AccessLog(f.fileno(), random.Random(3))
            await send(ip, 5)
            assert len(logged(out)) == 5  # on by default, every request
            reload(ip, tmp_path, {"enabled": False})
            await send(ip, 5)
            assert len(logged(out)) == 5
            reload(ip, tmp_path, {"sample": 0.5})
            await send(ip, 100)
            assert 20 <= len(logged(out)) - 5 <= 80
            reload(ip, tmp_path, {"sample": 0})
            before = len(logged(out))
            await send(ip, 10)
            assert len(logged(out)) == before


async def test_a_request_id_that_is_not_utf8_is_still_logged(tmp_path: Path) -> None:
    out = tmp_path / "access.jsonl"
    async with in_process_router(tmp_path, config()) as ip:
        with out.open("wb") as f:
            ip.app[STATE].access_log = AccessLog(f.fileno())
            host, port = ip.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                b"Content-Type: application/json\r\nX-Request-Id: id-\xff\xfe-1\r\n"
                b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
            )
            await writer.drain()
            head = await reader.readline()
            await reader.read()
            writer.close()
            await asyncio.sleep(0.01)
        assert head.startswith(b"HTTP/1.1 200")
        (line,) = logged(out)
        # Not ASCII, so not kept as the id (router.server.ids.usable_id): a fresh one is logged.
        assert line["request_id"].startswith("req-") and line["status"] == 200


def test_bad_settings_are_config_errors() -> None:
    doc = base_config(
        [("a", "vllm", "http://127.0.0.1:1")], access_log={"sample": 1.5, "enabeld": 1}
    )
    with pytest.raises(ConfigError) as exc:
        parse_config(doc)
    errors = dict(exc.value.errors)
    assert set(errors) == {"access_log.sample", "access_log.enabeld"}
