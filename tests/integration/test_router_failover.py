"""Failover before the first byte, ejection, timeouts and disconnects, with real processes."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.procs import Process, metric, metric_in, start_emulator, wait_for
from tests.router.harness import base_config, client_for, get, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a long story."}]


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def good() -> Iterator[Process]:
    with start_emulator("vllm", time_scale=20) as emu:
        yield emu


@pytest.fixture(scope="module")
def flaky() -> Iterator[Process]:
    with start_emulator(
        "deepinfer", time_scale=20, args=["--error-rate", "1", "--error-status", "503"]
    ) as emu:
        yield emu


def test_refused_then_503_then_success(good: Process, flaky: Process, tmp_path: Path) -> None:
    with start_emulator("vllm", time_scale=20) as doomed:
        backends = [("dead", "vllm", doomed.url), ("flaky", "deepinfer", flaky.url)]
        doc = base_config([*backends, ("good", "sglang", good.url)])
        doc["health"] = {"interval": 30, "failures_to_eject": 50}
        with start_router(write_config(tmp_path, doc)) as router:
            doomed.proc.kill()  # healthy at startup, refusing connections from now on
            doomed.proc.wait(10)
            raw = client_for(router.url).chat.completions.with_raw_response.create(
                model=MODEL,
                messages=CHAT,
                max_tokens=4,
            )
            assert raw.headers["x-turnout-backend"] == "good"
            assert raw.parse().choices[0].message.content
            text = get(router.url + "/metrics").text
    assert (
        metric_in(text, "turnout_failovers_total", {"backend": "dead", "policy": "class-split"})
        == 1
    )
    assert (
        metric_in(text, "turnout_failovers_total", {"backend": "flaky", "policy": "class-split"})
        == 1
    )
    assert (
        metric_in(text, "turnout_failovers_total", {"backend": "good", "policy": "class-split"})
        == 0
    )


def test_dead_at_startup_is_not_ready_at_once(good: Process, tmp_path: Path) -> None:
    doc = base_config(
        [("dead", "vllm", f"http://127.0.0.1:{free_port()}"), ("good", "x", good.url)]
    )
    doc["health"] = {"interval": 30, "failures_to_eject": 50}
    with start_router(write_config(tmp_path, doc)) as router:
        backends = {b["name"]: b["healthy"] for b in get(router.url + "/turnout/backends").json()}
        assert backends == {"dead": False, "good": True}
        raw = client_for(router.url).chat.completions.with_raw_response.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=2,
        )
        assert raw.headers["x-turnout-backend"] == "good"
        text = get(router.url + "/metrics").text
    assert (
        metric_in(text, "turnout_failovers_total", {"backend": "dead", "policy": "class-split"})
        == 0
    )


def test_killed_backend_fails_over_and_is_ejected(good: Process, tmp_path: Path) -> None:
    with start_emulator("vllm", time_scale=20) as victim:
        doc = base_config([("victim", "vllm", victim.url), ("good", "deepinfer", good.url)])
        doc["health"] = {"interval": 0.1, "timeout": 0.5, "failures_to_eject": 2, "cooldown": 60}
        with start_router(write_config(tmp_path, doc)) as router:
            client = client_for(router.url)
            first = client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=CHAT,
                max_tokens=3,
            )
            assert first.headers["x-turnout-backend"] == "victim"
            victim.proc.kill()
            victim.proc.wait(10)
            for _ in range(3):
                again = client.chat.completions.with_raw_response.create(
                    model=MODEL,
                    messages=CHAT,
                    max_tokens=3,
                )
                assert again.headers["x-turnout-backend"] == "good"

            def victim_down() -> bool:
                backends = {b["name"]: b for b in get(router.url + "/turnout/backends").json()}
                return not backends["victim"]["healthy"] and backends["good"]["healthy"]

            assert wait_for(victim_down)
            assert get(router.url + "/ready").status == 200
            text = get(router.url + "/metrics").text
            assert 'turnout_backend_up{backend="victim"} 0.0' in text


def test_no_healthy_backend_is_not_ready_and_tried_anyway(tmp_path: Path) -> None:
    doc = base_config([("dead", "vllm", f"http://127.0.0.1:{free_port()}")])
    doc["health"] = {"interval": 0.05, "timeout": 0.2, "failures_to_eject": 1}
    with start_router(write_config(tmp_path, doc)) as router:
        assert wait_for(lambda: get(router.url + "/ready").status == 503)
        with pytest.raises(openai.APIStatusError) as exc:
            client_for(router.url).chat.completions.create(model=MODEL, messages=CHAT)
        # Panic mode: the probes' verdict does not stop the attempt; the backend refuses it.
        assert exc.value.status_code == 502
        assert exc.value.response.headers["x-turnout-backend"] == "dead"
        text = get(router.url + "/metrics").text
    assert metric_in(text, r'turnout_panic_routing_total\{model="other"\}') == 1


def test_stall_before_headers_times_out_on_each_backend(good: Process, tmp_path: Path) -> None:
    with start_emulator("deepinfer", time_scale=20) as other:
        doc = base_config([("a", "vllm", good.url), ("b", "deepinfer", other.url)])
        doc["timeouts"] = {"interactive": {"first_byte": 0.3}}
        doc["health"] = {"interval": 30, "failures_to_eject": 50}
        for backend in doc["backends"]:
            backend["forward_headers"] = ["X-Emulator-Fault"]
        with start_router(write_config(tmp_path, doc)) as router:
            client = client_for(router.url, **{"X-Emulator-Fault": "stall=3"})
            with pytest.raises(openai.APIStatusError) as exc:
                client.chat.completions.create(
                    model=MODEL,
                    messages=CHAT,
                    stream=True,
                )
            assert exc.value.status_code == 504
            text = get(router.url + "/metrics").text
            assert (
                metric_in(
                    text, "turnout_failovers_total", {"backend": "a", "policy": "class-split"}
                )
                == 1
            )


def running(emu: Process) -> float:
    return metric(emu.url, "vllm:num_requests_running", required=True)


def test_client_disconnect_frees_the_engine_slot(tmp_path: Path) -> None:
    with start_emulator("vllm", time_scale=2) as emu:
        doc = base_config([("only", "vllm", emu.url)])
        with start_router(write_config(tmp_path, doc)) as router:
            host, port = router.url.removeprefix("http://").split(":")
            body = (
                b'{"model":"deepseek-v4.1-flash","messages":[{"role":"user","content":"x"}],'
                b'"max_tokens":4000,"stream":true}'
            )
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(head + body)
                got = b""
                while got.count(b"data:") < 3:
                    data = sock.recv(65536)
                    assert data, "router closed the stream early"
                    got += data
                assert running(emu) == 1
                inflight = get(router.url + "/turnout/backends").json()[0]["inflight"]
                assert inflight == 1
            assert wait_for(lambda: running(emu) == 0, timeout=5)
            assert wait_for(
                lambda: get(router.url + "/turnout/backends").json()[0]["inflight"] == 0
            )
            text = get(router.url + "/metrics").text
            assert 'code="499"' in text


def test_idle_upstream_mid_stream_ends_with_error_event(tmp_path: Path) -> None:
    # a hundred times slower than the engine: seconds between tokens, far over `idle`
    with start_emulator("vllm", time_scale=0.01) as slow:
        doc = base_config([("slow", "vllm", slow.url)])
        doc["timeouts"] = {"interactive": {"first_byte": 30, "idle": 0.3}}
        with start_router(write_config(tmp_path, doc)) as router:
            resp = post(
                router.url + "/v1/chat/completions",
                {"model": MODEL, "messages": CHAT, "max_tokens": 50, "stream": True},
            )
            assert resp.status == 200
            events = [e for e in resp.content.split(b"\n\n") if e]
            assert events[-1] == b"data: [DONE]"
            assert b"sent nothing for 0.3 s" in events[-2]
            assert wait_for(lambda: running(slow) == 0, timeout=5)


def test_backend_at_max_inflight_is_skipped_then_429(tmp_path: Path) -> None:
    with start_emulator("vllm", time_scale=2) as a, start_emulator("deepinfer", time_scale=2) as b:
        doc = base_config([("a", "vllm", a.url), ("b", "deepinfer", b.url)])
        doc["backends"][0]["max_inflight"] = 1
        doc["backends"][1]["max_inflight"] = 1
        with start_router(write_config(tmp_path, doc)) as router:
            client = client_for(router.url)
            with client.chat.completions.with_streaming_response.create(
                model=MODEL, messages=CHAT, max_tokens=4000, stream=True
            ) as first:
                assert first.headers["x-turnout-backend"] == "a"
                raw = client.chat.completions.with_raw_response.create(
                    model=MODEL,
                    messages=CHAT,
                    max_tokens=2,
                )
                assert raw.headers["x-turnout-backend"] == "b"  # a is full: skipped
                with client.chat.completions.with_streaming_response.create(
                    model=MODEL, messages=CHAT, max_tokens=4000, stream=True
                ) as second:
                    assert second.headers["x-turnout-backend"] == "b"
                    with pytest.raises(openai.RateLimitError):
                        client.chat.completions.create(
                            model=MODEL,
                            messages=CHAT,
                            max_tokens=2,
                        )
