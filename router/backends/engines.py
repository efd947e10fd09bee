"""Per-engine load metric names (a data table, not code branches) and /metrics parsing."""

from __future__ import annotations

from dataclasses import dataclass

from policies.types import EngineLoad


@dataclass(frozen=True, slots=True)
class EngineMetricNames:
    """Which Prometheus series of an engine's /metrics carry its load (first match wins)."""

    waiting: tuple[str, ...]
    running: tuple[str, ...]
    kv_cache_usage: tuple[str, ...]
    """A fraction in [0, 1]."""


_VLLM = EngineMetricNames(
    waiting=("vllm:num_requests_waiting",),
    running=("vllm:num_requests_running",),
    kv_cache_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
)

ENGINE_METRICS: dict[str, EngineMetricNames] = {
    "vllm": _VLLM,
    # The DeepInfer emulator (and DeepInfer's OpenAI server) expose vLLM-compatible names.
    "deepinfer": _VLLM,
    "sglang": EngineMetricNames(
        waiting=("sglang:num_queue_reqs",),
        running=("sglang:num_running_reqs",),
        kv_cache_usage=("sglang:token_usage",),
    ),
    "tgi": EngineMetricNames(
        waiting=("tgi_queue_size",),
        running=("tgi_batch_current_size",),
        kv_cache_usage=(),
    ),
}


def metric_names(engine: str) -> EngineMetricNames:
    """The table entry for ``engine`` (unknown kinds are read with vLLM's names)."""
    return ENGINE_METRICS.get(engine, _VLLM)


def parse_samples(text: str, wanted: frozenset[str]) -> dict[str, float]:
    """Sum of every sample of each ``wanted`` series (over all label sets) in Prometheus text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        if space < 0:
            continue
        end = brace if 0 <= brace < space else space
        name = line[:end]
        if name not in wanted:
            continue
        value_part = line[line.rfind("}") + 1 :] if brace == end else line[space:]
        fields = value_part.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def parse_load(text: str, engine: str) -> EngineLoad:
    """The engine's load as the policies see it."""
    names = metric_names(engine)
    samples = parse_samples(
        text, frozenset((*names.waiting, *names.running, *names.kv_cache_usage))
    )

    def first(keys: tuple[str, ...]) -> float | None:
        return next((samples[k] for k in keys if k in samples), None)

    return EngineLoad(
        waiting=first(names.waiting),
        running=first(names.running),
        kv_cache_usage=first(names.kv_cache_usage),
    )
