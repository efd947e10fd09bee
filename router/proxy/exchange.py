"""Per-request bookkeeping: what the handler learns as it goes, and what happens at the end.

:func:`bookkeeping` is synchronous so that a cancelled handler (client disconnect) still runs
it completely from its ``finally``: metrics, the policy's ``on_finish`` feedback, capture.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from aiohttp import web

from common.sse import StreamMeter
from policies.types import Outcome, RequestInfo
from router.observe.capture import CaptureEntry
from router.proxy.state import RouterState

log = logging.getLogger("router")


@dataclass(slots=True)
class Record:
    """What the bookkeeping needs, filled in as the request progresses."""

    request_id: str
    arrival: float
    arrival_wall: float
    policy: str
    body: bytes = b""
    info: RequestInfo | None = None
    backend: str | None = None
    failovers: int = 0
    status: int = 500
    meter: StreamMeter | None = None
    end: float | None = None
    error: dict[str, object] | None = None
    prefilled: bool = False
    """The first content byte arrived (the backend's prompt is no longer waiting)."""
    tenant: str | None = None
    """The client key's capture id (a keyed hash), when the key is a configured one."""

    @property
    def request_class(self) -> str:
        """The class label (``unknown`` before classification)."""
        return self.info.request_class if self.info is not None else "unknown"


def bookkeeping(request: web.Request, state: RouterState, rec: Record) -> None:
    """Metrics, policy feedback and capture for a finished request (synchronous)."""
    end = rec.end if rec.end is not None else time.monotonic()
    fig = rec.meter.figures(end) if rec.meter is not None else None
    e2e = end - rec.arrival
    ttft = fig.ttft if fig is not None else None
    tpot = fig.tpot if fig is not None else None
    prompt = fig.prompt_tokens if fig is not None else None
    output = fig.completion_tokens if fig is not None else None
    backend = rec.backend or "none"
    state.metrics.request_done(
        rec.policy,
        backend,
        rec.request_class,
        rec.status,
        ttft=ttft,
        tpot=tpot,
        e2e=e2e,
        prompt_tokens=prompt,
        output_tokens=output,
    )
    info = rec.info
    if info is None:
        return
    ok = 200 <= rec.status < 300 and rec.error is None
    outcome = Outcome(rec.status, ok, prompt or 0, output or 0, ttft, e2e, tpot)
    # Also when no backend served: a policy may hold state for the request it chose for.
    try:
        state.policies[rec.policy].on_finish(info, backend, outcome)
    except Exception:  # feedback must not break the request's other bookkeeping
        log.exception("policy %s failed in on_finish", rec.policy)
    targets = state.slo.get(rec.policy)
    if targets is not None:
        state.metrics.slo(rec.policy, info.request_class, targets[info.request_class].met(outcome))
    if state.capture is not None:
        error = rec.error if rec.error is not None else (fig.error if fig is not None else None)
        state.capture.record(
            CaptureEntry(
                request_id=rec.request_id,
                url=request.path,
                body=rec.body,
                headers=request.headers,
                arrival=rec.arrival,
                arrival_wall=rec.arrival_wall,
                policy=rec.policy,
                request_class=info.request_class,
                backend=rec.backend,
                failovers=rec.failovers,
                status=rec.status,
                stream=info.stream,
                finish_reason=fig.finish_reason if fig is not None else None,
                prompt_tokens=prompt,
                completion_tokens=output,
                error=error,
                ttft_s=ttft,
                tpot_s=tpot,
                e2e_s=e2e,
                tenant=rec.tenant,
            )
        )
