"""Prometheus metrics with vLLM's names, on a registry owned by each server instance."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from emulator.kvtransfer import Pull
from emulator.model import Engine

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
# vLLM's NIXL connector's buckets (its nixl_xfer_time_seconds drops the first)
_XFER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
_BYTES_BUCKETS = tuple(float(2**k) for k in range(16, 36, 2))  # 64 KiB to 16 GiB
_BLOCK_BUCKETS = tuple(float(2**k) for k in range(0, 16))
_ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
)  # fmt: skip


class _EngineCollector(Collector):
    """Reads the engine's live state at scrape time (nothing to keep in sync)."""

    def __init__(self, engine: Engine, model: str) -> None:
        self._engine = engine
        self._model = model

    def collect(self) -> Iterator[Metric]:
        e, labels = self._engine, [self._model]
        for name, doc, value in (
            ("vllm:num_requests_running", "Requests in model execution batches.", e.num_running),
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", e.num_waiting),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                e.kv_usage(),
            ),
        ):
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(labels, float(value))
            yield g
        yield self._cache_config()
        for name, doc, count in (
            ("vllm:num_preemptions", "Cumulative number of preemptions.", e.num_preemptions),
            (
                "vllm:nixl_num_failed_transfers",
                "Number of failed NIXL KV Cache transfers.",
                e.link.failed,
            ),
            (
                "vllm:nixl_num_failed_notifications",
                "Number of failed NIXL KV Cache notifications.",
                0,  # the pull and its notice are one exchange here: it cannot fail alone
            ),
            (
                "vllm:nixl_num_kv_expired_reqs",
                "Number of requests that had their KV expire.",
                e.holds.expired,
            ),
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                e.prefix_cache_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                e.prefix_cache_hits,
            ),
        ):
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric(labels, float(count))
            yield c

    def _cache_config(self) -> Metric:
        """vLLM's info gauge of the cache config, one sample per data-parallel engine (a
        router reads the KV capacity from it: blocks x block size)."""
        p = self._engine.profile
        g = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the KV cache config.",
            labels=["engine", "block_size", "num_gpu_blocks", "enable_prefix_caching"],
        )
        for rank in range(len(self._engine.ranks)):
            g.add_metric([str(rank), str(p.kv_block_size), str(p.kv_blocks_per_rank), "True"], 1.0)
        return g


class EngineMetrics:
    """The facade the server records into; ``render`` gives the Prometheus text."""

    def __init__(self, engine: Engine, model: str, time_scale: float = 1.0) -> None:
        self._scale = time_scale
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, model))
        r, lab = self.registry, ["model_name"]
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", lab,
            registry=r, buckets=_LATENCY_BUCKETS,
        ).labels(model)  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Gap between streamed chunks.", lab,
            registry=r, buckets=_ITL_BUCKETS,
        ).labels(model)  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", lab,
            registry=r, buckets=_LATENCY_BUCKETS,
        ).labels(model)  # fmt: skip
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", lab, registry=r
        ).labels(model)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generation tokens processed.", lab, registry=r
        ).labels(model)

        kv, eng = ["model_name", "engine"], (model, "0")
        self.xfer_time = Histogram(
            "vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache "
            "transfers.", kv, registry=r, buckets=_XFER_BUCKETS[1:],
        ).labels(*eng)  # fmt: skip
        self.post_time = Histogram(
            "vllm:nixl_post_time_seconds", "Histogram of transfer post time for NIXL KV Cache "
            "transfers.", kv, registry=r, buckets=_XFER_BUCKETS,
        ).labels(*eng)  # fmt: skip
        self.xfer_bytes = Histogram(
            "vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache "
            "transfers.", kv, registry=r, buckets=_BYTES_BUCKETS,
        ).labels(*eng)  # fmt: skip
        self.descriptors = Histogram(
            "vllm:nixl_num_descriptors", "Histogram of number of descriptors per NIXL KV Cache "
            "transfers.", kv, registry=r, buckets=_BLOCK_BUCKETS,
        ).labels(*eng)  # fmt: skip

    def pulled(self, pull: Pull) -> None:
        """A KV pull was scheduled: its duration (real seconds, as every latency here), its
        wait for the link as the post time, its bytes and blocks (one descriptor each)."""
        self.xfer_time.observe((pull.end - pull.start) / self._scale)
        self.post_time.observe((pull.start - pull.queued) / self._scale)
        self.xfer_bytes.observe(pull.bytes)
        self.descriptors.observe(pull.blocks)

    def render(self) -> bytes:
        """The exposition text of every metric."""
        return generate_latest(self.registry)
