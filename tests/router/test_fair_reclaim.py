"""The workers' fairness table holds the tenants active now: rows of tenants idle past the
class's ``active_window`` with nothing in flight or waiting are let go of, and reused
(router.control.fair.Activity, router.control.fair_shared). Two workers' queues over one
segment, as ``--workers 2`` maps it, on a virtual clock."""

from __future__ import annotations

import os
import time

from router.config.model import AdmissionSettings, ClassAdmission
from router.control.admission import Seat, WaitQueues
from router.control.fair import Share
from router.control.fair_shared import TENANTS, SharedFairness, SharedLedger

WINDOW = 10.0
SETTINGS = AdmissionSettings(
    {"batch": ClassAdmission(queue_size=8, reserve=1, active_window=WINDOW)}
)
COST = (100, 50)  # 200 weighted tokens a request


def workers(rows: int = 64) -> tuple[SharedFairness, list[SharedLedger], list[WaitQueues[str]]]:
    shared = SharedFairness(2, rows=rows)
    ledgers = [shared.ledger(w) for w in range(2)]
    return shared, ledgers, [WaitQueues(SETTINGS, ledger) for ledger in ledgers]


def visit(queues: WaitQueues[str], tenant: str, now: float, stay: float = 0.5) -> None:
    """One request of ``tenant`` admitted at ``now``, over ``stay`` seconds later."""
    seat = Seat()
    queues.admitted("batch", Share(tenant), COST, seat, now)
    queues.left(seat, now + stay)


def test_many_tenants_over_time_keep_sharing_their_counters_across_workers() -> None:
    _, ledgers, queues = workers()
    steady = Seat()  # in flight through worker 1 the whole time: never let go of
    queues[1].admitted("batch", Share("steady"), COST, steady, 0.0)
    for i in range(4 * TENANTS):  # a new tenant every second, four tables' worth
        visit(queues[i % 2], f"t{i}", float(i))
    now = float(4 * TENANTS)
    late = Seat()
    queues[0].admitted("batch", Share("late"), COST, late, now)
    # Worker 1 sees what the late tenant holds and was served through worker 0: its rows
    # are the router's, not worker 0's alone (a table that kept every key would be full).
    held, others = ledgers[1].holdings(("batch", "late"), since=now - WINDOW)
    assert held == 1
    assert ledgers[1].get(("batch", "late")) == 200.0
    assert {o.held for o in others} == {0, 1}  # steady holds one; the recent ones none
    # The rows in use are the recent tenants', steady's and late's: all others were freed.
    _, every = ledgers[1].holdings(("batch", "late"), since=float("-inf"))
    assert WINDOW <= len(every) <= WINDOW + 4
    assert ledgers[0].get(("batch", "steady")) == 200.0  # its service kept


def test_a_row_stays_while_any_worker_uses_it_and_is_reused_clean() -> None:
    _, ledgers, queues = workers()
    seat = Seat()
    queues[1].admitted("batch", Share("x"), COST, seat, 0.0)  # in flight through worker 1
    visit(queues[0], "x", 0.0)
    visit(queues[0], "other", 100.0)  # worker 0 lets go of x, idle there...
    assert ledgers[1].get(("batch", "x")) == 400.0  # ...but worker 1 uses its rows still
    queues[1].left(seat, 101.0)
    visit(queues[1], "y", 200.0)  # now worker 1 lets go of x too: its rows are freed
    visit(queues[0], "z", 200.0)  # and worker 0 of "other"
    assert ledgers[0].get(("batch", "z")) == 200.0  # nothing of x's in a reused row
    in_use = ledgers[0].holdings(("batch", "z"), since=float("-inf"))[1]
    assert len(in_use) == 1  # y's; x's and other's rows are free
    visit(queues[1], "x", 300.0)
    assert ledgers[1].get(("batch", "x")) == 200.0  # back, it starts afresh


def test_a_waiting_tenant_is_not_let_go_of_however_long_it_waits() -> None:
    _, ledgers, queues = workers()
    queues[0].put("batch", "w1", Share("patient"))
    queues[0].hold("batch", Share("patient"), 0, 0.0)
    visit(queues[0], "other", 100.0)

    def rows() -> int:  # the rows in use but the observer's own
        return len(ledgers[1].holdings(("batch", "observer"), since=float("-inf"))[1])

    assert rows() == 2  # patient's and other's
    queues[0].discard("batch", "w1")
    visit(queues[0], "other", 200.0)  # no longer waiting, idle since 0: let go of
    assert rows() == 1


def test_a_dead_workers_rows_are_freed_and_reused() -> None:
    shared, ledgers, queues = workers(rows=16)
    for i in range(TENANTS):  # worker 0 fills the held table, then dies
        queues[0].hold("batch", Share(f"t{i}"), 0, 0.0)
    shared.clear(0)
    queues[1].hold("batch", Share("after"), 0, 1.0)
    ledgers[1].add(("batch", "after"), 1.0)
    fresh = shared.ledger(0)  # its replacement sees the late tenant's rows, shared
    assert fresh.holdings(("batch", "after"), since=0.5)[1] == []
    assert fresh.get(("batch", "after")) == 1.0
    assert fresh.holdings(("batch", "t0"), since=0.5)[1][0].weight == 1.0  # "after" seen


def test_a_full_table_counts_a_tenant_alone_until_it_is_let_go_of() -> None:
    _, ledgers, queues = workers()
    for i in range(TENANTS):  # in flight, through worker 1: none can be let go of
        queues[1].admitted("batch", Share(f"t{i}"), (0, 0), Seat(), 0.0)
    seat = Seat()
    queues[0].admitted("batch", Share("late"), COST, seat, 1.0)  # alone in worker 0
    assert ledgers[1].holdings(("batch", "late"), since=0.0)[0] == 0
    assert ledgers[0].holdings(("batch", "late"), since=0.0)[0] == 1
    queues[0].left(seat, 2.0)  # counted where it was added, never below zero
    assert ledgers[0].holdings(("batch", "late"), since=0.0)[0] == 0


def _churn(shared: SharedFairness, worker: int, until: float) -> int:
    """Tenants come and go through both workers at once (more of them than the table holds,
    each idle past a short window), in real time: the times a tenant's count in the table
    was below what this worker alone holds for it (a row freed and reused while a worker
    still counts in it would show here)."""
    settings = AdmissionSettings(
        {"batch": ClassAdmission(queue_size=8, reserve=1, active_window=0.0)}
    )
    ledger = shared.ledger(worker)
    queues: WaitQueues[str] = WaitQueues(settings, ledger)
    wrong = i = 0
    while time.monotonic() < until:
        tenant = f"t{i % (TENANTS + 50)}"
        i += 1
        seats = [Seat() for _ in range(1 + i % 3)]
        for seat in seats:
            queues.admitted("batch", Share(tenant), COST, seat, time.monotonic())
        wrong += ledger.holdings(("batch", tenant), since=0.0)[0] < len(seats)
        for seat in seats:
            queues.left(seat, time.monotonic())
    return wrong


def test_two_workers_churning_tenants_never_count_into_a_freed_row() -> None:
    shared = SharedFairness(2)
    until = time.monotonic() + 8.0
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            code = 1 if _churn(shared, 1, until) else 0
        finally:
            os._exit(code)
    here = _churn(shared, 0, until)
    _, status = os.waitpid(pid, 0)
    assert (here, os.waitstatus_to_exitcode(status)) == (0, 0)
    _, rows = shared.ledger(0).holdings(("batch", "after"), since=float("-inf"))
    assert all(row.held == 0 for row in rows)  # every request left: nothing counted astray
