"""The upstream body: the client's bytes, changed only where the router must change them.

The original bytes go upstream untouched unless the model is an alias (rename), the policy
set a ``priority``, or the router asks the engine for the stream's usage chunk. Asking for
usage is spliced into the bytes when the body has no ``stream_options`` yet; anything else
re-serialises the parsed document once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from policies.types import Endpoint

OFFLOAD_BYTES = 256 * 1024
"""A body (request or answer) over this many bytes is parsed in a worker thread: parsing and
counting megabytes takes a quarter second of CPU, which on the event loop would stall every
other stream of the worker."""

_USAGE_OPTION = b'"stream_options":{"include_usage":true}'


def asks_usage(endpoint: Endpoint) -> bool:
    """Whether a stream of ``endpoint`` reports usage only when asked (``stream_options``);
    the Responses API's last event always carries it, and embeddings do not stream."""
    return endpoint in ("chat", "completions")


def upstream_body(
    raw: bytes,
    doc: Mapping[str, Any],
    *,
    model: str,
    priority: int | None,
    add_usage: bool,
) -> bytes:
    """The bytes to send; ``raw`` itself when nothing changes."""
    rename = model != doc["model"]
    if not rename and priority is None:
        if not add_usage:
            return raw
        if "stream_options" not in doc:
            return splice_usage(raw)
    out = dict(doc)
    out["model"] = model
    if priority is not None:
        out["priority"] = priority
    if add_usage:
        out["stream_options"] = {**(doc.get("stream_options") or {}), "include_usage": True}
    return orjson.dumps(out)


def splice_usage(raw: bytes) -> bytes:
    """Insert ``"stream_options":{"include_usage":true}`` before the object's closing brace."""
    return splice_field(raw, _USAGE_OPTION)


def splice_field(raw: bytes, member: bytes) -> bytes:
    """Insert ``member`` (``"key":value``, encoded) before the object's closing brace; the
    caller knows ``raw`` has no such key."""
    end = raw.rfind(b"}")
    head = raw[:end].rstrip()
    sep = b"" if head.endswith(b"{") else b","
    return head + sep + member + raw[end:]
