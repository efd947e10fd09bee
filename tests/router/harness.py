"""Helpers for router tests: configs in temp files, router processes, clients."""

from __future__ import annotations

import contextlib
import http.client
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import yaml

from tests.procs import Process, start_process

READY = "turnout listening on"


def base_config(backends: Sequence[tuple[str, str, str]], **overrides: Any) -> dict[str, Any]:
    """A config for ``(name, engine, url)`` backends with the embedded default's policies."""
    names = [b[0] for b in backends]
    doc: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "backends": [{"name": n, "engine": e, "url": u} for n, e, u in backends],
        "default_policy": "class-split",
        "policies": {
            "class-split": {
                "type": "class-split",
                "params": {"interactive": names, "batch": list(reversed(names))},
            },
            "round-robin": {"type": "round-robin"},
            **{f"{n}-only": {"type": "pinned", "params": {"backend": n}} for n in names},
        },
        "health": {"interval": 0.2, "timeout": 1.0, "failures_to_eject": 2, "cooldown": 0.5},
        "failover": {"max_attempts": 3, "backoff_initial": 0.001, "backoff_max": 0.01},
    }
    doc.update(overrides)
    return doc


def write_config(directory: Path, doc: dict[str, Any], name: str = "router.yaml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@contextlib.contextmanager
def start_router(
    config: Path | None,
    args: Sequence[str] = (),
    timeout: float = 30.0,
    lines: list[str] | None = None,
    stderr: Path | None = None,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[Process]:
    """``python -m turnout serve --port 0`` (the embedded default when ``config`` is None);
    its stdout lines (the access log) go to ``lines`` if given, its log to ``stderr``;
    ``preexec_fn``: as :func:`tests.procs.start_process`'s."""
    argv = [sys.executable, "-m", "turnout", "serve", "--port", "0", *args]
    if config is not None:
        argv += ["--config", str(config)]
    with start_process(
        argv, READY, timeout, lines=lines, stderr=stderr, env=env, preexec_fn=preexec_fn
    ) as proc:
        yield proc


def client_for(url: str, **headers: str) -> openai.OpenAI:
    """The official client without retries, so errors surface as the router sent them."""
    return openai.OpenAI(
        base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30, default_headers=headers
    )


@dataclass(frozen=True)
class Reply:
    """A raw HTTP answer (body de-chunked, otherwise byte for byte)."""

    status: int
    headers: dict[str, str]
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode()


def request(
    method: str,
    url: str,
    body: bytes | dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Reply:
    """One request over a fresh loopback connection with the standard library's client."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request(method, target, body=data, headers=hdrs)
        resp = conn.getresponse()
        content = resp.read()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, content)
    finally:
        conn.close()


def post(url: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
    return request("POST", url, body, headers)


def get(url: str) -> Reply:
    return request("GET", url)
