"""The prefix cache over HTTP: a warm emulator answers a shared prefix faster and says so."""

from __future__ import annotations

import time

from tests.emulator.conftest import client_for
from tests.procs import Emulator, metric, start_emulator

MODEL = "deepseek-v4.1-flash"
# About 6,000 tokens under the counting rule: long enough that its prefill dominates TTFT.
PREFIX = " ".join(f"clause {i} of the shared contract text;" for i in range(1000))


def ask(emu: Emulator, question: str) -> tuple[float, int]:
    """Stream one chat request; its TTFT (s) and the usage's cached token count."""
    client = client_for(emu)
    sent = time.perf_counter()
    first: float | None = None
    cached = -1
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": PREFIX},
            {"role": "user", "content": question},
        ],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
        if chunk.usage is not None:
            details = chunk.usage.prompt_tokens_details
            assert details is not None
            cached = details.cached_tokens or 0
    assert first is not None
    return first - sent, cached


def counter(emu: Emulator, name: str) -> float:
    return metric(emu.url, name + r"\{", required=True)


def test_shared_prefix_hits_only_where_it_was_computed() -> None:
    # Real time: a cold prefill takes about 1 s, so the warm answer has about 0.3 s for
    # loopback, the client and a busy machine's scheduling. At time scale 4 (0.26 s cold)
    # a 90 ms stall of the warm request under load failed the comparison.
    with (
        start_emulator("vllm", time_scale=1) as warm,
        start_emulator("vllm", time_scale=1) as other,
    ):
        for emu in (warm, other):  # first connections and imports out of the way
            client_for(emu).completions.create(model=MODEL, prompt="hello", max_tokens=1)
        cold_ttft, cold_cached = ask(warm, "Which clause covers payment?")
        warm_ttft, warm_cached = ask(warm, "Which clause covers termination?")
        other_ttft, other_cached = ask(other, "Which clause covers termination?")
        assert cold_cached == 0 and other_cached == 0
        assert warm_cached > 5000
        # The warm request prefills a few tokens instead of about 6,000: far shorter TTFT.
        assert warm_ttft < cold_ttft / 3 and warm_ttft < other_ttft / 3
        queries = counter(warm, "vllm:prefix_cache_queries_total")
        hits = counter(warm, "vllm:prefix_cache_hits_total")
        assert hits == warm_cached and queries > 2 * warm_cached + 1
        assert counter(other, "vllm:prefix_cache_hits_total") == 0
