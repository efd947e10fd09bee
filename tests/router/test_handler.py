"""The request path in-process: handler, relay, exchange, lease and reload, against a fake engine.

Real sockets on loopback, one event loop, no child processes: these run in milliseconds, so
the handler's bookkeeping can be checked request by request. The end-to-end paths against
real emulator processes stay in tests/integration.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
from openai.types.chat import ChatCompletionMessageParam

from policies.types import BackendInfo, Candidate, Decision, Outcome, RequestInfo
from router.app import RELOADER, STATE
from tests.procs import metric_in
from tests.router.fake_upstream import MODEL, FakeEngine, InProcess, in_process_router
from tests.router.harness import base_config, write_config
from tests.router.rawserver import until

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


class RecordingPolicy:
    """Sends everything to the first candidate and remembers the outcomes it is fed."""

    type = "recording"

    def __init__(self, name: str, tag: object) -> None:
        self.name = name
        self.tag = tag
        self.finished: list[tuple[str, int]] = []

    def choose(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Decision:
        return Decision(tuple(c.name for c in candidates))

    def committed(self, req: RequestInfo, decision: Decision, backend: str) -> None:
        pass

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        self.finished.append((req.request_id, outcome.status))


def make_recording(
    name: str, params: dict[str, Any], backends: Sequence[BackendInfo]
) -> RecordingPolicy:
    """An out-of-tree policy factory (``tests.router.test_handler:make_recording``)."""
    return RecordingPolicy(name, params.get("tag"))


def config(**overrides: Any) -> dict[str, Any]:
    doc = base_config([("fake", "vllm", "fake")], **overrides)
    doc["health"]["scrape_metrics"] = False
    return doc


async def chat(
    session: aiohttp.ClientSession, ip: InProcess, **body: Any
) -> aiohttp.ClientResponse:
    doc = {"model": MODEL, "messages": CHAT, **body}
    # A file-like body: aiohttp warns that large raw bytes would hold its own loop up.
    data = io.BytesIO(orjson.dumps(doc))
    return await session.post(f"{ip.url}/v1/chat/completions", data=data)


def backend_figures(ip: InProcess) -> tuple[int, int]:
    backend = ip.app[STATE].pool.by_name["fake"]
    return backend.inflight, backend.outstanding_prompt


async def test_a_stream_is_relayed_and_the_usage_the_router_asked_for_is_stripped(
    tmp_path: Path,
) -> None:
    async with in_process_router(tmp_path, config()) as ip:
        client = openai.AsyncOpenAI(base_url=ip.url + "/v1", api_key="x", max_retries=0)
        stream = await client.chat.completions.create(model=MODEL, messages=CHAT, stream=True)
        chunks = [c async for c in stream]
        await client.close()
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "hi there"
        assert all(c.usage is None for c in chunks)  # the client did not ask for usage
        assert ip.engine.bodies[0]["stream_options"] == {"include_usage": True}
        await asyncio.sleep(0)  # the handler's finally runs right after the last chunk
        assert backend_figures(ip) == (0, 0)
        metrics = ip.app[STATE].metrics.render().decode()
        assert 'turnout_requests_total{backend="fake",class="interactive"' in metrics


async def test_the_lease_counts_the_request_until_its_stream_ends(tmp_path: Path) -> None:
    engine = FakeEngine()
    engine.release.clear()
    async with in_process_router(tmp_path, config(), engine) as ip, aiohttp.ClientSession() as s:
        resp = await chat(s, ip, stream=True)
        await asyncio.wait_for(engine.streaming.wait(), 5)
        await resp.content.readuntil(b"\n\n")  # the first token reached the client
        inflight, prompt = backend_figures(ip)
        assert inflight == 1 and prompt == 0  # prefilled: its prompt no longer waits
        engine.release.set()
        assert b"[DONE]" in await resp.read()
        assert resp.headers["X-Turnout-Backend"] == "fake"
        await asyncio.sleep(0)
        assert backend_figures(ip) == (0, 0)


async def test_a_client_that_leaves_mid_stream_frees_the_backend(tmp_path: Path) -> None:
    engine = FakeEngine()
    engine.release.clear()
    async with in_process_router(tmp_path, config(), engine) as ip:
        async with aiohttp.ClientSession() as s:
            resp = await chat(s, ip, stream=True)
            await resp.content.readuntil(b"\n\n")
            assert backend_figures(ip)[0] == 1
            resp.close()  # drops the connection
        await until(lambda: backend_figures(ip) == (0, 0), 1.0)
        metrics = ip.app[STATE].metrics.render().decode()
        assert 'code="499"' in metrics
        engine.release.set()


async def test_a_client_that_leaves_right_after_done_was_served_whole(tmp_path: Path) -> None:
    """It closes once it has read [DONE], before the engine's body ends: it had its whole
    answer, so the request is served (200, ok), not a client that left (499)."""
    engine = FakeEngine()
    engine.ended.clear()
    async with in_process_router(tmp_path, config(), engine) as ip:
        async with aiohttp.ClientSession() as s:
            resp = await chat(s, ip, stream=True)
            await resp.content.readuntil(b"data: [DONE]\n\n")
            resp.close()
        await asyncio.sleep(0.2)  # the router sees the connection close
        engine.ended.set()
        await until(lambda: backend_figures(ip) == (0, 0), 1.0)
        metrics = ip.app[STATE].metrics.render().decode()
        assert metric_in(metrics, "turnout_requests_total", {"code": "499"}) == 0
        assert metric_in(metrics, "turnout_requests_total", {"reason": "ok"}, required=True) == 1


async def test_an_in_flight_request_reports_to_the_policy_that_chose_even_after_a_reload(
    tmp_path: Path,
) -> None:
    """Reload replaces a changed policy; the request it routed still feeds the old instance."""
    doc = config(default_policy="rec")
    doc["policies"]["rec"] = {
        "type": "tests.router.test_handler:make_recording",
        "params": {"tag": 1},
    }
    engine = FakeEngine()
    engine.release.clear()
    async with in_process_router(tmp_path, doc, engine) as ip, aiohttp.ClientSession() as s:
        state = ip.app[STATE]
        old = state.policies["rec"]
        assert isinstance(old, RecordingPolicy)
        resp = await chat(s, ip, stream=True)
        await asyncio.wait_for(engine.streaming.wait(), 5)
        doc["policies"]["rec"]["params"]["tag"] = 2
        write_config(tmp_path, doc)
        assert ip.app[RELOADER].reload() == []
        new = state.policies["rec"]
        assert isinstance(new, RecordingPolicy) and new is not old and new.tag == 2
        engine.release.set()
        await resp.read()
        await asyncio.sleep(0)
        assert [status for _, status in old.finished] == [200]
        assert new.finished == []


async def test_a_json_answer_is_passed_whole_with_the_routers_headers(tmp_path: Path) -> None:
    async with in_process_router(tmp_path, config()) as ip, aiohttp.ClientSession() as s:
        resp = await chat(s, ip, max_tokens=4)
        doc = await resp.json()
        assert resp.status == 200 and doc["choices"][0]["message"]["content"] == "hi there"
        assert resp.headers["X-Turnout-Class"] == "interactive"
        assert resp.headers["X-Turnout-Policy"] == "class-split"
        assert "stream_options" not in ip.engine.bodies[0]
        await asyncio.sleep(0)
        assert backend_figures(ip) == (0, 0)


async def test_a_body_of_megabytes_is_understood_off_the_event_loop(tmp_path: Path) -> None:
    """The same classification and routing whichever side of the offload threshold."""
    async with in_process_router(tmp_path, config()) as ip, aiohttp.ClientSession() as s:
        words = "lorem ipsum " * 250_000  # 3 MB, 500,000 tokens
        resp = await chat(s, ip, messages=[{"role": "user", "content": words}], max_tokens=4)
        assert resp.status == 200, await resp.text()
        assert ip.engine.bodies[-1]["messages"][0]["content"] == words
        assert resp.headers["X-Turnout-Class"] == "interactive"
        await asyncio.sleep(0)
        assert backend_figures(ip) == (0, 0)


async def test_a_mirrored_request_reaches_the_shadow_and_the_client_gets_the_live_answer(
    tmp_path: Path,
) -> None:
    shadow = FakeEngine()
    doc = base_config([("fake", "vllm", "fake"), ("shadow", "deepinfer", "fake:shadow")])
    doc["health"]["scrape_metrics"] = False
    doc["policies"]["mirrored"] = {"type": "pinned", "params": {"backend": "fake"}}
    doc["shadow"] = {"mirrored": {"backend": "shadow"}}
    async with (
        in_process_router(tmp_path, doc, others={"shadow": shadow}) as ip,
        aiohttp.ClientSession() as s,
    ):
        resp = await s.post(
            f"{ip.url}/v1/chat/completions",
            data=orjson.dumps({"model": MODEL, "messages": CHAT, "max_tokens": 4}),
            headers={"X-Turnout-Policy": "mirrored", "X-Request-Id": "r-1"},
        )
        assert resp.status == 200 and resp.headers["X-Turnout-Backend"] == "fake"
        for _ in range(200):
            if shadow.bodies:
                break
            await asyncio.sleep(0.01)
        assert [h["X-Request-Id"] for h in shadow.headers] == ["r-1-shadow"]
        assert len(ip.engine.bodies) == 1  # the live engine served it once
        assert shadow.headers[0]["User-Agent"] == "turnout"  # no versions upstream either
        await asyncio.sleep(0.05)  # the shadow's own bookkeeping after its answer
        metrics = ip.app[STATE].metrics.render().decode()
        assert 'turnout_shadow_requests_total{backend="shadow"' in metrics
        assert 'turnout_requests_total{backend="shadow"' not in metrics


async def test_probes_take_a_failing_backend_out_and_bring_it_back(tmp_path: Path) -> None:
    engine = FakeEngine()
    doc = config()
    doc["health"].update({"interval": 0.05, "failures_to_eject": 2})
    async with in_process_router(tmp_path, doc, engine) as ip, aiohttp.ClientSession() as s:

        async def ready_status() -> int:
            async with s.get(f"{ip.url}/ready") as resp:
                return resp.status

        async def becomes(status: int) -> None:
            for _ in range(200):
                if await ready_status() == status:
                    return
                await asyncio.sleep(0.02)
            raise AssertionError(f"/ready never answered {status}")

        await becomes(200)
        engine.healthy = False
        await becomes(503)
        engine.healthy = True
        await becomes(200)
