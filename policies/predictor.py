"""The online TTFT predictor: TTFT learned per backend from the request's own prompt and the
prefill queued ahead of it.

Per backend, predicted TTFT = ``c0 + c1 x (prompt + share x queued)``: ``c0`` the fixed cost
(front end, the step the request waits out), ``c1`` seconds per prompt token, ``share`` the
part of the queued prefill a new request actually waits behind. One engine prefilling one
queue has ``share == 1``; an engine of ``k`` data-parallel ranks balancing requests by their
pending prefill (vLLM's DP front end) puts a new request behind about a ``k``-th of the
queue, or none of it while a rank is free. The predictor does not need to know ``k``: it
learns all three online, by exponentially weighted least squares over finished streamed
requests, with the sums of requests that had a queue ahead kept apart and decaying with
those only (so a queue seen once in fifty requests is not forgotten over the next ten idle
ones). The prior (no fixed cost and ``c1 = 1 / prefill_rate_prior`` as two
pseudo-observations that age like real ones; one queue, with a small weight that does not
age) steers the first predictions and then decides only what the traffic never exercises:
an engine nobody queues on keeps ``share == 1``. An observation far off the line (a request
that met a rare stall) counts with a weight that shrinks with its error against the line's
recent errors, so one outlier moves the line by little.

Learning uses the same queue estimate the prediction uses, so a systematic bias in that
estimate (e.g. counting prompts already prefilled) is absorbed into the learned share.
No clock is involved: the weights decay per observation.

Two smaller learners complete the picture of when a request would finish: ``TpotTracker``
(time per output token, from streamed outcomes) and ``PaceTracker`` (end-to-end seconds per
output token of batch work, streamed or not).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.params import BuildContext
from policies.types import Candidate, Lesson, Outcome, RequestInfo, group_of
from turnout.common.schema import Reader


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


# Tokens are counted in thousands inside the fit, so its numbers stay near 1.
_UNIT = 1000.0
# The line's prior is two pseudo-observations (no prompt: no time; two thousand tokens: two
# thousand at the prior rate) weighing this much, decaying like real ones: it steers the first
# predictions and is gone after a few dozen requests.
PRIOR_WEIGHT = 0.05
# The share's prior (one queue: c2 == c1) keeps a constant weight, so it decides the share
# while nothing queues, and a few queued requests outweigh it.
_SHARE_PRIOR_WEIGHT = 0.01
# An observation whose log error |ln(TTFT / line)| exceeds this many times the recent mean
# log error counts with weight ``(that bound / its log error) ** 2``, so a rare stall moves
# the line little. The mean follows every observation: while the line is far off (a wrong
# prior) every error is large, the bound with them, and they count in full.
_OUTLIER_SPREADS = 3.0
_START_SPREAD = 0.5
# Keeps the fit solvable whatever the traffic (prompts all of one size, say).
_RIDGE = 1e-6
# The shortest TTFT the line predicts (seconds).
_FLOOR_S = 0.001
# The prediction error is the mean over each backend's last this many observed TTFTs.
ERROR_WINDOW = 200
DEFAULT_PRIOR = 10_000.0


def _sums(n: int) -> list[list[float]]:
    return [[0.0] * (n + 1) for _ in range(n)]  # each row: x_i x_j ..., then x_i y


@dataclass(slots=True)
class _Fit:
    """One backend's weighted sums and the line they give (module docstring): seconds
    ``c0 + c1 x prompt + c2 x queued``, tokens in thousands, ``c2 = share x c1``.

    Requests with nothing queued ahead and those with a queue keep separate sums: the first
    decay with every observation, the second only with queued ones, so a queue seen once in
    fifty requests is remembered over the last few queued requests, not forgotten over the
    next ten idle ones.
    """

    c1_prior: float
    idle: list[list[float]] = field(default_factory=lambda: _sums(2))
    queued: list[list[float]] = field(default_factory=lambda: _sums(3))
    coef: tuple[float, float, float] = (0.0, 0.0, 0.0)
    spread: float = _START_SPREAD
    """The recent mean log error of the line."""

    def __post_init__(self) -> None:
        self.coef = (0.0, self.c1_prior, self.c1_prior)
        for x in (0.0, 2.0):
            _accumulate(self.idle, (1.0, x), x * self.c1_prior, 1.0, PRIOR_WEIGHT)

    @property
    def share(self) -> float:
        return self.coef[2] / self.coef[1]

    def predict(self, prompt: float, queued: float) -> float:
        """TTFT for ``prompt`` thousand tokens behind ``queued`` thousand."""
        c0, c1, c2 = self.coef
        return max(_FLOOR_S, c0 + c1 * prompt + c2 * queued)

    def add(self, prompt: float, queued: float, y: float, alpha: float) -> None:
        """Learn from one observation: it weighs ``alpha`` (less if an outlier), and the sums
        it belongs with decay by ``1 - alpha`` first."""
        miss = abs(math.log(y / self.predict(prompt, queued)))
        bound = _OUTLIER_SPREADS * self.spread
        weight = alpha * (min(1.0, bound / miss) ** 2 if miss else 1.0)
        self.spread += alpha * (miss - self.spread)
        keep = 1 - alpha
        if queued > 0:
            _accumulate(self.queued, (1.0, prompt, queued), y, keep, weight)
            _accumulate(self.idle, (1.0, prompt), y, keep, 0.0)
        else:
            _accumulate(self.idle, (1.0, prompt), y, keep, weight)
        self.coef = self._solve()

    def _solve(self) -> tuple[float, float, float]:
        """Least squares over both sums, ``c2`` pulled towards ``c1``; where the fit makes
        the fixed cost or the per-token cost negative, the line through the origin instead
        (no request takes less than no time); the share is kept within 0 to 1."""
        m = [row[:] for row in self.queued]
        for i in range(2):
            for j in range(2):
                m[i][j] += self.idle[i][j]
            m[i][3] += self.idle[i][2]
        w = _SHARE_PRIOR_WEIGHT
        m[1][1] += w
        m[2][2] += w
        m[1][2] -= w
        m[2][1] -= w
        for i in range(3):
            m[i][i] += _RIDGE
        c0, c1, c2 = _solve(m, [0, 1, 2])
        if c0 < 0 or c1 <= 0:  # prompts of too narrow a range to tell the two apart
            _, c1, c2 = _solve(m, [1, 2])
            c0 = 0.0
        c1 = max(c1, 1e-9)
        return (c0, c1, min(c1, max(0.0, c2)))


def _accumulate(
    sums: list[list[float]], x: tuple[float, ...], y: float, keep: float, weight: float
) -> None:
    for i, xi in enumerate(x):
        row = sums[i]
        for j, xj in enumerate(x):
            row[j] = keep * row[j] + weight * xi * xj
        row[-1] = keep * row[-1] + weight * xi * y


def _solve(m: list[list[float]], free: list[int]) -> tuple[float, float, float]:
    """The normal equations ``m`` (rows: coefficients, then the right-hand side) solved over
    the ``free`` coefficients, the others held at zero (Gauss-Jordan; ``m`` is positive
    definite)."""
    a = [[m[i][j] for j in free] + [m[i][-1]] for i in free]
    n = len(free)
    for col in range(n):
        pivot = a[col][col]
        for r in range(n):
            if r != col:
                f = a[r][col] / pivot
                for k in range(col, n + 1):
                    a[r][k] -= f * a[col][k]
    out = [0.0, 0.0, 0.0]
    for k, i in enumerate(free):
        out[i] = a[k][n] / a[k][k]
    return (out[0], out[1], out[2])


@dataclass(slots=True)
class TtftPredictor:
    """Learns each backend's TTFT line from outcomes and predicts TTFT (module docstring).

    ``priors`` maps each backend name to its prior prefill rate (tokens/s); a replica
    discovered behind one starts from that backend's (:func:`~policies.types.group_of`), any
    other backend first seen later from ``default_prior``. ``alpha`` is the weight of each
    new observation (older ones decay by ``1 - alpha``). ``pending_limit`` bounds the
    per-request memory kept between ``note`` and ``observe`` (oldest dropped first), so lost
    feedback cannot grow it.
    """

    priors: Mapping[str, float]
    default_prior: float = DEFAULT_PRIOR
    alpha: float = 0.1
    pending_limit: int = 10_000
    _fits: dict[str, _Fit] = field(default_factory=dict)
    _pending: OrderedDict[str, dict[str, tuple[float, float]]] = field(default_factory=OrderedDict)
    """Request id -> per backend, the queue estimate and the TTFT predicted from it."""
    _errors: dict[str, deque[float]] = field(default_factory=dict)
    """Per backend, the absolute percentage errors of its last predictions."""

    def _fit(self, backend: str) -> _Fit:
        fit = self._fits.get(backend)
        if fit is None:
            prior = self.priors.get(backend) or self.priors.get(group_of(backend))
            fit = self._fits[backend] = _Fit(_UNIT / (prior or self.default_prior))
        return fit

    def rate(self, backend: str) -> float:
        """The learned prefill rate of a request's own prompt on ``backend`` (tokens/s)."""
        return _UNIT / self._fit(backend).coef[1]

    def fixed_s(self, backend: str) -> float:
        """The learned fixed cost of a request on ``backend`` (seconds)."""
        return self._fit(backend).coef[0]

    def share(self, backend: str) -> float:
        """The learned part of the queued prefill a new request waits behind (0 to 1)."""
        return self._fit(backend).share

    def predict(self, backend: str, ahead_tokens: float, prompt_tokens: int) -> float:
        """Seconds to first token for ``prompt_tokens`` behind ``ahead_tokens``."""
        return self._fit(backend).predict(prompt_tokens / _UNIT, ahead_tokens / _UNIT)

    def note(
        self,
        req: RequestInfo,
        ahead: Mapping[str, float],
        predicted: Mapping[str, float] | None = None,
    ) -> None:
        """Remember the queue estimates made for ``req`` (per backend), and the TTFT each
        predicts (``predicted``, when the caller has them already), until it finishes."""
        prompt = req.prompt_tokens
        if predicted is None:
            predicted = {b: self.predict(b, a, prompt) for b, a in ahead.items()}
        self._pending[req.request_id] = {b: (a, predicted[b]) for b, a in ahead.items()}
        while len(self._pending) > self.pending_limit:
            self._pending.popitem(last=False)

    def forget(self, backend: str) -> None:
        """Drop what was learned of ``backend`` (see :class:`policies.base.Forgets`)."""
        self._fits.pop(backend, None)
        self._errors.pop(backend, None)

    def error(self) -> dict[str, float]:
        """Per backend, the mean absolute percentage error (a ratio: 0.1 is 10%) of the TTFT
        predicted at decision time against the TTFT observed, over its last
        ``ERROR_WINDOW`` streamed requests; backends without any are absent."""
        return {b: sum(e) / len(e) for b, e in self._errors.items() if e}

    def lesson(self, req: RequestInfo, backend: str, outcome: Outcome) -> Lesson:
        """What the finished ``req`` teaches, with the queue estimate noted for it on
        ``backend`` (none: 0); changes nothing."""
        ahead, _ = self._pending.get(req.request_id, {}).get(backend, (0.0, None))
        # The router's estimate, not the engine's usage: predictions are made in those units.
        prompt = req.prompt_tokens or outcome.prompt_tokens
        return Lesson(backend, req.request_class, req.stream, prompt, ahead, outcome)

    def observe(self, req: RequestInfo, backend: str, outcome: Outcome) -> Lesson:
        """Learn from a request this process sent, and score the TTFT predicted for it
        (:meth:`error`); returns its :meth:`lesson`."""
        lesson = self.lesson(req, backend, outcome)
        _, predicted = self._pending.pop(req.request_id, {}).get(backend, (0.0, None))
        ttft = outcome.ttft_s
        if predicted is not None and ttft is not None and _teaches(lesson):
            errors = self._errors.setdefault(backend, deque(maxlen=ERROR_WINDOW))
            errors.append(abs(predicted - ttft) / ttft)
        self.learn(lesson)
        return lesson

    def learn(self, lesson: Lesson) -> None:
        """Learn from a finished request, whichever router process served it.

        Failed and non-streamed requests teach nothing: a non-streamed response arrives
        whole, so its "first token" time includes the whole generation.
        """
        ttft = lesson.outcome.ttft_s
        if ttft is not None and _teaches(lesson):
            fit = self._fit(lesson.backend)
            fit.add(lesson.prompt_tokens / _UNIT, lesson.ahead_tokens / _UNIT, ttft, self.alpha)


def _teaches(lesson: Lesson) -> bool:
    """Whether ``lesson`` holds a TTFT to learn the line from (module docstring)."""
    outcome = lesson.outcome
    ttft = outcome.ttft_s
    if not lesson.stream or not outcome.ok or ttft is None or ttft <= 0:
        return False
    return lesson.prompt_tokens + lesson.ahead_tokens > 0


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

    def learn(self, lesson: Lesson) -> None:
        """Learn from a finished streamed request that produced at least two tokens."""
        outcome, backend = lesson.outcome, lesson.backend
        if not lesson.stream or not outcome.ok or outcome.tpot_s is None or outcome.tpot_s <= 0:
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

    def learn(self, lesson: Lesson) -> None:
        """Learn from a finished batch request that produced output."""
        outcome, backend = lesson.outcome, lesson.backend
        if lesson.request_class != "batch" or not outcome.ok or outcome.e2e_s is None:
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
