"""`turnout serve` as a newcomer runs it: the embedded default, workers, clean shutdown."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from tests.procs import start_emulator
from tests.router.harness import base_config, client_for, get, start_router, write_config

MODEL = "deepseek-v4.1-flash"


def refused(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=2):
            return False
    except OSError:
        return True


def test_embedded_default_serves_and_stops_its_emulators() -> None:
    with start_router(None) as router:
        backends = get(router.url + "/turnout/backends").json()
        assert {b["name"] for b in backends} == {"vllm", "deepinfer"}
        assert all(b["healthy"] for b in backends)
        policies = get(router.url + "/turnout/policies").json()
        assert [p["name"] for p in policies if p["default"]] == ["adaptive"]
        client = client_for(router.url)
        assert [m.id for m in client.models.list()] == [MODEL]
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=3,
        )
        assert raw.headers["x-turnout-policy"] == "adaptive"
        assert raw.headers["x-turnout-backend"] == "vllm"
        assert raw.parse().choices[0].message.content
        urls = [b["url"] for b in backends]
        assert not any(refused(u) for u in urls)
    # start_router sent SIGTERM and waited: the emulators went with the router
    assert all(refused(u) for u in urls)


def test_workers_share_one_port(tmp_path: Path) -> None:
    with start_emulator("vllm", time_scale=50) as emu:
        path = write_config(tmp_path, base_config([("only", "vllm", emu.url)]))
        with start_router(path, ["--workers", "2"]) as router:
            pids = {get(router.url + "/health").json()["pid"] for _ in range(60)}
            assert len(pids) == 2
            client = client_for(router.url)
            for _ in range(4):
                out = client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
                assert out.choices[0].text
        assert refused(router.url)


def test_busy_port_fails_fast(tmp_path: Path) -> None:
    doc = base_config([("only", "vllm", "http://127.0.0.1:9")])
    doc["backends"] = [{"name": "only", "engine": "vllm", "emulator": {"profile": "vllm"}}]
    path = write_config(tmp_path, doc)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [
            sys.executable,
            "-m",
            "turnout",
            "serve",
            "--config",
            str(path),
            "--port",
            str(port),
        ]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in res.stderr
