"""Synthesized prompts hit the requested length and share the prefixes hash_ids say."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from replay.sources import BLOCK_TOKENS, Synth
from replay.synth import Calibration, PromptSynth, calibrate, salted
from turnout.common.tokens import count_chat


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=7, max_value=5000))
def test_exact_length_under_the_rule(n: int) -> None:
    msgs = PromptSynth().messages(Synth(n), seed="req-1")
    assert count_chat(msgs) == n


def test_shared_hash_ids_share_a_prefix() -> None:
    s = PromptSynth()
    a = s.messages(Synth(3 * BLOCK_TOKENS, (1, 2, 3)), "a")[0]["content"]
    b = s.messages(Synth(3 * BLOCK_TOKENS, (1, 2, 9)), "b")[0]["content"]
    c = s.messages(Synth(3 * BLOCK_TOKENS, (7, 2, 3)), "c")[0]["content"]
    common = len(" ".join(a.split()[: 2 * BLOCK_TOKENS]))
    assert a[:common] == b[:common] and a != b
    assert a[:50] != c[:50]


def test_a_responses_line_gets_its_prompt_as_input_messages() -> None:
    s = PromptSynth()
    body = s.body({"model": "m", "max_output_tokens": 5}, Synth(40), "r", "/v1/responses")
    assert set(body) == {"model", "max_output_tokens", "input"}
    assert count_chat(body["input"]) == 40
    assert "messages" in s.body({"model": "m"}, Synth(40), "r")  # chat, by default


def test_unshared_prompts_differ_from_the_first_word() -> None:
    s = PromptSynth()
    a = s.messages(Synth(300), "x")[0]["content"]
    b = s.messages(Synth(300), "y")[0]["content"]
    assert a.split()[:8] != b.split()[:8]


async def test_calibration_fits_another_tokenizer() -> None:
    # a target whose tokenizer counts 2 tokens per word and 10 tokens of template
    async def count(messages: list[dict[str, Any]]) -> int:
        return 10 + 2 * len(str(messages[0]["content"]).split())

    cal = await calibrate(count)
    assert cal == Calibration(overhead=10.0, per_word=2.0)
    msgs = PromptSynth(cal).messages(Synth(1000), "z")
    assert await count(msgs) == 1000


def test_a_salt_changes_the_text_but_not_the_sharing() -> None:
    a0, b0 = (
        PromptSynth().messages(Synth(2 * BLOCK_TOKENS, ids), s)[0]["content"]
        for ids, s in (((1, 2), "a"), ((1, 3), "b"))
    )
    a1, b1 = (
        PromptSynth(salt=1).messages(Synth(2 * BLOCK_TOKENS, ids), s)[0]["content"]
        for ids, s in (((1, 2), "a"), ((1, 3), "b"))
    )
    first = BLOCK_TOKENS
    assert a0.split()[:first] == b0.split()[:first] and a1.split()[:first] == b1.split()[:first]
    assert a0.split()[:first] != a1.split()[:first]
    assert count_chat([{"role": "user", "content": a1}]) == 2 * BLOCK_TOKENS


def test_a_recorded_prompt_is_marked_at_its_first_text() -> None:
    chat: dict[str, Any] = {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": "hi"},
        ]
    }
    got = salted(chat, 2)
    assert got is not None
    assert got["messages"][0]["content"][0]["text"] == "(run 2) be brief"
    assert got["messages"][1] == {"role": "user", "content": "hi"}
    assert chat["messages"][0]["content"][0]["text"] == "be brief"  # the recorded body is kept
    assert salted({"prompt": "abc"}, 1) == {"prompt": "(run 1) abc"}
    assert salted({"input": "q"}, 0) == {"input": "(run 0) q"}
    assert salted({"prompt": [1, 2, 3]}, 1) is None  # token ids: nothing to mark
