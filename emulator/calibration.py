"""The public B200 run the profiles are fitted to, and the tolerances of that fit.

Figures from GPUStack's run of DeepInfer-server and vLLM 0.32 on 8x B200 (DP8+EP8,
DeepSeek-V4.1-Flash): 100 requests at concurrency 16, 8,192 input and 1,024 output tokens,
streaming, output length forced. Latencies in ms, throughput in output tokens/s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SHAPE = {"requests": 100, "concurrency": 16, "prompt_tokens": 8192, "output_tokens": 1024}

PUBLISHED: dict[str, dict[str, float]] = {
    "deepinfer": {
        "output_throughput": 1392.44,
        "mean_ttft_ms": 4280.0,
        "p95_ttft_ms": 16330.0,
        "mean_itl_ms": 8.74,
        "mean_e2el_ms": 13230.0,
        "p95_e2el_ms": 25460.0,
    },
    "vllm": {
        "output_throughput": 1112.20,
        "mean_ttft_ms": 2040.0,
        "p95_ttft_ms": 8270.0,
        "mean_itl_ms": 11.98,
        "mean_e2el_ms": 14300.0,
        "p95_e2el_ms": 20030.0,
    },
}

# Relative tolerance per figure; figures without one are reported but not held to the fit
# (the published E2E is not fully consistent with the other figures, hence its wider band).
TOLERANCE = {
    "output_throughput": 0.10,
    "mean_ttft_ms": 0.10,
    "p95_ttft_ms": 0.15,
    "mean_itl_ms": 0.10,
    "mean_e2el_ms": 0.20,
}
# DeepInfer's P95 TTFT must be at least this multiple of vLLM's (published: about 2.0).
MIN_P95_TTFT_RATIO = 1.2


@dataclass(frozen=True, slots=True)
class Row:
    """One figure: measured, published, their ratio and whether it is within tolerance."""

    metric: str
    measured: float
    published: float
    tolerance: float | None

    @property
    def ratio(self) -> float:
        return self.measured / self.published

    @property
    def ok(self) -> bool:
        return self.tolerance is None or abs(self.ratio - 1.0) <= self.tolerance


def compare(profile: str, figures: Mapping[str, float]) -> list[Row]:
    """Measured vs published for every published figure of ``profile``."""
    return [
        Row(metric, figures[metric], published, TOLERANCE.get(metric))
        for metric, published in PUBLISHED[profile].items()
    ]


def p95_ttft_ratio(deepinfer: Mapping[str, float], vllm: Mapping[str, float]) -> float:
    """DeepInfer's P95 TTFT over vLLM's."""
    return deepinfer["p95_ttft_ms"] / vllm["p95_ttft_ms"]


def table(profile: str, rows: list[Row]) -> str:
    """A plain-text table of ``rows``."""
    lines = [f"{profile:<10} {'metric':<18} {'measured':>10} {'published':>10} {'ratio':>6}  ok"]
    for r in rows:
        band = "" if r.tolerance is None else f"±{r.tolerance:.0%}"
        mark = ("yes" if r.ok else "NO") + (f" ({band})" if band else " (reported)")
        figures = f"{r.measured:>10.2f} {r.published:>10.2f} {r.ratio:>6.2f}"
        lines.append(f"{'':<10} {r.metric:<18} {figures}  {mark}")
    return "\n".join(lines)
