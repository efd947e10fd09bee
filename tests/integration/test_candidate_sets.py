"""The candidate sets the router keeps between requests follow the fleet, over real emulators.

The router app runs in this event loop on a loopback port (so the test can read its pool),
in front of real emulator processes; requests go through the official client. Each change
the sets depend on is made for real: a backend's process starting and stopping (health),
a backend answering 503 until it is ejected, and its cooldown running out (ejection), a
reload dropping a backend, and a DNS name's addresses changing (discovery). Between
changes, requests reuse the set kept for their model rather than walking the backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlsplit

import openai

from policies.prefix import HOLDERS
from policies.types import Candidate
from router.app import STATE, build_app, listen_socket, serve
from router.backends.fleet import Resolver, resolve_dns
from router.config.parse import load_config
from router.proxy.state import RouterState
from tests.procs import start_emulator
from tests.router.harness import base_config, post, write_config

MODEL = "deepseek-v4.1-flash"
FAILING = ["--error-rate", "1", "--error-status", "503"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def _router(
    path: Path, resolver: Resolver = resolve_dns
) -> AsyncIterator[tuple[str, RouterState]]:
    app = build_app(load_config(path), config_path=path, resolver=resolver)
    served = await serve(app, listen_socket("127.0.0.1", 0))
    try:
        yield served.url, app[STATE]
    finally:
        await served.runner.cleanup()


async def _until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _served_by(url: str, n: int) -> set[str]:
    """The backends that served ``n`` round-robin requests."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    used = set()
    try:
        for _ in range(n):
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            used.add(raw.headers["x-turnout-backend"])
    finally:
        await client.close()
    return used


def _offered(state: RouterState) -> tuple[str, ...]:
    return state.pool.candidates(MODEL).names


async def test_sets_follow_health_ejection_and_reload(tmp_path: Path) -> None:
    dead = _free_port()
    with (
        start_emulator("vllm", time_scale=50) as a,
        start_emulator("vllm", time_scale=50) as b,
        start_emulator("vllm", time_scale=50, args=FAILING) as failing,
    ):
        backends = [
            ("a", "vllm", a.url),
            ("b", "vllm", b.url),
            ("c", "vllm", f"http://127.0.0.1:{dead}"),
            ("f", "vllm", failing.url),
        ]
        doc = base_config(backends, default_policy="round-robin")
        doc["health"] = {**doc["health"], "interval": 0.1, "cooldown": 60}
        path = write_config(tmp_path, doc)
        async with _router(path) as (url, state):
            assert _offered(state) == ("a", "b", "f")  # c's first probe found nobody
            # f answers 503 (a gateway status: the backend's at once): ejected after two,
            # while a and b serve every request by failover.
            assert await _served_by(url, 6) <= {"a", "b"}
            assert state.pool.by_name["f"].breaker.ejected
            assert _offered(state) == ("a", "b")

            kept = state.pool.candidates(MODEL).members
            assert await _served_by(url, 6) == {"a", "b"}
            assert state.pool.candidates(MODEL).members is kept  # not rebuilt per request

            # Health: c's engine starts, its probe passes, it joins; it stops, it leaves.
            with start_emulator("vllm", time_scale=50, args=["--port", str(dead)]):
                await _until(lambda: _offered(state) == ("a", "b", "c"))
                assert await _served_by(url, 6) == {"a", "b", "c"}
            await _until(lambda: _offered(state) == ("a", "b"))

            # Reload: b is dropped from the config.
            doc["backends"] = [d for d in doc["backends"] if d["name"] != "b"]
            doc["policies"] = {"round-robin": {"type": "round-robin"}}
            write_config(tmp_path, doc)
            reloaded = await asyncio.to_thread(post, url + "/turnout/reload", b"")
            assert reloaded.status == 200, reloaded.text
            assert _offered(state) == ("a",)
            assert await _served_by(url, 3) == {"a"}


