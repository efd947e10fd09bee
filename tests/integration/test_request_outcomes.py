"""What a real router records for every way a request can end, in front of real emulators.

One router process, four emulated engines (one good, one answering 503 to everything, one
cutting every stream after two tokens, one in real time with room for one request), and a
scripted mix of requests through the official client and raw HTTP: served ones, the router's
own rejections (key, quota, overload, size, bad JSON, unknown model), the engines' errors,
a stream broken by its engine and one its client left. Then ``/metrics`` must count each
outcome by code and reason exactly as sent, while the latency histograms hold the served
requests and nothing else; and the router's stdout must hold one access line per request
that says the same, with neither a key nor the prompt in it.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from tests.procs import start_emulator
from tests.router.harness import base_config, get, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
KEY = "sk-outcomes-main-3f9a"
TINY = "sk-outcomes-tiny-77c1"
PROMPT = "tangerine walrus recites the quarterly numbers"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]
REQUEST_ID = "outcomes-req-1"
ACCESS_FIELDS = {"ts", "request_id", "tenant", "path", "model", "stream", "class", "policy",
                 "backend", "attempts", "status", "reason", "ttft_ms", "e2e_ms",
                 "prompt_tokens", "completion_tokens"}  # fmt: skip
MAX_BODY = 8192
OK, TOTAL = "ok", "turnout_requests_total"
HISTOGRAMS = (
    "turnout_time_to_first_token_seconds_count",
    "turnout_time_per_output_token_seconds_count",
    "turnout_e2e_request_latency_seconds_count",
)


@dataclass(frozen=True)
class Run:
    """What was sent, as (code, reason) counts, and the router's /metrics afterwards."""

    sent: Counter[tuple[str, str]]
    samples: dict[str, list[tuple[dict[str, str], float]]]
    stdout: list[str]
    """Every line the router wrote to stdout after its ready line."""

    @property
    def access(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.stdout if line.startswith("{")]


def client(
    url: str, key: str = KEY, policy: str = "good-only", timeout: float = 30
) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=url + "/v1",
        api_key=key,
        max_retries=0,
        timeout=timeout,
        default_headers={"X-Turnout-Policy": policy},
    )


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(get(url + "/metrics").text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def outcomes(samples: dict[str, list[tuple[dict[str, str], float]]]) -> Counter[tuple[str, str]]:
    """turnout_requests_total summed by (code, reason), series at 0 left out."""
    counts: Counter[tuple[str, str]] = Counter()
    for labels, value in samples.get(TOTAL, []):
        if value:
            counts[labels["code"], labels["reason"]] += int(value)
    return counts


def send_mix(url: str) -> Counter[tuple[str, str]]:
    """The scripted requests; returns what each should be counted as."""
    sent: Counter[tuple[str, str]] = Counter()
    auth = {"Authorization": f"Bearer {KEY}", "X-Turnout-Policy": "good-only"}
    with client(url) as c:
        for i in range(3):
            stream = c.chat.completions.create(
                model=MODEL,
                messages=CHAT,
                max_tokens=4,
                stream=True,
                extra_headers={"X-Request-Id": REQUEST_ID} if i == 0 else None,
            )
            assert "".join(k.choices[0].delta.content or "" for k in stream if k.choices)
            sent["200", OK] += 1
        for _ in range(2):
            out = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
            assert out.choices[0].message.content
            sent["200", OK] += 1
        # The engine refuses a temperature out of range: its 400 is passed on, never a TTFT.
        for stream_it in (False, True):
            with pytest.raises(openai.BadRequestError):
                c.chat.completions.create(
                    model=MODEL, messages=CHAT, max_tokens=4, temperature=5, stream=stream_it
                )  # fmt: skip
            sent["400", "upstream_rejected"] += 1
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=4)
        sent["404", "unknown_model"] += 1
    for key in ("sk-wrong", "sk-also-wrong"):
        with client(url, key=key) as c, pytest.raises(openai.AuthenticationError):
            c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
        sent["401", "auth"] += 1
    with client(url, key=TINY) as c:
        c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
        sent["200", OK] += 1
        with pytest.raises(openai.RateLimitError):
            c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
        sent["429", "quota"] += 1
    assert post(url + "/v1/chat/completions", b"{not json", auth).status == 400
    sent["400", "invalid"] += 1
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    assert post(url + "/v1/chat/completions", big, auth).status == 413
    sent["413", "too_large"] += 1
    with client(url, policy="broken-only") as c, pytest.raises(openai.InternalServerError):
        c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
    sent["503", "upstream_error"] += 1
    with client(url, policy="cut-only") as c, pytest.raises(openai.APIError):
        for _ in c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, stream=True):
            pass
    sent["200", "upstream_broken"] += 1
    # "slow" takes one request at a time: a second one while a stream holds it is refused;
    # then the stream's client leaves after its first token.
    with client(url, policy="slow-only") as c:
        stream = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=300, stream=True)
        next(iter(stream))
        with pytest.raises(openai.RateLimitError):
            c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
        sent["429", "overloaded"] += 1
        stream.close()
    sent["499", "client_closed"] += 1
    return sent


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    fast = 50
    with (
        start_emulator("vllm", time_scale=fast) as good,
        start_emulator("vllm", args=["--error-rate", "1", "--error-status", "503"]) as broken,
        start_emulator("vllm", time_scale=fast, args=["--drop-after", "2"]) as cut,
        start_emulator("vllm", time_scale=1) as slow,
    ):
        backends = [("good", "vllm", good.url), ("broken", "vllm", broken.url),
                    ("cut", "vllm", cut.url), ("slow", "vllm", slow.url)]  # fmt: skip
        doc = base_config(backends)
        doc["backends"][3]["max_inflight"] = 1
        doc["listen"]["max_body_bytes"] = MAX_BODY
        doc["health"]["failures_to_eject"] = 100  # the broken engine stays a candidate
        doc["require_api_key"] = True
        doc["api_keys"] = [
            {"name": "main", "sha256": hashlib.sha256(KEY.encode()).hexdigest()},
            {"name": "tiny", "sha256": hashlib.sha256(TINY.encode()).hexdigest(),
             "requests_per_minute": 1},
        ]  # fmt: skip
        stdout: list[str] = []
        path = write_config(tmp_path_factory.mktemp("outcomes"), doc)
        with start_router(path, lines=stdout) as router:
            sent = send_mix(router.url)
            deadline = time.monotonic() + 10
            run = Run(sent, scrape(router.url), stdout)
            # The stream's client has gone; the router records it once it notices.
            while time.monotonic() < deadline and (
                outcomes(run.samples)["499", "client_closed"] < 1
                or len(run.access) < sum(sent.values())
            ):
                time.sleep(0.05)
                run = Run(sent, scrape(router.url), stdout)
            yield run


