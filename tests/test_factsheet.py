"""Factsheet: build from a run's results, render Markdown (golden) and JSON, and keep the labels honest."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from core.energy import EnergyReading, modelled_energy
from core.factsheet import (
    FactsheetInputs,
    HostInfo,
    build_factsheet,
    git_revision,
    render_json,
    render_markdown,
    write_factsheet,
)
from core.factsheet.host import detect_cpu, detect_gpus
from core.factsheet.model import GpuInfo
from core.metrics.summary import summarize
from core.profile import KnobsSpec, PowerModel, Profile, profile_hash
from core.records import RequestRecord, RequestSLO, Status

GOLDEN = Path(__file__).parent / "golden"
# Set to regenerate the golden files after an intended change; review the diff before committing.
UPDATE_GOLDEN = os.environ.get("SLO_CONSOLE_UPDATE_GOLDEN") == "1"

STARTED = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
GENERATED = datetime(2026, 3, 1, 12, 5, 0, tzinfo=UTC)

HOST = HostInfo(
    gpus=[],
    gpu_count=0,
    gpu_driver_version=None,
    gpu_source="unavailable: nvidia-ml-py not installed; install the extra: pip install 'slo-console[nvml]'",
    cpu_model="Example CPU 8-Core",
    cpu_logical_cores=16,
    memory_total_gib=62.5,
    operating_system="Linux 6.8.0",
    software={"python": "3.11.7", "slo-console": "0.1.0", "numpy": "2.0.0", "pydantic": "2.9.0"},
)


def make_profile(**overrides: Any) -> Profile:
    data: dict[str, Any] = {
        "name": "chat-mix",
        "description": "chat and code completions",
        "seed": 7,
        "workload": {
            "arrival": {"kind": "poisson", "rate_rps": 12.0},
            "tasks": [
                {
                    "name": "chat",
                    "weight": 3,
                    "prompt_tokens": {"dist": "lognormal", "mean": 256, "sigma": 0.6},
                    "output_tokens": {"dist": "fixed", "value": 128},
                },
                {
                    "name": "code",
                    "weight": 1,
                    "prompt_tokens": {"dist": "uniform", "low": 512, "high": 1024},
                    "output_tokens": {"dist": "fixed", "value": 64},
                    "slo": {"e2e_s": 2.0, "ttft_s": 0.5},
                },
            ],
            "requests": 2000,
            "warmup_requests": 50,
        },
        "slo": {"e2e_s": 1.2},
    }
    data.update(overrides)
    return Profile.model_validate(data)


# Shaped like core.metrics.Summary.to_dict() (NaN already turned into None there).
SUMMARY: dict[str, Any] = {
    "requests": 2000,
    "completed": 1990,
    "failed": 10,
    "failed_by_status": {"timeout": 7, "error": 3},
    "window_s": 166.5,
    "p50_s": 0.4123,
    "p90_s": 0.7702,
    "p95_s": 0.8811,
    "p99_s": 1.0432,
    "mean_s": 0.4711,
    "ttft_p50_s": 0.0612,
    "ttft_p90_s": 0.1511,
    "ttft_p95_s": 0.1904,
    "ttft_p99_s": 0.3107,
    "ttft_mean_s": 0.0833,
    "tpot_p50_s": 0.0031,
    "tpot_p90_s": 0.0049,
    "tpot_p95_s": 0.0058,
    "tpot_p99_s": 0.0074,
    "tpot_mean_s": 0.0036,
    "itl_p50_s": 0.0029,
    "itl_p90_s": 0.0051,
    "itl_p95_s": 0.0062,
    "itl_p99_s": 0.0123,
    "itl_mean_s": 0.0035,
    "goodput_rps": 11.73,
    "slo_attainment": 0.9765,
    "token_goodput_tps": 1290.4,
    "smooth_goodput": 1101.2,
    "smooth_alpha": 5.0,
    "smooth_reading_speed_tps": 20.0,
    "smooth_ttft_allow_s": 1.0,
    "smooth_penalty": "linear",
    "throughput_rps": 11.95,
    "output_tps": 1337.9,
    "output_tokens": 222_760,
    "cv_completion_over_slo": 0.212,
    "mean_idle_latency_s": None,
    "per_task": {
        "code": {
            "requests": 498,
            "completed": 496,
            "failed": 2,
            "p50_s": 0.52,
            "p99_s": 1.31,
            "ttft_p99_s": 0.41,
            "slo_attainment": 0.982,
            "goodput_rps": 2.95,
            "token_goodput_tps": 188.1,
            "smooth_goodput": 180.4,
        },
        "chat": {
            "requests": 1502,
            "completed": 1494,
            "failed": 8,
            "p50_s": 0.39,
            "p99_s": 0.97,
            "slo_attainment": 0.9747,
            "goodput_rps": 8.78,
            "token_goodput_tps": 1102.3,
            "smooth_goodput": 920.8,
        },
    },
}

SIM_DESCRIPTION = {
    "backend": "sim",
    "engine": "simulator",
    "calibration": "tinyllama-1.1b-l40s",
    "model": "TinyLlama-1.1B-Chat",
    "hardware": "NVIDIA L40S",
}


def sim_inputs(**overrides: Any) -> FactsheetInputs:
    """A simulator batch run with modelled energy, pinned for golden comparison."""
    power = PowerModel(idle_w=80, peak_w=350)
    energy = modelled_energy(power, busy_s=150.0, window_s=166.5, device="modelled NVIDIA L40S")
    inputs = FactsheetInputs(
        profile=make_profile(),
        summary=SUMMARY,
        backend_description=SIM_DESCRIPTION,
        knobs=KnobsSpec(max_num_seqs=64, max_num_batched_tokens=4096),
        energy=energy,
        tuning=None,
        command_line=["slo-console", "--batch", "run", "chat-mix", "--out", "results"],
        seed=7,
        started_at=STARTED,
        host=HOST,
        git_revision="0123456789abcdef0123456789abcdef01234567",
        generated_at=GENERATED,
    )
    return replace(inputs, **overrides)


def live_inputs(**overrides: Any) -> FactsheetInputs:
    """A live vLLM run with measured energy and a tuner, as the batch runner will pass it."""
    energy = EnergyReading(
        joules=41_625.0,
        avg_power_w=250.0,
        window_s=166.5,
        basis="measured",
        method="NVML cumulative energy counter (nvmlDeviceGetTotalEnergyConsumption)",
        device="1x GPU: GPU 0 (NVIDIA L40S)",
    )
    tuning = {
        "tuner": "slo-tuner hill-climb",
        "objective": "goodput_rps under p99 e2e <= 1.2 s",
        "baseline": {
            "knobs": {"max_num_seqs": 256},
            "goodput_rps": 8.1,
            "p99_s": 1.36,
            "slo_attainment": 0.71,
        },
        "tuned": {"knobs": {"max_num_seqs": 64}, "goodput_rps": 11.7, "p99_s": 1.04, "slo_attainment": 0.98},
        "trajectory": [
            {"knobs": {"max_num_seqs": 256}, "goodput_rps": 8.1, "p99_s": 1.36},
            {"knobs": {"max_num_seqs": 128}, "goodput_rps": 10.2, "p99_s": 1.15},
            {"knobs": {"max_num_seqs": 64}, "goodput_rps": 11.7, "p99_s": 1.04},
        ],
        "wall_time_s": 540.0,
    }
    host = HOST.model_copy(
        update={
            "gpus": [GpuInfo(index=0, name="NVIDIA L40S", memory_total_mib=46068)],
            "gpu_count": 1,
            "gpu_driver_version": "550.54.15",
            "gpu_source": "NVML",
        }
    )
    return sim_inputs(
        backend_description={"backend": "vllm", "engine": "vllm", "version": "0.32.0", "model": "TinyLlama"},
        energy=energy,
        tuning=tuning,
        host=host,
        **overrides,
    )


def check_golden(name: str, text: str) -> None:
    # The profile hash changes whenever any profile model gains a defaulted field; that is not a change in
    # the factsheet's layout, so the golden files hold a placeholder.
    text = text.replace(profile_hash(make_profile()), "PROFILE-HASH")
    path = GOLDEN / name
    if UPDATE_GOLDEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    hint = "if the change is intended, rerun with SLO_CONSOLE_UPDATE_GOLDEN=1 and review the diff"
    assert path.exists(), f"{path} missing; {hint}"
    assert text == path.read_text(encoding="utf-8"), f"{path} differs; {hint}"


# ---------------------------------------------------------------- golden files


def test_markdown_matches_golden() -> None:
    check_golden("factsheet.md", render_markdown(build_factsheet(sim_inputs())))


def test_json_matches_golden() -> None:
    check_golden("factsheet.json", render_json(build_factsheet(sim_inputs())))


def test_live_markdown_matches_golden() -> None:
    check_golden("factsheet-live.md", render_markdown(build_factsheet(live_inputs())))


# ---------------------------------------------------------------- page structure and labels


def test_markdown_has_headline_table_first_and_every_section() -> None:
    page = render_markdown(build_factsheet(sim_inputs()))
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    # A run has no job section of its own (a tune's, compare's ... comes right after the headline).
    assert headings == [
        "## Headline",
        "## System",
        "## Configuration",
        "## Workload",
        "## Performance",
        "## Sustainability",
        "## Provenance",
        "## Caveats",
    ]
    headline = page.split("## Headline")[1].split("## System")[0]
    assert headline.strip().startswith("**SLO ")  # the verdict heads the page
    for row in ("SLO", "p99 end-to-end latency", "Goodput", "SLO attainment", "Energy per 1k output tokens"):
        assert f"| {row} |" in headline
    assert "| gCO2e per 1k output tokens |" in headline


def test_simulator_run_labels_energy_modelled_and_performance_simulated() -> None:
    factsheet = build_factsheet(sim_inputs())
    sus = factsheet.sustainability
    assert factsheet.performance.basis == "simulated"
    for figure in (
        sus.energy_j,
        sus.avg_power_w,
        sus.wh_per_1k_output_tokens,
        sus.gco2e_per_1k_output_tokens,
    ):
        assert figure.basis == "modelled"
    page = render_markdown(factsheet)
    headline = page.split("## Headline")[1].split("## System")[0]
    assert "| Energy per 1k output tokens | " in headline and "| modelled |" in headline
    assert "measured" not in headline  # nothing in a simulator run's headline may claim measurement
    assert factsheet.system.engine == "simulator"
    assert factsheet.system.calibration == "tinyllama-1.1b-l40s"
    assert any("modelled, not measured" in caveat for caveat in factsheet.caveats)


def test_live_run_records_engine_version_and_measured_energy() -> None:
    factsheet = build_factsheet(live_inputs())
    assert factsheet.system.engine == "vllm"
    assert factsheet.system.engine_version == "0.32.0"
    assert factsheet.system.host.software["vllm"] == "0.32.0"
    assert factsheet.performance.basis == "measured"
    assert factsheet.sustainability.energy_j.basis == "measured"
    # Measured energy times an assumed grid factor is an estimate, not a measurement of carbon.
    assert factsheet.sustainability.gco2e_per_1k_output_tokens.basis == "estimated"
    assert any("MLPerf Power" in caveat for caveat in factsheet.caveats)
    assert factsheet.tuning is not None and factsheet.tuning.segments == 3


def test_unavailable_energy_is_shown_with_its_reason_and_never_as_zero() -> None:
    reason = "permission denied reading /sys/class/powercap/intel-rapl:0/energy_uj"
    gap = EnergyReading(None, None, 166.5, "unavailable", "RAPL package energy counter", reason=reason)
    factsheet = build_factsheet(sim_inputs(energy=gap))
    data = json.loads(render_json(factsheet))
    sustainability = data["sustainability"]
    for key in (
        "energy_j",
        "avg_power_w",
        "wh_per_1k_output_tokens",
        "j_per_request",
        "gco2e_per_1k_output_tokens",
    ):
        assert sustainability[key]["value"] is None
        assert sustainability[key]["basis"] == "unavailable"
        assert reason in sustainability[key]["reason"]
    page = render_markdown(factsheet)
    assert f"unavailable: energy unavailable: {reason}" in page
    assert f"(reason: {reason})" in page


def test_no_meter_at_all_is_unavailable() -> None:
    factsheet = build_factsheet(sim_inputs(energy=None))
    assert factsheet.sustainability.meter is None
    assert factsheet.sustainability.energy_j.reason == "no energy meter ran for this run"


def test_too_short_window_reaches_the_factsheet_as_its_reason() -> None:
    short = EnergyReading(
        None, None, 0.05, "unavailable", "NVML", reason="window shorter than the counter update period"
    )
    page = render_markdown(build_factsheet(sim_inputs(energy=short)))
    assert "window shorter than the counter update period" in page


# ---------------------------------------------------------------- arithmetic by hand


def test_energy_and_carbon_arithmetic_by_hand() -> None:
    # 7200 J measured; 20,000 output tokens; 400 completed requests; 436 gCO2e/kWh; PUE 1.5.
    #   Wh                      = 7200 J / 3600 J/Wh          = 2 Wh
    #   Wh per 1k output tokens = 2 Wh / (20,000 / 1000)      = 0.1 Wh
    #   J per request           = 7200 J / 400                = 18 J
    #   gCO2e per 1k tokens     = 0.1 Wh / 1000 Wh/kWh * 436 gCO2e/kWh * 1.5 = 0.0654 g
    #   average power           = 7200 J / 60 s               = 120 W
    energy = EnergyReading(7200.0, 120.0, 60.0, "measured", "NVML cumulative energy counter", device="GPU 0")
    profile = make_profile(
        sustainability={
            "grid_intensity_gco2e_per_kwh": 436,
            "grid_intensity_source": "test grid",
            "grid_intensity_year": 2022,
            "pue": 1.5,
            "pue_source": "test facility",
            "pue_year": 2023,
        }
    )
    summary = {"completed": 400, "output_tokens": 20_000, "window_s": 60.0}
    sus = build_factsheet(sim_inputs(profile=profile, summary=summary, energy=energy)).sustainability
    assert sus.energy_j.value == pytest.approx(7200.0)
    assert sus.avg_power_w.value == pytest.approx(120.0)
    assert sus.wh_per_1k_output_tokens.value == pytest.approx(0.1)
    assert sus.j_per_request.value == pytest.approx(18.0)
    assert sus.gco2e_per_1k_output_tokens.value == pytest.approx(0.0654)
    assert sus.carbon_inputs.pue == 1.5
    assert sus.carbon_inputs.grid_intensity_source == "test grid"


def test_modelled_simulator_energy_by_hand() -> None:
    # Power model idle 80 W, peak 350 W; busy 150 s of 166.5 s:
    #   80 * 166.5 + 270 * 150 = 13,320 + 40,500 = 53,820 J
    #   per 1k output tokens: 53,820 / 3600 / 222.76 = 0.067112... Wh
    #   gCO2e per 1k (world 436, PUE 1.0): 0.067112 / 1000 * 436 = 0.029261... g
    sus = build_factsheet(sim_inputs()).sustainability
    assert sus.energy_j.value == pytest.approx(53_820.0)
    assert sus.wh_per_1k_output_tokens.value == pytest.approx(53_820 / 3600 / 222.76)
    assert sus.gco2e_per_1k_output_tokens.value == pytest.approx(53_820 / 3600 / 222.76 / 1000 * 436)


def test_default_carbon_inputs_carry_source_and_year() -> None:
    carbon = build_factsheet(sim_inputs()).sustainability.carbon_inputs
    assert carbon.grid_intensity_gco2e_per_kwh == 436.0
    assert "Ember" in carbon.grid_intensity_source and carbon.grid_intensity_year == 2022
    assert carbon.pue == 1.0 and carbon.pue_year == 2023 and "workstation" in carbon.pue_source


# ---------------------------------------------------------------- missing inputs


def test_missing_summary_keys_read_unknown() -> None:
    factsheet = build_factsheet(sim_inputs(summary={"requests": 10, "p99_s": float("nan")}))
    perf = factsheet.performance
    assert perf.requests == 10
    assert perf.e2e.p99_s is None  # NaN (p99 of nothing) is unknown, not a number
    assert perf.goodput_rps is None and perf.completed is None and perf.per_task == {}
    page = render_markdown(factsheet)
    assert "- Goodput: unknown" in page
    # No tokens counted: per-token energy cannot be derived even though energy was modelled.
    assert factsheet.sustainability.wh_per_1k_output_tokens.basis == "unavailable"


def test_unmapped_summary_scalars_are_kept() -> None:
    perf = build_factsheet(sim_inputs()).performance
    assert perf.other_metrics == {"cv_completion_over_slo": 0.212, "mean_idle_latency_s": None}
    assert list(perf.per_task) == ["chat", "code"]  # sorted: stable output


def test_smooth_goodput_parameters_under_either_key_name() -> None:
    summary = {"smooth_goodput": 50.0, "smooth_goodput_alpha": 10.0, "smooth_goodput_reading_speed_tps": 5.0}
    smooth = build_factsheet(sim_inputs(summary=summary)).performance.smooth_goodput
    assert (smooth.value, smooth.alpha, smooth.reading_speed_tps) == (50.0, 10.0, 5.0)
    # Not in the summary: the profile's configured values (paper 003's alpha 5 with V 20 tok/s).
    assert smooth.ttft_allow_s is None and smooth.penalty == "linear"  # None: token i due at i/V (eq. 4)


def test_built_from_a_real_metrics_summary() -> None:
    records = [
        RequestRecord(
            request_id=i,
            task="chat",
            slo=RequestSLO(e2e_s=1.2),
            prompt_tokens=100,
            max_tokens=4,
            scheduled_s=float(i),
            arrival_s=float(i),
            end_s=float(i) + 0.2 + 0.4 * i,
            output_tokens=4,
            chunk_times=np.array([i + 0.1, i + 0.15, i + 0.18, i + 0.2 + 0.4 * i]),
        )
        for i in range(4)
    ]
    records.append(RequestRecord(4, "chat", RequestSLO(e2e_s=1.2), 100, 4, 4.0, 4.0, status=Status.TIMEOUT, end_s=9.0))
    profile = make_profile()
    summary = summarize(records, slo=profile.slo, smooth=profile.smooth_goodput)
    factsheet = build_factsheet(sim_inputs(summary=summary, profile=profile))
    perf = factsheet.performance
    assert (perf.requests, perf.completed, perf.failed) == (5, 4, 1)
    assert perf.failed_by_status == {"timeout": 1}
    # e2e latencies 0.2, 0.6, 1.0, 1.4 s; 3 of 5 submitted meet 1.2 s; window 0 -> 9 s.
    assert perf.slo_attainment == pytest.approx(3 / 5)
    assert perf.goodput_rps == pytest.approx(3 / 9)
    assert perf.output_tokens == 16
    assert perf.smooth_goodput.alpha == 5.0
    assert factsheet.sustainability.wh_per_1k_output_tokens.value is not None


def test_few_completed_requests_warn_about_p99() -> None:
    factsheet = build_factsheet(sim_inputs(summary={**SUMMARY, "completed": 40}))
    assert any("Only 40 requests completed" in caveat for caveat in factsheet.caveats)


# ---------------------------------------------------------------- JSON stability and files


def test_json_is_stable_apart_from_generation_time() -> None:
    first = render_json(build_factsheet(sim_inputs()))
    assert first == render_json(build_factsheet(sim_inputs()))
    later = render_json(build_factsheet(sim_inputs(generated_at=datetime(2027, 1, 1, tzinfo=UTC))))

    def without_time(text: str) -> list[str]:
        return [line for line in text.splitlines() if '"generated_at"' not in line]

    assert first != later
    assert without_time(first) == without_time(later)


def test_json_top_level_order_and_version() -> None:
    data = json.loads(render_json(build_factsheet(sim_inputs())))
    assert list(data)[:5] == ["schema", "schema_version", "title", "job", "verdict"]
    assert data["schema"] == "slo-console-factsheet" and data["schema_version"] == "1.2"
    assert data["job"] == "run" and data["tuning"] is None


def test_write_factsheet_writes_both_files(tmp_path: Path) -> None:
    factsheet = build_factsheet(sim_inputs())
    json_path, markdown_path = write_factsheet(factsheet, tmp_path / "out")
    assert json_path.name == "factsheet.json" and markdown_path.name == "factsheet.md"
    assert json.loads(json_path.read_text())["provenance"]["seed"] == 7
    assert markdown_path.read_text().startswith("# Factsheet: chat-mix")


def test_provenance() -> None:
    prov = build_factsheet(sim_inputs()).provenance
    assert prov.command_line[:2] == ["slo-console", "--batch"]
    assert prov.seed == 7 and len(prov.profile_hash) == 16
    assert prov.git_revision.startswith("0123456789")


# ---------------------------------------------------------------- host detection


def test_detect_gpus_from_nvml() -> None:
    class Nvml:
        def nvmlInit(self) -> None: ...
        def nvmlShutdown(self) -> None: ...
        def nvmlSystemGetDriverVersion(self) -> bytes:
            return b"550.54.15"

        def nvmlDeviceGetCount(self) -> int:
            return 2

        def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
            return index

        def nvmlDeviceGetName(self, handle: int) -> str:
            return "NVIDIA H100 80GB HBM3"

        def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
            return SimpleNamespace(total=81_559_060_480)

    gpus, driver, source = detect_gpus(Nvml())
    assert source == "NVML" and driver == "550.54.15"
    assert [gpu.index for gpu in gpus] == [0, 1]
    assert gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].memory_total_mib == 81_559_060_480 // 2**20


def test_detect_cpu_from_proc(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Example CPU 8-Core\n")
    (tmp_path / "meminfo").write_text("MemTotal:       65536000 kB\n")
    model, cores, memory_gib = detect_cpu(tmp_path)
    assert model == "Example CPU 8-Core"
    assert cores == os.cpu_count()
    assert memory_gib == pytest.approx(62.5)


def test_git_revision_outside_a_checkout_is_unknown(tmp_path: Path) -> None:
    assert git_revision(tmp_path) == "unknown"


def test_git_revision_of_this_checkout() -> None:
    revision = git_revision()
    assert revision == "unknown" or len(revision.split("+")[0]) == 40


# ---------------------------------------------------------------- end to end on the real simulator


def test_simulator_run_to_factsheet_files(tmp_path: Path) -> None:
    """The path the batch runner wires: simulate, model energy over the metrics window, write both files."""
    import asyncio

    import jsonschema

    from core.backends.factory import make_backend
    from core.energy import ModelledEnergy
    from core.events import null_sink
    from core.jobs import RunOptions, run_workload
    from core.profile import load_calibration, load_profile
    from tests.fakes import PUBLISHED_SCHEMA

    profile = load_profile("quickstart")
    result = asyncio.run(run_workload(profile, make_backend("sim", profile), null_sink, RunOptions(requests=120)))
    measured = [record for record in result.records if not record.warmup]
    # The summary's window starts at the earliest measured arrival; model energy over the same window.
    window_start_s = min(record.arrival_s for record in measured)
    meter = ModelledEnergy(load_calibration(profile).power, device=f"modelled {result.backend['hardware']}")
    meter.start()
    meter.record_samples(result.outcome.samples, window_s=result.summary.window_s, start_s=window_start_s)
    energy = meter.stop()
    assert energy.basis == "modelled"

    factsheet = build_factsheet(
        sim_inputs(
            profile=profile,
            summary=result.summary,
            backend_description=result.backend,
            knobs=profile.knobs,
            energy=energy,
            seed=result.seed,
        )
    )
    json_path, markdown_path = write_factsheet(factsheet, tmp_path)
    schema = json.loads(PUBLISHED_SCHEMA.read_text(encoding="utf-8"))
    jsonschema.validate(json.loads(json_path.read_text()), schema, cls=jsonschema.Draft202012Validator)
    page = markdown_path.read_text()
    assert "| Energy per 1k output tokens |" in page and "| modelled |" in page
    assert factsheet.performance.requests == len(measured)
    assert factsheet.system.engine == "simulator" and factsheet.performance.basis == "simulated"
    assert not any("energy window" in caveat for caveat in factsheet.caveats)  # windows agree
