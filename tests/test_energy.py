"""Energy arithmetic on synthetic series, and the meters against fake NVML modules and powercap trees."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from core.backend_api import EngineSample
from core.energy import (
    WINDOW_TOO_SHORT,
    EnergyReading,
    ModelledEnergy,
    NvmlEnergyMeter,
    RaplEnergyMeter,
    UnavailableMeter,
    auto_meter,
    busy_seconds,
    counter_increase,
    energy_from_counter,
    energy_from_power,
    modelled_energy,
    sum_readings,
)
from core.profile import PowerModel

NVML_MJ = {"joules_per_unit": 1e-3, "update_period_s": 0.1, "method": "nvml counter"}
RAPL_UJ = {"joules_per_unit": 1e-6, "update_period_s": 0.001, "method": "rapl"}
RAPL_MAX_UJ = 262_143_328_850  # a real package's max_energy_range_uj


# ---------------------------------------------------------------- cumulative counters


def test_counter_difference_gives_energy_and_average_power() -> None:
    # NVML counts mJ: 1,000,000 mJ more after 10 s is 1000 J at 100 W.
    reading = energy_from_counter([(0.0, 5_000_000), (10.0, 6_000_000)], **NVML_MJ, device="GPU 0")
    assert reading.basis == "measured"
    assert reading.joules == pytest.approx(1000.0)
    assert reading.avg_power_w == pytest.approx(100.0)
    assert reading.window_s == 10.0
    assert reading.note is None  # 10 s is 100 update periods


def test_counter_wrap_around_adds_the_range() -> None:
    # 1 J before the wrap point, 0.5 J after it: 1.5 J in all, not a huge negative number.
    series = [(0.0, RAPL_MAX_UJ - 1_000_000), (1.0, 500_000)]
    reading = energy_from_counter(series, **RAPL_UJ, wrap_range=RAPL_MAX_UJ)
    assert reading.basis == "measured"
    assert reading.joules == pytest.approx(1.5)


def test_polled_counter_sees_every_wrap() -> None:
    wrap = 2**32
    # Three polls, two wraps: (2^32 - 100) -> 50 -> 40 (wrapped again) -> 60.
    values = [wrap - 100, 50, 40, 60]
    assert counter_increase(values, wrap) == 100 + 50 + (wrap - 10) + 20
    series = [(float(i), v) for i, v in enumerate(values)]
    reading = energy_from_counter(series, **RAPL_UJ, wrap_range=wrap)
    assert reading.joules == pytest.approx((wrap + 160) * 1e-6)


def test_counter_going_backwards_without_wrap_range_is_unavailable() -> None:
    reading = energy_from_counter([(0.0, 9_000), (5.0, 1_000)], **NVML_MJ)
    assert reading.basis == "unavailable"
    assert reading.joules is None
    assert "went backwards" in reading.reason


def test_missing_counter_at_window_end_is_unavailable_not_zero() -> None:
    reading = energy_from_counter([(0.0, 1_000), (5.0, None)], **NVML_MJ)
    assert reading.basis == "unavailable"
    assert reading.joules is None and reading.avg_power_w is None
    assert "counter missing" in reading.reason


def test_missing_reading_in_the_middle_is_skipped() -> None:
    reading = energy_from_counter([(0.0, 1_000), (2.0, None), (5.0, 6_000)], **NVML_MJ)
    assert reading.basis == "measured"
    assert reading.joules == pytest.approx(5.0)


def test_window_shorter_than_update_period_is_too_short_not_zero() -> None:
    # 50 ms with a 100 ms counter: the counter may not have ticked, so 0 J would be a lie.
    reading = energy_from_counter([(0.0, 1_000), (0.05, 1_000)], **NVML_MJ)
    assert reading.basis == "unavailable"
    assert reading.reason == WINDOW_TOO_SHORT == "window shorter than the counter update period"
    assert reading.joules is None
    assert reading.window_s == pytest.approx(0.05)


def test_window_of_a_few_periods_is_kept_with_a_note() -> None:
    reading = energy_from_counter([(0.0, 0), (0.5, 50_000)], **NVML_MJ)
    assert reading.basis == "measured"
    assert reading.joules == pytest.approx(50.0)
    assert reading.note is not None and "under 10 counter update periods" in reading.note


def test_single_reading_is_unavailable() -> None:
    reading = energy_from_counter([(0.0, 1_000)], **NVML_MJ)
    assert reading.basis == "unavailable"
    assert "fewer than two readings" in reading.reason


def test_flat_counter_over_a_long_window_is_unavailable() -> None:
    reading = energy_from_counter([(0.0, 7_000), (30.0, 7_000)], **NVML_MJ)
    assert reading.basis == "unavailable"
    assert "did not advance" in reading.reason


# ---------------------------------------------------------------- sampled power and sums


def test_sampled_power_is_integrated_by_trapezoids() -> None:
    # 100 W -> 200 W over the first second (150 J), then 200 W for a second (200 J): 350 J over 2 s.
    series = [(0.0, 100_000), (1.0, 200_000), (2.0, 200_000)]
    reading = energy_from_power(series, update_period_s=1.0, method="power", watts_per_unit=1e-3)
    assert reading.basis == "measured"
    assert reading.joules == pytest.approx(350.0)
    assert reading.avg_power_w == pytest.approx(175.0)


def test_sampled_power_window_shorter_than_averaging_period_is_too_short() -> None:
    reading = energy_from_power([(0.0, 100.0), (0.4, 100.0)], update_period_s=1.0, method="power")
    assert reading.basis == "unavailable"
    assert reading.reason == WINDOW_TOO_SHORT


def _measured(joules: float, device: str, basis: str = "measured") -> EnergyReading:
    return EnergyReading(joules, joules / 10, 10.0, basis, "m", device=device)  # type: ignore[arg-type]


def test_sum_over_devices() -> None:
    total = sum_readings([_measured(100.0, "GPU 0"), _measured(300.0, "GPU 1")])
    assert total.basis == "measured"
    assert total.joules == 400.0
    assert total.avg_power_w == pytest.approx(40.0)
    assert total.device == "GPU 0, GPU 1"


def test_sum_with_an_unavailable_part_is_unavailable_and_names_it() -> None:
    gap = EnergyReading(None, None, 10.0, "unavailable", "m", reason="permission denied", device="pkg 1")
    total = sum_readings([_measured(100.0, "pkg 0"), gap])
    assert total.basis == "unavailable"
    assert total.joules is None
    assert total.reason == "pkg 1: permission denied"


def test_sum_with_a_modelled_part_is_modelled() -> None:
    total = sum_readings([_measured(100.0, "GPU"), _measured(50.0, "CPU", basis="modelled")])
    assert total.basis == "modelled"
    assert total.joules == 150.0


# ---------------------------------------------------------------- modelled energy


def test_modelled_energy_is_idle_plus_utilisation_share_of_the_dynamic_range() -> None:
    # Idle 50 W, peak 300 W, busy 30 s of a 60 s window:
    # 50 W * 60 s + (300 - 50) W * 30 s = 3000 J + 7500 J = 10500 J; 10500 J / 60 s = 175 W.
    reading = modelled_energy(PowerModel(idle_w=50, peak_w=300), busy_s=30.0, window_s=60.0)
    assert reading.basis == "modelled"
    assert reading.joules == pytest.approx(10_500.0)
    assert reading.avg_power_w == pytest.approx(175.0)
    assert "power model" in reading.method


def test_modelled_busy_time_is_clipped_to_the_window() -> None:
    reading = modelled_energy(PowerModel(idle_w=50, peak_w=300), busy_s=90.0, window_s=60.0)
    assert reading.joules == pytest.approx(300 * 60)


def test_modelled_energy_without_power_model_is_unavailable() -> None:
    reading = modelled_energy(None, busy_s=30.0, window_s=60.0)
    assert reading.basis == "unavailable"
    assert "no power model" in reading.reason


def test_busy_seconds_from_engine_samples() -> None:
    samples = [
        EngineSample(time_s=0.0, running=2, waiting=0, kv_usage=0.1),
        EngineSample(time_s=1.0, running=0, waiting=0, kv_usage=0.0),
        EngineSample(time_s=3.0, running=1, waiting=0, kv_usage=0.1),
    ]
    # busy 0-1, idle 1-3, busy 3-5 (the last sample holds until the end).
    assert busy_seconds(samples, end_s=5.0) == pytest.approx(3.0)
    # Without an end the last sample's interval is open: only 0-1 counts.
    assert busy_seconds(samples) == pytest.approx(1.0)
    # Clipped to a window 0.5-4 s: 0.5-1 and 3-4.
    assert busy_seconds(samples, end_s=4.0, start_s=0.5) == pytest.approx(1.5)
    assert busy_seconds([], end_s=4.0) == 0.0


def test_busy_seconds_from_the_engines_busy_counter_add_nothing_over_an_idle_gap() -> None:
    def at(t: float, running: int, busy: float) -> EngineSample:
        return EngineSample(time_s=t, running=running, waiting=0, kv_usage=0.0, busy_s=busy)

    # Busy 0.4 s of the first 0.5 s interval, then a 30 s idle gap with no sample (the engine had nothing
    # to do), then 0.2 s of work. Holding the running sample through the gap would count 30 s.
    samples = [at(0.0, 1, 0.0), at(0.5, 1, 0.4), at(30.6, 1, 0.6)]
    assert busy_seconds(samples, end_s=40.0) == pytest.approx(0.6)
    assert busy_seconds(samples, start_s=0.5, end_s=40.0) == pytest.approx(0.2)
    # Inside an interval the busy time comes first: by 10 s the engine has done the 0.2 s it had.
    assert busy_seconds(samples, start_s=0.0, end_s=10.0) == pytest.approx(0.6)
    assert busy_seconds(samples, start_s=0.0, end_s=0.25) == pytest.approx(0.2, abs=0.06)
    # A half-busy window draws half the dynamic power, not peak.
    reading = modelled_energy(PowerModel(idle_w=50, peak_w=300), busy_s=busy_seconds(samples), window_s=1.2)
    assert reading.avg_power_w == pytest.approx(50 + 250 * 0.5)


def test_modelled_meter_needs_the_simulators_figures() -> None:
    meter = ModelledEnergy(PowerModel(idle_w=10, peak_w=110), device="modelled L40S")
    meter.start()
    assert meter.stop().basis == "unavailable"
    meter.start()
    meter.record(busy_s=5.0, window_s=10.0)
    reading = meter.stop()
    assert reading.joules == pytest.approx(10 * 10 + 100 * 5)
    assert reading.device == "modelled L40S"


# ---------------------------------------------------------------- NVML meter with a stand-in module


class FakeClock:
    """Each call advances time, so a window's length is known exactly."""

    def __init__(self, step_s: float) -> None:
        self.now = 0.0
        self.step_s = step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


