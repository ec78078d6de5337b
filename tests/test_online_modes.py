"""Online tuning of the scheduling mode and each mode's own knobs (issue 23 item 1): the mode handover
(core/control/mode_switch.py) drops, fails and reorders nothing; the online space's neighbours; the tuner
switching modes on the simulator and at a gateway in front of a scripted upstream."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from core.control.concurrency_cap import ConcurrencyCapPolicy
from core.control.mode_switch import ModeSwitch
from core.controller_api import ControlledRequest, Policy, Verdict
from core.gateway.server import Gateway
from core.profile import ProfileError, load_calibration, load_profile
from core.records import RequestRecord, Status
from core.sim.engine import SimEngine
from core.tune.hillclimb import StepRecord
from core.tune.knobspace import Point
from core.tune.online_gateway import attach_online_tuner
from core.tune.online_sim import run_online
from core.tune.online_space import OnlinePoint, online_space
from core.workload import build_load_plan
from tests.fakeserver import FakeOpenAIServer, StreamReply
from tests.test_gateway import assert_accounted, completion, post, until
from tests.test_gateway_tune_endpoints import QUICK, quick_profile


def _engine(policy: Policy, requests: int = 400) -> SimEngine:
    profile = load_profile("saber-w1")
    plan = build_load_plan(profile, seed=3, requests=requests)
    return SimEngine(load_calibration(profile), profile.knobs, plan, seed=3, policy=policy)


def test_a_mode_switch_in_the_simulator_keeps_first_come_first_released_and_drops_nothing() -> None:
    switch = ModeSwitch(ConcurrencyCapPolicy(6))
    engine = _engine(switch)
    for until_s, cap in ((20.0, 1), (40.0, 12), (60.0, 2), (80.0, 30)):
        engine.advance_until(until_s)
        switch.switch(ConcurrencyCapPolicy(cap), engine.clock)  # a new mode each time, not a new cap in place
    records = engine.run()
    assert switch.switches == 4
    assert len(records) == 400 and all(r.status is Status.OK for r in records)
    by_arrival = sorted(records, key=lambda r: (r.arrival_s, r.request_id))
    dispatched = [r.dispatched_s for r in by_arrival]
    assert dispatched == sorted(dispatched)  # no request overtook an earlier one through a handover


def test_what_the_old_mode_holds_is_served_even_when_the_new_mode_rejects_newcomers() -> None:
    old = ConcurrencyCapPolicy(1)
    switch = ModeSwitch(old)
    engine = _engine(switch, requests=200)
    engine.advance_until(30.0)
    switched_at = engine.clock
    assert len(old.queue) > 1, "the old mode holds requests at the switch"
    switch.switch(ConcurrencyCapPolicy(1, max_queue=0), switched_at)  # rejects whatever it cannot run at once
    records = engine.run()
    assert len(records) == 200
    before = [r for r in records if r.arrival_s < switched_at]
    after = [r for r in records if r.arrival_s >= switched_at]
    assert all(r.status is Status.OK for r in before)  # held by the old mode at the switch: all served
    assert switch.forced > 0  # ... those the new mode would have rejected included
    assert any(r.status is Status.REJECTED for r in after)  # the new mode's own rule, for its own arrivals
    assert not any(r.status is Status.ERROR for r in records)


class _HoldsForever(Policy):
    """A mode whose queue waits for a lull that never comes (SABER's low tier under overload)."""

    name = "holds-forever"
    passthrough = False

    def __init__(self) -> None:
        self.held: list[ControlledRequest] = []

    def on_arrival(self, req: ControlledRequest, now: float, replicas: Any) -> Verdict:
        self.held.append(req)
        return Verdict.hold()

    def drain(self) -> list[ControlledRequest]:
        held, self.held = self.held, []
        return held


def test_a_mode_that_would_hold_forever_hands_what_it_holds_to_the_next_mode() -> None:
    switch = ModeSwitch(_HoldsForever())
    engine = _engine(switch, requests=100)
    engine.advance_until(10.0)
    switched_at = engine.clock
    switch.switch(ConcurrencyCapPolicy(8), switched_at)
    records = engine.run()
    assert len(records) == 100 and all(r.status is Status.OK for r in records)
    by_arrival = sorted(records, key=lambda r: (r.arrival_s, r.request_id))
    assert [r.dispatched_s for r in by_arrival] == sorted(r.dispatched_s for r in by_arrival)


def test_the_online_space_moves_the_cap_in_fcfs_and_each_modes_own_knobs_and_switches_modes() -> None:
    profile = quick_profile()
    space = online_space(profile, modes=("fcfs", "saber", "slos-serve"))
    start = space.point(Point(4, 8, 0, False), "fcfs")
    assert start == OnlinePoint(4, 8, 0, False, "fcfs", ())
    moves = {(n.mode, n.concurrency, n.mode_knobs) for n in space.neighbours(start)}
    saber_window = profile.saber.window_size
    assert (("fcfs", 2, ()) in moves) and (("fcfs", 6, ()) in moves)
    assert ("saber", 4, (("window_size", saber_window),)) in moves
    assert any(mode == "slos-serve" for mode, _, _ in moves)
    saber = space.point(Point(4, 8, 0, False), "saber")
    saber_moves = space.neighbours(saber)
    assert {n.concurrency for n in saber_moves} == {4}  # the cap is fcfs's knob: it does not move in saber
    windows = {dict(n.mode_knobs)["window_size"] for n in saber_moves if n.mode == "saber"}
    assert windows == {saber_window // 2, saber_window * 2}
    assert saber.as_dict()["mode"] == "saber" and saber.as_dict()["mode_knobs"] == {"window_size": saber_window}
    with pytest.raises(ProfileError, match="adaserve"):
        online_space(profile, modes=("fcfs", "adaserve"))


def test_the_online_tuner_switches_modes_on_the_simulator_and_accounts_for_every_request() -> None:
    base = load_profile("saber-w1")
    workload = base.workload.model_copy(update={"arrival": base.workload.arrival.model_copy(update={"rate_rps": 3.0})})
    tuner = base.tuner.model_copy(update={"concurrency_bounds": (4, 64), "concurrency_step": 8})
    profile = base.model_copy(update={"workload": workload, "tuner": tuner})
    events: list[dict[str, Any]] = []
    duration = 3000.0
    run = run_online(
        profile, load_calibration(profile), 16, duration_s=duration, seed=0, max_queue=16, sink=events.append,
        modes=("fcfs", "saber", "slos-serve"),
    )  # fmt: skip
    tried = {e["best_neighbour"]["mode"] for e in events}
    assert {"saber", "slos-serve"} & tried, "a round tried another mode"
    assert run.policy.switch.switches >= 2  # out to the trial's mode and back (or onward)
    batch_fields = set(StepRecord(1, Point(8, 64, 0, False), run.tuner.windows[0].segment, 0, 0, None, 0, False, "")
                       .as_event_fields())  # fmt: skip
    assert all(batch_fields <= set(e) and "mode" in e["knobs"] and "mode" in e["incumbent"] for e in events)
    plan = build_load_plan(profile, seed=0, requests=10**9, duration_s=duration)
    assert len(run.records) == sum(1 for _ in plan.requests)  # every request ended, exactly once
    assert len({r.request_id for r in run.records}) == len(run.records)
    assert not any(r.status is Status.ERROR for r in run.records)


def test_a_gateway_tuning_modes_switches_under_load_and_fails_nothing() -> None:
    async def scenario() -> None:
        profile = quick_profile()
        records: list[RequestRecord] = []
        async with (
            FakeOpenAIServer(StreamReply(first_delay_s=0.02, chunk_delay_s=0.01)) as fake,
            Gateway([fake.base_url], Policy()) as gateway,
        ):
            tuning = attach_online_tuner(
                gateway, profile, settings=QUICK,
                modes=("fcfs", "slos-serve"),
            )  # fmt: skip
            inner = gateway.record_sink
            assert inner is not None

            def keep(record: RequestRecord) -> None:
                records.append(record)
                inner(record)

            gateway.record_sink = keep
            sent = 0
            async with aiohttp.ClientSession() as session:
                for _ in range(40):
                    if tuning.policy.switch.switches >= 2:
                        break
                    results = await asyncio.gather(*(post(session, gateway.base_url, completion()) for _ in range(12)))
                    assert all(status in (200, 429) for status, _ in results)
                    sent += 12
                    await asyncio.sleep(0.3)
                    tuning.poll()
            await until(lambda: gateway.stats.open() == 0)
            await tuning.stop()
            assert tuning.policy.switch.switches >= 2, [s["best_neighbour"] for s in tuning.steps]
            assert any(s["best_neighbour"]["mode"] == "slos-serve" for s in tuning.steps)
            assert_accounted(gateway, sent)
            assert gateway.stats.failed == 0 and gateway.stats.deferred == 0
            assert all(r.status in (Status.OK, Status.REJECTED) for r in records)

    asyncio.run(scenario())


def test_the_consoles_knob_line_shows_the_mode_and_its_knobs_of_an_online_step() -> None:
    from console.widgets.format import knobs_text

    point = OnlinePoint(8, 64, 0, False, "saber", (("window_size", 8),))
    assert knobs_text(point.as_dict()).endswith("· saber (window_size 8)")
    assert "saber" not in knobs_text(Point(8, 64, 0, False).as_dict())  # the batch tuner's points: as before
