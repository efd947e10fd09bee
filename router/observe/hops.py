"""The metrics of a ``pd`` policy's two hops (router/proxy/pd.py), beside the per-request ones."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram

PHASES = ("prefill", "handoff", "decode_first_token")


class HopMetrics:
    """Per ``pd`` request: which way it went, and how long each phase took."""

    def __init__(self, registry: CollectorRegistry, buckets: Sequence[float]) -> None:
        self._requests = Counter(
            "turnout_pd_requests_total",
            "Requests of a pd policy by path: two_hop, skipped (no prefill hop), fallback (one "
            "hop to a co-located backend) or local (the prefill answered without KV params).",
            ["policy", "path"],
            registry=registry,
        )
        self._prefills = Counter(
            "turnout_pd_prefills_total",
            "Prefill hops answered, by prefill backend (a fresh one after a decode failed "
            "counts again).",
            ["policy", "backend"],
            registry=registry,
        )
        self._phase = Histogram(
            "turnout_pd_phase_seconds",
            "Phases of a served pd request: prefill (the prefill hop, send to answer), handoff "
            "(that answer to the decode hop's send), decode_first_token (the decode hop's send "
            "to its first content chunk: the engine's KV pull and first step).",
            ["policy", "phase"],
            buckets=buckets,
            registry=registry,
        )

    def done(
        self,
        policy: str,
        path: str,
        prefill_backend: str | None,
        prefills: int,
        phases: tuple[float | None, float | None, float | None],
    ) -> None:
        """One ``pd`` request ended; ``phases`` in :data:`PHASES` order (None: not measured)."""
        self._requests.labels(policy, path).inc()
        if prefill_backend is not None and prefills:
            self._prefills.labels(policy, prefill_backend).inc(prefills)
        for phase, seconds in zip(PHASES, phases, strict=True):
            if seconds is not None:
                self._phase.labels(policy, phase).observe(seconds)
