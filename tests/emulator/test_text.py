"""Output text counts back to the number of tokens drawn, under the shared rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from emulator.text import embedding, output_pieces, request_rng
from turnout.common.tokens import count_text


@given(seed=st.integers(0, 2**32), n=st.integers(0, 400), cut=st.integers(0, 400))
def test_pieces_count_back_exactly_however_chunked(seed: int, n: int, cut: int) -> None:
    pieces = output_pieces(request_rng(seed, b"body"), n)
    assert len(pieces) == n
    assert count_text("".join(pieces)) == n
    k = min(cut, n)  # a stream splits the text into chunks at token boundaries
    assert count_text("".join(pieces[:k])) + count_text("".join(pieces[k:])) == n


def test_same_seed_and_body_same_text_and_vectors() -> None:
    a = output_pieces(request_rng(1, b"x"), 50)
    assert a == output_pieces(request_rng(1, b"x"), 50)
    assert a != output_pieces(request_rng(2, b"x"), 50)
    assert a != output_pieces(request_rng(1, b"y"), 50)
    assert embedding(0, b"t", 8) == embedding(0, b"t", 8) != embedding(0, b"u", 8)
