"""The upstream body keeps the client's bytes unless a change is needed."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from router.proxy.body import splice_usage, upstream_body

RAW = b'{"model": "m", "messages": [{"role": "user", "content": "}"}], "stream": true}\n'


def test_untouched_when_nothing_changes() -> None:
    doc = orjson.loads(RAW)
    out = upstream_body(RAW, doc, model="m", priority=None, add_usage=False)
    assert out is RAW


def test_usage_is_spliced_without_reserialising() -> None:
    doc = orjson.loads(RAW)
    out = upstream_body(RAW, doc, model="m", priority=None, add_usage=True)
    assert out.startswith(RAW.rstrip()[:-1])
    assert orjson.loads(out) == {**doc, "stream_options": {"include_usage": True}}


def test_existing_stream_options_are_merged() -> None:
    raw = b'{"model":"m","prompt":"x","stream_options":{"continuous_usage_stats":false}}'
    out = upstream_body(raw, orjson.loads(raw), model="m", priority=None, add_usage=True)
    assert orjson.loads(out)["stream_options"] == {
        "continuous_usage_stats": False,
        "include_usage": True,
    }


def test_alias_and_priority_rewrite() -> None:
    doc = orjson.loads(RAW)
    out = orjson.loads(upstream_body(RAW, doc, model="real", priority=-5, add_usage=False))
    assert out["model"] == "real" and out["priority"] == -5
    assert doc["model"] == "m"  # the parsed request is not mutated


@given(
    st.dictionaries(
        st.text(max_size=5), st.integers(-(2**31), 2**31) | st.text(max_size=5), max_size=5
    )
)
def test_splice_keeps_any_object_valid(doc: dict[str, object]) -> None:
    doc.pop("stream_options", None)
    raw = orjson.dumps(doc)
    assert orjson.loads(splice_usage(raw)) == {**doc, "stream_options": {"include_usage": True}}
