"""A backend going down or coming back is logged by the router, once per change, with the
reason: a real router in front of real emulators, one behind a wrong URL, one stopped and
started again on its port, one whose requests fail until its breaker opens."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.procs import Process, start_emulator
from tests.router.harness import base_config, client_for, get, start_router, write_config

MODEL = "deepseek-v4.1-flash"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
SECRET = "s3cret-pw-41"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def healthy(router: Process) -> dict[str, bool]:
    return {b["name"]: b["healthy"] for b in get(router.url + "/turnout/backends").json()}


def wait_for(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout} s")
        time.sleep(0.05)


def test_health_changes_are_logged_once_each_with_their_reason(tmp_path: Path) -> None:
    log = tmp_path / "router.log"

    def said(about: str) -> list[str]:
        """The router's log lines about one backend, without their time stamps."""
        lines = log.read_text().splitlines()
        return [line.split(" router ", 1)[1] for line in lines if f"router {about} " in line]

    port = free_port()
    with (
        start_emulator("vllm", time_scale=50) as good,
        contextlib.ExitStack() as restarted,  # exits after the router: no last "down" line
        start_emulator("vllm", time_scale=50, args=["--port", str(port)]) as flaky,
    ):
        host = good.url.removeprefix("http://")
        doc = base_config(
            [
                ("good", "vllm", good.url),
                ("flaky", "vllm", flaky.url),
                # A path the engine does not serve, and credentials the log must not show.
                ("wrong", "vllm", f"http://probe:{SECRET}@{host}/nope"),
            ],
            access_log={"enabled": False},
        )
        doc["backends"][0]["forward_headers"] = ["X-Emulator-Fault"]
        doc["health"] = {**doc["health"], "interval": 0.1, "failures_to_eject": 2, "cooldown": 1}
        with start_router(write_config(tmp_path, doc), stderr=log) as router:
            assert said("backend wrong") == [
                "backend wrong is down: its first health probe failed "
                f"(GET http://{host}/nope/health: 404 Not Found)"
            ]
            flaky.proc.terminate()
            flaky.proc.wait(10)
            wait_for(lambda: not healthy(router)["flaky"], "down")
            time.sleep(1.0)  # ten more failed probes: still one line
            restarted.enter_context(
                start_emulator("vllm", time_scale=50, args=["--port", str(port)])
            )
            wait_for(lambda: healthy(router)["flaky"], "up again")

            client = client_for(router.url, **{"X-Turnout-Policy": "good-only"})
            failing = client.with_options(default_headers={"X-Emulator-Fault": "status=503"})
            for _ in range(3):  # the third finds the breaker open: no third failure
                with pytest.raises(openai.APIStatusError):
                    failing.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
            wait_for(lambda: not healthy(router)["good"], "ejected")
            time.sleep(1.1)  # the cooldown: the next request is the half-open trial
            for _ in range(3):
                client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
    assert said("backend flaky") == [
        "backend flaky is down: 2 health probes in a row failed "
        f"(GET http://127.0.0.1:{port}/health: Connection refused)",
        "backend flaky is up: its health probe passes again",
    ]
    assert said("backend good") == [
        "backend good is ejected for 1 s: 2 requests in a row failed",
        "backend good is back in service: a trial request after its ejection succeeded",
    ]
    assert len(said("backend wrong")) == 1
    assert SECRET not in log.read_text()
