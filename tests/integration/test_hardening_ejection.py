"""No client can take backends out of service, over real processes (router and emulators).

Requests that make every engine fail count against none of them; a backend that fails while
another serves the same request is still ejected; ejection is capped at half of the
backends; when every backend is out the router routes anyway (panic mode); /ready follows
the active probes only.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.procs import Process, start_emulator
from tests.router.harness import base_config, client_for, get, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
FAULT = "X-Emulator-Fault"
FAILING = ["--error-rate", "1", "--error-status"]


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Process, Process]]:
    with start_emulator("vllm", time_scale=50) as a, start_emulator("vllm", time_scale=50) as b:
        yield a, b


def config(urls: list[tuple[str, str]], **health: Any) -> dict[str, Any]:
    """Backends that accept the emulator's fault header; breakers open for 60 s."""
    doc = base_config([(name, "vllm", url) for name, url in urls])
    for backend in doc["backends"]:
        backend["forward_headers"] = [FAULT]
    doc["health"] = {**doc["health"], "failures_to_eject": 2, "cooldown": 60, **health}
    return doc


def breakers(router: Process) -> dict[str, str]:
    return {b["name"]: b["breaker"] for b in get(router.url + "/turnout/backends").json()}


def ordinary(router: Process) -> str:
    """One plain request; the backend that served it."""
    raw = client_for(router.url).chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT, max_tokens=2
    )
    return raw.headers["x-turnout-backend"]


def nested(depth: int) -> bytes:
    """A chat body with a ``depth``-deep list in it (engines give up on those: the emulator
    at orjson's depth limit, vLLM in its validation)."""
    doc = {"model": MODEL, "messages": CHAT, "max_tokens": 2, "metadata": {"x": "[]"}}
    body = orjson.dumps(doc)
    return body.replace(b'"[]"', b"[" * depth + b"]" * depth)


def test_abuse_that_fails_every_engine_ejects_none(
    engines: tuple[Process, Process], tmp_path: Path
) -> None:
    a, b = engines
    doc = config([("a", a.url), ("b", b.url)])
    with start_router(write_config(tmp_path, doc)) as router:
        url = router.url + "/v1/chat/completions"
        chat = {"model": MODEL, "messages": CHAT, "max_tokens": 2}
        for _ in range(4):  # each fails on a, then on b: the request's fault
            failed = post(url, chat, {FAULT: "status=500"})
            assert failed.status == 500, failed.text
        for _ in range(4):  # answered 500 by the engine when the encoding went upstream
            gz = post(url, gzip.compress(orjson.dumps(chat)), {"Content-Encoding": "gzip"})
            assert gz.status == 200, gz.text
        for _ in range(4):
            assert post(url, nested(300)).status == 500  # every engine fails on it
            assert post(url, orjson.dumps(chat), {"Content-Type": "text/plain"}).status == 415
        assert breakers(router) == {"a": "closed", "b": "closed"}
        assert get(router.url + "/ready").status == 200
        assert ordinary(router) == "a"


def test_a_backend_failing_where_another_serves_is_ejected(tmp_path: Path) -> None:
    with (
        start_emulator("vllm", time_scale=50, args=[*FAILING, "500"]) as bad,
        start_emulator("vllm", time_scale=50) as good,
    ):
        doc = config([("bad", bad.url), ("good", good.url)])
        with start_router(write_config(tmp_path, doc)) as router:
            assert {ordinary(router) for _ in range(4)} == {"good"}
            assert breakers(router) == {"bad": "open", "good": "closed"}
            assert get(router.url + "/ready").status == 200


def test_at_most_half_of_the_backends_are_ejected(tmp_path: Path) -> None:
    with (
        start_emulator("vllm", time_scale=50, args=[*FAILING, "503"]) as a,
        start_emulator("vllm", time_scale=50, args=[*FAILING, "503"]) as b,
    ):
        doc = config([("a", a.url), ("b", b.url)], failures_to_eject=1)
        with start_router(write_config(tmp_path, doc)) as router:
            for _ in range(4):
                with pytest.raises(openai.APIStatusError) as exc:
                    ordinary(router)
                assert exc.value.status_code == 503  # the engines', passed on
            assert sorted(breakers(router).values()) == ["closed", "open"]
            assert get(router.url + "/ready").status == 200


def test_with_every_backend_ejected_the_router_routes_anyway(
    engines: tuple[Process, Process], tmp_path: Path
) -> None:
    a, b = engines
    doc = config([("a", a.url), ("b", b.url)], failures_to_eject=1, max_ejected_fraction=1.0)
    with start_router(write_config(tmp_path, doc)) as router:
        chat = {"model": MODEL, "messages": CHAT, "max_tokens": 2}
        assert post(router.url + "/v1/chat/completions", chat, {FAULT: "status=503"}).status == 503
        assert breakers(router) == {"a": "open", "b": "open"}
        assert get(router.url + "/ready").status == 200  # probes pass: passive ejection only
        assert ordinary(router) == "a"
        text = get(router.url + "/metrics").text
    panics = re.search(rf'turnout_panic_routing_total\{{model="{MODEL}"\}} (\S+)', text)
    assert panics is not None and float(panics[1]) == 1.0
