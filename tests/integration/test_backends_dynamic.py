"""Backends that come and go, with real emulator processes over loopback.

- A reload adds and removes backends while a stream is in flight: the stream ends whole on
  the backend that was removed, whose gauges and probes are gone.
- DNS discovery through the system's resolver: ``localhost`` becomes ``pool@127.0.0.1``.
- The backend set follows the resolver (the one test seam): two emulators on one port at
  127.0.0.1 and 127.0.0.2 join and leave as the name's addresses change, a stream on a
  replica that left finishes, and a failed lookup keeps the set.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from router.app import build_app, listen_socket, serve
from router.backends.engines import parse_samples
from router.config.parse import load_config
from tests.procs import Process, start_emulator
from tests.router.harness import base_config, client_for, get, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
LONG = 600  # tokens: about 2 s at time scale 50, open across the changes below


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Process, Process]]:
    """Two emulators on one port, at 127.0.0.1 and 127.0.0.2 (a name's two replicas)."""
    with start_emulator("vllm", time_scale=50) as first:
        port = str(urlsplit(first.url).port)
        args = ["--host", "127.0.0.2", "--port", port]
        with start_emulator("vllm", time_scale=50, seed=1, args=args) as second:
            yield first, second


def _backends(url: str) -> dict[str, dict[str, Any]]:
    return {b["name"]: b for b in get(url + "/turnout/backends").json()}


def _gauges(url: str, name: str) -> set[str]:
    """The backends ``name`` (a per-backend gauge) has a series for."""
    text = get(url + "/metrics").text
    return {line.split('"')[1] for line in text.splitlines() if line.startswith(name + "{")}


def _body(max_tokens: int = 4, stream: bool = False) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


def test_reload_adds_and_removes_backends_under_a_stream(
    pair: tuple[Process, Process], tmp_path: Path
) -> None:
    first, second = pair
    doc_a = base_config([("a", "vllm", first.url)])
    doc_b = base_config([("b", "vllm", second.url)])
    path = write_config(tmp_path, doc_a)
    with start_router(path) as router:
        client = client_for(router.url)
        stream = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me a long story."}],
            max_tokens=LONG,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        assert stream.headers["x-turnout-backend"] == "a"
        chunks = iter(stream.parse())
        next(chunks)

        write_config(tmp_path, doc_b)  # a goes, b comes, while a still streams
        reply = post(router.url + "/turnout/reload", b"")
        assert reply.status == 200, reply.text
        assert set(_backends(router.url)) == {"b"}  # b was probed before the reload answered
        assert _backends(router.url)["b"]["healthy"] is True
        assert _gauges(router.url, "turnout_backend_up") == {"b"}
        served = post(router.url + "/v1/chat/completions", _body())
        assert served.status == 200 and served.headers["x-turnout-backend"] == "b"

        rest = list(chunks)
        assert rest[-1].choices[0].finish_reason == "length"  # a's stream ended whole
        text = get(router.url + "/metrics").text
        done = parse_samples(text, frozenset({"turnout_requests_total"}))
        assert done["turnout_requests_total"] == 2

        both = base_config([("a", "vllm", first.url), ("b", "vllm", second.url)])
        write_config(tmp_path, both)
        assert post(router.url + "/turnout/reload", b"").status == 200
        assert set(_backends(router.url)) == {"a", "b"}
        pinned = post(router.url + "/v1/chat/completions", _body(), {"X-Turnout-Policy": "a-only"})
        assert pinned.headers["x-turnout-backend"] == "a"


def test_discovery_through_the_system_resolver(
    pair: tuple[Process, Process], tmp_path: Path
) -> None:
    port = urlsplit(pair[0].url).port
    doc = base_config([("pool", "vllm", "unused")])
    doc["backends"] = [
        {"name": "pool", "engine": "vllm", "discover": {"dns": "localhost", "port": port}}
    ]
    with start_router(write_config(tmp_path, doc)) as router:
        found = _backends(router.url)
        assert "pool@127.0.0.1" in found  # ...and pool@::1 where localhost has both
        assert found["pool@127.0.0.1"]["url"] == f"http://127.0.0.1:{port}"
        assert all(b["healthy"] for name, b in found.items() if name != "pool@::1")
        # Policies name the configured backend; its replicas answer to it.
        reply = post(
            router.url + "/v1/chat/completions", _body(), {"X-Turnout-Policy": "pool-only"}
        )
        assert reply.status == 200, reply.text
        assert reply.headers["x-turnout-backend"].startswith("pool@")


async def _equals(value: Awaitable[set[str]], expected: set[str]) -> bool:
    return await value == expected


class Names:
    """A resolver the test steers: the addresses a name has now, or a failing lookup."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        self.failing = False
        self.lookups = 0

    async def __call__(self, name: str, port: int) -> list[str]:
        self.lookups += 1
        if self.failing:
            raise OSError("lookup failed")
        return list(self.addresses)


async def _until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _in_process(tmp_path: Path, doc: dict[str, Any], names: Names) -> AsyncIterator[str]:
    """The router app in this event loop (so ``names`` can steer it), on a loopback port."""
    app = build_app(load_config(write_config(tmp_path, doc)), resolver=names)
    served = await serve(app, listen_socket("127.0.0.1", 0))
    try:
        yield served.url
    finally:
        await served.runner.cleanup()


async def test_the_backend_set_follows_the_resolver(
    pair: tuple[Process, Process], tmp_path: Path
) -> None:
    port = urlsplit(pair[0].url).port
    doc = base_config([("pool", "vllm", "unused")], default_policy="round-robin")
    doc["backends"] = [
        {
            "name": "pool",
            "engine": "vllm",
            "discover": {"dns": "engines.test", "port": port, "interval_seconds": 0.1},
        }
    ]
    names = Names("127.0.0.1")
    one, two = "pool@127.0.0.1", "pool@127.0.0.2"
    async with _in_process(tmp_path, doc, names) as url:

        async def current() -> set[str]:
            # The standard library's client in a thread: the turnout serves from this loop.
            return set(await asyncio.to_thread(_backends, url))

        assert await current() == {one}  # joined (probed) before the app started serving
        names.addresses = ["127.0.0.2", "127.0.0.1"]
        await _until(lambda: _equals(current(), {one, two}))

        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        used = set()
        for _ in range(4):  # round-robin: both replicas serve
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            used.add(raw.headers["x-turnout-backend"])
        assert used == {one, two}

        pinned = openai.AsyncOpenAI(
            base_url=url + "/v1",
            api_key="unused",
            max_retries=0,
            default_headers={"X-Turnout-Policy": "round-robin"},
        )
        stream: openai.AsyncStream[ChatCompletionChunk] | None = None
        for _ in range(2):  # the rotation lands on the second replica within two requests
            opened = await pinned.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Tell me a long story."}],
                max_tokens=LONG,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            if opened.headers["x-turnout-backend"] == two:
                stream = opened.parse()
                break
            await opened.parse().close()
        assert stream is not None
        first = await stream.__anext__()
        assert first.choices

        names.addresses = ["127.0.0.1"]  # the second replica leaves mid-stream
        await _until(lambda: _equals(current(), {one}))
        gauges = await asyncio.to_thread(_gauges, url, "turnout_backend_up")
        assert gauges == {one}
        last = None
        async for chunk in stream:
            if chunk.choices:
                last = chunk.choices[0].finish_reason or last
        assert last == "length"  # served whole by the replica that left

        names.failing = True  # a DNS outage keeps the last set
        seen = names.lookups

        async def looked_up() -> bool:
            return names.lookups >= seen + 3

        await _until(looked_up)
        assert await current() == {one}
        await client.close()
        await pinned.close()
