"""router.control.fair: bands, least attained service per tenant, weights, shedding."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from router.cli import load_checked
from router.config.model import ConfigError
from router.control.fair import (
    FairQueue,
    Holding,
    LocalLedger,
    Share,
    below_share,
    engine_priority,
)
from router.control.fair_shared import TENANTS, SharedFairness
from tests.router.harness import base_config, write_config

HEAVY, LIGHT = Share("heavy"), Share("light")


def drain(q: FairQueue[str], serve: dict[str, Share] | None = None) -> list[str]:
    """Pop every waiter; with ``serve``, count each popped one's service (100 prompt tokens)
    as admission does."""
    out = []
    while (w := q.pop()) is not None:
        out.append(w)
        if serve is not None:
            q.served(serve[w], 100, 0)
    return out


def test_a_light_tenant_waits_behind_one_heavy_request_not_its_whole_flood() -> None:
    q: FairQueue[str] = FairQueue("batch", LocalLedger())
    shares = {}
    for i in range(5):
        q.put(f"h{i}", HEAVY)
        shares[f"h{i}"] = HEAVY
    q.served(HEAVY, 5000, 0)  # heavy has been served a lot already
    q.put("l0", LIGHT)
    shares["l0"] = LIGHT
    order = drain(q, shares)
    assert order.index("l0") <= 1  # FIFO would have made it the sixth
    assert [w for w in order if w != "l0"] == [f"h{i}" for i in range(5)]  # a tenant's order


def test_backlogged_tenants_alternate_by_service_and_weight() -> None:
    q: FairQueue[str] = FairQueue("batch", LocalLedger())
    double = Share("double", weight=2.0)
    shares = {}
    for i in range(30):
        for name, share in (("d", double), ("s", HEAVY)):
            q.put(f"{name}{i}", share)
            shares[f"{name}{i}"] = share
    first = drain(q, shares)[:30]
    served = sum(1 for w in first if w.startswith("d"))
    assert served == 20  # weight 2 against 1: two thirds of the turns


def test_higher_bands_first_whoever_has_been_served_least() -> None:
    q: FairQueue[str] = FairQueue("interactive", LocalLedger())
    q.put("low", Share("a", band=-1))
    q.put("mid", Share("b"))
    q.served(Share("c", band=2), 10**6, 0)
    q.put("top", Share("c", band=2))
    assert drain(q) == ["top", "mid", "low"]


def test_credit_is_not_saved_up_while_idle() -> None:
    ledger = LocalLedger()
    q: FairQueue[str] = FairQueue("batch", ledger)
    q.put("a0", HEAVY)
    q.served(HEAVY, 10_000, 0)
    q.put("b0", LIGHT)  # new, counter 0: lifted to heavy's 10,000, not left 10,000 behind
    assert ledger.get(("batch", "light")) == ledger.get(("batch", "heavy")) == 10_000
    assert len(q) == 2 and "b0" in q


def test_the_lowest_band_is_shed_first_youngest_of_the_most_served() -> None:
    q: FairQueue[str] = FairQueue("batch", LocalLedger())
    q.put("x0", Share("x", band=-1))
    q.put("x1", Share("x", band=-1))
    q.put("y0", Share("y", band=-1))
    q.served(Share("x", band=-1), 1000, 0)
    assert q.shed(-1) is None  # only a higher band takes a place
    assert q.shed(0) == "x1"
    q.put("z", Share("z", band=0))
    assert q.shed(1) == "x0"  # the lowest band still, its most served tenant first
    assert drain(q) == ["z", "y0"]


def test_discard_leaves_no_trace() -> None:
    q: FairQueue[str] = FairQueue("batch", LocalLedger())
    q.put("a", HEAVY)
    q.discard("a")
    q.discard("a")
    assert len(q) == 0 and q.pop() is None and q.shed(5) is None


def test_the_band_moves_an_engines_priority_field() -> None:
    assert engine_priority(None, 0) is None
    assert engine_priority(10, 0) == 10  # spill's, untouched
    assert engine_priority(None, 2) == -2  # vLLM serves lower values first
    assert engine_priority(10, -1) == 11


def test_the_workers_of_a_router_share_counters_and_queue_lengths() -> None:
    shared = SharedFairness(2)
    one, two = shared.ledger(0), shared.ledger(1)
    a: FairQueue[str] = FairQueue("batch", one)
    b: FairQueue[str] = FairQueue("batch", two)
    a.served(HEAVY, 1000, 0)  # served by worker 0...
    assert two.get(("batch", "heavy")) == 1000  # ...counts in worker 1's choice too
    b.put("l", LIGHT)
    b.put("h", HEAVY)
    assert b.pop() == "l"
    b.discard("l")  # it found room and left
    a.put("x", HEAVY)
    b.put("y", LIGHT)
    assert a.waiting() == b.waiting() == 3  # the router's, not the worker's
    shared.clear(1)  # worker 1 died with its waiters
    assert a.waiting() == 1


def test_two_workers_checking_at_once_cannot_both_take_the_last_place() -> None:
    shared = SharedFairness(2)
    a: FairQueue[str] = FairQueue("interactive", shared.ledger(0))
    b: FairQueue[str] = FairQueue("interactive", shared.ledger(1))
    a.put("waiting", LIGHT)
    # Both workers look before either has queued its newcomer: one place is left (bound 2).
    assert a.reserve(2)
    assert not b.reserve(2)
    a.put("newcomer", LIGHT)  # takes the place it held, no more
    assert a.waiting() == b.waiting() == 2
    a.discard("waiting")
    assert b.reserve(2)
    b.put("next", LIGHT)
    assert a.waiting() == 2


def test_one_process_reserves_against_its_own_queue() -> None:
    q: FairQueue[str] = FairQueue("batch", LocalLedger())
    assert q.reserve(1)
    q.put("w", LIGHT)
    assert not q.reserve(1)


def test_a_woken_waiter_keeps_its_place_until_it_is_put_back_or_gone() -> None:
    shared = SharedFairness(2)
    a: FairQueue[str] = FairQueue("interactive", shared.ledger(0))
    b: FairQueue[str] = FairQueue("interactive", shared.ledger(1))
    a.put("w", LIGHT)
    assert a.pop() == "w"  # woken to look for room: until it has, its place is not free
    assert not b.reserve(1)
    a.put("w", LIGHT, front=True)  # no room: back at the head, counted once
    assert b.waiting() == 1
    assert a.pop() == "w"
    a.discard("w")  # room found: it leaves, and the place is free
    assert b.reserve(1)


def test_a_reserved_slot_goes_to_a_tenant_below_its_weighted_share() -> None:
    light, heavy = Holding(1.0, 0), Holding(1.0, 3)
    assert below_share(light, [heavy], free=1)  # 0 of 4 slots, its share 2
    assert not below_share(heavy, [light], free=1)  # 3 of 4: over its share
    assert below_share(heavy, [], free=1)  # alone: every slot is its own
    # Two floods: the one behind takes the slot, not the one ahead (2 of 4 each).
    assert below_share(Holding(1.0, 1), [Holding(1.0, 2)], free=1)
    assert not below_share(Holding(1.0, 2), [Holding(1.0, 1)], free=1)
    # Weight 3 against 1: a share of 3 of 4 slots.
    assert below_share(Holding(3.0, 2), [Holding(1.0, 1)], free=1)
    assert not below_share(Holding(1.0, 1), [Holding(3.0, 2)], free=1)


def test_who_shares_a_class_is_in_flight_or_seen_lately() -> None:
    ledger = LocalLedger()
    ledger.hold(("batch", "heavy"), 1.0, 1, now=100.0)
    ledger.hold(("batch", "light"), 2.0, 1, now=100.0)
    ledger.hold(("batch", "light"), 2.0, -1, now=101.0)
    ledger.hold(("interactive", "other"), 1.0, 1, now=101.0)  # another class's
    assert ledger.holdings(("batch", "heavy"), since=100.5) == (1, [Holding(2.0, 0)])
    assert ledger.holdings(("batch", "heavy"), since=102.0) == (1, [])  # light gone idle
    assert ledger.holdings(("batch", "light"), since=102.0) == (0, [Holding(1.0, 1)])


def test_the_workers_of_a_router_share_what_each_tenant_holds() -> None:
    shared = SharedFairness(2)
    one, two = shared.ledger(0), shared.ledger(1)
    one.hold(("batch", "heavy"), 1.0, 2, now=10.0)
    two.hold(("batch", "heavy"), 1.0, 1, now=10.0)  # the same tenant through worker 1
    two.hold(("batch", "light"), 1.0, 0, now=10.0)  # seen waiting, holding none
    assert one.holdings(("batch", "light"), since=5.0) == (0, [Holding(1.0, 3)])
    assert two.holdings(("batch", "heavy"), since=5.0) == (3, [Holding(1.0, 0)])
    assert two.holdings(("interactive", "heavy"), since=5.0) == (0, [])
    shared.clear(0)  # worker 0 died with its requests
    assert two.holdings(("batch", "heavy"), since=50.0) == (1, [])


def test_tenants_past_the_shared_table_count_in_their_worker_alone() -> None:
    shared = SharedFairness(2)
    one, two = shared.ledger(0), shared.ledger(1)
    for i in range(TENANTS):
        one.hold(("batch", f"t{i}"), 1.0, 1, now=1.0)
    one.hold(("batch", "late"), 1.0, 1, now=1.0)
    assert one.holdings(("batch", "late"), since=0.0)[0] == 1
    assert two.holdings(("batch", "late"), since=0.0)[0] == 0  # not in the table
    assert len(two.holdings(("batch", "t0"), since=0.0)[1]) == TENANTS - 1


def test_a_slot_goes_to_the_routers_first_waiter_whichever_worker_holds_it() -> None:
    shared = SharedFairness(2)
    one, two = shared.ledger(0), shared.ledger(1)
    a: FairQueue[str] = FairQueue("batch", one)
    b: FairQueue[str] = FairQueue("batch", two)
    a.served(HEAVY, 5000, 0)
    a.put("h0", HEAVY)
    assert one.ahead("batch", a.head()) is None  # nobody waits in worker 1
    b.put("l0", LIGHT)  # lifted to heavy's 5,000: a tie, which stays with each worker
    assert one.ahead("batch", a.head()) is None and two.ahead("batch", b.head()) is None
    a.served(HEAVY, 100, 0)  # heavy served again: light, in worker 1, goes first
    assert one.ahead("batch", a.head()) == 1
    assert two.ahead("batch", b.head()) is None
    assert one.ahead("batch", None) == 1  # worker 0 with nobody waiting
    b.put("vip", Share("vip", band=1))
    a.served(Share("vip", band=1), 0, 0)
    assert one.ahead("batch", a.head()) == 1  # a higher band, whatever its counter
    one.ring(1)
    one.ring(1)
    bell = two.bell()
    assert bell is not None and os.eventfd_read(bell) == 2  # two slots rung for
    assert b.pop() == "vip" and b.pop() == "l0"
    b.discard("vip")
    b.discard("l0")
    assert one.ahead("batch", a.head()) is None  # worker 1's queue is empty again
    b.put("l1", LIGHT)
    shared.clear(1)  # worker 1 died with its waiters
    assert one.ahead("batch", a.head()) is None


def test_a_reserve_and_its_window_are_read_and_checked(tmp_path: Path) -> None:
    doc = base_config([("a", "vllm", "http://127.0.0.1:9")])
    doc["admission"] = {"batch": {"queue_size": 4, "reserve": 1, "active_window": 5}}
    batch = load_checked(write_config(tmp_path, doc)).admission.for_class("batch")
    assert (batch.reserve, batch.active_window) == (1, 5.0)
    plain = write_config(tmp_path, base_config([("a", "vllm", "http://127.0.0.1:9")]))
    assert load_checked(plain).admission.for_class("batch").reserve == 0  # off unless asked
    doc["admission"] = {"interactive": {"reserve": -1, "active_window": "soon"}}
    with pytest.raises(ConfigError) as exc:
        load_checked(write_config(tmp_path, doc))
    paths = {p for p, _ in exc.value.errors}
    assert paths == {"admission.interactive.reserve", "admission.interactive.active_window"}
