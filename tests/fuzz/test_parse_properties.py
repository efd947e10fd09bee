"""Property tests: no body, however malformed, gets past parsing as anything but a 400.

Parsing and classification either give a well-formed request or raise the router's 400;
never another exception (which would surface as a 500). The upstream body the router builds
from an accepted request is valid JSON that says what the client said.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.types import REQUEST_CLASSES, Endpoint
from router.config.model import ClassificationSettings, Rule
from router.control.classify import classify
from router.proxy.body import upstream_body
from router.server.errors import RouterError

ENDPOINTS: tuple[Endpoint, ...] = ("chat", "completions", "embeddings")
RULES = ClassificationSettings(
    rules=(
        Rule("batch", max_tokens_at_least=1000),
        Rule("batch", stream=False, prompt_tokens_at_least=50),
    )
)
KEYS = ["model", "messages", "prompt", "input", "stream", "max_tokens",
        "max_completion_tokens", "stream_options", "service_tier", "content", "role"]  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)  # JSON has no infinity (orjson: null)
    | st.text(max_size=30)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=20,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"])},
        optional={"content": st.text(max_size=40) | json_values},
    ),
    max_size=4,
)
requests = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["m", ""]) | json_values,
        "messages": messages | json_values,
        "prompt": st.text(max_size=40) | st.lists(st.integers(0, 1000), max_size=5) | json_values,
        "input": st.text(max_size=40) | json_values,
        "stream": st.booleans() | json_values,
        "max_tokens": st.integers(-5, 5000) | json_values,
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()})
        | json_values,
        "service_tier": st.sampled_from(["flex", "auto"]) | json_values,
    },
)


def _parse(raw: bytes, endpoint: Endpoint) -> Any:
    return classify(
        raw,
        endpoint,
        request_id="r",
        header_class=None,
        key_class=None,
        session_key=None,
        settings=RULES,
    )


@settings(max_examples=300)
@given(raw=st.binary(max_size=200), endpoint=st.sampled_from(ENDPOINTS))
def test_any_bytes_parse_or_400(raw: bytes, endpoint: Endpoint) -> None:
    try:
        _parse(raw, endpoint)
    except RouterError as exc:
        assert exc.status == 400


@settings(max_examples=400)
@given(doc=requests, endpoint=st.sampled_from(ENDPOINTS), priority=st.none() | st.integers(0, 9))
def test_any_document_parses_or_400(
    doc: dict[str, Any], endpoint: Endpoint, priority: int | None
) -> None:
    try:
        raw = orjson.dumps(doc)
    except TypeError:  # integers past 64 bits: not something a client can send as JSON here
        return
    try:
        parsed = _parse(raw, endpoint)
    except RouterError as exc:
        assert exc.status == 400
        return
    info = parsed.info
    assert info.request_class in REQUEST_CLASSES
    assert info.prompt_tokens >= 0 and info.expected_output_tokens >= 0
    add_usage = info.stream and not parsed.include_usage
    out = orjson.loads(
        upstream_body(raw, parsed.doc, model="up", priority=priority, add_usage=add_usage)
    )
    assert out["model"] == "up"
    assert {k: v for k, v in out.items() if k not in ("model", "priority", "stream_options")} == {
        k: v for k, v in doc.items() if k not in ("model", "stream_options")
    }
    if add_usage:
        assert out["stream_options"]["include_usage"] is True
