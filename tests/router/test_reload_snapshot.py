"""A reload swaps the config, policies and keys as one snapshot (router.proxy.state.Snapshot):
a request reloaded under, while its body arrives or while it streams, keeps the settings it
began with, all of them, and the next request gets the new ones, all of them.

In-process router over real loopback sockets; the reload goes through ``POST
/turnout/reload`` as an operator's would. Each test changes a setting read before the
request's first await and one read after it, so a request that mixed them would show it."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from router.app import STATE
from router.observe.access import AccessLog
from tests.router.fake_upstream import MODEL, FakeEngine, InProcess, in_process_router
from tests.router.harness import base_config, write_config
from tests.router.test_handler import RecordingPolicy


def config(tag: int, access_log: bool, default_class: str = "interactive") -> dict[str, Any]:
    doc = base_config([("fake", "vllm", "fake")], default_policy="rec")
    doc["health"]["scrape_metrics"] = False
    doc["policies"]["rec"] = {
        "type": "tests.router.test_handler:make_recording",
        "params": {"tag": tag},
    }
    doc["access_log"] = {"enabled": access_log}
    doc["classification"] = {"default": default_class}
    return doc


def policy(ip: InProcess) -> RecordingPolicy:
    rec = ip.app[STATE].policies["rec"]
    assert isinstance(rec, RecordingPolicy)
    return rec


async def reload(s: aiohttp.ClientSession, ip: InProcess, doc: dict[str, Any]) -> None:
    doc["backends"][0]["url"] = ip.app[STATE].config.backends[0].url
    write_config(ip.config_path.parent, doc)
    async with s.post(f"{ip.url}/turnout/reload") as resp:
        assert resp.status == 200, await resp.text()


def logged(path: Path) -> list[str]:
    return [orjson.loads(line)["request_id"] for line in path.read_bytes().splitlines()]


async def chat(
    s: aiohttp.ClientSession, ip: InProcess, rid: str, cls: str = "interactive", **body: Any
) -> bytes:
    doc = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body})
    headers = {"X-Request-Id": rid, "Content-Type": "application/json"}
    url = f"{ip.url}/v1/chat/completions"
    async with s.post(url, data=io.BytesIO(doc), headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["X-Turnout-Class"] == cls
        return await resp.read()


async def test_a_reload_while_the_body_arrives_leaves_the_request_on_its_snapshot(
    tmp_path: Path,
) -> None:
    """The policy is picked before the body is read; the class, after; the access log's
    switch, at the end. All three come from the config the request began under."""
    out = tmp_path / "access.jsonl"
    async with in_process_router(tmp_path, config(1, access_log=True)) as ip:
        state = ip.app[STATE]
        old = policy(ip)
        with out.open("wb") as f:
            state.access_log = AccessLog(f.fileno())
            body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
            host, port = ip.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: early\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                % (len(body), body[:10])
            )
            async with asyncio.timeout(5):
                while state.drain.open == 0:  # the handler has begun: it awaits the body
                    await asyncio.sleep(0.005)
            async with aiohttp.ClientSession() as s:
                await reload(s, ip, config(2, access_log=False, default_class="batch"))
                new = policy(ip)
                assert new is not old and new.tag == 2
                writer.write(body[10:])
                head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode()
                assert head.startswith("HTTP/1.1 200") and "X-Turnout-Class: interactive" in head
                writer.close()
                # ...and the next request is the new config's, whole.
                await chat(s, ip, "late", "batch")
            await asyncio.sleep(0.01)  # each handler's finally runs just after its answer
        assert [rid for rid, _ in old.finished] == ["early"]
        assert [rid for rid, _ in new.finished] == ["late"]
        assert logged(out) == ["early"]  # logged under the old switch; the new one is off


async def test_a_reload_mid_stream_leaves_the_stream_on_its_snapshot(tmp_path: Path) -> None:
    """A stream under way when the access log is switched on finishes as it began, unlogged
    and reported to the policy that chose for it; the request after it is logged."""
    out = tmp_path / "access.jsonl"
    engine = FakeEngine()
    engine.release.clear()
    async with in_process_router(tmp_path, config(1, access_log=False), engine) as ip:
        old = policy(ip)
        with out.open("wb") as f:
            ip.app[STATE].access_log = AccessLog(f.fileno())
            async with aiohttp.ClientSession() as s:
                streaming = asyncio.create_task(chat(s, ip, "early", stream=True))
                await asyncio.wait_for(engine.streaming.wait(), 5)
                await reload(s, ip, config(2, access_log=True))
                new = policy(ip)
                engine.release.set()
                assert (await asyncio.wait_for(streaming, 5)).endswith(b"data: [DONE]\n\n")
                await chat(s, ip, "late")
            await asyncio.sleep(0.01)
        assert [rid for rid, _ in old.finished] == ["early"]
        assert [rid for rid, _ in new.finished] == ["late"]
        assert logged(out) == ["late"]
