"""Outlier ejection over real processes: a backend answering 503 is ejected after
``failures_to_eject`` failures in a row and gets no traffic while its breaker is open; once
it is healthy again, a half-open probe brings it back."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.procs import Process, start_emulator, start_process
from tests.router.harness import base_config, get, start_router, write_config

MODEL = "deepseek-v4.1-flash"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    broken = ["--error-rate", "1", "--error-status", "503"]
    with (
        start_emulator("vllm", time_scale=50, args=broken) as bad,
        start_emulator("vllm", time_scale=50) as good,
    ):
        doc = base_config([("bad", "vllm", bad.url), ("good", "vllm", good.url)])
        doc["default_policy"] = "round-robin"
        # A long cooldown: within this test the ejected backend must see no request at all.
        doc["health"] = {**doc["health"], "failures_to_eject": 2, "cooldown": 60}
        with start_router(write_config(tmp_path_factory.mktemp("breaker"), doc)) as proc:
            yield proc


def _failovers(router: Process) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in get(router.url + "/metrics").text.splitlines()
        if line.startswith("turnout_failovers_total{") and 'backend="bad"' in line
    )


def test_failing_backend_is_ejected_and_skipped(router: Process) -> None:
    with openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0) as c:
        for _ in range(12):
            raw = c.chat.completions.with_raw_response.create(
                model=MODEL, messages=CHAT, max_tokens=2
            )
            assert raw.headers["x-turnout-backend"] == "good"  # failover hid every 503
    assert _failovers(router) == 2  # two failures ejected it; round-robin never tried it again
    states = {b["name"]: b for b in get(router.url + "/turnout/backends").json()}
    assert states["bad"]["breaker"] == "open" and not states["bad"]["healthy"]
    assert states["good"]["breaker"] == "closed"


def test_half_open_probe_brings_a_recovered_backend_back(tmp_path: Path) -> None:
    broken = ["--error-rate", "1", "--error-status", "503"]
    with start_emulator("vllm", time_scale=50) as good, contextlib.ExitStack() as flaky:
        emu = flaky.enter_context(start_emulator("vllm", time_scale=50, args=broken))
        doc = base_config([("flaky", "vllm", emu.url), ("good", "vllm", good.url)])
        doc["default_policy"] = "round-robin"
        doc["health"] = {**doc["health"], "failures_to_eject": 1, "cooldown": 0.3}
        with (
            start_router(write_config(tmp_path, doc)) as router,
            openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0) as c,
        ):
            for _ in range(4):
                c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
            assert _breaker(router, "flaky") in ("open", "half-open")
            flaky.close()  # the engine is fixed and comes back on the same port
            argv = [sys.executable, "-m", "turnout", "emulator", "--profile", "vllm",
                    "--time-scale", "50", "--port", str(urlsplit(emu.url).port)]  # fmt: skip
            with start_process(argv, "emulator listening on"):
                deadline = time.monotonic() + 15
                while _breaker(router, "flaky") != "closed":  # until a probe got through
                    assert time.monotonic() < deadline
                    c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
                    time.sleep(0.05)
                served = {
                    c.chat.completions.with_raw_response.create(
                        model=MODEL, messages=CHAT, max_tokens=2
                    ).headers["x-turnout-backend"]
                    for _ in range(6)
                }
                assert served == {"flaky", "good"}


def _breaker(router: Process, name: str) -> str:
    states = {b["name"]: b["breaker"] for b in get(router.url + "/turnout/backends").json()}
    return str(states[name])


@contextlib.contextmanager
def stalling_upstream(stall: float) -> Iterator[str]:
    """A loopback engine whose streams send one event and then nothing for ``stall`` s."""
    server = socket.create_server(("127.0.0.1", 0))
    event = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'

    def handle(conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            if b" /health " not in data.split(b"\r\n", 1)[0] + b" ":
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(event), event)
                )
                time.sleep(stall)
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        # close() alone does not wake a thread blocked in accept() (Linux): the join then
        # waited its whole 5 s. shutdown() makes that accept() fail at once.
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(5)
        assert not thread.is_alive()


def test_a_stream_stalling_past_the_idle_timeout_counts_toward_ejection(tmp_path: Path) -> None:
    with stalling_upstream(stall=3.0) as url, start_emulator("vllm", time_scale=50) as good:
        doc = base_config([("stall", "vllm", url), ("good", "vllm", good.url)])
        doc["backends"][0]["models"] = [MODEL]
        doc["default_policy"] = "stall-only"
        doc["health"] = {**doc["health"], "failures_to_eject": 1, "cooldown": 60,
                         "scrape_metrics": False}  # fmt: skip
        doc["timeouts"] = {"interactive": {"idle": 0.3}}
        with (
            start_router(write_config(tmp_path, doc)) as router,
            openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0) as c,
        ):
            assert _breaker(router, "stall") == "closed"
            with pytest.raises(openai.APIError):  # the router ends the stream with an error
                for _ in c.chat.completions.create(
                    model=MODEL, messages=CHAT, max_tokens=4, stream=True
                ):
                    pass
            assert _breaker(router, "stall") == "open"
