"""Request tracing: what the request path tells a trace, and the no-op it tells by default.

The request path calls a :class:`RequestTrace` at each step (classified, picked, each upstream
attempt, finished). Without tracing that is :data:`NO_TRACE`, whose methods do nothing, and
OpenTelemetry is never imported. Tracing starts when the optional extra is installed
(``pip install turnout[otel]``) and OpenTelemetry's own environment asks for an exporter
(``OTEL_TRACES_EXPORTER``, or an ``OTEL_EXPORTER_OTLP_*ENDPOINT``); ``OTEL_SDK_DISABLED=true``
turns it off. The OpenTelemetry side lives in router.observe.otel.

Times are the router's ``time.monotonic()`` readings; a trace converts them to wall-clock
span times against the request's arrival, so that steps need no clock of their own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from policies.types import RequestInfo

log = logging.getLogger("router")

# The environment variables that ask OpenTelemetry for an exporter.
_EXPORTER_VARS = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)


@dataclass(frozen=True, slots=True)
class Ending:
    """How a traced request ended (what its root span and last attempt are told)."""

    end: float
    status: int
    reason: str
    failed: bool
    """The service failed the request (an error span), as opposed to the client's error."""
    policy: str
    request_class: str
    backend: str | None
    attempts: int
    tenant: str | None
    ttft: float | None
    input_tokens: int | None
    output_tokens: int | None
    finish_reason: str | None


class RequestTrace(Protocol):
    """One request's trace; every method is called from the request's own task."""

    @property
    def recording(self) -> bool:
        """False for the no-op (callers skip building what it would ignore)."""
        ...

    def classified(self, info: RequestInfo, start: float, end: float) -> None:
        """The body was parsed and classified between ``start`` and ``end``."""
        ...

    def picked(self, policy: str, ranked: Sequence[str], start: float, end: float) -> None:
        """``policy`` ranked the backends (admission's wait included)."""
        ...

    def attempt(self, backend: str, url: str, headers: MutableMapping[str, str]) -> None:
        """An upstream attempt starts: its span's context goes into ``headers`` (W3C
        ``traceparent``, replacing the client's)."""
        ...

    def attempt_failed(self, status: int | None, message: str, timeout: bool) -> None:
        """The current attempt failed before an answer was taken (``status`` if it answered)."""
        ...

    def finish(self, ending: Ending) -> None:
        """The request is over: end the last attempt and the request's span."""
        ...


class Tracing(Protocol):
    """Makes one :class:`RequestTrace` per request; one per router process."""

    def begin(
        self, headers: Mapping[str, str], method: str, path: str, request_id: str, now: float
    ) -> RequestTrace:
        """A trace for a request that arrived at ``now``, continuing the client's
        ``traceparent`` if it sent one."""
        ...

    def close(self) -> None:
        """Export what is pending (the app's cleanup)."""
        ...


class _NoTrace:
    __slots__ = ()
    recording = False

    def classified(self, info: RequestInfo, start: float, end: float) -> None:
        pass

    def picked(self, policy: str, ranked: Sequence[str], start: float, end: float) -> None:
        pass

    def attempt(self, backend: str, url: str, headers: MutableMapping[str, str]) -> None:
        pass

    def attempt_failed(self, status: int | None, message: str, timeout: bool) -> None:
        pass

    def finish(self, ending: Ending) -> None:
        pass


NO_TRACE: RequestTrace = _NoTrace()


class NoTracing:
    """Tracing off: every request gets :data:`NO_TRACE`."""

    def begin(
        self, headers: Mapping[str, str], method: str, path: str, request_id: str, now: float
    ) -> RequestTrace:
        return NO_TRACE

    def close(self) -> None:
        pass


def tracing_from_env(service: str = "turnout", *, warn: bool = True) -> Tracing:
    """OpenTelemetry tracing if the environment asks for an exporter and the extra is
    installed; else :class:`NoTracing` (and nothing of OpenTelemetry is imported).

    When the environment asks but the extra (or the exporter it names) is missing, tracing
    is off and, with ``warn``, one warning says so and names the install that fixes it (the
    workers of ``--workers N`` but the first pass ``warn=False``: one line per router).
    """
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return NoTracing()
    asked = [v for v in _EXPORTER_VARS if env.get(v)]
    if not asked or env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return NoTracing()
    try:
        from router.observe.otel import OtelTracing

        return OtelTracing.from_env(service)
    except ImportError as exc:
        problem = f"the otel extra is not installed ({exc})"
    except ValueError as exc:  # an exporter that is not installed, a malformed OTEL_* value
        problem = str(exc)
    if warn:
        log.warning("tracing is off: %s asks for it but %s; pip install 'turnout[otel]' "
                    "brings the SDK and its OTLP exporter", asked[0], problem)  # fmt: skip
    return NoTracing()
