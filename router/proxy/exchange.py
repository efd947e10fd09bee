"""One request as the router handled it: the record the handler fills in and finishes once.

The handler (router.proxy.handler) is the only writer of an :class:`Exchange`. Its
:meth:`Exchange.finish` is synchronous so that a cancelled handler (client disconnect) still
runs it completely from its ``finally``: metrics, the policy's ``on_finish`` feedback, SLO
goodput and capture. The capture line is derived from the same record
(:meth:`Exchange.capture_record`), later, by the capture writer's task.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from policies.base import Policy
from policies.types import Outcome, RequestInfo
from router.control.admission import QueueRejected
from router.control.auth import STORE_DOWN_CODE
from router.observe.outcomes import ANSWERED, FAILURES, REJECTED, Reason, answer_reason
from router.observe.tracing import NO_TRACE, Ending, RequestTrace
from router.proxy.drain import CODE as DRAIN_CODE
from router.proxy.pd import Hops
from router.proxy.relay import CLIENT_CLOSED
from router.proxy.state import RouterState, Snapshot
from router.proxy.upstream import UpstreamFault
from router.server.errors import RouterError
from turnout.common.capture import CaptureRecord, Observed, Response, Route, iso_utc
from turnout.common.figures import StreamFigures
from turnout.common.sse import StreamMeter

log = logging.getLogger("router")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


_MAX_MODEL = 200  # characters of a (client-given) model name in an access line


def rejection_reason(exc: RouterError) -> Reason:
    """Why the router answered ``exc``."""
    if isinstance(exc, UpstreamFault):
        return exc.reason
    if exc.code == DRAIN_CODE:
        return "shutting_down"
    if isinstance(exc, QueueRejected):
        return "overloaded"
    if exc.code == STORE_DOWN_CODE:  # limits that could not be checked (on_error: deny)
        return "quota"
    return REJECTED.get(exc.status, "internal")


@dataclass(slots=True)
class Exchange:
    """What the router learns about one request as it goes, and what it makes of it."""

    request_id: str
    path: str
    headers: Mapping[str, str]
    arrival: float
    """``time.monotonic()`` when the request arrived."""
    arrival_wall: float
    policy: Policy
    """The policy object that chose (a reload may replace the one of that name meanwhile)."""
    body: bytes = b""
    info: RequestInfo | None = None
    """What the body says, once it parsed (the capture parses it again, off the loop)."""
    tenant: str | None = None
    """The client key's capture id (a keyed hash), when the key is a configured one."""
    backend: str | None = None
    sent: bool = False
    """The request went out to an engine (its first attempt began)."""
    failovers: int = 0
    status: int = 500
    meter: StreamMeter | None = None
    end: float | None = None
    error: Mapping[str, object] | None = None
    protocol_error: str | None = None
    """What the router found wrong with the backend's answer itself, as a kind of
    ``turnout_upstream_protocol_errors_total`` (the meter counts what it finds)."""
    reason: Reason | None = None
    """Why the request was not served, when the handler knows (else :meth:`final_reason` works it
    out from the status and the error)."""
    trace: RequestTrace = NO_TRACE
    hops: Hops | None = None
    """A ``pd`` policy's two hops (router.proxy.pd); ``backend`` is then the decode one."""
    _figures: StreamFigures | None = field(default=None, repr=False)

    @property
    def attempts(self) -> int:
        """How many backends were tried (0: none)."""
        return 0 if self.backend is None else self.failovers + 1

    @property
    def request_class(self) -> str:
        """The class label (``unknown`` before classification)."""
        return self.info.request_class if self.info is not None else "unknown"

    def refused(self, exc: RouterError) -> None:
        """The client gets ``exc`` instead of an answer."""
        self.status = exc.status
        self.error = {"message": exc.message, "code": exc.code}
        self.reason = rejection_reason(exc)

    def final_reason(self) -> Reason:
        """The request's reason for ``turnout_requests_total``: ``ok`` only for a backend's
        2xx answer served whole."""
        if self.reason is not None:
            return self.reason
        if self.status == CLIENT_CLOSED:
            return "client_closed"
        if self.backend is None:
            return "internal"
        if 200 <= self.status < 300 and self.error is None:
            return "ok"
        return answer_reason(self.status)  # the engine's own error answer, passed on

    def settlement(self, charged: int, answered: int | None) -> int:
        """The tokens the request is finally charged: it was charged ``charged`` up front
        (its budget, as bounded there), and an engine's answer began with status
        ``answered`` (None: none did).

        Nothing when an engine's answer was an error (it generated nothing); else the
        engine's usage when it reported one. A client who left after the request was sent
        is charged what the engine was asked to generate (``charged``), unless it left a
        stream the engine had begun: closing that stream stops the engine, and it is charged
        what was relayed. A refused or failed request (no engine answered) is charged
        nothing. Otherwise, with no usage figure, what the router saw relayed: the prompt as
        it counted it plus a token per streamed event (or the tokens it counts in a body's
        text, or one per 4 bytes of a body it cannot read), at least one and never more
        than ``charged``, so a missing figure neither frees the answer nor bills the budget.
        """
        meter, info = self.meter, self.info
        if info is None or (answered is not None and not 200 <= answered < 300):
            return 0
        if meter is not None and meter.completion_tokens is not None:
            return (meter.prompt_tokens or info.prompt_tokens) + meter.completion_tokens
        left = self.sent and self.status == CLIENT_CLOSED
        if answered is None or meter is None:
            return charged if left else 0
        if left and not info.stream:
            return charged
        if info.stream:
            output = meter.data_events
        elif meter.body_tokens is not None:
            output = meter.body_tokens
        else:
            output = -(-meter.body_bytes // 4)
        return min(charged, info.prompt_tokens + max(1, output))

    def finish(self, state: RouterState, snap: Snapshot) -> None:
        """Metrics, policy feedback, goodput and capture for the finished request, under the
        settings it began with (``snap``)."""
        end = self.end = self.end if self.end is not None else time.monotonic()
        fig = self._figures = self.meter.figures(end) if self.meter is not None else None
        e2e = end - self.arrival
        ttft = fig.ttft if fig is not None else None
        tpot = fig.tpot if fig is not None else None
        prompt = fig.prompt_tokens if fig is not None else None
        output = fig.completion_tokens if fig is not None else None
        if self.error is None and fig is not None:
            self.error = fig.error
        policy = self.policy
        backend = self.backend or "none"
        cls = self.request_class
        reason = self.reason = self.final_reason()
        served = reason == "ok"  # the latency histograms are the service's, nothing else's
        state.metrics.request_done(
            policy.name,
            backend,
            cls,
            self.status,
            reason,
            ttft=ttft if served else None,
            tpot=tpot if served else None,
            e2e=e2e if served else None,
            prompt_tokens=prompt,
            output_tokens=output,
        )
        for watch in state.on_finish:
            watch(cls, backend, ttft, reason)
        if self.hops is not None:
            self._hops_done(state, served, ttft)
        # A TTFT is the first token of an answer, not of an engine's error body.
        first = ttft if reason in ANSWERED else None
        if state.access_log.wanted(snap.config.access_log):
            state.access_log.write(self._access_line(cls, reason, first, e2e, prompt, output))
        if self.trace.recording:
            self.trace.finish(
                Ending(
                    end,
                    self.status,
                    reason,
                    reason in FAILURES,
                    policy.name,
                    cls,
                    self.backend,
                    self.attempts,
                    self.tenant,
                    first,
                    prompt,
                    output,
                    fig.finish_reason if fig is not None else None,
                )
            )
        if self.meter is not None:
            for kind, count in self.meter.protocol_errors.items():
                state.metrics.protocol_errors(backend, kind, count)
        if self.protocol_error is not None:
            state.metrics.protocol_errors(backend, self.protocol_error)
        info = self.info
        if info is None:
            return
        ok = 200 <= self.status < 300 and self.error is None
        outcome = Outcome(self.status, ok, prompt or 0, output or 0, ttft, e2e, tpot)
        # Also when no backend served: a policy may hold state for the request it chose for.
        try:
            if state.placement is not None:  # what it teaches the router's other processes
                state.placement.finished(policy, info, backend, outcome)
            policy.on_finish(info, backend, outcome)
        except Exception:  # feedback must not break the request's other bookkeeping
            log.exception("policy %s failed in on_finish", policy.name)
        targets = snap.slo.get(policy.name)
        if targets is not None:
            met = targets[info.request_class].met(outcome)
            state.metrics.slo(policy.name, info.request_class, met)
        if state.capture is not None:
            state.capture.record(self)

    def _hops_done(self, state: RouterState, served: bool, ttft: float | None) -> None:
        hops = self.hops
        assert hops is not None
        first = None
        if served and ttft is not None and hops.decode_sent is not None:
            first = self.arrival + ttft - hops.decode_sent
        phases = (hops.prefill_s, hops.handoff_s, first) if served else (None, None, None)
        state.metrics.hops.done(
            self.policy.name, hops.path, hops.prefill_backend, hops.prefills, phases
        )

    def _access_line(
        self,
        cls: str,
        reason: str,
        ttft: float | None,
        e2e: float,
        prompt: int | None,
        output: int | None,
    ) -> dict[str, object]:
        """The access log's line: who, how it was routed, how it ended, how long it took.
        Never the body nor a key (the tenant is the keyed hash the capture uses)."""
        info = self.info
        return {
            "ts": dt.datetime.fromtimestamp(self.arrival_wall, dt.UTC),  # orjson writes it
            "request_id": self.request_id,
            "tenant": self.tenant,
            "path": self.path,
            "model": info.model[:_MAX_MODEL] if info is not None else None,
            "stream": info.stream if info is not None else None,
            "class": cls,
            "policy": self.policy.name,
            "backend": self.backend,
            **({"prefill_backend": self.hops.prefill_backend} if self.hops is not None else {}),
            "attempts": self.attempts,
            "status": self.status,
            "reason": reason,
            "ttft_ms": _ms(ttft),
            "e2e_ms": _ms(e2e),
            "prompt_tokens": prompt,
            "completion_tokens": output,
        }

    @property
    def capture_bytes(self) -> int:
        """The body and headers as received, in bytes: what the capture's queue counts."""
        headers = self.headers
        return len(self.body) + sum(map(len, headers.keys())) + sum(map(len, headers.values()))

    def capture_record(self, t0: float) -> CaptureRecord:
        """The request as a capture line's record, before redaction (offsets from ``t0``).
        Called in the capture writer's thread: the body is parsed there, not kept parsed
        while the request waits in the queue (its raw bytes are what the queue counts)."""
        fig, info = self._figures, self.info
        return CaptureRecord(
            custom_id=self.request_id,
            url=self.path,
            body=orjson.loads(self.body) if info is not None else {},
            t_offset_ms=(self.arrival - t0) * 1000.0,
            ts=iso_utc(self.arrival_wall),
            headers=self.headers,
            route=Route(
                self.policy.name,
                self.request_class,
                self.backend,
                self.failovers,
                self.tenant,
                self.hops.prefill_backend if self.hops is not None else None,
            ),
            resp=Response(
                status=self.status,
                stream=info.stream if info is not None else False,
                finish_reason=fig.finish_reason if fig is not None else None,
                prompt_tokens=fig.prompt_tokens if fig is not None else None,
                completion_tokens=fig.completion_tokens if fig is not None else None,
                error=self.error,
            ),
            obs=Observed(
                ttft_ms=_ms(fig.ttft if fig is not None else None),
                tpot_ms=_ms(fig.tpot if fig is not None else None),
                e2e_ms=_ms(None if self.end is None else self.end - self.arrival),
            ),
        )
