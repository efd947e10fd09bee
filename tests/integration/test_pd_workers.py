"""``pd``'s records across workers: the second turn of a conversation skips the prefill hop
on whichever worker takes it, because the worker that served the first turn passed its
decode placement on (real router of two workers, two prefill and two decode emulators)."""

from __future__ import annotations

from pathlib import Path

from tests.integration.test_pd_router import (
    DECODE,
    MODEL,
    PREFILL,
    PROMPT,
    access,
    engines,
    pd_config,
)
from tests.router.harness import client_for, start_router, write_config


def turn(url: str, question: str) -> tuple[str, str]:
    """One chat of the conversation on a fresh connection: the router-made request id and
    its worker part."""
    raw = client_for(url).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"{PROMPT} {question}"}],
        max_tokens=3,
    )
    assert raw.parse().choices[0].message.content
    rid = raw.headers["x-request-id"]
    return rid, rid.rsplit("-", 1)[0]


def test_the_second_turn_skips_prefill_on_the_other_worker(tmp_path: Path) -> None:
    with engines(2, PREFILL) as prefill, engines(2, DECODE) as decode:
        lines: list[str] = []
        doc = pd_config(prefill, decode, skip_prefill_above=0.5)
        with start_router(write_config(tmp_path, doc), ["--workers", "2"], lines=lines) as r:
            rid, first_worker = turn(r.url, "What happens first?")
            first = access(lines, rid)
            assert first["prefill_backend"] is not None  # a cold prompt: both hops
            for _ in range(60):  # fresh connections until the other worker answers
                rid, worker = turn(r.url, "And then?")
                if worker != first_worker:
                    break
            else:
                raise AssertionError("the other worker never answered")
            again = access(lines, rid)
            assert again["prefill_backend"] is None  # skipped: it knows where the KV is
            assert again["backend"] == first["backend"]
