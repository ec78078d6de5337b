"""The NVML meter on a real NVIDIA GPU: the hardware's own counter, not a stand-in module.

tests/test_energy.py checks the meter's arithmetic against fakes; this file checks that what it reads from
a real driver is the GPU's energy. It runs only where nvidia-ml-py, an NVIDIA GPU and torch with CUDA are
present (a GPU workstation, or a lent device machine) and is skipped elsewhere with the reason; CI machines
have no GPU. Large effects only: a bf16 matrix-product load against an idle card, the counter against the
sampled-power fallback on the same window, and the card's own enforced power limit as the outside bound.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import pytest

from core.energy import NvmlEnergyMeter, auto_meter
from core.energy.nvml import COUNTER_METHOD, POWER_METHOD

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (pip install '.[nvml]')")
torch = pytest.importorskip("torch", reason="torch is needed to load the GPU")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

IDLE_WINDOW_S = 4.0
# NVML's power reading is a 1 s average on Ampere and newer: warm the load past it before the window opens.
LOAD_WARMUP_S = 3.0
LOAD_WINDOW_S = 8.0


class CounterHidden:
    """pynvml with the energy counter reported missing, so the meter falls back to sampled power."""

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml = nvml

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        raise self._nvml.NVMLError(self._nvml.NVML_ERROR_NOT_SUPPORTED)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nvml, name)


def _matrix_products(seconds: float, operands: tuple[Any, Any]) -> int:
    """Run bf16 matrix products on GPU 0 for `seconds`; how many ran."""
    left, right = operands
    deadline = time.monotonic() + seconds
    count = 0
    while time.monotonic() < deadline:
        for _ in range(8):
            torch.matmul(left, right)
        torch.cuda.synchronize()  # waits with the GIL released, so the power sampler's thread keeps time
        count += 8
    return count


def _power_limit_w() -> float:
    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetEnforcedPowerLimit(pynvml.nvmlDeviceGetHandleByIndex(0)) / 1000.0
    finally:
        pynvml.nvmlShutdown()


def test_the_nvml_meter_measures_a_real_gpu_idle_and_under_load() -> None:
    assert isinstance(auto_meter("gpu"), NvmlEnergyMeter)  # the real probe finds the driver and a GPU
    limit_w = _power_limit_w()

    idle_meter = NvmlEnergyMeter(gpu_indices=[0])
    idle_meter.start()
    time.sleep(IDLE_WINDOW_S)
    idle = idle_meter.stop()

    size = 8192
    operands = (
        torch.randn(size, size, device="cuda", dtype=torch.bfloat16),
        torch.randn(size, size, device="cuda", dtype=torch.bfloat16),
    )
    _matrix_products(LOAD_WARMUP_S, operands)
    counter_meter = NvmlEnergyMeter(gpu_indices=[0])
    sampled_meter = NvmlEnergyMeter(CounterHidden(pynvml), gpu_indices=[0], poll_interval_s=0.05)
    counter_meter.start()
    sampled_meter.start()
    products = _matrix_products(LOAD_WINDOW_S, operands)
    sampled = sampled_meter.stop()
    load = counter_meter.stop()
    tflops = products * 2 * size**3 / load.window_s / 1e12

    print(
        f"\n{load.device}: enforced power limit {limit_w:.0f} W\n"
        f"idle   {idle.joules:8.1f} J over {idle.window_s:.2f} s = {idle.avg_power_w:6.1f} W ({idle.method})\n"
        f"load   {load.joules:8.1f} J over {load.window_s:.2f} s = {load.avg_power_w:6.1f} W "
        f"({products} bf16 {size}^3 products, {tflops:.0f} TFLOP/s)\n"
        f"sample {sampled.joules:8.1f} J over {sampled.window_s:.2f} s = {sampled.avg_power_w:6.1f} W "
        f"({sampled.method})\n"
        f"sampled/counter energy: {sampled.joules / load.joules:.3f}"
    )
    for reading in (idle, load, sampled):
        assert reading.basis == "measured", reading.reason
    # The counter windows span over ten of its 0.1 s updates; power is a 1 s average, so 8 s of it is flagged.
    assert idle.note is None and load.note is None
    assert sampled.note is not None and "under 10 counter update periods" in sampled.note
    assert idle.method == load.method == COUNTER_METHOD
    assert sampled.method == POWER_METHOD
    assert "GPU 0" in load.device
    # A powered, idle data-centre GPU draws tens of watts, never nothing and never near its limit.
    assert 5.0 < idle.avg_power_w < 0.6 * limit_w
    # Dense bf16 products draw far more than idle and, averaged over seconds, stay under the enforced limit
    # (10% margin for the counter's 0.1 s granularity at the window's ends).
    assert load.avg_power_w > max(1.5 * idle.avg_power_w, idle.avg_power_w + 100.0)
    assert load.avg_power_w < 1.1 * limit_w
    # Two mechanisms over one window of steady load: the integral of sampled power matches the counter.
    assert sampled.joules == pytest.approx(load.joules, rel=0.15)
