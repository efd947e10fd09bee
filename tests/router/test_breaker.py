"""router.backends.breaker: ejection after consecutive failures, growing cooldown, half-open,
and tickets: an outcome counts only in the state its request was sent in."""

from __future__ import annotations

from router.backends.breaker import UNCOUNTED, Breaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fail(b: Breaker) -> None:
    """One request sent now that fails."""
    ticket = b.started()
    b.ended(ticket)
    b.failed(ticket)


def succeed(b: Breaker) -> None:
    ticket = b.started()
    b.ended(ticket)
    b.ok(ticket)


def test_consecutive_failures_eject_and_a_success_resets_the_count() -> None:
    clock = Clock()
    b = Breaker(3, 1.0, 8.0, clock)
    fail(b)
    fail(b)
    succeed(b)
    fail(b)
    fail(b)
    assert b.allows() and b.state == "closed"
    fail(b)
    assert not b.allows() and b.state == "open"


def test_half_open_lets_one_probe_through_and_its_failure_doubles_the_cooldown() -> None:
    clock = Clock()
    b = Breaker(1, 1.0, 3.0, clock)
    fail(b)
    clock.now = 0.99
    assert not b.allows()
    clock.now = 1.0
    assert b.state == "half-open" and b.allows()
    probe = b.started()
    assert not b.allows()  # only one probe at a time
    assert b.started() == UNCOUNTED  # a request beside it (panic mode) is not a probe
    b.ended(probe)
    b.failed(probe)
    assert b.cooldown == 2.0 and not b.allows()
    clock.now = 3.0
    fail(b)
    assert b.cooldown == 3.0  # capped at cooldown_max
    clock.now = 6.0
    succeed(b)
    assert b.state == "closed" and b.cooldown == 1.0 and b.ejections == 3


def test_requests_sent_before_the_ejection_neither_close_nor_reopen_it() -> None:
    clock = Clock()
    b = Breaker(1, 5.0, 60.0, clock)
    early = [b.started() for _ in range(3)]  # in flight while another request ejects it
    fail(b)
    clock.now = 1.0
    b.ok(early[0])  # came back fine during the cooldown: still out
    assert b.state == "open"
    clock.now = 6.0  # past the cooldown: half-open, and no probe has been sent
    b.ok(early[1])
    assert b.state == "half-open"  # a late success is not the probe's
    b.failed(early[2])
    assert b.state == "half-open" and b.cooldown == 5.0  # nor a late failure
    for ticket in early:
        b.ended(ticket)
    assert b.allows()  # and their ends free no probe slot they never held
    probe = b.started()
    b.ended(early[0])
    assert not b.allows()  # still the probe's slot
    b.ok(probe)
    assert b.state == "closed"


def test_requests_sent_while_open_do_not_decide() -> None:
    clock = Clock()
    b = Breaker(1, 5.0, 60.0, clock)
    fail(b)
    clock.now = 1.0
    during = b.started()  # panic mode routes to an ejected backend
    assert during == UNCOUNTED
    clock.now = 6.0
    b.ok(during)
    assert b.state == "half-open" and b.allows()


def test_a_probe_that_closed_the_breaker_counts_its_later_failure() -> None:
    clock = Clock()
    b = Breaker(1, 1.0, 8.0, clock)
    fail(b)
    clock.now = 2.0
    probe = b.started()
    probe = b.ok(probe)  # its head came back fine: closed
    assert b.state == "closed"
    b.failed(probe)  # then its stream stalled: the backend's, in the new state
    b.ended(probe)
    assert b.state == "open" and b.ejections == 2


def test_a_probe_failing_before_its_end_leaves_no_probe_slot_taken() -> None:
    clock = Clock()
    b = Breaker(1, 1.0, 8.0, clock)
    fail(b)
    clock.now = 1.0
    probe = b.started()
    b.failed(probe)  # a stream's fault is reported before the lease is released
    b.ended(probe)
    clock.now = 3.0
    assert b.state == "half-open" and b.allows()


def test_a_breaker_the_cap_holds_back_stays_closed_and_asks_again_at_the_next_failure() -> None:
    allowed = [False]
    b = Breaker(2, 1.0, 8.0, Clock(), may_eject=lambda: allowed[0])
    for _ in range(5):
        fail(b)
    assert b.state == "closed" and b.allows() and not b.ejected
    allowed[0] = True
    fail(b)
    assert b.state == "open" and b.ejected and b.ejections == 1
