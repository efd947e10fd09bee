"""Per-request fault plans: the profile's fault knobs combined with ``X-Emulator-Fault``.

Header syntax: ``X-Emulator-Fault: status=503; drop_after=K; stall=T; first_token_stall=S;
slow_decode=F; slow_tokens=N``, any subset, separated by ``;``. ``status`` answers the request
with that HTTP status (429, 500 or 503) and an error body; ``drop_after`` aborts the connection
after K streamed tokens (no final chunk, no ``[DONE]``); ``stall`` waits T real seconds before
the response headers. The stragglers live in the engine model, so they run in virtual time too
(``replay simulate``): ``first_token_stall`` holds the first content token S model seconds
(the headers go at once); ``slow_decode`` makes the tokens after the first F times slower for
``slow_tokens`` tokens (default the profile's). Header values win over the profile's knobs;
without them the engine draws stragglers at the profile's rates (:func:`draw_stragglers`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from emulator.api import ApiError
from emulator.profiles import ERROR_STATUSES, Faults
from emulator.rank import Sequence

HEADER = "X-Emulator-Fault"


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What to do wrong for one request."""

    status: int | None = None
    drop_after: int | None = None
    stall: float = 0.0
    first_token_stall: float | None = None
    slow_decode: int | None = None
    slow_tokens: int | None = None

    def mark(self, seq: Sequence, faults: Faults) -> None:
        """Give ``seq`` the stragglers the header asked for (the rest the engine draws)."""
        if self.first_token_stall is not None:
            seq.stall = self.first_token_stall
        if self.slow_decode is not None:
            seq.slow_factor = self.slow_decode
            tokens = self.slow_tokens
            seq.slow_tokens = faults.slow_decode_tokens if tokens is None else tokens


def draw_stragglers(seq: Sequence, faults: Faults, rng: random.Random) -> None:
    """Decide at the profile's rates what ``seq`` was not told by its request."""
    if seq.stall is None:
        rate = faults.first_token_stall_rate
        seq.stall = faults.first_token_stall if rate and rng.random() < rate else 0.0
    if seq.slow_factor is None:
        rate = faults.slow_decode_rate
        slow = bool(rate) and rng.random() < rate
        seq.slow_factor = faults.slow_decode_factor if slow else 1
        seq.slow_tokens = faults.slow_decode_tokens if slow else 0


def _number(raw: str, low: float, high: float) -> float:
    x = float(raw)
    if not low <= x <= high:
        raise ValueError(raw)
    return x


def parse_header(value: str) -> FaultPlan:
    """Parse the header; a malformed header is the client's error (400)."""
    status: int | None = None
    drop_after: int | None = None
    stall = 0.0
    first: float | None = None
    slow: int | None = None
    slow_tokens: int | None = None
    for part in value.split(";"):
        part = part.strip()
        if not part:
            continue
        key, sep, raw = part.partition("=")
        key, raw = key.strip(), raw.strip()
        try:
            if not sep:
                raise ValueError(part)
            if key == "status":
                status = int(raw)
                if status not in ERROR_STATUSES:
                    raise ValueError(raw)
            elif key == "drop_after":
                drop_after = int(raw)
                if drop_after < 0:
                    raise ValueError(raw)
            elif key == "stall":
                stall = _number(raw, 0, 3600)
            elif key == "first_token_stall":
                first = _number(raw, 0, 3600)
            elif key == "slow_decode":
                slow = int(_number(raw, 1, 1000))
            elif key == "slow_tokens":
                slow_tokens = int(_number(raw, 0, 1_000_000))
            else:
                raise ValueError(key)
        except ValueError:
            raise ApiError(
                400,
                f"Bad {HEADER} header {value!r}: expected `status=429|500|503; drop_after=K; "
                "stall=SECONDS; first_token_stall=SECONDS; slow_decode=FACTOR; slow_tokens=N`.",
            ) from None
    return FaultPlan(status, drop_after, stall, first, slow, slow_tokens)


def plan_for(header: str | None, faults: Faults, rng: random.Random) -> FaultPlan:
    """Combine the header with the profile's knobs (the header wins field by field)."""
    given = parse_header(header) if header else FaultPlan()
    status = given.status
    if status is None and faults.error_rate > 0 and rng.random() < faults.error_rate:
        status = faults.error_status
    drop = given.drop_after if given.drop_after is not None else faults.drop_after
    stall = given.stall if given.stall else faults.stall
    return FaultPlan(
        status, drop, stall, given.first_token_stall, given.slow_decode, given.slow_tokens
    )


def injected_error(status: int) -> ApiError:
    """The error an injected fault answers with."""
    return ApiError(status, f"Injected fault: HTTP {status} from the emulator.")
