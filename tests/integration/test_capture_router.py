"""Capture through the router, replay under two policies, and a kill -9 during capture."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.procs import run_replay, start_emulator
from tests.router.harness import base_config, client_for, start_router, write_config
from turnout.common.capture import CaptureRecord, dump_line, parse_line

MODEL = "deepseek-v4.1-flash"


@pytest.fixture(scope="module")
def emulators() -> Iterator[list[tuple[str, str, str]]]:
    with (
        start_emulator("vllm", time_scale=50, seed=5) as vllm,
        start_emulator("deepinfer", time_scale=50, seed=5) as deepinfer,
    ):
        yield [("vllm", "vllm", vllm.url), ("deepinfer", "deepinfer", deepinfer.url)]


def _router_config(tmp: Path, backends: list[tuple[str, str, str]], capture: Path) -> Path:
    doc = base_config(backends, capture={"path": str(capture), "redaction": "none"})
    return write_config(tmp, doc)


def _traffic(client: openai.OpenAI, n: int) -> None:
    for i in range(n):
        batch = i % 3 == 2
        headers = {"x-request-class": "batch"} if batch else {}
        content = f"Request {i}: tell me about routing."
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": content}]
        if batch:
            client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=20 + i, extra_headers=headers
            )
        else:
            stream = client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=8 + i, stream=True
            )
            for _ in stream:
                pass


def _served(rec: CaptureRecord) -> bool:
    """A streamed request whose every token arrived (whatever status the router booked)."""
    r = rec.resp
    return bool(
        r is not None
        and r.stream
        and r.finish_reason == "length"
        and r.completion_tokens == rec.body.get("max_tokens")
    )


def _wait_stable(path: Path, rounds: int = 100) -> None:
    """Wait until the capture file stops growing (the sink finishing after the router)."""
    sizes = [-1, -2]
    for _ in range(rounds):
        if sizes[-1] == sizes[-2]:
            return
        time.sleep(0.1)
        sizes.append(path.stat().st_size if path.exists() else 0)


def test_capture_then_replay_under_two_policies(
    emulators: list[tuple[str, str, str]], tmp_path: Path
) -> None:
    capture = tmp_path / "capture.jsonl"
    config = _router_config(tmp_path, emulators, capture)
    n = 18
    with start_router(config) as router:
        _traffic(client_for(router.url), n)
    lines = capture.read_bytes().splitlines()
    assert len(lines) == n
    recs = [parse_line(line) for line in lines]
    assert all(b"authorization" not in line.lower() for line in lines)  # the client sent one
    assert {r.headers.get("x-request-class") for r in recs} == {None, "batch"}
    assert all(r.route is not None and r.route.policy == "class-split" for r in recs)
    # A client that closes right after the final [DONE] was once booked 499 though served
    # whole (the relay now checks the meter there too); any such line must still be complete.
    bad = [r.resp for r in recs if not (r.resp and (r.resp.status == 200 or _served(r)))]
    assert not bad, bad
    assert all(r.obs is not None and r.obs.e2e_ms is not None for r in recs)
    offsets = [r.t_offset_ms or 0.0 for r in recs]
    assert offsets == sorted(offsets)

    out = tmp_path / "report.json"
    results = tmp_path / "results.jsonl"
    with start_router(_router_config(tmp_path, emulators, tmp_path / "c2.jsonl")) as router:
        args = ["--target", router.url, "--policy", "round-robin", "--policy", "class-split"]
        # One block a run and no warm-up: a warm-up or a block's lead-in is sent through the
        # router unmeasured and takes round-robin turns too, so the measured split would
        # depend on how many of them the capture's timing put before each block.
        args += ["--warmup", "0", "--blocks", "1"]
        args += ["--speed", "4", "--out", str(out), "--results", str(results)]
        p = run_replay(str(capture), *args)
    assert p.returncode == 0, p.stderr
    report = orjson.loads(out.read_bytes())
    assert [r["policy"] for r in report["runs"]] == ["round-robin", "class-split"]
    rr, cs = report["runs"]
    for run in (rr, cs):
        assert run["overall"]["completed"] == n and run["overall"]["failed"] == 0
        assert set(run["by_class"]) == {"interactive", "batch"}
        assert run["by_class"]["batch"]["completed"] == n // 3

    # round-robin alternates; class-split sends interactive to vllm and batch to deepinfer
    def served(run: dict[str, Any]) -> dict[str, int]:
        return {name: b["requests"] for name, b in run["by_backend"].items()}

    assert served(rr) == {"deepinfer": n // 2, "vllm": n // 2}
    assert served(cs) == {"deepinfer": n // 3, "vllm": 2 * n // 3}
    assert set(cs["by_backend"]["deepinfer"]["by_class"]) == {"batch"}
    assert "| round-robin" in p.stdout and "Class batch" in p.stdout
    joined = {parse_line(line).custom_id for line in results.read_bytes().splitlines()}
    assert joined == {r.custom_id for r in recs}  # results join the capture by custom_id


def test_kill_9_during_capture_leaves_only_whole_lines(
    emulators: list[tuple[str, str, str]], tmp_path: Path
) -> None:
    capture = tmp_path / "capture.jsonl"
    config = _router_config(tmp_path, emulators, capture)
    stop = threading.Event()
    with start_router(config) as router:
        client = client_for(router.url)

        def load() -> None:
            for i in range(2000):
                if stop.is_set():
                    return
                try:
                    client.completions.create(model=MODEL, prompt=f"p{i} " * 50, max_tokens=2)
                except openai.OpenAIError:
                    return  # the router is gone

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (
                not capture.exists() or capture.stat().st_size < 20_000
            ):
                time.sleep(0.05)
            os.kill(router.proc.pid, signal.SIGKILL)
            router.proc.wait(10)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    _wait_stable(capture)
    data = capture.read_bytes()
    assert len(data) >= 20_000
    lines = data.splitlines()
    assert data.endswith(b"\n")
    assert all(parse_line(line).resp is not None for line in lines)


def test_replay_sends_the_api_key_it_is_given(
    emulators: list[tuple[str, str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cap = tmp_path / "cap.jsonl"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    cap.write_bytes(
        b"".join(
            dump_line(CaptureRecord(f"k{i}", "/v1/chat/completions", body, t_offset_ms=i))
            for i in range(4)
        )
    )
    doc = base_config(emulators, require_api_key=True)
    doc["api_keys"] = [{"name": "bench", "env": "TURNOUT_TEST_KEY", "class": "batch"}]
    monkeypatch.setenv("TURNOUT_TEST_KEY", "sk-replay")  # the router child reads it
    out = tmp_path / "report.json"
    with start_router(write_config(tmp_path, doc)) as router:
        # without the key the router's 401 stops the replay before its first request
        refused = run_replay(str(cap), "--target", router.url, "--out", str(out), timeout=60)
        assert refused.returncode == 2 and "wants an API key (401" in refused.stderr
        assert not out.exists()
        args = [str(cap), "--target", router.url, "--api-key", "sk-replay", "--out", str(out)]
        p = run_replay(*args, timeout=60)
        assert p.returncode == 0, p.stderr
    run = orjson.loads(out.read_bytes())["runs"][0]
    assert run["overall"]["completed"] == 4
    assert set(run["by_class"]) == {"batch"}  # the key's class
