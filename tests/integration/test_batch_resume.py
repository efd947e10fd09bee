"""A router killed with SIGKILL mid-batch, restarted on the same data directory, finishes the
batch with every line answered exactly once, and re-runs none of those already answered."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import openai

from tests.batchkit import answered_once, chat_line, submit
from tests.procs import start_emulator
from tests.router.harness import base_config, start_router, write_config

LINES = 200
WINDOW = 8


def test_sigkill_mid_batch_then_restart(tmp_path: Path) -> None:
    with (
        start_emulator("vllm", time_scale=50) as vllm,
        start_emulator("deepinfer", time_scale=50) as deepinfer,
    ):
        doc = base_config([("vllm", "vllm", vllm.url), ("deepinfer", "deepinfer", deepinfer.url)])
        doc["batch"] = {
            "data_dir": str(tmp_path / "data"),
            "max_concurrency": WINDOW,
            "lease_seconds": 1.0,
        }
        config = write_config(tmp_path, doc)
        rows = [chat_line(f"r{i}", max_tokens=150, ignore_eos=True) for i in range(LINES)]
        with start_router(config) as first:
            client = openai.OpenAI(base_url=first.url + "/v1", api_key="x", max_retries=0)
            batch = submit(client, rows)
            deadline = time.monotonic() + 60
            completed = 0
            while time.monotonic() < deadline:
                counts = client.batches.retrieve(batch.id).request_counts
                assert counts is not None
                completed = counts.completed
                if completed >= LINES // 5:
                    break
                time.sleep(0.05)
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(10)
        assert completed < LINES, "the batch ended before the kill: make its lines longer"
        with start_router(config) as second:
            client = openai.OpenAI(base_url=second.url + "/v1", api_key="x", max_retries=0)
            answered_once(client, batch.id, rows, [vllm.url, deepinfer.url], WINDOW)


def test_a_draining_router_takes_no_new_lines(tmp_path: Path) -> None:
    """SIGTERM: the lines running finish, no new one is taken, so the router exits long
    before its drain deadline; a restart finishes the batch, every line answered once."""
    with (
        start_emulator("vllm", time_scale=50) as vllm,
        start_emulator("deepinfer", time_scale=50) as deepinfer,
    ):
        doc = base_config([("vllm", "vllm", vllm.url), ("deepinfer", "deepinfer", deepinfer.url)])
        doc["batch"] = {"data_dir": str(tmp_path / "data"), "max_concurrency": WINDOW}
        # Long enough that the whole batch (about 6 s of lines) would fit in it: a router
        # that kept taking lines while draining would answer every line before it exits.
        doc["shutdown"] = {"drain_seconds": 30}
        config = write_config(tmp_path, doc)
        rows = [chat_line(f"d{i}", max_tokens=1000, ignore_eos=True) for i in range(LINES)]
        with start_router(config) as first:
            client = openai.OpenAI(base_url=first.url + "/v1", api_key="x", max_retries=0)
            batch = submit(client, rows)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                counts = client.batches.retrieve(batch.id).request_counts
                assert counts is not None
                if counts.completed >= WINDOW:
                    break
                time.sleep(0.05)
            first.proc.send_signal(signal.SIGTERM)
            first.proc.wait(30)
        with start_router(config) as second:
            client = openai.OpenAI(base_url=second.url + "/v1", api_key="x", max_retries=0)
            counts = client.batches.retrieve(batch.id).request_counts
            assert counts is not None
            assert counts.completed + counts.failed < LINES // 2, counts
            # A line whose answer came back while the executor was being closed is given
            # back unrecorded and runs again: at most the window's worth.
            answered_once(client, batch.id, rows, [vllm.url, deepinfer.url], WINDOW)