class FakeNvml:
    """The slice of pynvml the meter uses. GPU i consumes watts[i]; counters tick with the fake clock."""

    class NVMLError(Exception):
        pass

    def __init__(self, clock: FakeClock, watts: list[float], has_counter: list[bool]) -> None:
        self.clock = clock
        self.watts = watts
        self.has_counter = has_counter
        self.initialised = False

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.watts)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"Fake GPU"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        if not self.has_counter[handle]:
            raise self.NVMLError("Not Supported")
        return int(self.watts[handle] * self.clock.now * 1000)  # mJ since "driver load" at t=0

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return int(self.watts[handle] * 1000)  # mW


def test_nvml_meter_sums_energy_counters_of_all_gpus() -> None:
    clock = FakeClock(step_s=5.0)
    nvml = FakeNvml(clock, watts=[100.0, 250.0], has_counter=[True, True])
    meter = NvmlEnergyMeter(nvml, clock=clock)
    meter.start()
    reading = meter.stop()
    assert reading.basis == "measured"
    assert reading.method.startswith("NVML cumulative energy counter")
    assert reading.avg_power_w == pytest.approx(350.0)
    assert reading.joules == pytest.approx(350.0 * reading.window_s)
    assert "2x GPU" in reading.device
    assert not nvml.initialised  # shut down after the window


