"""Open and closed loop in virtual time: send times, lag, independence, concurrency."""

from __future__ import annotations

from replay.plan import Plan, PlanOptions
from replay.runner import Runner
from replay.sources import Item
from turnout.common.capture import CaptureRecord

from .vtime import VirtualTime


def _items(offsets_ms: list[float]) -> list[Item]:
    return [
        Item(n, CaptureRecord(f"r{n}", "/v1/completions", {}, t_offset_ms=t))
        for n, t in enumerate(offsets_ms)
    ]


class Recorder:
    def __init__(self, vt: VirtualTime, service: float) -> None:
        self.vt = vt
        self.service = service
        self.sends: list[tuple[str, float, float | None]] = []
        self.inflight = 0
        self.peak = 0

    async def send(self, item: Item, body: bytes, lag: float | None) -> None:
        self.sends.append((item.record.custom_id, self.vt.now, lag))
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        await self.vt.sleep(self.service)
        self.inflight -= 1


async def test_open_loop_sends_on_the_absolute_schedule() -> None:
    vt = VirtualTime()
    rec = Recorder(vt, service=10.0)  # responses far slower than arrivals
    runner = Runner(lambda i: b"{}", rec.send, clock=vt.clock, sleep=vt.sleep)
    plan = Plan(_items([0, 500, 500, 2000, 7000]), PlanOptions(speed=2.0))
    timing = await vt.drive(runner.open_loop(plan))
    assert [(i, t) for i, t, _ in rec.sends] == [
        ("r0", 0.0),
        ("r1", 0.25),
        ("r2", 0.25),
        ("r3", 1.0),
        ("r4", 3.5),
    ]
    assert all(lag == 0.0 for _, _, lag in rec.sends)
    assert rec.peak == 5  # a slow answer never holds back the next send
    assert timing.duration == 13.5
    assert runner.sent == runner.done == 5


async def test_lateness_is_reported_and_never_accumulates() -> None:
    vt = VirtualTime()
    rec = Recorder(vt, service=0.1)

    def slow_prepare(item: Item) -> bytes:
        vt.now += 0.3  # building a body takes 0.3 s of (virtual) time
        return b"{}"

    runner = Runner(slow_prepare, rec.send, clock=vt.clock, sleep=vt.sleep)
    await vt.drive(runner.open_loop(Plan(_items([0, 1000, 2000, 3000]), PlanOptions())))
    assert [round(t, 6) for _, t, _ in rec.sends] == [0.3, 1.0, 2.0, 3.0]
    assert [round(lag or 0, 6) for _, _, lag in rec.sends] == [0.3, 0.0, 0.0, 0.0]


async def test_max_gap_and_window_in_virtual_time() -> None:
    vt = VirtualTime()
    rec = Recorder(vt, service=0.0)
    runner = Runner(lambda i: b"{}", rec.send, clock=vt.clock, sleep=vt.sleep)
    opts = PlanOptions(window=(1.0, 100.0), max_gap=2.0)
    await vt.drive(runner.open_loop(Plan(_items([0, 1000, 61_000, 62_000, 200_000]), opts)))
    assert [(i, t) for i, t, _ in rec.sends] == [("r1", 0.0), ("r2", 2.0), ("r3", 3.0)]


async def test_closed_loop_keeps_n_in_flight() -> None:
    vt = VirtualTime()
    rec = Recorder(vt, service=1.0)
    runner = Runner(lambda i: b"{}", rec.send, clock=vt.clock, sleep=vt.sleep)
    plan = Plan(_items([0, 0, 50_000, 90_000, 90_000]), PlanOptions())
    timing = await vt.drive(runner.closed_loop(plan, 2))
    assert sorted(t for _, t, _ in rec.sends) == [0.0, 0.0, 1.0, 1.0, 2.0]
    assert all(lag is None for _, _, lag in rec.sends)  # arrival times are ignored
    assert rec.peak == 2
    assert timing.duration == 3.0
