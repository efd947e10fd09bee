"""Shadow mirroring: copy a sampled share of one policy's requests to a shadow target.

The copy is sent from a background task after the live request was planned, so the client
never waits for it and never sees it. The shadow's answer is read to the end through a
:class:`StreamMeter` (to measure TTFT, E2E and tokens) and then discarded. Each served policy
has a bound on open shadow requests; a request sampled while that bound is reached is dropped
and counted. Shadow figures go to their own ``turnout_shadow_*`` metric families, so they
never mix with served traffic; a shadow *policy* also learns from them through ``on_finish``.
Shadow requests do not count in the shadow backend's in-flight figures (they must not steer
live routing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import replace

import aiohttp

from policies.base import Policy, reads_prefix
from policies.types import Endpoint, Outcome, RequestInfo
from router.backends.pool import BackendState, Pool
from router.config.model import LimitSettings, ShadowSettings
from router.control.classify import Parsed, with_prefix
from router.observe.mirrors import ShadowMetrics
from router.proxy.body import asks_usage, upstream_body
from turnout.common.sse import StreamMeter

log = logging.getLogger("router")


class Shadows:
    """Every configured mirror of one router app; used from the event loop only."""

    def __init__(
        self,
        settings: Mapping[str, ShadowSettings],
        pool: Pool,
        metrics: ShadowMetrics,
        limits: LimitSettings,
        rng: random.Random | None = None,
    ) -> None:
        """``limits``: how much of a shadow backend's answer is held (as of a served one)."""
        self._settings = settings
        self._limits = limits
        self._pool = pool
        self._metrics = metrics
        self._rng = rng if rng is not None else random.Random()
        self._open: dict[str, int] = dict.fromkeys(settings, 0)
        self._tasks: set[asyncio.Task[None]] = set()

    def mirror(
        self,
        policy: str,
        parsed: Parsed,
        raw: bytes,
        paths: Mapping[Endpoint, str],
        session: aiohttp.ClientSession,
        policies: Mapping[str, Policy],
    ) -> None:
        """Maybe mirror this request of ``policy`` (synchronous: it only starts a task).

        ``policies`` are the live ones (a config reload replaces them).
        """
        s = self._settings.get(policy)
        if s is None:
            return
        info = parsed.info
        if s.request_class is not None and info.request_class != s.request_class:
            return
        if s.sample < 1.0 and self._rng.random() >= s.sample:
            return
        if self._open[policy] >= s.max_concurrency:
            self._metrics.dropped(policy)
            return
        shadow_policy = policies.get(s.policy) if s.policy is not None else None
        if shadow_policy is not None and reads_prefix(shadow_policy):
            info = with_prefix(parsed)  # the served policy may not have needed it hashed
        shadow_info = replace(info, request_id=f"{info.request_id}-shadow")
        backend = self._target(s, shadow_info, shadow_policy)
        model = None if backend is None else self._pool.upstream_model(backend, info.model)
        if backend is None or model is None:
            self._metrics.dropped(policy)
            return
        add_usage = info.stream and asks_usage(info.endpoint)
        body = upstream_body(raw, parsed.doc, model=model, priority=None, add_usage=add_usage)
        url = backend.spec.url + paths[info.endpoint]
        self._open[policy] += 1
        task = asyncio.create_task(
            self._send(policy, shadow_policy, shadow_info, backend, url, body, session, s.timeout)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _target(
        self, s: ShadowSettings, info: RequestInfo, shadow_policy: Policy | None
    ) -> BackendState | None:
        if shadow_policy is None:  # a backend (config: exactly one of backend / policy)
            # ...or the first healthy replica discovered behind it; none if it has gone.
            return self._pool.member(s.backend) if s.backend is not None else None
        candidates = self._pool.candidates(info.model)
        if not candidates:
            return None
        try:
            decision = shadow_policy.choose(info, candidates)
            backend = self._pool.by_name.get(decision.ranked[0]) if decision.ranked else None
            if backend is not None:
                shadow_policy.committed(info, decision, backend.name)
        except Exception:  # a shadow policy's bug must never touch served traffic
            log.exception("shadow policy %s failed to choose", s.policy)
            return None
        return backend

    async def _send(
        self,
        policy: str,
        shadow_policy: Policy | None,
        info: RequestInfo,
        backend: BackendState,
        url: str,
        body: bytes,
        session: aiohttp.ClientSession,
        timeout_s: float,
    ) -> None:
        start = time.monotonic()
        limits = self._limits
        meter = StreamMeter(
            start, max_event_size=limits.max_upstream_event_bytes, choices=info.choices
        )
        status = 0  # no answer at all (connect error or timeout)
        headers = {"Content-Type": "application/json", "X-Request-Id": info.request_id}
        if backend.api_key:
            headers["Authorization"] = f"Bearer {backend.api_key}"
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with session.post(
                url,
                data=body,
                headers=headers,
                timeout=timeout,
                ssl=backend.ssl,
                server_hostname=backend.server_name,
            ) as resp:
                status = resp.status
                if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                    while meter.failure is None and (data := await resp.content.readany()):
                        meter.feed(data, time.monotonic())
                else:
                    answer = await _bounded(resp.content, limits.max_upstream_body_bytes)
                    if answer is None:
                        status = 0  # too large: a served request would have got an error
                    else:
                        meter.feed_body(answer, time.monotonic())
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass
        finally:
            self._open[policy] -= 1
        end = time.monotonic()
        fig = meter.figures(end)
        ok = 200 <= status < 300 and fig.error is None
        self._metrics.done(
            policy, backend.name, info.request_class, status, ttft=fig.ttft, e2e=end - start
        )
        if shadow_policy is not None:
            outcome = Outcome(
                status,
                ok,
                fig.prompt_tokens or 0,
                fig.completion_tokens or 0,
                fig.ttft,
                end - start,
                fig.tpot,
            )
            with contextlib.suppress(Exception):
                shadow_policy.on_finish(info, backend.name, outcome)

    async def aclose(self) -> None:
        """Cancel the shadow requests still open (at app shutdown)."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


async def _bounded(content: aiohttp.StreamReader, limit: int) -> bytes | None:
    """The whole body, or None (having stopped reading) once it passes ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
