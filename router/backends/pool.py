"""Live backend state (in-flight work, health, models, scraped load) and candidate snapshots.

Two pool-wide guards keep passive ejection from taking a fleet down (as Envoy's outlier
detection does): at most ``max_ejected_fraction`` of all backends may be ejected at once, and
when every backend serving a model is out, the model is served by all of them anyway (panic
mode).
"""

from __future__ import annotations

import logging
import math
import os
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from policies.candidates import Candidates
from policies.types import Candidate, EngineLoad, RequestInfo, group_of
from router.backends.breaker import Breaker
from router.backends.grants import FleetShare
from router.backends.serving import Serving, ServingSets
from router.backends.shared import Slot, WorkerRow
from router.config.backends import ClientTls, client_tls
from router.config.model import BackendSpec, HealthSettings

log = logging.getLogger("router")
Clock = Callable[[], float]


class BackendState:
    """One backend as the router sees it. Mutated only from the event loop."""

    def __init__(
        self,
        spec: BackendSpec,
        health: HealthSettings,
        clock: Clock,
        may_eject: Callable[[], bool] = lambda: True,
        shared: Slot | None = None,
        changed: Callable[[], None] = lambda: None,
        granted: bool = False,
    ) -> None:
        """``changed`` is called when what decides the pool's candidate sets changes: the
        spec, health, ejection, models or context length (see :class:`Pool`). ``granted``:
        the router's replicas share ``max_inflight`` by slot grants (see :attr:`limit`)."""
        self._changed = changed
        self._spec = spec
        self._health = health
        self._clock = clock
        self.api_key: str | None = os.environ.get(spec.api_key_env) if spec.api_key_env else None
        self.tls: ClientTls | None = client_tls(spec)
        """Every client of this backend talks TLS with this (None: plain HTTP)."""
        # This process's requests on the backend; with ``shared``, every worker's are summed
        # there (router.backends.shared) and that sum is what the properties below read.
        self._inflight = self._prompt = self._output = 0
        self._shared = shared
        self._claims = 0  # slots taken by admission that no lease has adopted yet
        self.elsewhere = 0
        """Requests other router replicas have in flight here, as last heard
        (router.backends.fleet_load): the policies see them beside this router's."""
        self.fleet = FleetShare(shared, granted)
        """This router's share of the backend's ``max_inflight`` among its replicas."""
        self._probe_ok = True
        self._probe_failures = 0
        self.breaker = Breaker(
            health.failures_to_eject,
            health.cooldown,
            health.cooldown_max,
            clock,
            may_eject,
            changed,
        )
        self._models: tuple[str, ...] = ()
        self._context: int | None = None
        self.load: EngineLoad | None = None
        self._load_at = 0.0

    def _set(self, attr: str, value: object) -> None:
        if getattr(self, attr) != value:
            setattr(self, attr, value)
            self._changed()

    @property
    def spec(self) -> BackendSpec:
        return self._spec

    @spec.setter
    def spec(self, spec: BackendSpec) -> None:
        self._set("_spec", spec)

    @property
    def probe_ok(self) -> bool:
        """Its health probes pass (see :meth:`probe_result`)."""
        return self._probe_ok

    @probe_ok.setter
    def probe_ok(self, ok: bool) -> None:
        self._set("_probe_ok", ok)

    @property
    def discovered_models(self) -> tuple[str, ...]:
        """The models its /v1/models listed."""
        return self._models

    @discovered_models.setter
    def discovered_models(self, models: tuple[str, ...]) -> None:
        self._set("_models", models)

    @property
    def context_tokens(self) -> int | None:
        """The context length its /v1/models reports (vLLM's ``max_model_len``), if any."""
        return self._context

    @context_tokens.setter
    def context_tokens(self, tokens: int | None) -> None:
        self._set("_context", tokens)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ssl(self) -> ssl.SSLContext | bool:
        """aiohttp's ``ssl`` argument for this backend (True: its default, unused for http)."""
        return self.tls.context if self.tls is not None else True

    @property
    def server_name(self) -> str | None:
        """aiohttp's ``server_hostname`` argument: the configured TLS server name, if any."""
        return self.tls.server_name if self.tls is not None else None

    def figures(self) -> tuple[int, int, int]:
        """Requests in flight, outstanding prompt and output tokens: over every worker of the
        router when they share their load, else this process's; the requests in flight
        include :attr:`elsewhere`."""
        inflight, prompt, output = self.own_figures()
        return inflight + self.elsewhere, prompt, output

    def own_figures(self) -> tuple[int, int, int]:
        """:meth:`figures` of this router alone (all its workers)."""
        if self._shared is None:
            return self._inflight, self._prompt, self._output
        return self._shared.totals()

    @property
    def inflight(self) -> int:
        return self.figures()[0]

    @property
    def limit(self) -> int | None:
        """The most requests in flight (:attr:`inflight`, the fleet's as heard) that leave
        room here: ``max_inflight``, or, under a grant, the grant plus :attr:`elsewhere`, so
        that room means this router's own requests are fewer than its grant."""
        cap = self.spec.max_inflight
        if cap is None:
            return None
        grant = self.fleet.grant
        return cap if grant is None else grant + self.elsewhere

    @property
    def outstanding_prompt(self) -> int:
        return self.figures()[1]

    @property
    def outstanding_output(self) -> int:
        return self.figures()[2]

    def _count(self, inflight: int, prompt: int, output: int) -> None:
        """Add to this process's figures (only :class:`BackendLease` calls it)."""
        if self._shared is not None:
            self._shared.add(inflight, prompt, output)
        else:
            self._inflight += inflight
            self._prompt += prompt
            self._output += output

    def claim(self) -> None:
        """Count one more request in flight here now, for the lease its attempt opens next
        (which adopts it rather than counting again): admission takes the slot in the same
        step as it finds it free, under a lock the router's workers share."""
        self._claims += 1
        self._count(1, 0, 0)

    def drop_claims(self) -> None:
        """Give back the slots claimed that no lease adopted (a request gone between its
        admission and its attempt)."""
        if self._claims:
            self._count(-self._claims, 0, 0)
            self._claims = 0

    def _adopt(self) -> bool:
        if self._claims:
            self._claims -= 1
            return True
        return False

    @property
    def healthy(self) -> bool:
        """Probes pass and the breaker lets a request through (see router.backends.breaker)."""
        return self.probe_ok and self.breaker.allows()

    @property
    def models(self) -> tuple[str, ...]:
        """Configured models, else those the backend's /v1/models listed."""
        return self.spec.models or self.discovered_models

    def lease(self, req: RequestInfo) -> BackendLease:
        """Count ``req`` as in flight here until the returned lease is released."""
        return BackendLease(self, req)

    def probe_result(self, ok: bool, *, first: bool = False, problem: str = "") -> None:
        """Active probe: down after ``failures_to_eject`` misses, up again on one success.

        The ``first`` probe (at startup) decides alone: nothing vouches for the backend yet.
        ``problem`` says what the failed probe met; each change is logged once, with it.
        """
        if ok:
            if not self.probe_ok:
                log.info("backend %s is up: its health probe passes again", self.name)
            self._probe_failures = 0
            self.probe_ok = True
            return
        self._probe_failures += 1
        if self.probe_ok and (first or self._probe_failures >= self._health.failures_to_eject):
            self.probe_ok = False
            misses = "its first health probe" if first else (
                f"{self._probe_failures} health probes in a row")  # fmt: skip
            log.warning("backend %s is down: %s failed (%s)", self.name, misses, problem)

    def set_load(self, load: EngineLoad) -> None:
        self.load = load
        self._load_at = self._clock()

    def candidate(self) -> Candidate:
        load = self.load
        if load is not None:
            age = self._clock() - self._load_at
            load = replace(load, age_s=age, stale=age > self._health.scrape_stale_after)
        inflight, prompt, output = self.figures()
        return Candidate(
            name=self.spec.name,
            engine=self.spec.engine,
            healthy=self.healthy,
            inflight=inflight,
            max_inflight=self.limit,
            outstanding_prompt_tokens=prompt,
            outstanding_output_tokens=output,
            load=load,
            priority_capable=self.spec.priority_capable,
        )

    def describe(self) -> dict[str, object]:
        """The ``/turnout/backends`` entry."""
        load = self.load
        inflight, prompt, output = self.figures()
        return {
            "name": self.spec.name,
            "url": self.spec.url,
            "engine": self.spec.engine,
            "healthy": self.healthy,
            "breaker": self.breaker.state,
            "inflight": inflight,
            "max_inflight": self.spec.max_inflight,
            "grant": self.fleet.grant if self.spec.max_inflight is not None else None,
            "outstanding_prompt_tokens": prompt,
            "outstanding_output_tokens": output,
            "models": list(self.models),
            "context_tokens": self.context_tokens,
            "priority_capable": self.spec.priority_capable,
            "load": None
            if load is None
            else {
                "waiting": load.waiting,
                "running": load.running,
                "kv_cache_usage": load.kv_cache_usage,
                "kv_cache_tokens": load.kv_cache_tokens,
            },
        }


