"""Slot grants (router.backends.grants): the arithmetic, the protocol around it (asks whose
answers arrive late, routers admitting meanwhile) never letting the fleet pass the cap, and
the Lua script on a real redis-server giving what the arithmetic gives."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis import Redis

from router.backends.grants import GRANT, WARM, Ask, Held, backend_key, fair_share, grant
from tests.redis_server import start_redis

TTL = 2000


def test_a_fair_share_gives_the_modest_what_they_want_and_splits_the_rest() -> None:
    assert fair_share(10, 2, [20]) == 2
    assert fair_share(10, 20, [2]) == 8
    assert fair_share(10, 20, [20]) == 5
    assert fair_share(9, 20, [20, 20]) == 3
    assert fair_share(10, 20, [1, 20]) == 5  # (10 - 1) / 2, rounded up for the asker
    assert fair_share(1, 5, [5]) == 1  # the last slot goes to whoever asks, not to nobody


def test_slots_nobody_wants_are_handed_out_as_headroom() -> None:
    assert fair_share(10, 1, [1]) == 5
    assert fair_share(10, 0, []) == 10
    assert fair_share(10, 3, [1, 1]) == 3 + 2


@given(st.integers(1, 64), st.integers(0, 80), st.lists(st.integers(0, 80), max_size=5))
def test_max_min_shares_never_add_up_past_the_cap_but_for_rounding(
    cap: int, want: int, others: list[int]
) -> None:
    everyone = [want, *others]
    shares = [fair_share(cap, w, everyone[:i] + everyone[i + 1 :]) for i, w in enumerate(everyone)]
    if sum(everyone) <= cap:
        assert all(s >= w for s, w in zip(shares, everyone, strict=True))
    else:
        assert all(s <= w for s, w in zip(shares, everyone, strict=True))
        assert sum(shares) <= cap + len(everyone)  # each rounds its own share up once


def test_a_target_never_exceeds_what_the_others_leave_free() -> None:
    target, stored = grant(10, Ask(want=10, inflight=0, held=0), [Held(8, 1)], False)
    assert (target, stored) == (2, 2)


def test_a_grant_above_its_share_shrinks_but_never_below_what_is_held() -> None:
    # It held 10 when it asked, and 7 are in flight: 5 is its share, 10 stays stored.
    assert grant(10, Ask(want=8, inflight=7, held=10), [Held(0, 8)], False) == (5, 10)
    # Next period it asks holding its new limit, 5: what is stored shrinks to its 7.
    assert grant(10, Ask(want=8, inflight=7, held=5), [Held(0, 8)], False) == (5, 7)


def test_while_warming_no_target_exceeds_what_the_asker_held() -> None:
    assert grant(10, Ask(want=10, inflight=1, held=3), [], True) == (3, 3)


@dataclass
class Router:
    limit: int = 0
    inflight: int = 0
    answer: int | None = None  # a target on its way back


@settings(max_examples=200)
@given(st.integers(1, 12), st.integers(2, 4), st.randoms(use_true_random=False))
def test_routers_asking_and_admitting_in_any_order_never_pass_the_cap(
    cap: int, count: int, rnd: random.Random
) -> None:
    """Each step one router admits (below its limit), finishes a request, sends an ask (the
    script runs at once, its answer arrives later) or takes its answer."""
    routers = [Router() for _ in range(count)]
    stored = [0] * count
    wants = [0] * count
    for _ in range(300):
        i = rnd.randrange(count)
        r = routers[i]
        move = rnd.randrange(4)
        if move == 0 and r.inflight < r.limit:
            r.inflight += 1
        elif move == 1 and r.inflight:
            r.inflight -= 1
        elif move == 2 and r.answer is None:
            wants[i] = r.inflight + rnd.randrange(4)
            ask = Ask(wants[i], r.inflight, r.limit)
            others = [Held(stored[j], wants[j]) for j in range(count) if j != i]
            r.answer, stored[i] = grant(cap, ask, others, False)
        elif move == 3 and r.answer is not None:
            r.limit, r.answer = r.answer, None
        assert sum(x.inflight for x in routers) <= cap
        assert sum(stored) <= cap
        assert all(x.inflight <= s for x, s in zip(routers, stored, strict=True))


@pytest.fixture(scope="module")
def redis() -> Iterator[Redis]:
    with start_redis() as server:
        client = Redis.from_url(server.url)
        yield client
        client.close()


def _run(redis: Redis, me: str, asks: dict[str, tuple[int, Ask]]) -> list[int]:
    keys = [WARM] + [backend_key(name) for name in asks]
    args: list[str | int] = [me, TTL]
    for cap, ask in asks.values():
        args += [cap, ask.want, ask.inflight, ask.held]
    return [int(t) for t in redis.register_script(GRANT)(keys=keys, args=args)]


def _stored(redis: Redis, name: str, me: str) -> tuple[int, int]:
    value = redis.hget(backend_key(name), me)
    assert isinstance(value, bytes)
    stored, want, _ = value.split()
    return int(stored), int(want)


def test_the_script_gives_what_the_arithmetic_gives(redis: Redis) -> None:
    rnd = random.Random(29)
    redis.flushall()
    redis.set(WARM, 0)  # a store that has not lost its data
    until = int(time.time() * 1000) + 60_000
    for case in range(150):
        name = f"b{case}"
        cap = rnd.randint(1, 40)
        others = [Held(rnd.randint(0, cap // 2), rnd.randint(0, 50)) for _ in range(3)]
        others = others[: rnd.randint(0, 3)]
        for j, o in enumerate(others):
            redis.hset(backend_key(name), f"r{j}", f"{o.stored} {o.want} {until}")
        inflight = rnd.randint(0, 10)
        ask = Ask(inflight + rnd.randint(0, 30), inflight, rnd.randint(inflight, inflight + 5))
        target, stored = grant(cap, ask, others, False)
        assert _run(redis, "me", {name: (cap, ask)}) == [target], (cap, ask, others)
        assert _stored(redis, name, "me") == (stored, ask.want)


def test_a_router_that_stopped_asking_loses_its_grant(redis: Redis) -> None:
    redis.flushall()
    redis.set(WARM, 0)
    gone = int(time.time() * 1000) - 1
    redis.hset(backend_key("b"), "dead", f"8 8 {gone}")
    assert _run(redis, "me", {"b": (8, Ask(8, 0, 0))}) == [8]
    assert redis.hget(backend_key("b"), "dead") is None


def test_a_store_that_lost_its_data_warms_before_a_grant_grows(redis: Redis) -> None:
    redis.flushall()  # as a restarted server without persistence: the routers still hold 4
    assert _run(redis, "a", {"b": (8, Ask(8, 4, 4))}) == [4]
    assert _run(redis, "c", {"b": (8, Ask(8, 0, 0))}) == [0]  # a's 4 and b's, unheard yet
    assert int(redis.get(WARM) or 0) > time.time() * 1000
    redis.flushall()
    assert _run(redis, "a", {"b": (8, Ask(2, 0, 0))}) == [8]  # a first start: no warming
    assert int(redis.get(WARM) or 1) == 0
