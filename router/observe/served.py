"""The per-request series of one router process: every request's outcome, and a served
request's TTFT, TPOT, end-to-end latency and tokens, by (policy, backend, class).

prometheus_client keeps each histogram bucket as a value object with a lock of its own (33 of
each for one TTFT series), and every label set as a metric object: about 83 values and as many
locks per (policy, backend, class), which at fleet size is most of the router's memory per
backend, and a request writes the series of a backend last used hundreds of requests ago.
:class:`Served` keeps each label set as one flat array of floats instead, and exposes the same
families through a collector registered on the facade's registry: names, labels, buckets and
samples (``_bucket``, ``_count``, ``_sum``, ``_total``, ``_created``) as prometheus_client
would give them. It is written from the event loop's thread only, as the router writes all
its metrics.

With ``turnout serve --workers N`` the figures must reach prometheus_client's multiprocess
files, which only its own values write: :class:`SharedServed` keeps prometheus_client's metrics
for that (router.observe.metrics picks one of the two).
"""

from __future__ import annotations

import time
from array import array
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from router.observe.series import E2E_BUCKETS, REQUEST_LABELS, TPOT_BUCKETS, TTFT_BUCKETS, Series

REQUESTS = ("turnout_requests", "Requests by outcome: the status the client got and why (reason).")
OUTCOME_LABELS = ("code", "reason")
HISTOGRAMS = (
    ("turnout_time_to_first_token_seconds",
     "Request arrival to the first content chunk sent to the client (served requests).",
     TTFT_BUCKETS),
    ("turnout_time_per_output_token_seconds",
     "(E2E - TTFT) / (output tokens - 1) (served requests).",
     TPOT_BUCKETS),
    ("turnout_e2e_request_latency_seconds",
     "Request arrival to the response's last byte (served requests).",
     E2E_BUCKETS),
)  # fmt: skip
TOKENS = (
    ("turnout_prompt_tokens", "Prompt tokens (engine usage)."),
    ("turnout_output_tokens", "Output tokens (engine usage)."),
)

_BOUNDS = tuple((*b, float("inf")) for _, _, b in HISTOGRAMS)
"""Each histogram's upper bounds, +Inf last (as prometheus_client adds it)."""
_LE = tuple(
    tuple(floatToGoString(b) for b in bounds)  # type: ignore[no-untyped-call]
    for bounds in _BOUNDS
)
"""Each bucket's ``le`` label, as prometheus_client writes it."""
_AT = tuple(accumulate((len(b) + 1 for b in _BOUNDS), initial=0))
"""Where each histogram starts in a record (its buckets, then its sum), and the tokens."""
_TTFT, _TPOT, _E2E, _PROMPT = _AT
_OUTPUT = _PROMPT + 1
_SIZE = _OUTPUT + 1
_ZEROS = array("d", bytes(8 * _SIZE))


class _Record:
    """One (policy, backend, class): its histograms' buckets and sums and its token counts
    in one array, and per (code, reason) seen the slot of its request count, followed by
    that count's creation time. ``created``: when its first request finished (None before:
    a label set only :meth:`Served.known` has no histograms or tokens yet, as with
    prometheus_client's children, made at a label set's first request)."""

    __slots__ = ("created", "labels", "outcomes", "values")

    def __init__(self, labels: tuple[str, str, str]) -> None:
        self.labels = labels
        self.values = array("d", _ZEROS)
        self.outcomes: dict[tuple[int, str], int] = {}
        self.created: float | None = None

    def outcome(self, code: int, reason: str) -> int:
        slot = self.outcomes.get((code, reason))
        if slot is None:
            slot = self.outcomes[(code, reason)] = len(self.values)
            self.values.extend((0.0, time.time()))
        return slot


def _observe(values: array[float], at: int, bounds: tuple[float, ...], value: float) -> None:
    """One observation: its bucket (the first bound at or above it; the cumulative counts are
    made when collected) and the sum after the buckets."""
    values[at + bisect_left(bounds, value)] += 1.0
    values[at + len(bounds)] += value


