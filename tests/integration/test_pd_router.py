"""The ``pd`` policy end to end: the router in front of two prefill and two decode emulators.

Real processes over loopback and the official ``openai`` client: chat, completions and the
Responses API streamed and not, cancellation in either hop, a prefill or decode engine
killed, and blocks that expired before the decode engine pulled them.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.procs import Process, metric, start_emulator, wait_for
from tests.router.harness import base_config, client_for, start_router, write_config

MODEL = "deepseek-v4.1-flash"
PROMPT = "Tell me a story about " + " ".join(f"w{i}" for i in range(300))
PREFILL = ["--set", "role=prefill", "--set", "ranks=1"]
DECODE = ["--set", "role=decode", "--set", "ranks=1"]
Fleet = tuple[Process, list[str], dict[str, str]]


def pd_config(
    prefill: list[Process], decode: list[Process], fallback: Sequence[Process] = (), **params: Any
) -> dict[str, Any]:
    named = [(f"p{i}", p) for i, p in enumerate(prefill)]
    named += [(f"d{i}", d) for i, d in enumerate(decode)]
    named += [(f"c{i}", c) for i, c in enumerate(fallback)]
    doc = base_config([(n, "vllm", e.url) for n, e in named])
    split = {
        "prefill": [n for n, _ in named if n[0] == "p"],
        "decode": [n for n, _ in named if n[0] == "d"],
        **({"fallback": [n for n, _ in named if n[0] == "c"]} if fallback else {}),
        **params,
    }
    doc["policies"]["split"] = {"type": "pd", "params": split}
    doc["default_policy"] = "split"
    doc["access_log"] = {"enabled": True}
    doc["health"]["failures_to_eject"] = 100  # a killed engine stays ranked: failover is tested
    return doc


@contextlib.contextmanager
def engines(n: int, args: list[str], time_scale: float = 20) -> Iterator[list[Process]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(start_emulator("vllm", time_scale=time_scale, args=args))
               for _ in range(n)]  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with engines(2, PREFILL) as prefill, engines(2, DECODE) as decode:
        lines: list[str] = []
        path = write_config(tmp_path_factory.mktemp("pd"), pd_config(prefill, decode))
        with start_router(path, lines=lines) as router:
            urls = {"p0": prefill[0].url, "p1": prefill[1].url}
            urls |= {"d0": decode[0].url, "d1": decode[1].url}
            yield router, lines, urls


def access(lines: list[str], request_id: str) -> dict[str, Any]:
    assert wait_for(lambda: any(request_id in line for line in lines))
    return next(json.loads(line) for line in lines if request_id in line)


def test_a_streamed_chat_goes_through_both_hops(fleet: Fleet) -> None:
    router, lines, urls = fleet
    pulls = sum(metric(u, "vllm:nixl_xfer_time_seconds_count") for k, u in urls.items())
    raw = client_for(router.url, **{"X-Request-Id": "pd-stream"}).chat.completions.with_raw_response
    stream = raw.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    backend = stream.headers["x-turnout-backend"]
    chunks = list(stream.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text and usage is not None and usage.completion_tokens == 24
    assert backend in ("d0", "d1")
    line = access(lines, "pd-stream")
    assert line["backend"] == backend and line["prefill_backend"] in ("p0", "p1")
    after = sum(metric(u, "vllm:nixl_xfer_time_seconds_count") for k, u in urls.items())
    assert after == pulls + 1  # the decode engine pulled the prefill engine's blocks
    assert metric(urls[line["prefill_backend"]], "vllm:kv_cache_usage_perc") == 0  # freed
    assert metric(router.url, r'turnout_pd_requests_total\{path="two_hop"') >= 1
    assert metric(router.url, r'turnout_pd_phase_seconds_count\{phase="prefill"') >= 1


def test_completions_and_responses_whole_and_streamed(
    fleet: Fleet,
) -> None:
    router, _, _ = fleet
    client = client_for(router.url)
    done = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=9,
                                     extra_body={"ignore_eos": True})  # fmt: skip
    assert done.usage is not None and done.usage.completion_tokens == 9 and done.choices[0].text
    assert "kv_transfer_params" not in (done.model_extra or {})  # the decode engine's answer
    resp = client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=7,
                                   extra_body={"ignore_eos": True})  # fmt: skip
    assert resp.usage is not None and resp.usage.output_tokens == 7 and resp.output_text
    events = list(
        client.responses.create(
            model=MODEL, input=PROMPT, max_output_tokens=5, stream=True,
            extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    assert events[-1].type == "response.completed"
    assert events[-1].response.usage is not None
    assert events[-1].response.usage.output_tokens == 5


def running(url: str) -> float:
    return metric(url, "vllm:num_requests_running")


def test_cancellation_reaches_the_prefill_hop_and_the_decode_hop(tmp_path: Path) -> None:
    long = " ".join(f"w{i}" for i in range(8000))  # about 1.3 s of vLLM prefill, at scale 1
    with (
        engines(1, PREFILL, time_scale=1) as prefill,
        engines(1, DECODE) as decode,
        start_router(write_config(tmp_path, pd_config(prefill, decode))) as router,
    ):
        body = {"model": MODEL, "prompt": long, "max_tokens": 2000, "stream": True,
                "ignore_eos": True}  # fmt: skip
        with _raw_stream(router.url, body):
            assert wait_for(lambda: running(prefill[0].url) == 1)
        assert wait_for(lambda: running(prefill[0].url) == 0)  # cut in the prefill hop
        assert metric(prefill[0].url, "vllm:kv_cache_usage_perc") == 0
        stream = client_for(router.url).completions.create(
            model=MODEL, prompt="short one", max_tokens=2000, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        first = next(iter(stream))
        assert first.choices[0].text is not None
        assert running(decode[0].url) == 1
        stream.close()  # mid-stream, in the decode hop
        assert wait_for(lambda: running(decode[0].url) == 0)


@contextlib.contextmanager
def _raw_stream(url: str, body: dict[str, Any]) -> Iterator[socket.socket]:
    """A request sent over a socket that is reset (the client gone: a plain close is a
    half-close, which the router answers) when the block ends."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(data)}\r\n\r\n")  # fmt: skip
        sock.sendall(head.encode() + data)
        yield sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_killed_prefill_engine_fails_over_then_to_the_fallback(tmp_path: Path) -> None:
    with (
        engines(2, PREFILL) as prefill,
        engines(2, DECODE) as decode,
        engines(1, ["--set", "ranks=1"]) as colocated,
    ):
        lines: list[str] = []
        doc = pd_config(prefill, decode, colocated)
        with start_router(write_config(tmp_path, doc), lines=lines) as router:
            client = client_for(router.url, **{"X-Request-Id": "pd-p-killed"})
            prefill[0].proc.kill()
            prefill[0].proc.wait(10)
            for i in range(3):  # whichever prefill engine is ranked first, p1 serves
                done = client.completions.create(model=MODEL, prompt=f"{i} {PROMPT}", max_tokens=4)
                assert done.choices[0].text
            assert access(lines, "pd-p-killed")["prefill_backend"] == "p1"
            prefill[1].proc.kill()
            prefill[1].proc.wait(10)
            client = client_for(router.url, **{"X-Request-Id": "pd-fallback"})
            raw = client.completions.with_raw_response.create(
                model=MODEL, prompt=f"new {PROMPT}", max_tokens=4
            )
            assert raw.headers["x-turnout-backend"] == "c0" and raw.parse().choices[0].text
            line = access(lines, "pd-fallback")
            assert line["backend"] == "c0" and line["prefill_backend"] is None
            assert metric(router.url, r'turnout_pd_requests_total\{path="fallback"') == 1