def test_nvml_meter_samples_power_where_the_counter_is_missing() -> None:
    clock = FakeClock(step_s=2.0)  # each sample 2 s apart: longer than the 1 s power averaging
    nvml = FakeNvml(clock, watts=[120.0], has_counter=[False])
    meter = NvmlEnergyMeter(nvml, clock=clock, poll_interval_s=0.001)
    meter.start()
    reading = meter.stop()
    assert reading.basis == "measured"
    assert reading.method.startswith("NVML sampled power")
    assert reading.avg_power_w == pytest.approx(120.0)


def test_nvml_meter_too_short_window() -> None:
    clock = FakeClock(step_s=0.01)
    nvml = FakeNvml(clock, watts=[100.0], has_counter=[True])
    meter = NvmlEnergyMeter(nvml, clock=clock)
    meter.start()
    reading = meter.stop()
    assert reading.basis == "unavailable"
    assert reading.reason.endswith(WINDOW_TOO_SHORT)


def test_nvml_meter_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    meter = auto_meter("gpu")
    assert isinstance(meter, UnavailableMeter)
    meter.start()
    reading = meter.stop()
    assert reading.basis == "unavailable"
    assert reading.reason.startswith("nvidia-ml-py not installed")


def test_nvml_meter_when_the_driver_is_missing() -> None:
    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:
            raise self.NVMLError("Driver Not Loaded")

    meter = NvmlEnergyMeter(NoDriver(FakeClock(1.0), [100.0], [True]), clock=FakeClock(1.0))
    meter.start()
    reading = meter.stop()
    assert reading.basis == "unavailable"
    assert "Driver Not Loaded" in reading.reason