class Served(Collector):
    """The per-request series, one flat record per label set (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._records: dict[tuple[str, str, str], _Record] = {}
        registry.register(self)

    def _record(self, labels: tuple[str, str, str]) -> _Record:
        record = self._records.get(labels)
        if record is None:
            record = self._records[labels] = _Record(labels)
        return record

    def known(self, labels: tuple[str, str, str], code: int, reason: str) -> None:
        """Export a request count of these labels at 0."""
        self._record(labels).outcome(code, reason)

    def done(
        self,
        labels: tuple[str, str, str],
        code: int,
        reason: str,
        ttft: float | None,
        tpot: float | None,
        e2e: float | None,
        prompt_tokens: int | None,
        output_tokens: int | None,
    ) -> None:
        """One finished request (latencies and tokens only for a served one)."""
        record = self._records.get(labels) or self._record(labels)
        if record.created is None:
            record.created = time.time()
        values = record.values
        values[record.outcome(code, reason)] += 1.0
        if ttft is not None:
            _observe(values, _TTFT, _BOUNDS[0], ttft)
        if tpot is not None:
            _observe(values, _TPOT, _BOUNDS[1], tpot)
        if e2e is not None:
            _observe(values, _E2E, _BOUNDS[2], e2e)
        if prompt_tokens:
            values[_PROMPT] += prompt_tokens
        if output_tokens:
            values[_OUTPUT] += output_tokens

    def describe(self) -> Iterator[Metric]:
        """The families without samples: the registry checks their names against the rest."""
        yield Metric(REQUESTS[0], REQUESTS[1], "counter")
        for name, doc, _ in HISTOGRAMS:
            yield Metric(name, doc, "histogram")
        for name, doc in TOKENS:
            yield Metric(name, doc, "counter")

    def collect(self) -> Iterator[Metric]:
        created = prometheus_metrics._use_created  # PROMETHEUS_DISABLE_CREATED_SERIES, as theirs
        served = [(r, r.created) for r in self._records.values() if r.created is not None]
        family = Metric(REQUESTS[0], REQUESTS[1], "counter")
        for r in self._records.values():
            for (code, reason), slot in r.outcomes.items():
                labels = {**_labels(r), "code": str(code), "reason": reason}
                family.add_sample(f"{family.name}_total", labels, r.values[slot])
                if created:
                    family.add_sample(f"{family.name}_created", labels, r.values[slot + 1])
        yield family
        for (name, doc, _), les, at in zip(HISTOGRAMS, _LE, _AT, strict=False):
            family = Metric(name, doc, "histogram")
            for r, at_first in served:
                _histogram(family, _labels(r), r.values[at : at + len(les) + 1], les)
                if created:
                    family.add_sample(f"{name}_created", _labels(r), at_first)
            yield family
        for (name, doc), at in ((TOKENS[0], _PROMPT), (TOKENS[1], _OUTPUT)):
            family = Metric(name, doc, "counter")
            for r, at_first in served:
                family.add_sample(f"{name}_total", _labels(r), r.values[at])
                if created:
                    family.add_sample(f"{name}_created", _labels(r), at_first)
            yield family


def _labels(r: _Record) -> dict[str, str]:
    return dict(zip(REQUEST_LABELS, r.labels, strict=True))


def _histogram(
    family: Metric, labels: dict[str, str], values: Sequence[float], les: tuple[str, ...]
) -> None:
    """A histogram's samples from its buckets' own counts and its sum (last)."""
    total = 0.0
    for le, count in zip(les, values, strict=False):
        total += count
        family.add_sample(f"{family.name}_bucket", {**labels, "le": le}, total)
    family.add_sample(f"{family.name}_count", labels, total)
    family.add_sample(f"{family.name}_sum", labels, values[len(les)])


@dataclass(frozen=True, slots=True)
class _Children:
    """The per-request series of one label set, as prometheus_client's children."""

    ttft: Histogram
    tpot: Histogram
    e2e: Histogram
    prompt: Counter
    output: Counter


class SharedServed:
    """The same series as prometheus_client's metrics, whose values write the multiprocess
    files that ``--workers N`` merges (router.observe.sharing)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._requests = Counter(
            f"{REQUESTS[0]}_total", REQUESTS[1], [*REQUEST_LABELS, *OUTCOME_LABELS],
            registry=registry,
        )  # fmt: skip
        self._histograms = [
            Histogram(name, doc, REQUEST_LABELS, buckets=buckets, registry=registry)
            for name, doc, buckets in HISTOGRAMS
        ]
        self._tokens = [
            Counter(f"{name}_total", doc, REQUEST_LABELS, registry=registry) for name, doc in TOKENS
        ]
        self._requests_by = Series(self._requests)
        self._children: dict[tuple[str, str, str], _Children] = {}

    def known(self, labels: tuple[str, str, str], code: int, reason: str) -> None:
        self._requests.labels(*labels, str(code), reason)

    def done(
        self,
        labels: tuple[str, str, str],
        code: int,
        reason: str,
        ttft: float | None,
        tpot: float | None,
        e2e: float | None,
        prompt_tokens: int | None,
        output_tokens: int | None,
    ) -> None:
        children = self._children.get(labels)
        if children is None:  # labels() takes a lock and builds a key: do it once per label set
            ttft_h, tpot_h, e2e_h = (h.labels(*labels) for h in self._histograms)
            prompt_c, output_c = (c.labels(*labels) for c in self._tokens)
            children = self._children[labels] = _Children(ttft_h, tpot_h, e2e_h, prompt_c, output_c)
        self._requests_by(*labels, str(code), reason).inc()
        if ttft is not None:
            children.ttft.observe(ttft)
        if tpot is not None:
            children.tpot.observe(tpot)
        if e2e is not None:
            children.e2e.observe(e2e)
        if prompt_tokens:
            children.prompt.inc(prompt_tokens)
        if output_tokens:
            children.output.inc(output_tokens)
