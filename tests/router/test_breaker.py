"""router.backends.breaker: ejection after consecutive failures, growing cooldown, half-open."""

from __future__ import annotations

from router.backends.breaker import Breaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_consecutive_failures_eject_and_a_success_resets_the_count() -> None:
    clock = Clock()
    b = Breaker(3, 1.0, 8.0, clock)
    b.failed()
    b.failed()
    b.ok()
    b.failed()
    b.failed()
    assert b.allows() and b.state == "closed"
    b.failed()
    assert not b.allows() and b.state == "open"


def test_half_open_lets_one_probe_through_and_its_failure_doubles_the_cooldown() -> None:
    clock = Clock()
    b = Breaker(1, 1.0, 3.0, clock)
    b.failed()
    clock.now = 0.99
    assert not b.allows()
    clock.now = 1.0
    assert b.state == "half-open" and b.allows()
    b.started()
    assert not b.allows()  # only one probe at a time
    b.ended()
    b.failed()
    assert b.cooldown == 2.0 and not b.allows()
    clock.now = 3.0
    b.started()
    b.ended()
    b.failed()
    assert b.cooldown == 3.0  # capped at cooldown_max
    clock.now = 6.0
    b.started()
    b.ended()
    b.ok()
    assert b.state == "closed" and b.cooldown == 1.0 and b.ejections == 3


def test_late_answers_from_before_the_ejection_do_not_decide() -> None:
    clock = Clock()
    b = Breaker(1, 5.0, 60.0, clock)
    b.failed()
    clock.now = 1.0
    b.ok()  # a request sent before the ejection came back fine: still out
    assert b.state == "open"
    b.failed()  # and another one failing does not grow the cooldown
    assert b.cooldown == 5.0


def test_a_breaker_the_cap_holds_back_stays_closed_and_asks_again_at_the_next_failure() -> None:
    allowed = [False]
    b = Breaker(2, 1.0, 8.0, Clock(), may_eject=lambda: allowed[0])
    for _ in range(5):
        b.failed()
    assert b.state == "closed" and b.allows() and not b.ejected
    allowed[0] = True
    b.failed()
    assert b.state == "open" and b.ejected and b.ejections == 1
