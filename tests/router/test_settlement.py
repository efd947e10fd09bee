"""What a finished request is finally charged (router.proxy.exchange.Exchange.settlement):
the engine's usage when it reported one; a client who left after the request was sent, what
the engine was asked to generate, or for a stream it had begun, what was relayed; nothing
when no engine answered with success. (Over real processes:
tests/integration/test_quota_side_doors.py.)"""

from __future__ import annotations

import orjson
import pytest

from policies.registry import BackendInfo, build_policy
from policies.types import RequestInfo
from router.proxy.exchange import Exchange
from router.proxy.relay import CLIENT_CLOSED
from turnout.common.sse import StreamMeter

CHARGED = 110
"""Its prompt of 10 plus its max_tokens of 100, as charged up front."""


def exchange(*, stream: bool, sent: bool = True, status: int = 200) -> Exchange:
    policy = build_policy("rr", "round-robin", {}, [BackendInfo("b", "vllm", False)])
    ex = Exchange("r", "/v1/chat/completions", {}, 0.0, 0.0, policy)
    ex.info = RequestInfo(
        "r", "chat", "m", "interactive", stream=stream, prompt_tokens=10, max_tokens=100
    )
    ex.sent, ex.status = sent, status
    ex.meter = StreamMeter(0.0)
    return ex


def events(ex: Exchange, count: int, usage: int | None = None) -> None:
    """``count`` streamed content events (and a usage chunk of ``usage`` output tokens)."""
    assert ex.meter is not None
    chunk = {"choices": [{"index": 0, "delta": {"content": "x"}}]}
    data = b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for _ in range(count))
    if usage is not None:
        figures = {"prompt_tokens": 12, "completion_tokens": usage, "total_tokens": 12 + usage}
        data += b"data: " + orjson.dumps({"choices": [], "usage": figures}) + b"\n\n"
    ex.meter.feed(data, 0.1)


@pytest.mark.parametrize("status", [200, CLIENT_CLOSED])
def test_the_engines_usage_settles_it(status: int) -> None:
    ex = exchange(stream=True, status=status)
    events(ex, 3, usage=40)
    assert ex.settlement(CHARGED, 200) == 12 + 40


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_before_the_answer_pays_the_budget(stream: bool) -> None:
    ex = exchange(stream=stream, status=CLIENT_CLOSED)
    assert ex.settlement(CHARGED, None) == CHARGED


def test_one_that_leaves_a_non_streamed_answer_being_read_pays_the_budget() -> None:
    ex = exchange(stream=False, status=CLIENT_CLOSED)
    assert ex.settlement(CHARGED, 200) == CHARGED


def test_one_that_leaves_a_stream_pays_what_was_relayed() -> None:
    """Closing the stream stops the engine: the prompt and a token an event relayed."""
    ex = exchange(stream=True, status=CLIENT_CLOSED)
    events(ex, 3)
    assert ex.settlement(CHARGED, 200) == 10 + 3


def test_one_that_leaves_before_the_request_is_sent_pays_nothing() -> None:
    """Still in the admission queue: no engine was asked for anything."""
    ex = exchange(stream=False, sent=False, status=CLIENT_CLOSED)
    assert ex.settlement(CHARGED, None) == 0


@pytest.mark.parametrize("status", [502, CLIENT_CLOSED])
def test_an_engines_error_answer_generated_nothing(status: int) -> None:
    ex = exchange(stream=False, status=status)
    assert ex.settlement(CHARGED, 400) == 0


def test_a_request_no_engine_answered_pays_nothing() -> None:
    assert exchange(stream=False, status=504).settlement(CHARGED, None) == 0


def test_an_answer_without_usage_pays_what_was_relayed() -> None:
    ex = exchange(stream=True)
    events(ex, 5)
    assert ex.settlement(CHARGED, 200) == 10 + 5
    whole = exchange(stream=False)
    assert whole.meter is not None
    whole.meter.feed_body(b'{"choices":[{"message":{"content":"a b c"}}]}', 0.1)
    assert 10 < whole.settlement(CHARGED, 200) < CHARGED
