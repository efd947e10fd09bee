from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.common.tokens import (
    MESSAGE_OVERHEAD,
    REPLY_OVERHEAD,
    count_chat,
    count_text,
    text_tokens,
)


def test_text_rule() -> None:
    assert text_tokens("Hello, world!") == ["Hello", ",", "world", "!"]
    assert count_text("Hello, world!") == 4
    assert count_text("") == 0
    assert count_text("  a  b\n c ") == 3


@settings(deadline=None)  # a wall-clock limit per example fails on a loaded machine
@given(st.text())
def test_the_count_is_the_number_of_tokens_found(text: str) -> None:
    assert count_text(text) == len(text_tokens(text))


def test_chat_rule() -> None:
    msgs: list[Mapping[str, object]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi there"}, {"type": "image_url"}]},
    ]
    assert count_chat(msgs) == REPLY_OVERHEAD + 2 * MESSAGE_OVERHEAD + 3 + 2
