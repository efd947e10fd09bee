"""Per-request fault plans: the profile's fault knobs combined with ``X-Emulator-Fault``.

Header syntax: ``X-Emulator-Fault: status=503; drop_after=K; stall=T``, any subset, separated
by ``;``. ``status`` answers the request with that HTTP status (429, 500 or 503) and an error
body; ``drop_after`` aborts the connection after K streamed tokens (no final chunk, no
``[DONE]``); ``stall`` waits T real seconds before the response headers. Header values win
over the profile's knobs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from emulator.api import ApiError
from emulator.profiles import ERROR_STATUSES, Faults

HEADER = "X-Emulator-Fault"


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What to do wrong for one request."""

    status: int | None = None
    drop_after: int | None = None
    stall: float = 0.0


def parse_header(value: str) -> FaultPlan:
    """Parse the header; a malformed header is the client's error (400)."""
    status: int | None = None
    drop_after: int | None = None
    stall = 0.0
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
                stall = float(raw)
                if not 0 <= stall <= 3600:
                    raise ValueError(raw)
            else:
                raise ValueError(key)
        except ValueError:
            raise ApiError(
                400,
                f"Bad {HEADER} header {value!r}: expected `status=429|500|503; drop_after=K; "
                "stall=SECONDS`.",
            ) from None
    return FaultPlan(status=status, drop_after=drop_after, stall=stall)


def plan_for(header: str | None, faults: Faults, rng: random.Random) -> FaultPlan:
    """Combine the header with the profile's knobs (the header wins field by field)."""
    given = parse_header(header) if header else FaultPlan()
    status = given.status
    if status is None and faults.error_rate > 0 and rng.random() < faults.error_rate:
        status = faults.error_status
    drop = given.drop_after if given.drop_after is not None else faults.drop_after
    stall = given.stall if given.stall else faults.stall
    return FaultPlan(status=status, drop_after=drop, stall=stall)


def injected_error(status: int) -> ApiError:
    """The error an injected fault answers with."""
    return ApiError(status, f"Injected fault: HTTP {status} from the emulator.")
