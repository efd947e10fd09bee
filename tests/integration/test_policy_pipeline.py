"""A pipeline policy through a real router: when its filter removes every candidate the
client gets a 503 that names the filter, and /metrics counts the rejection and times it."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.procs import start_emulator
from tests.router.harness import Reply, base_config, get, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2}


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Reply, Reply, str]]:
    """(interactive reply, batch reply, /metrics text) from a router whose pipeline sends
    interactive requests only to a backend that is down, and batch ones to a live one."""
    with start_emulator("deepinfer", time_scale=50) as good:
        dead = f"http://127.0.0.1:{free_port()}"
        doc = base_config([("dead", "vllm", dead), ("good", "deepinfer", good.url)])
        doc["health"] = {"interval": 30, "failures_to_eject": 50}  # dead: down from the start
        members = {"interactive": ["dead"], "batch": ["good"]}
        doc["policies"]["split"] = {
            "type": "pipeline",
            "params": {
                "filters": ["not-saturated", {"type": "class-members", "params": members}],
                "scorers": ["least-requests"],
            },
        }
        doc["default_policy"] = "split"
        with start_router(write_config(tmp_path_factory.mktemp("pipeline"), doc)) as router:
            # Batch first: a plugin's first run is the one timed for sure (PLUGIN_SAMPLE).
            batch = post(router.url + "/v1/chat/completions", CHAT, {"X-Request-Class": "batch"})
            interactive = post(router.url + "/v1/chat/completions", CHAT,
                               {"X-Request-Class": "interactive"})  # fmt: skip
            yield interactive, batch, get(router.url + "/metrics").text


def test_emptied_set_is_a_503_counted_against_the_filter(served: tuple[Reply, Reply, str]) -> None:
    interactive, batch, text = served
    assert interactive.status == 503, interactive.text
    assert interactive.json()["error"]["code"] == "no_backend"
    assert batch.status == 200, batch.text
    assert batch.headers["x-turnout-backend"] == "good"
    rejected = 'turnout_policy_filter_rejections_total{filter="class-members",policy="split"}'
    assert f"{rejected} 1.0" in text
    # Timed: each plugin's first run (the batch request's), not the filter's second.
    timed = 'turnout_policy_plugin_duration_seconds_count{kind="filter",plugin="class-members"'
    assert f'{timed},policy="split"}} 1.0' in text
    scorer = 'turnout_policy_plugin_duration_seconds_count{kind="scorer",plugin="least-requests"'
    assert f'{scorer},policy="split"}} 1.0' in text


def test_the_503_names_the_filter(served: tuple[Reply, Reply, str]) -> None:
    interactive, _, _ = served
    assert interactive.json()["error"]["message"] == (
        "policy 'split' found no backend: "
        "filter 'class-members' (filters[1]) removed every candidate"
    )
