"""The cache-aware policy through a real router in front of two emulated vLLM replicas:
requests sharing a long prefix land where it is cached (and the engine says it hit), a
request with another prefix goes to the other, idle replica."""

from __future__ import annotations

from pathlib import Path

from tests.procs import start_emulator
from tests.router.harness import base_config, client_for, start_router, write_config

MODEL = "deepseek-v4.1-flash"
SHARED = " ".join(f"rule {i} of the tenant's long system prompt." for i in range(400))


def ask(url: str, system: str, question: str) -> tuple[str, int]:
    """One non-streamed chat through the router: the backend that served it, cached tokens."""
    raw = client_for(url).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=2,
    )
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return raw.headers["x-turnout-backend"], usage.prompt_tokens_details.cached_tokens or 0


def test_shared_prefixes_follow_their_cache(tmp_path: Path) -> None:
    with (
        start_emulator("vllm", time_scale=50, args=["--set", "ranks=1"]) as one,
        start_emulator("vllm", time_scale=50, args=["--set", "ranks=1"]) as two,
    ):
        doc = base_config([("one", "vllm", one.url), ("two", "vllm", two.url)])
        doc["policies"]["warm"] = {"type": "cache-aware"}
        doc["default_policy"] = "warm"
        with start_router(write_config(tmp_path, doc)) as router:
            first, cached = ask(router.url, SHARED, "What is rule 7?")
            assert cached == 0
            for question in ("What is rule 9?", "And rule 300?", "Summarize rules 1 to 5."):
                backend, cached = ask(router.url, SHARED, question)
                assert backend == first and cached > 2000
            other, cached = ask(router.url, "A different tenant. " * 300, "Hello?")
            assert other != first and cached == 0
