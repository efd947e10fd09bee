"""Admission queue and SLO goodput through a real router and emulator."""

from __future__ import annotations

import threading
from pathlib import Path

import openai
from openai.types.chat import ChatCompletionMessageParam

from tests.procs import metric, metric_in, start_emulator, wait_for
from tests.router.harness import base_config, client_for, get, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a long story."}]


def test_saturated_batch_waits_then_full_queue_gets_429(tmp_path: Path) -> None:
    with start_emulator("vllm", time_scale=2) as emu:
        doc = base_config([("a", "vllm", emu.url)])
        doc["backends"][0]["max_inflight"] = 1
        doc["admission"] = {"batch": {"queue_size": 1, "max_wait": 20}, "retry_after": 2}
        with start_router(write_config(tmp_path, doc)) as router:
            client = client_for(router.url)
            batch = {"X-Request-Class": "batch"}
            waited: list[str] = []

            def queued() -> None:
                reply = client.chat.completions.create(
                    model=MODEL, messages=CHAT, max_tokens=2, extra_headers=batch
                )
                waited.append(reply.choices[0].finish_reason or "")

            with client.chat.completions.with_streaming_response.create(
                model=MODEL,
                messages=CHAT,
                max_tokens=4000,
                stream=True,
                extra_body={"ignore_eos": True},  # holds the slot until closed below
            ) as first:
                assert first.headers["x-turnout-backend"] == "a"
                thread = threading.Thread(target=queued)
                thread.start()
                queue = r'turnout_admission_queue_length\{class="batch"\}'
                assert wait_for(lambda: metric(router.url, queue) == 1)
                # The queued request holds the one batch place: the next one is refused.
                r = post(
                    router.url + "/v1/chat/completions",
                    {"model": MODEL, "messages": CHAT, "max_tokens": 2},
                    batch,
                )
                assert r.status == 429
                assert r.headers.get("retry-after") == "2"
                assert r.json()["error"]["type"] == "rate_limit_error"
                assert not waited  # still waiting while the slot is taken
            # The stream closed: its slot frees and the queued batch request is served.
            thread.join(20)
            assert waited == ["length"]


def test_interactive_without_queue_gets_429_with_retry_after(tmp_path: Path) -> None:
    with start_emulator("vllm", time_scale=2) as emu:
        doc = base_config([("a", "vllm", emu.url)])
        doc["backends"][0]["max_inflight"] = 1
        with start_router(write_config(tmp_path, doc)) as router:
            client = client_for(router.url)
            with client.chat.completions.with_streaming_response.create(
                model=MODEL, messages=CHAT, max_tokens=4000, stream=True
            ):
                try:
                    client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
                except openai.RateLimitError as exc:
                    assert exc.response.headers["retry-after"] == "1"
                else:
                    raise AssertionError("expected 429")


def test_slo_goodput_is_counted_per_policy_and_class(tmp_path: Path) -> None:
    """Every policy is judged by the adaptive policy's SLOs: here the batch TTFT target of
    1 ms cannot be met (at time scale 2 one engine step alone takes over 5 ms), the
    interactive one of 30 s always is."""
    with start_emulator("vllm", time_scale=2) as emu:
        # One engine behind two names, so that adaptive has a pool of each kind.
        doc = base_config([("a", "vllm", emu.url), ("b", "deepinfer", emu.url)])
        doc["policies"]["adaptive"] = {
            "type": "adaptive",
            "params": {
                "low_ttft": ["vllm"],
                "high_throughput": ["deepinfer"],
                "slo": {"interactive": {"ttft_s": 30, "tpot_s": 5}, "batch": {"ttft_s": 0.001}},
            },
        }
        with start_router(write_config(tmp_path, doc)) as router:
            client = client_for(router.url)
            for cls in ("interactive", "interactive", "batch"):
                list(
                    client.chat.completions.create(
                        model=MODEL,
                        messages=CHAT,
                        max_tokens=8,
                        stream=True,
                        extra_headers={"X-Request-Class": cls},
                    )
                )
            client.chat.completions.create(
                model=MODEL,
                messages=CHAT,
                max_tokens=8,
                extra_headers={"X-Request-Class": "interactive", "X-Turnout-Policy": "adaptive"},
            )
            text = get(router.url + "/metrics").text
            met = r'turnout_slo_attained_total\{class="interactive",policy="%s"\}'
            missed = r'turnout_slo_missed_total\{class="batch",policy="class-split"\}'
            assert metric_in(text, met % "class-split") == 2
            assert metric_in(text, met % "adaptive") == 1
            assert metric_in(text, missed) == 1


def test_prompt_leaves_outstanding_at_the_first_byte(tmp_path: Path) -> None:
    with start_emulator("vllm", time_scale=2) as emu:
        doc = base_config([("a", "vllm", emu.url)])
        with start_router(write_config(tmp_path, doc)) as router:
            client = client_for(router.url)

            def counts() -> tuple[int, int, int]:
                (b,) = get(router.url + "/turnout/backends").json()
                return (
                    b["inflight"],
                    b["outstanding_prompt_tokens"],
                    b["outstanding_output_tokens"],
                )

            stream = client.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=4000, stream=True
            )
            try:
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        break  # content has reached the client: prefill is over
                assert counts() == (1, 0, 4000)
            finally:
                stream.close()
            assert wait_for(lambda: counts() == (0, 0, 0))
