"""The online TTFT predictor: predicted TTFT = prefill tokens ahead / learned prefill rate.

Per backend, the prefill rate (tokens/s) is the ratio of two exponentially weighted sums over
finished requests: tokens that had to be prefilled before the first token (the queue ahead,
as estimated at decision time, plus the request's own prompt) and the TTFT observed. The
ratio weights big prompts more than a mean of per-request rates would, so small requests
dominated by fixed overheads do not drag the estimate down. Until requests have been seen,
a configured prior carries the whole weight; it decays away as observations arrive.

Learning uses the same queue estimate the prediction uses, so a systematic bias in that
estimate (e.g. counting prompts already prefilled) is absorbed into the learned rate.
No clock is involved: the weights decay per observation.

Two smaller learners complete the picture of when a request would finish: ``TpotTracker``
(time per output token, from streamed outcomes) and ``PaceTracker`` (end-to-end seconds per
output token of batch work, streamed or not).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.schema import Reader
from policies.params import BuildContext
from policies.types import Candidate, Outcome, RequestInfo, group_of


def queued_prefill_tokens(c: Candidate, typical_prompt: float) -> float:
    """Prompt tokens waiting for prefill on ``c`` (before a new request would start).

    With a fresh scrape the engine's waiting count is trusted, sized by the router's mean
    open prompt (or ``typical_prompt`` when the router has none open there). Otherwise every
    open prompt the router knows of counts: an upper bound.
    """
    load = c.load
    if load is not None and not load.stale and load.waiting is not None:
        mean = c.outstanding_prompt_tokens / c.inflight if c.inflight else typical_prompt
        return load.waiting * mean
    return float(c.outstanding_prompt_tokens)


@dataclass(slots=True)
class _Rate:
    tokens: float
    seconds: float

    @property
    def per_s(self) -> float:
        return self.tokens / self.seconds


# The prediction error is the mean over each backend's last this many observed TTFTs.
ERROR_WINDOW = 200

# The prior counts as much as one observed tenth of a second of prefill: enough to steer the
# first decisions, little enough that a few real observations outweigh it.
PRIOR_SECONDS = 0.1
DEFAULT_PRIOR = 10_000.0


@dataclass(slots=True)
class TtftPredictor:
    """Learns each backend's prefill rate from outcomes and predicts TTFT.

    ``priors`` maps each backend name to its prior rate (tokens/s); a replica discovered
    behind one starts from that backend's (:func:`~policies.types.group_of`), any other
    backend first seen later from ``default_prior``. ``alpha`` is the weight
    of each new observation. ``pending_limit`` bounds the per-request memory kept between
    ``note`` and ``observe`` (oldest dropped first), so lost feedback cannot grow it.
    """

    priors: Mapping[str, float]
    default_prior: float = DEFAULT_PRIOR
    alpha: float = 0.1
    pending_limit: int = 10_000
    _rates: dict[str, _Rate] = field(init=False)
    _pending: OrderedDict[str, dict[str, tuple[float, float]]] = field(default_factory=OrderedDict)
    """Request id -> per backend, the queue estimate and the TTFT predicted from it."""
    _errors: dict[str, deque[float]] = field(default_factory=dict)
    """Per backend, the absolute percentage errors of its last predictions."""

    def __post_init__(self) -> None:
        self._rates = {
            name: _Rate(prior * PRIOR_SECONDS, PRIOR_SECONDS) for name, prior in self.priors.items()
        }

    def _rate(self, backend: str) -> _Rate:
        rate = self._rates.get(backend)
        if rate is None:
            prior = self.priors.get(group_of(backend), self.default_prior)
            rate = self._rates[backend] = _Rate(prior * PRIOR_SECONDS, PRIOR_SECONDS)
        return rate

    def rate(self, backend: str) -> float:
        """The current prefill-rate estimate for ``backend`` (tokens/s)."""
        return self._rate(backend).per_s

    def predict(self, backend: str, ahead_tokens: float, prompt_tokens: int) -> float:
        """Seconds to first token for ``prompt_tokens`` behind ``ahead_tokens``."""
        return (ahead_tokens + prompt_tokens) / self._rate(backend).per_s

    def note(self, req: RequestInfo, ahead: Mapping[str, float]) -> None:
        """Remember the queue estimates made for ``req`` (per backend), and the TTFT each
        predicts, until it finishes."""
        prompt = req.prompt_tokens
        self._pending[req.request_id] = {
            b: (a, self.predict(b, a, prompt)) for b, a in ahead.items()
        }
        while len(self._pending) > self.pending_limit:
            self._pending.popitem(last=False)

    def forget(self, backend: str) -> None:
        """Drop what was learned of ``backend`` (see :class:`policies.base.Forgets`)."""
        self._rates.pop(backend, None)
        self._errors.pop(backend, None)

    def error(self) -> dict[str, float]:
        """Per backend, the mean absolute percentage error (a ratio: 0.1 is 10%) of the TTFT
        predicted at decision time against the TTFT observed, over its last
        ``ERROR_WINDOW`` streamed requests; backends without any are absent."""
        return {b: sum(e) / len(e) for b, e in self._errors.items() if e}

    def observe(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        """Learn from a finished request.

        Failed and non-streamed requests teach nothing: a non-streamed response arrives
        whole, so its "first token" time includes the whole generation.
        """
        ahead, predicted = self._pending.pop(req.request_id, {}).get(backend, (0.0, None))
        ttft = outcome.ttft_s
        if not req.stream or not outcome.ok or ttft is None or ttft <= 0:
            return
        # The router's estimate, not the engine's usage: predictions are made in those units.
        tokens = ahead + (req.prompt_tokens or outcome.prompt_tokens)
        if tokens <= 0:
            return
        if predicted is not None:
            errors = self._errors.setdefault(backend, deque(maxlen=ERROR_WINDOW))
            errors.append(abs(predicted - ttft) / ttft)
        rate = self._rate(backend)
        rate.tokens = (1 - self.alpha) * rate.tokens + self.alpha * tokens
        rate.seconds = (1 - self.alpha) * rate.seconds + self.alpha * ttft


@dataclass(slots=True)
class TpotTracker:
    """Each backend's time per output token: an EWMA over streamed outcomes, from a prior.

    Used to predict when a request would finish (TTFT + output tokens x TPOT); the engines'
    decode speed under their current load is what decides whether borrowing one pays off.
    """

    priors: Mapping[str, float]
    default_prior: float = 0.01
    alpha: float = 0.1
    _tpot: dict[str, float] = field(init=False)
    _learned: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._tpot = dict(self.priors)

    def tpot(self, backend: str) -> float:
        """Seconds per output token expected on ``backend`` (a discovered replica starts from
        its configured backend's prior)."""
        tpot = self._tpot.get(backend)
        return tpot if tpot is not None else self.priors.get(group_of(backend), self.default_prior)

    def measured(self, backend: str) -> bool:
        """Whether any outcome of ``backend`` has been learned from (not the prior alone)."""
        return backend in self._learned

    def forget(self, backend: str) -> None:
        self._tpot.pop(backend, None)
        self._learned.discard(backend)

    def observe(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        """Learn from a finished streamed request that produced at least two tokens."""
        if not req.stream or not outcome.ok or outcome.tpot_s is None or outcome.tpot_s <= 0:
            return
        old = self.tpot(backend)
        self._tpot[backend] = old + self.alpha * (outcome.tpot_s - old)
        self._learned.add(backend)


@dataclass(slots=True)
class PaceTracker:
    """Each backend's recent batch pace: EWMA of end-to-end seconds per output token.

    Measured on finished batch requests, streamed or not (end-to-end time is observable
    either way), so it includes queueing and prefill under the backend's current load.
    """

    alpha: float = 0.1
    _pace: dict[str, float] = field(default_factory=dict)

    def pace(self, backend: str) -> float | None:
        """Seconds per output token of recent batch work on ``backend``; None before any."""
        return self._pace.get(backend)

    def forget(self, backend: str) -> None:
        self._pace.pop(backend, None)

    def observe(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        """Learn from a finished batch request that produced output."""
        if req.request_class != "batch" or not outcome.ok or outcome.e2e_s is None:
            return
        if outcome.output_tokens <= 0:
            return
        sample = outcome.e2e_s / outcome.output_tokens
        old = self._pace.get(backend)
        self._pace[backend] = sample if old is None else old + self.alpha * (sample - old)


def _per_engine(p: Reader, ctx: BuildContext, key: str, default: float) -> dict[str, float]:
    """``key``: one number for every backend, or a mapping engine kind -> number (others get
    ``default``). Returns backend name -> value."""
    by_engine: dict[str, float] = {}
    if isinstance(p.raw_value(key), Mapping):
        values = p.child(key)
        for engine in ctx.engines:
            if values.has(engine):
                by_engine[engine] = values.number(engine, default, low=1e-6)
        values.done()
    else:
        default = p.number(key, default, low=1e-6)
    return {b.name: by_engine.get(b.engine, default) for b in ctx.backends}


def read_predictor(p: Reader, ctx: BuildContext) -> TtftPredictor:
    """Params ``prefill_rate_prior`` (tokens/s: one number, or per engine kind) and
    ``learning_rate`` (the weight of each observation, default 0.1)."""
    priors = _per_engine(p, ctx, "prefill_rate_prior", DEFAULT_PRIOR)
    alpha = p.number("learning_rate", 0.1, low=0.001, high=1.0)
    return TtftPredictor(priors, alpha=alpha)


def read_tpot(p: Reader, ctx: BuildContext, alpha: float) -> TpotTracker:
    """Param ``tpot_prior_s`` (seconds per output token: one number, or per engine kind)."""
    return TpotTracker(_per_engine(p, ctx, "tpot_prior_s", 0.01), alpha=alpha)
