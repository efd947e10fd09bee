"""Sessions in ``replay simulate``: a conversation's turns go one after another, each after
the answer before it and its think time, as the live replayer sends them (replay.sessions)."""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from emulator.rank import Sequence
from replay.plan import Planned
from replay.sessions import Turn
from replay.simulate.attempts import Flight
from replay.simulate.requests import SimTurn
from replay.sources import Item

SESSIONS = 100_000
"""Conversations remembered at once (the least recently continued idle one goes first)."""


@dataclass(slots=True)
class Session:
    """A conversation in simulate: its last turn, and turns waiting for its answer."""

    busy: bool = False
    """A turn is in flight or scheduled: later turns wait."""
    last: SimTurn | None = None
    ended: float = 0.0
    waiting: deque[Planned] = field(default_factory=deque)


class Conversations:
    """Every session of one simulation, and the turns due at a time of their own."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self.ready: list[tuple[float, int, Planned]] = []
        """Turns due after an answer (and closed-loop requests), soonest first."""
        self.queued = 0
        """Turns waiting for an answer: engines then run step by step."""

    def follow(self, planned: Planned) -> None:
        heapq.heappush(self.ready, (planned.at, planned.item.row, planned))

    def begin(self, planned: Planned, now: float, ready: bool) -> tuple[bool, SimTurn | None]:
        """Whether ``planned``'s turn goes now (else it waits for its session), and the turn
        it continues."""
        item = planned.item
        if item.session is None:
            return True, None
        s = self._session(item.session)
        if not ready and s.busy:  # after the answer in flight (see replay.sessions)
            s.waiting.append(planned)
            self.queued += 1
            return False, None
        delay = item.delay or 0.0
        if not ready and s.last is not None and s.ended + delay > now:  # thinking still
            s.busy = True
            heapq.heappush(self.ready, (s.ended + delay, item.row, planned))
            return False, None
        s.busy = True
        return True, s.last

    def turn_over(self, item: Item, last: SimTurn | None, now: float) -> None:
        """A session's turn ended (``last`` None: it failed): its next turn may go."""
        if item.session is None:
            return
        s = self._session(item.session)
        s.busy, s.last, s.ended = False, last, now
        if s.waiting:
            planned = s.waiting.popleft()
            self.queued -= 1
            s.busy = True
            heapq.heappush(
                self.ready, (now + (planned.item.delay or 0.0), planned.item.row, planned)
            )

    def _session(self, name: str) -> Session:
        s = self._sessions.get(name)
        if s is None:
            s = self._sessions[name] = Session()
            if len(self._sessions) > SESSIONS:  # forget the least recently continued idle one
                idle = next((k for k, v in self._sessions.items() if not v.busy), None)
                if idle is not None:
                    del self._sessions[idle]
        self._sessions.move_to_end(name)
        return s


def sim_turn(f: Flight, seq: Sequence) -> SimTurn:
    """What the next turn of ``f``'s session continues, from its answer ``seq``."""
    routed, n = f.routed, seq.generated
    messages: tuple[Mapping[str, Any], ...] = ()
    answer = ""
    if routed.doc is not None:  # a recorded turn: the next one continues its messages
        messages = tuple(routed.doc.get("messages") or ())
        answer = " ".join(f"a{f.reply[0] + i}" for i in range(n))  # a token each, unshared
    recorded = len(routed.item.record.body.get("messages") or ()) if messages else 0
    turn = Turn(messages, recorded, seq.prompt_tokens, n, answer)
    return SimTurn(turn, seq.tokens, (*routed.pieces, f.reply))