def test_a_killed_decode_engine_fails_over_with_the_same_blocks(tmp_path: Path) -> None:
    with (
        engines(1, PREFILL) as prefill,
        engines(2, DECODE) as decode,
        start_router(write_config(tmp_path, pd_config(prefill, decode))) as router,
    ):
        decode[0].proc.kill()
        decode[0].proc.wait(10)
        client = client_for(router.url)
        for i in range(3):  # whichever decode engine is ranked first, d1 serves
            content = f"{i} {PROMPT}"  # none cached anywhere: every one takes both hops
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=4
            )
            assert raw.headers["x-turnout-backend"] == "d1" and raw.parse().choices
        # d0 was never reached, so d1 pulled the blocks p0 made: one prefill per request
        assert metric(router.url, r'turnout_pd_prefills_total\{backend="p0"') == 3
        assert metric(decode[1].url, "vllm:nixl_xfer_time_seconds_count") == 3
        assert metric(decode[1].url, "vllm:nixl_num_failed_transfers_total") == 0


def test_expired_blocks_are_prefilled_by_the_decode_engine(tmp_path: Path) -> None:
    hold = [*PREFILL, "--set", "kv_hold_timeout_s=0"]
    with (
        engines(1, hold) as prefill,
        engines(1, DECODE) as decode,
        start_router(write_config(tmp_path, pd_config(prefill, decode))) as router,
    ):
        done = client_for(router.url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=6,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert done.usage is not None and done.usage.completion_tokens == 6
        assert metric(decode[0].url, "vllm:nixl_num_failed_transfers_total") == 1
        assert metric(prefill[0].url, "vllm:nixl_num_kv_expired_reqs_total") == 1


def test_a_prompt_the_decode_engine_holds_skips_the_prefill_hop(
    fleet: Fleet,
) -> None:
    router, lines, _ = fleet
    messages = [{"role": "user", "content": f"skip {PROMPT}"}]
    for rid in ("pd-first", "pd-again"):
        client = client_for(router.url, **{"X-Request-Id": rid})
        done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)  # type: ignore[arg-type]
        assert done.choices[0].message.content
    first, again = access(lines, "pd-first"), access(lines, "pd-again")
    assert first["prefill_backend"] is not None and again["prefill_backend"] is None
    assert again["backend"] == first["backend"]  # where its KV is cached
    assert metric(router.url, r'turnout_pd_requests_total\{path="skipped"') >= 1