async def test_an_ejected_backend_returns_when_its_cooldown_ends(tmp_path: Path) -> None:
    with (
        start_emulator("vllm", time_scale=50) as a,
        start_emulator("vllm", time_scale=50, args=FAILING) as failing,
    ):
        doc = base_config([("a", "vllm", a.url), ("f", "vllm", failing.url)])
        doc["health"] = {**doc["health"], "interval": 30, "cooldown": 1.0}
        doc["default_policy"] = "round-robin"
        async with _router(write_config(tmp_path, doc)) as (url, state):
            await _served_by(url, 4)
            f = state.pool.by_name["f"]
            assert f.breaker.state == "open"
            assert _offered(state) == ("a",)
            # No event marks the cooldown's end: the kept set says when to look again.
            await _until(lambda: f.breaker.state == "half-open", timeout=5)
            assert _offered(state) == ("a", "f")


class _Names:
    """A resolver the test steers: the addresses a name has now."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)

    async def __call__(self, name: str, port: int) -> list[str]:
        return list(self.addresses)


async def test_sets_follow_discovery(tmp_path: Path) -> None:
    with start_emulator("vllm", time_scale=50) as first:
        port = str(urlsplit(first.url).port)
        args = ["--host", "127.0.0.2", "--port", port]
        with start_emulator("vllm", time_scale=50, seed=1, args=args):
            doc = base_config([("pool", "vllm", "unused")], default_policy="round-robin")
            doc["backends"] = [
                {
                    "name": "pool",
                    "engine": "vllm",
                    "discover": {"dns": "engines.test", "port": int(port), "interval_seconds": 0.1},
                }
            ]
            names = _Names("127.0.0.1")
            one, two = "pool@127.0.0.1", "pool@127.0.0.2"
            async with _router(write_config(tmp_path, doc), names) as (url, state):
                assert _offered(state) == (one,)
                names.addresses = ["127.0.0.1", "127.0.0.2"]
                await _until(lambda: _offered(state) == (one, two))
                assert await _served_by(url, 4) == {one, two}
                shadow = state.pool.member("pool")  # what a shadow to "pool" is sent to
                assert shadow is not None and shadow.name == one
                names.addresses = ["127.0.0.2"]
                await _until(lambda: _offered(state) == (two,))
                assert await _served_by(url, 2) == {two}
                shadow = state.pool.member("pool")
                assert shadow is not None and shadow.name == two


Snapshot = Callable[[], Candidate]
BATCH = {"batch": ["vllm"]}
SIZED = [("round-robin", 0), ("least-outstanding", 2), ("pinned", 2), ("class-split", 2)]


async def test_a_request_reads_a_few_of_many_backends(tmp_path: Path) -> None:
    """64 backends (one engine behind them all): each request takes snapshots of the few
    backends its policy reads, not of every backend."""
    with start_emulator("vllm", time_scale=50) as engine:
        names = [f"b{i}" for i in range(64)]
        doc = base_config([(n, "vllm", engine.url) for n in names])
        doc["health"] = {**doc["health"], "interval": 30, "scrape_metrics": False}
        doc["policies"] = {
            "round-robin": {"type": "round-robin"},
            "least-outstanding": {"type": "least-outstanding"},
            "pinned": {"type": "pinned", "params": {"engine": "vllm"}},
            "class-split": {
                "type": "class-split",
                "params": {"interactive": ["vllm"], "batch": ["vllm"]},
            },
            "cache-aware": {"type": "cache-aware"},
        }
        doc["default_policy"] = "round-robin"
        async with _router(write_config(tmp_path, doc)) as (url, state):
            taken = Counter[str]()
            for b in state.pool.backends:
                build = b.candidate

                def counted(
                    build: Callable[[], Candidate] = build, name: str = b.name
                ) -> Candidate:
                    taken[name] += 1
                    return build()

                b.candidate = counted  # type: ignore[method-assign]
            for policy, most in [*SIZED, ("cache-aware", 2 + 2 * HOLDERS)]:
                client = openai.AsyncOpenAI(
                    base_url=url + "/v1",
                    api_key="unused",
                    max_retries=0,
                    default_headers={"X-Turnout-Policy": policy},
                )
                before = taken.total()
                for i in range(8):
                    await client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"request {i} " * 200}],
                        max_tokens=2,
                    )
                await client.close()
                assert taken.total() - before <= 8 * most, policy
