"""Response trailers from a hostile backend (tests/misbehaving.py) through a real router
(issue 26): endless trailers took the router up by 1 GB; one 151 MiB trailer value, joined
piece by piece (quadratic), stalled its loop (``/health`` 5.4 s). Now whatever follows the
body without a byte of it is bounded (64 KiB): the router stops reading, counts the backend's
protocol error, and its client gets its answer's end or a clean error."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from tests.integration.test_hostile_backend import _HealthPoller, _protocol_errors
from tests.procs import Process, rss_kb, start_misbehaving
from tests.router.harness import base_config, get, post, start_router, write_config

MiB = 1 << 20
FLOOD = 256 * MiB


@pytest.fixture(scope="module")
def backend() -> Iterator[Process]:
    with start_misbehaving("--flood-bytes", str(FLOOD)) as proc:
        yield proc


@pytest.fixture(scope="module")
def router(backend: Process, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    doc = base_config([("bad", "vllm", backend.url)])
    doc["health"]["failures_to_eject"] = 1000  # these tests look at answers, not ejection
    with start_router(write_config(tmp_path_factory.mktemp("trailers"), doc)) as proc:
        yield proc


def _sent(backend: Process, mode: str) -> int:
    """Bytes of trailers the backend got out in ``mode`` so far (kernel buffers included)."""
    return int(get(backend.url + "/stats").json()["sent"].get(mode, 0))


@pytest.mark.parametrize("mode", ["endless-trailers", "huge-trailer"])
def test_trailers_after_a_stream_end_it_cleanly_and_count(
    router: Process, backend: Process, mode: str
) -> None:
    before, sent = _protocol_errors(router, "trailers_too_large"), _sent(backend, mode)
    rss = rss_kb(router.proc.pid)
    with _HealthPoller(router.url) as health:
        # Read to the end of the router's answer, not only to [DONE] as the SDK does: a client
        # gone after [DONE] may leave before the router has read (or stopped reading) the
        # trailers, and then nothing was counted (seen in CI); and nothing may follow [DONE].
        body = {"model": mode, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        reply = post(router.url + "/v1/chat/completions", body)
    assert reply.status == 200, reply.content[:500]
    events = [e.removeprefix(b"data: ") for e in reply.content.split(b"\n\n") if e]
    texts = [orjson.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]]
    assert texts == ["hi", " there"] and events[-1] == b"[DONE]"  # the whole answer, no more
    assert set(health.statuses) <= {200} and get(router.url + "/health").status == 200
    assert _protocol_errors(router, "trailers_too_large") == before + 1
    assert (_sent(backend, mode) - sent) / MiB < 32  # of 256 MiB: the router stopped reading
    assert (rss_kb(router.proc.pid) - rss) / 1024 < 50


@pytest.mark.parametrize("mode", ["endless-trailers", "huge-trailer"])
def test_trailers_after_a_json_answer_get_a_clean_502(
    router: Process, backend: Process, mode: str
) -> None:
    before, sent = _protocol_errors(router, "trailers_too_large"), _sent(backend, mode)
    with _HealthPoller(router.url) as health:
        body = {"model": mode, "messages": [{"role": "user", "content": "hi"}]}
        reply = post(router.url + "/v1/chat/completions", body)
    assert reply.status == 502
    error = reply.json()["error"]
    assert error["code"] == "upstream_protocol_error" and "trailers" in error["message"]
    assert set(health.statuses) <= {200} and get(router.url + "/health").status == 200
    assert _protocol_errors(router, "trailers_too_large") == before + 1
    assert (_sent(backend, mode) - sent) / MiB < 32


def test_a_stream_without_trailers_of_note_is_untouched(router: Process) -> None:
    reply = post(router.url + "/v1/chat/completions", {"model": "ok", "stream": True,
                 "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert reply.status == 200 and reply.content.endswith(b"data: [DONE]\n\n")
    assert b'"error"' not in reply.content