def test_auto_meter_picks_nvml_when_it_works() -> None:
    nvml = FakeNvml(FakeClock(1.0), [100.0], [True])
    assert isinstance(auto_meter("gpu", nvml=nvml), NvmlEnergyMeter)


# ---------------------------------------------------------------- RAPL meter on a fake powercap tree


def make_zone(root: Path, zone: str, name: str, energy_uj: int, max_uj: int = RAPL_MAX_UJ) -> Path:
    path = root / zone
    path.mkdir(parents=True)
    (path / "name").write_text(f"{name}\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path


@pytest.fixture
def powercap(tmp_path: Path) -> Path:
    root = tmp_path / "powercap"
    make_zone(root, "intel-rapl:0", "package-0", 1_000_000)
    make_zone(root, "intel-rapl:1", "package-1", RAPL_MAX_UJ - 2_000_000)
    # Nested and non-package domains: summing them would double count.
    make_zone(root, "intel-rapl:0:0", "core", 5_000_000)
    make_zone(root, "intel-rapl:2", "psys", 9_000_000)
    (root / "intel-rapl").mkdir()  # the control-type directory, not a zone
    return root


def test_rapl_meter_sums_package_zones_only_and_handles_wrap(powercap: Path) -> None:
    clock = FakeClock(step_s=10.0)
    meter = RaplEnergyMeter(powercap, poll_interval_s=None, clock=clock)
    meter.start()
    (powercap / "intel-rapl:0" / "energy_uj").write_text("301000000\n")  # +300 J
    (powercap / "intel-rapl:1" / "energy_uj").write_text("98000000\n")  # wrapped: +2 J + 98 J
    (powercap / "intel-rapl:0:0" / "energy_uj").write_text("999000000\n")  # ignored
    reading = meter.stop()
    assert reading.basis == "measured"
    assert reading.joules == pytest.approx(400.0)
    assert reading.avg_power_w == pytest.approx(400.0 / reading.window_s)
    assert "package-0" in reading.device and "package-1" in reading.device
    assert "core" not in reading.device and "psys" not in reading.device


def test_rapl_permission_denied_is_unavailable_with_the_fix(powercap: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests may run as root, which ignores file modes; refuse the read the way the kernel does for users.
    real_read_text = Path.read_text

    def guarded_read_text(self: Path, *args, **kwargs) -> str:
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", guarded_read_text)
    meter = auto_meter("cpu", powercap_root=powercap)
    assert isinstance(meter, UnavailableMeter)
    meter.start()
    reading = meter.stop()
    assert reading.basis == "unavailable"
    assert reading.joules is None
    assert reading.reason.startswith("permission denied reading")
    assert "chmod a+r" in reading.reason

    direct = RaplEnergyMeter(powercap, poll_interval_s=None)
    direct.start()
    assert direct.stop().reason.startswith("permission denied")


def test_rapl_without_powercap_is_unavailable(tmp_path: Path) -> None:
    meter = auto_meter("cpu", powercap_root=tmp_path / "absent")
    meter.start()
    reading = meter.stop()
    assert reading.basis == "unavailable"
    assert "no RAPL powercap interface" in reading.reason


def test_rapl_without_package_zones_is_unavailable(tmp_path: Path) -> None:
    make_zone(tmp_path, "intel-rapl:0", "psys", 1_000)
    meter = RaplEnergyMeter(tmp_path, poll_interval_s=None)
    meter.start()
    assert "no RAPL package zones" in meter.stop().reason


def test_auto_meter_picks_rapl_when_readable(powercap: Path) -> None:
    assert isinstance(auto_meter("cpu", powercap_root=powercap), RaplEnergyMeter)


def test_auto_meter_rejects_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="unknown meter kind"):
        auto_meter("tpu")  # type: ignore[arg-type]


def test_a_sparse_simulator_run_is_charged_its_busy_time_not_its_idle_gaps() -> None:
    """Issue 12 item 5: 20 requests at 0.2 req/s leave the engine idle most of the window; the modelled
    energy is idle power over the window plus the dynamic range over the engine's own busy seconds."""
    import asyncio

    from core.backends.sim import SimBackend
    from core.factsheet.run import modelled_run_energy
    from core.jobs import RunOptions, run_workload
    from core.profile import load_calibration, load_profile

    profile = load_profile("quickstart")
    arrival = profile.workload.arrival.model_copy(update={"rate_rps": 0.2})
    profile = profile.model_copy(
        update={"workload": profile.workload.model_copy(update={"arrival": arrival, "warmup_requests": 0})}
    )
    calibration = load_calibration(profile)
    backend = SimBackend(calibration, profile.knobs, seed=1)
    result = asyncio.run(run_workload(profile, backend, lambda event: None, RunOptions(requests=20)))
    power = calibration.power
    assert power is not None
    reading = modelled_run_energy(result)
    assert reading is not None and reading.basis == "modelled"
    window = result.summary.window_s
    busy = result.outcome.notes["busy_s"]
    assert busy < 0.2 * window  # sparse: mostly idle
    assert reading.joules == pytest.approx(power.idle_w * window + (power.peak_w - power.idle_w) * busy, rel=0.02)
    # Sample power follows utilisation: not the peak whenever a request is running.
    running = [s.power_w for s in result.outcome.samples if s.running > 0 and s.power_w is not None]
    assert running and min(running) < power.peak_w


def _quickstart_samples(requests: int, seed: int) -> tuple[PowerModel, list[EngineSample]]:
    """The quickstart calibration's power model and a simulator run's samples, at 4 req/s (busy part of the
    time, so utilisation takes many values between samples)."""
    from core.profile import load_calibration, load_profile
    from core.sim.engine import SimEngine
    from core.workload import build_load_plan

    profile = load_profile("quickstart")
    arrival = profile.workload.arrival.model_copy(update={"rate_rps": 4.0})
    profile = profile.model_copy(update={"workload": profile.workload.model_copy(update={"arrival": arrival})})
    calibration = load_calibration(profile)
    assert calibration.power is not None
    samples: list[EngineSample] = []
    engine = SimEngine(
        calibration, profile.knobs, build_load_plan(profile, requests=requests), seed=seed, on_sample=samples.append
    )
    engine.run()
    return calibration.power, samples


def test_the_simulators_sampled_power_integrates_to_the_modelled_energy() -> None:
    """One power model: the power the simulator reports per sample (PowerModel.power_w at the utilisation
    since the previous sample), held over each interval, adds up to PowerModel.energy_j of its busy time."""
    power, samples = _quickstart_samples(requests=200, seed=1)
    assert len(samples) > 10
    times = [0.0] + [s.time_s for s in samples]
    integrated = sum(s.power_w * (t1 - t0) for s, t0, t1 in zip(samples, times[:-1], times[1:], strict=True))  # type: ignore[operator]
    last = samples[-1]
    assert integrated == pytest.approx(power.energy_j(last.busy_s, last.time_s), rel=1e-9)
    assert power.idle_w * last.time_s < integrated < power.peak_w * last.time_s


def test_the_simulators_sample_power_is_power_w_to_the_bit() -> None:
    """The simulator applies PowerModel.power_w's line itself (idle_w and slope_w read once per run): each
    sample's power equals power_w at the busy share since the previous sample, bit for bit."""
    power, samples = _quickstart_samples(requests=300, seed=3)
    last_time, last_busy = 0.0, 0.0
    shares = set()
    for sample in samples:
        assert sample.busy_s is not None
        span = sample.time_s - last_time
        share = min(1.0, (sample.busy_s - last_busy) / span) if span > 0 else (1.0 if sample.running else 0.0)
        assert sample.power_w == power.power_w(share)
        shares.add(share)
        last_time, last_busy = sample.time_s, sample.busy_s
    assert len(shares) > 5  # utilisation took many values, not only idle and full