class BackendLease:
    """One request's hold on a backend's in-flight figures: the only writer of them.

    Opened by :meth:`BackendState.lease` when an attempt starts; :meth:`release` (idempotent)
    when the attempt fails or the answer ends, however it ends. The breaker hears of the
    attempt's fate through :meth:`ok` and :meth:`failed`, with the ticket it gave the attempt
    when it started (so a verdict counts only in the breaker state it was sent in).
    """

    __slots__ = ("_backend", "_output", "_prefilled", "_released", "_req", "_ticket")

    def __init__(self, backend: BackendState, req: RequestInfo) -> None:
        self._backend = backend
        self._req = req
        self._output = req.expected_output_tokens
        self._prefilled = False
        self._released = False
        self._ticket = backend.breaker.started()
        backend._count(0 if backend._adopt() else 1, req.prompt_tokens, self._output)

    @property
    def backend(self) -> BackendState:
        return self._backend

    def prefilled(self) -> None:
        """The first content arrived: the prompt no longer waits for prefill.

        From here on the backend's ``outstanding_prompt`` excludes this request, which is what
        the TTFT predictor needs (prompt tokens still waiting for prefill).
        """
        if not self._prefilled and not self._released:
            self._prefilled = True
            self._backend._count(0, -self._req.prompt_tokens, 0)

    def ok(self) -> None:
        """The backend answered properly: the breaker's run of failures ends."""
        breaker, ticket = self._backend.breaker, self._ticket
        self._ticket = breaker.ok(ticket)
        if self._ticket != ticket:  # a new epoch: this was the probe, and it closed the breaker
            log.info("backend %s is back in service: a trial request after its ejection "
                     "succeeded", self._backend.name)  # fmt: skip

    def failed(self) -> None:
        """A failure that is the backend's (see the breaker): eject after enough in a row."""
        b = self._backend
        was_out = b.breaker.ejected
        b.breaker.failed(self._ticket)
        if not was_out and b.breaker.ejected:  # a failed probe only keeps it out: no change
            log.warning("backend %s is ejected for %g s: %d requests in a row failed",
                        b.name, b.breaker.cooldown, b._health.failures_to_eject)  # fmt: skip

    def release(self) -> None:
        """The attempt is over; later calls do nothing."""
        if self._released:
            return
        self._released = True
        b, req = self._backend, self._req
        b.breaker.ended(self._ticket)
        prompt = 0 if self._prefilled else req.prompt_tokens
        b._count(-1, -prompt, -self._output)


