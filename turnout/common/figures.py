"""The arithmetic of a finished request's figures, defined once for everything that measures:
the router's meter (turnout.common.sse) and its record (router.proxy.exchange), the
replayer's results and report (replay.client, replay.timeline), the simulator
(replay.simulate.loop) and the policies' SLO targets (policies.types.Slo).

Times are seconds from the request's start. TTFT is the first content's arrival (for an
answer that is not streamed, its whole response time: its first byte is its last); TPOT is
the mean time per output token after the first, per choice, since ``n`` choices decode side
by side; a request meets its SLO when it succeeded within the TTFT target and, where it has a
TPOT, within the TPOT target.
"""

from __future__ import annotations

from dataclasses import dataclass


def first_token(stream: bool, first: float | None, e2e: float | None) -> float | None:
    """The TTFT of an answer whose first content came at ``first`` and which ended at
    ``e2e``: ``first`` for a stream, the whole response time otherwise."""
    return first if stream else e2e


def per_token(
    ttft: float | None, e2e: float | None, tokens: float, choices: int = 1
) -> float | None:
    """``(e2e - ttft) / (tokens a choice - 1)``; None without both times or with fewer than
    two tokens a choice."""
    n = tokens / choices
    if ttft is None or e2e is None or n < 2:
        return None
    return (e2e - ttft) / (n - 1)


def meets(
    ok: bool,
    ttft: float | None,
    tpot: float | None,
    ttft_target: float,
    tpot_target: float,
) -> bool:
    """Goodput's test: a failed request, or one over either target, misses (a request
    without a TPOT is judged on its TTFT alone)."""
    if not ok or ttft is None or ttft > ttft_target:
        return False
    return tpot is None or tpot <= tpot_target


@dataclass(slots=True)
class StreamFigures:
    """What a finished stream measured. Times are seconds relative to the request's start."""

    ttft: float | None
    e2e: float | None
    content_events: int
    itl_sum: float
    itls: list[float] | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    finish_reason: str | None
    error: dict[str, object] | None
    done: bool
    choices: int = 1
    """Choices generated in parallel (a request's ``n``): the token counts cover them all."""

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first, per choice (None with fewer than two
        tokens a choice): ``n`` choices decode side by side, so the tokens are divided among
        them."""
        tokens = self.completion_tokens or self.content_events
        return per_token(self.ttft, self.e2e, tokens, self.choices)
