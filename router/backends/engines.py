"""Per-engine load metric names (a data table, not code branches) and /metrics parsing.

A backend's ``engine`` kind picks its row; a kind the table does not know is recognised by the
series its /metrics exposes (the first row with any of them), so ``engine: llama`` in front of
llama.cpp still reads ``llamacpp:*``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from policies.types import EngineLoad


@dataclass(frozen=True, slots=True)
class EngineMetricNames:
    """Which Prometheus series of an engine's /metrics carry its load (first match wins)."""

    waiting: tuple[str, ...]
    running: tuple[str, ...]
    kv_cache_usage: tuple[str, ...]
    """A fraction in [0, 1]."""
    kv_cache_tokens: tuple[str, ...] = ()
    """A gauge of the whole KV cache in tokens (engines that say so in a value; vLLM says it
    in ``cache_config_info``'s labels, read by :func:`parse_cache_config`)."""

    @property
    def series(self) -> frozenset[str]:
        """Every name of the row."""
        return frozenset(
            (*self.waiting, *self.running, *self.kv_cache_usage, *self.kv_cache_tokens)
        )


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
        kv_cache_tokens=("sglang:max_total_num_tokens",),
    ),
    "tgi": EngineMetricNames(
        waiting=("tgi_queue_size",),
        running=("tgi_batch_current_size",),
        kv_cache_usage=(),
    ),
    # llama.cpp's llama-server with --metrics: busy slots and requests queued for a free slot.
    # The build this project tests (vendored in llama-cpp-python 0.3.36) has no KV gauge;
    # older builds exported kv_cache_usage_ratio, read when present.
    "llamacpp": EngineMetricNames(
        waiting=("llamacpp:requests_deferred",),
        running=("llamacpp:requests_processing",),
        kv_cache_usage=("llamacpp:kv_cache_usage_ratio",),
    ),
}

_ALL_SERIES = frozenset().union(*(names.series for names in ENGINE_METRICS.values()))


def metric_names(engine: str) -> EngineMetricNames:
    """The table entry for ``engine`` (unknown kinds are read with vLLM's names)."""
    return ENGINE_METRICS.get(engine, _VLLM)


def detect_engine(samples: dict[str, float]) -> str | None:
    """The first table kind any of whose load series is among ``samples``."""
    for kind, names in ENGINE_METRICS.items():
        if not names.series.isdisjoint(samples):
            return kind
    return None


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


_CACHE_CONFIG = "vllm:cache_config_info{"
_BLOCKS = re.compile(r'[{,]num_gpu_blocks="(\d+)"')
_BLOCK_SIZE = re.compile(r'[{,]block_size="(\d+)"')


def parse_cache_config(text: str) -> float | None:
    """vLLM's KV cache in tokens, from ``vllm:cache_config_info`` (an info gauge whose labels
    carry the cache config: ``num_gpu_blocks`` x ``block_size``, summed over the label sets
    of its data-parallel engines); None when no sample says both."""
    total = 0
    for line in text.splitlines():
        if not line.startswith(_CACHE_CONFIG):
            continue
        blocks, size = _BLOCKS.search(line), _BLOCK_SIZE.search(line)
        if blocks and size:
            total += int(blocks.group(1)) * int(size.group(1))
    return float(total) if total else None


def parse_load(text: str, engine: str) -> EngineLoad:
    """The engine's load as the policies see it (an unknown kind: by the series it exposes)."""
    if engine in ENGINE_METRICS:
        names = ENGINE_METRICS[engine]
        samples = parse_samples(text, names.series)
    else:
        samples = parse_samples(text, _ALL_SERIES)
        names = metric_names(detect_engine(samples) or engine)

    def first(keys: tuple[str, ...]) -> float | None:
        return next((samples[k] for k in keys if k in samples), None)

    kv_tokens = first(names.kv_cache_tokens)
    if kv_tokens is None and names is _VLLM:
        kv_tokens = parse_cache_config(text)
    return EngineLoad(
        waiting=first(names.waiting),
        running=first(names.running),
        kv_cache_usage=first(names.kv_cache_usage),
        kv_cache_tokens=kv_tokens,
    )
