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
