"""The ``tail`` section: per request class, a first-token deadline and hedged requests.

```yaml
tail:
  interactive:
    first_token_timeout: 2.0      # seconds, or auto
    hedge: {after: 0.5, max_fraction: 0.05, max_prompt_tokens: 8192}   # after: seconds or pNN
```

Both act on streamed answers only, between the upstream's headers and its first content
token (router.proxy.tail). ``auto`` is ``auto_multiple`` times the class's measured P99 TTFT on
that backend, within [``auto_min``, ``auto_max``] (``auto_max`` until 20 answers were seen).
A hedge's ``after: pNN`` is that quantile of the same measurements (no hedge before 20).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from policies.types import REQUEST_CLASSES
from turnout.common.schema import Reader, kind

_QUANTILE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")


@dataclass(frozen=True, slots=True)
class HedgeSettings:
    """When a copy goes to the next-ranked backend, and how many may."""

    after: float | None = 0.5
    """Seconds without a first token before the copy goes (None: :attr:`after_quantile`)."""
    after_quantile: float | None = None
    """The percentile (0-100) of the backend's measured TTFT used instead of ``after``."""
    max_fraction: float = 0.05
    """Hedges per request of the class, over recent requests (a token bucket)."""
    max_prompt_tokens: int | None = None
    """Longer prompts are never hedged (their prefill is the cost a hedge doubles)."""


@dataclass(frozen=True, slots=True)
class TailSettings:
    """One request class's defences against stragglers."""

    first_token_timeout: float | None = None
    """Seconds from an attempt's send to its first content token (None: no deadline)."""
    auto: bool = False
    """The deadline follows the backend's measured P99 TTFT (``first_token_timeout: auto``)."""
    auto_multiple: float = 3.0
    auto_min: float = 0.5
    auto_max: float = 10.0
    last_attempt_grace: float = 3.0
    """The last attempt is never cut: past this multiple of the deadline its stream is let
    through to the client as it is, however late its first token."""
    hedge: HedgeSettings | None = None


def read_tail(m: Reader) -> dict[str, TailSettings]:
    out: dict[str, TailSettings] = {}
    for cls in REQUEST_CLASSES:
        if m.has(cls):
            out[cls] = _class(m.child(cls, required=True))
    m.done()
    return out


def _class(t: Reader) -> TailSettings:
    d = TailSettings()
    raw = t.raw_value("first_token_timeout")
    timeout: float | None = None
    auto = raw == "auto"
    if isinstance(raw, str) and not auto:
        t.error("first_token_timeout", f"expected seconds or auto, got {kind(raw)}")
    elif not auto:
        timeout = t.number("first_token_timeout", None, low=0.001)
    low = t.number("auto_min", d.auto_min, low=0.001)
    out = TailSettings(
        first_token_timeout=timeout,
        auto=auto,
        auto_multiple=t.number("auto_multiple", d.auto_multiple, low=1.0),
        auto_min=low,
        auto_max=t.number("auto_max", d.auto_max, low=low),
        last_attempt_grace=t.number("last_attempt_grace", d.last_attempt_grace, low=1.0),
        hedge=_hedge(t.child("hedge")) if t.has("hedge") else None,
    )
    t.done()
    return out


def _hedge(h: Reader) -> HedgeSettings:
    d = HedgeSettings()
    raw = h.raw_value("after")
    after, quantile = d.after, None
    if isinstance(raw, str):
        m = _QUANTILE.match(raw)
        if m is None or not 0 < float(m.group(1)) < 100:
            h.error("after", f"expected seconds or a percentile such as p95, got {kind(raw)}")
        else:
            after, quantile = None, float(m.group(1))
    else:
        after = h.number("after", d.after, low=0.0)
    out = HedgeSettings(
        after=after,
        after_quantile=quantile,
        max_fraction=h.number("max_fraction", d.max_fraction, low=0.0, high=1.0),
        max_prompt_tokens=h.integer("max_prompt_tokens", None, low=0),
    )
    h.done()
    return out
