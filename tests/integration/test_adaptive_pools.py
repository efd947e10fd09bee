"""Pools: several replicas per engine kind, through the router with every policy."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import yaml
from openai.types.chat import ChatCompletionMessageParam

from tests.procs import ROOT, Process, metric_in, wait_for
from tests.router.harness import client_for, get, start_router, write_config

MODEL = "deepseek-v4.1-flash"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something short."}]
EXAMPLE = ROOT / "config" / "examples" / "emulated-pools.yaml"


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """The shipped pool example, its emulators time-scaled so the test stays short."""
    doc = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    for b in doc["backends"]:
        b["emulator"]["time_scale"] = 20
    doc["shadow"]["adaptive"]["sample"] = 1.0  # every batch request, so counts are exact
    doc["listen"]["port"] = 0
    with start_router(write_config(tmp_path_factory.mktemp("pools"), doc)) as proc:
        yield proc


def served_by(router: Process, policy: str, cls: str, n: int, **headers: str) -> Counter[str]:
    client = client_for(router.url, **{"X-Turnout-Policy": policy})
    out: Counter[str] = Counter()
    for _ in range(n):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=4,
            extra_headers={"X-Request-Class": cls, **headers},
        )
        out[raw.headers["x-turnout-backend"]] += 1
    return out


def test_every_policy_sees_all_four_replicas(router: Process) -> None:
    names = {b["name"] for b in get(router.url + "/turnout/backends").json()}
    assert names == {"vllm-a", "vllm-b", "deepinfer-a", "deepinfer-b"}
    assert set(served_by(router, "round-robin", "interactive", 8)) == names
    assert set(served_by(router, "deepinfer-only", "batch", 4)) <= {"deepinfer-a", "deepinfer-b"}
    # pinned to an engine kind: least in-flight replica of the pool first.
    client = client_for(router.url, **{"X-Turnout-Policy": "vllm-only"})
    # ignore_eos: the busy stream runs all 2,000 tokens (about 1.2 s at this time scale), so
    # it is still in flight when the next request is routed even on a loaded machine.
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=CHAT, max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
    ) as busy:
        first = busy.headers["x-turnout-backend"]
        assert served_by(router, "vllm-only", "interactive", 1) == {
            ({"vllm-a", "vllm-b"} - {first}).pop(): 1
        }


def test_adaptive_keeps_classes_in_their_pools(router: Process) -> None:
    interactive = served_by(router, "adaptive", "interactive", 6)
    batch = served_by(router, "adaptive", "batch", 6)
    assert set(interactive) <= {"vllm-a", "vllm-b"}
    assert set(batch) <= {"deepinfer-a", "deepinfer-b"}


def test_adaptive_session_affinity_within_the_pool(router: Process) -> None:
    homes: set[str] = set()
    for session in ("alice", "bob", "carol", "dave"):
        got = served_by(router, "adaptive", "interactive", 3, **{"X-Session-Id": session})
        assert len(got) == 1, got  # one session, one replica (the pool is idle: no bound)
        homes.update(got)
    assert homes <= {"vllm-a", "vllm-b"}


def test_batch_is_mirrored_through_the_shadow_policy(router: Process) -> None:
    def mirrored() -> float:
        text = get(router.url + "/metrics").text
        return sum(
            metric_in(
                text,
                r'turnout_shadow_requests_total\{backend="NAME",class="batch",code="200",'
                r'policy="adaptive"\}'.replace("NAME", name),
            )
            for name in ("deepinfer-a", "deepinfer-b")  # class-split's batch pool
        )

    before = mirrored()
    served_by(router, "adaptive", "batch", 3)
    served_by(router, "adaptive", "interactive", 2)  # not mirrored: the shadow is batch-only
    assert wait_for(lambda: mirrored() == before + 3)
    assert 'turnout_shadow_requests_total{backend="vllm' not in get(router.url + "/metrics").text