def test_every_outcome_is_counted_by_code_and_reason(run: Run) -> None:
    assert outcomes(run.samples) == run.sent


def test_latency_histograms_hold_the_served_requests_only(run: Run) -> None:
    served = run.sent["200", OK]
    ttft, tpot, e2e = (sum(v for _, v in run.samples[name]) for name in HISTOGRAMS)
    assert ttft == served and e2e == served
    assert 0 < tpot <= served  # TPOT needs two tokens or more
    for name in HISTOGRAMS:
        backends = {labels["backend"] for labels, v in run.samples[name] if v}
        assert backends == {"good"}, f"{name}: {backends}"


def test_rejection_series_exist_before_their_first_request(run: Run) -> None:
    """Pre-initialised at 0 for every policy: e.g. no request of round-robin was refused."""
    zero = {
        (labels["class"], labels["code"], labels["reason"])
        for labels, value in run.samples[TOTAL]
        if labels["policy"] == "round-robin" and labels["backend"] == "none" and value == 0
    }
    assert {("unknown", "401", "auth"), ("interactive", "429", "overloaded"),
            ("batch", "503", "no_backend")} <= zero  # fmt: skip


def test_one_access_line_per_request_says_how_it_ended(run: Run) -> None:
    lines = run.access
    assert all(set(line) == ACCESS_FIELDS for line in lines)
    assert Counter((str(x["status"]), x["reason"]) for x in lines) == run.sent
    (first,) = [x for x in lines if x["request_id"] == REQUEST_ID]
    assert first["backend"] == "good" and first["policy"] == "good-only"
    assert first["class"] == "interactive" and first["stream"] is True
    assert first["model"] == MODEL and first["path"] == "/v1/chat/completions"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z", str(first["ts"]))
    for x in lines:
        if x["reason"] == OK:
            assert x["attempts"] == 1 and x["backend"] == "good"
            assert 0 < x["ttft_ms"] <= x["e2e_ms"]  # type: ignore[operator]
            assert x["prompt_tokens"] and x["completion_tokens"]
        elif x["backend"] is None:
            assert x["attempts"] == 0 and x["ttft_ms"] is None
    # An engine's error body is no first token.
    assert all(x["ttft_ms"] is None for x in lines if x["reason"] == "upstream_rejected")


def test_access_lines_name_tenants_by_hash_only(run: Run) -> None:
    lines = run.access
    tenants = {x["tenant"] for x in lines}
    assert None in tenants  # the wrong keys: no tenant
    hashes = tenants - {None}
    assert len(hashes) == 2 and all(re.fullmatch(r"[0-9a-f]{16}", str(t)) for t in hashes)
    text = "\n".join(run.stdout)
    for secret in (
        KEY,
        TINY,
        "sk-wrong",
        "sk-also-wrong",
        "tangerine",
        hashlib.sha256(KEY.encode()).hexdigest(),
    ):
        assert secret not in text