class Pool:
    """All backends plus model aliases: which backends can serve a model, under what name.

    The ejection cap counts all backends, not a model's: Envoy caps a cluster, and a router's
    backends are one. A model served by only some of them is covered by panic mode instead.

    The set changes only through :meth:`add` and :meth:`remove` (router.backends.fleet):
    a removed backend's object lives on in the leases of its requests still in flight.

    Per model, the backends that serve it are kept between requests (router.backends.serving)
    and dropped whenever a backend's health, ejection, models, spec or membership changes, or
    the aliases do: a request costs the same whatever the fleet's size.
    """

    def __init__(
        self,
        specs: Sequence[BackendSpec],
        aliases: Mapping[str, Mapping[str, str]],
        health: HealthSettings,
        clock: Clock = time.monotonic,
        on_panic: Callable[[str], None] = lambda model: None,
        shared: WorkerRow | None = None,
        granted: bool = False,
    ) -> None:
        """``shared``: this worker's row of the load its router's workers share;
        ``granted``: its replicas share each ``max_inflight`` by slot grants
        (router.backends.grants)."""
        self._health = health
        self._shared = shared
        self._granted = granted
        self._clock = clock
        self._on_panic = on_panic
        self._aliases = aliases
        self._sets = ServingSets(self._upstream_model, clock)
        # Discovered entries join as their replicas are found (router.backends.fleet).
        self.backends = [self.state(s) for s in specs if s.discover is None]
        self.by_name = {b.name: b for b in self.backends}

    @property
    def aliases(self) -> Mapping[str, Mapping[str, str]]:
        return self._aliases

    @aliases.setter
    def aliases(self, aliases: Mapping[str, Mapping[str, str]]) -> None:
        self._aliases = aliases
        self._sets.clear()

    def state(self, spec: BackendSpec) -> BackendState:
        """A backend for ``spec`` under this pool's settings, not yet in it (see :meth:`add`)."""
        slot = self._shared.slot(spec.name) if self._shared is not None else None
        return BackendState(
            spec, self._health, self._clock, self._may_eject, slot, self._sets.clear,
            self._granted,
        )  # fmt: skip

    def add(self, backend: BackendState) -> None:
        """``backend`` is offered to policies from now on (its name must be new)."""
        self.backends.append(backend)
        self.by_name[backend.name] = backend
        self._sets.clear()

    def remove(self, name: str) -> BackendState | None:
        """Offer ``name`` no more; the requests it holds finish on the returned object."""
        backend = self.by_name.pop(name, None)
        if backend is not None:
            self.backends.remove(backend)
            self._sets.clear()
        return backend

    def member(self, name: str) -> BackendState | None:
        """The first healthy backend a configured name stands for (itself, or one of its
        discovered replicas), else the first of them; None when there are none. Kept between
        requests like the candidate sets (shadowing asks on every mirrored request)."""
        offered = self._sets.group(name, self.backends).backends
        return offered[0] if offered else None

    def _may_eject(self) -> bool:
        """The ejection cap: one more backend may be ejected without passing it."""
        # The epsilon keeps 0.3 * 10 from rounding down to 2.
        cap = math.floor(self._health.max_ejected_fraction * len(self.backends) + 1e-9)
        return sum(b.breaker.ejected for b in self.backends) < cap

    def upstream_model(self, backend: BackendState, model: str) -> str | None:
        """The model name ``backend`` knows client ``model`` by; None if it cannot serve it."""
        return self._upstream_model(backend, model)

    def _upstream_model(self, backend: BackendState, model: str) -> str | None:
        alias = self._aliases.get(model)
        if alias is not None:
            return alias.get(group_of(backend.name))
        served = backend.models
        if not served or model in served:
            return model
        return None

    def known_model(self, model: str) -> bool:
        return bool(self._serving(model).served)

    def candidates(self, model: str) -> Candidates:
        """Healthy backends that can serve ``model``, as a view whose snapshots are taken
        when a policy reads them (policies/candidates.py).

        Panic mode: when none of them is healthy (probes failing or breaker open), all of
        them are offered as healthy. A whole fleet found out is more often a wrong verdict (or
        one about to expire) than a dead fleet, and an attempt costs little next to a certain
        503; failover still moves past the ones that really are down.
        """
        serving = self._serving(model)
        if serving.panic:
            # Backends listing no models serve any name: label only names the pool knows.
            self._on_panic(model if model in self._sets.named else "other")
        return serving.members.view()

    def serving(self, model: str) -> tuple[BackendState, ...]:
        """The backends :meth:`candidates` offers for ``model``, in order."""
        return self._serving(model).backends

    def context_tokens(self, model: str) -> int:
        """The most tokens one request for ``model`` can use: the smallest context length
        its backends report, else
        :data:`router.backends.serving.DEFAULT_CONTEXT_TOKENS`."""
        return self._serving(model).context

    def _serving(self, model: str) -> Serving:
        return self._sets.get(model, self.backends, self._aliases)

    def model_ids(self) -> list[str]:
        """The union of every backend's models and the configured aliases, sorted."""
        return sorted(self._sets.ids(self.backends, self._aliases))

    def any_healthy(self) -> bool:
        return any(b.healthy for b in self.backends)
