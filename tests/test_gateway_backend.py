"""`GatewayBackend`: the load client through the gateway; the gateway's account completes the records."""

from __future__ import annotations

import asyncio

from core.backend_api import LoadPlan
from core.backends.factory import make_backend
from core.backends.gateway_backend import GatewayBackend
from core.backends.live import UrlBackend
from core.control.concurrency_cap import ConcurrencyCapPolicy
from core.profile import load_profile
from core.records import RequestSLO, RequestSpec, Status
from tests.fakeserver import FakeOpenAIServer, StreamReply

# The served request's slot at the fake server. 1 s left a 0.6 s margin for the last send to reach the gateway
# before the slot freed; the suite run beside a .ci/run (load average 20, 2026-11-24) delayed it past that (one
# request deferred instead of rejected). 3 s leaves 2.6 s.
SLOT_S = 3.0


def open_specs(count: int, gap_s: float) -> list[RequestSpec]:
    return [RequestSpec(i, 8, 4, arrival_s=i * gap_s, task="chat", slo=RequestSLO(e2e_s=5.0 + i)) for i in range(count)]


def test_records_say_rejected_deferred_or_ok_and_add_up_to_what_was_sent() -> None:
    async def scenario() -> None:
        async with FakeOpenAIServer(StreamReply(first_delay_s=SLOT_S), tokens_per_word=1) as fake:
            profile = load_profile("quickstart")
            backend = GatewayBackend(
                UrlBackend(fake.base_url, metrics_interval_s=None),
                profile,
                "fcfs",
                policy=ConcurrencyCapPolicy(cap=1, max_queue=3),
                metrics_interval_s=None,
            )
            try:
                # 6 requests within 0.4 s against one slot of SLOT_S and three queue places; the run's horizon
                # (1.6 x SLOT_S) ends while two still wait: 2 served, 2 deferred, 2 rejected. The last sends
                # must reach the gateway before the first request's slot ends: a margin of SLOT_S - 0.4 s.
                plan = LoadPlan(requests=iter(open_specs(6, 0.08)), duration_s=1.6 * SLOT_S)
                outcome = await backend.run(plan)
            finally:
                await backend.close()
            by_status = {s: [r for r in outcome.records if r.status is s] for s in Status}
            counts = {s.value: len(v) for s, v in by_status.items() if v}
            assert counts == {"ok": 2, "rejected": 2, "deferred": 2}, counts
            assert all("queue full" in (r.error or "") for r in by_status[Status.REJECTED])
            assert all("run ended" in (r.error or "") for r in by_status[Status.DEFERRED])
            served = by_status[Status.OK]
            assert all(r.replica == 0 and r.tier == "high" and r.dispatched_s is not None for r in served)
            # The second one waited for the slot at the gateway: released about SLOT_S after it was sent.
            waited = max(served, key=lambda r: r.request_id)
            assert waited.dispatched_s is not None and waited.sent_s is not None
            assert waited.dispatched_s - waited.sent_s > 0.6 * SLOT_S
            assert fake.bodies[0]["max_tokens"] == 4 and "slo" not in fake.bodies[0]
            stats = outcome.notes["gateway"]
            assert (stats["received"], stats["completed"], stats["rejected"], stats["deferred"]) == (6, 2, 2, 2)

    asyncio.run(scenario())


def test_make_backend_puts_the_gateway_in_front_when_a_mode_is_asked_for() -> None:
    profile = load_profile("quickstart")
    backend = make_backend("url", profile, url="http://127.0.0.1:9", mode="fcfs")
    assert isinstance(backend, GatewayBackend) and backend.mode == "fcfs"
    assert isinstance(make_backend("url", profile, url="http://127.0.0.1:9"), UrlBackend)


def test_make_backend_builds_a_managed_vllm_with_the_modes_speculation_schedule_and_state_callback() -> None:
    """The console and the batch runner build a managed vLLM here (nothing starts): AdaServe's batch-size
    schedule rides along, and so does the callback the console's process tab hears state changes on."""
    from core.backends.vllm import VllmBackend
    from core.control.adaserve.live import SCHEDULE_CONFIG_KEY

    base = load_profile("quickstart")
    knobs = base.knobs.model_copy(update={"spec_on": True, "spec_width": 4})
    profile = base.model_copy(update={"mode": "adaserve", "knobs": knobs})
    heard: list[object] = []
    backend = make_backend("vllm", profile, on_server_state=lambda state, detail: heard.append(state))
    assert isinstance(backend, GatewayBackend) and isinstance(backend.inner, VllmBackend)
    schedule = backend.inner.server.speculation_extra[SCHEDULE_CONFIG_KEY]
    assert schedule and max(width for _, _, width in schedule) <= 4
    backend.inner.server._on_state("ready", "")  # the callback the process watcher will call
    assert heard == ["ready"]


class WindowObserver:
    """Notes what a live run tells the job's observer: records, and when the measured window starts."""

    def __init__(self) -> None:
        self.records: list[object] = []
        self.measurement_starts: list[float] = []

    def on_record(self, record: object) -> None:
        self.records.append(record)

    def on_engine_sample(self, sample: object) -> None:
        pass

    def on_measurement_start(self, time_s: float) -> None:
        self.measurement_starts.append(time_s)


def test_the_energy_window_starts_at_the_first_measured_send_through_the_gateway_too() -> None:
    async def scenario() -> None:
        async with FakeOpenAIServer(StreamReply(first_delay_s=0.05), tokens_per_word=1) as fake:
            profile = load_profile("quickstart")
            backend = GatewayBackend(UrlBackend(fake.base_url, metrics_interval_s=None), profile, "fcfs")
            observer = WindowObserver()
            try:
                # Two warm-up requests, then three measured: the window opens with the third send, once.
                plan = LoadPlan(requests=iter(open_specs(5, 0.1)), warmup_requests=2)
                outcome = await backend.run(plan, observer)  # type: ignore[arg-type]
            finally:
                await backend.close()
            assert len(outcome.records) == len(observer.records) == 5
            assert len(observer.measurement_starts) == 1
            assert 0.15 <= observer.measurement_starts[0] < 0.5  # the third arrival is at 0.2 s

    asyncio.run(scenario())


def test_back_to_back_runs_each_account_for_their_own_requests() -> None:
    # Streams whose upstream body ends after the client read the last event: the gateway is still busy with
    # them as the client returns, and a run's account must count them there, not in the next run.
    async def scenario() -> None:
        async with FakeOpenAIServer(StreamReply(tail_delay_s=0.4), tokens_per_word=1) as fake:
            profile = load_profile("quickstart")
            backend = GatewayBackend(UrlBackend(fake.base_url, metrics_interval_s=None), profile, "fcfs")
            try:
                for _ in range(2):
                    specs = (RequestSpec(i, 8, 4, task="chat") for i in range(100))
                    plan = LoadPlan(requests=specs, mode="closed", concurrency=2, max_requests=4)
                    outcome = await backend.run(plan)
                    stats = outcome.notes["gateway"]
                    assert stats["accounted"] and stats["in_flight"] == 0 and stats["held"] == 0, stats
                    assert (stats["received"], stats["completed"]) == (4, 4), stats
            finally:
                await backend.close()

    asyncio.run(scenario())
