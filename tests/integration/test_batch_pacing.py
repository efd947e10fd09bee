"""A batch runs while interactive traffic runs (the small version of benchmarks/batch_api.py):
it completes with one output line per custom_id, and its window follows the interactive TTFT:
it shrinks to the floor while interactive requests miss their SLO, and grows past its
start while they meet it. Round-robin routes both classes to both engines, so every
interactive request shares a backend with the batch (and counts); the SLO is the adaptive
policy's, which every policy of the router is judged by.

Which way the window goes depends only on which side of the SLO the interactive TTFTs are;
the SLOs are set far on either side of what the emulators take, so no latency is asserted.
"""

from __future__ import annotations

import io
import re
import threading
import time
from pathlib import Path

import openai
import pytest

from tests.batchkit import MODEL, batch_client, chat_line, jsonl, keyed, lines_of, paced
from tests.procs import start_emulator
from tests.router.harness import base_config, get, start_router, write_config


def window(url: str) -> float:
    found = re.search(r"^turnout_batch_concurrency_limit (\S+)$", get(url + "/metrics").text, re.M)
    assert found is not None
    return float(found.group(1))


def interactive(client: openai.OpenAI, stop: threading.Event) -> None:
    while not stop.is_set():
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
        )
        for _ in stream:
            pass
        time.sleep(0.05)


# Shrinking to one line at a time, fewer lines do (they still outlast the halvings).
@pytest.mark.parametrize(("ttft_slo", "grows", "lines"), [(0.001, False, 60), (600.0, True, 120)])
def test_the_window_follows_the_interactive_slo(
    tmp_path: Path, ttft_slo: float, grows: bool, lines: int
) -> None:
    with (
        start_emulator("vllm", time_scale=10) as vllm,
        start_emulator("deepinfer", time_scale=10) as deepinfer,
    ):
        doc = base_config([("vllm", "vllm", vllm.url), ("deepinfer", "deepinfer", deepinfer.url)])
        paced(doc, ttft_slo)
        doc["batch"] = {
            "data_dir": str(tmp_path / "data"),
            "initial_concurrency": 4,
            "min_concurrency": 1,
            "max_concurrency": 32,
        }
        with start_router(write_config(tmp_path, keyed(doc))) as router:
            client = batch_client(router.url)
            stop = threading.Event()
            chatter = threading.Thread(target=interactive, args=(client, stop), daemon=True)
            chatter.start()
            try:
                time.sleep(1.0)  # interactive TTFTs are in before the batch starts
                rows = [chat_line(f"w{i}", max_tokens=150, ignore_eos=True) for i in range(lines)]
                f = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
                batch = client.batches.create(
                    input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
                )
                seen: list[float] = []
                deadline = time.monotonic() + 120
                while (b := client.batches.retrieve(batch.id)).status != "completed":
                    # finalizing: its output file is being written, between in_progress and
                    # completed (OpenAI's lifecycle); a poll may land on it
                    running = b.status in ("validating", "in_progress", "finalizing")
                    assert time.monotonic() < deadline and running, b
                    seen.append(window(router.url))
                    time.sleep(0.2)
            finally:
                stop.set()
                chatter.join(30)
            out = lines_of(client, b.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(r["custom_id"] for r in rows)
    if grows:
        assert max(seen) > 4, seen
    else:
        assert min(seen) == 1, seen  # the floor (after at most a slow start's first steps)
