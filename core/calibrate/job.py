"""`--job calibrate`: sweep a live server, fit the simulator's performance model, write a calibration profile.

    result = await run_calibrate(profile, backend_kind="vllm", sink=print_event, out_dir=Path("runs/cal"))

Events: `start`, `calibrate_server` per server (re)start, `calibrate_point` per measured point,
`calibrate_fit`, then `calibrate_summary`. Files in `out_dir`: `calibration.yaml` (load it with
`engine: {calibration: <path>}` in a profile) and `sweep.json` (every point and observation, for review).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np

from core.backend_api import BackendUnavailable
from core.calibrate.fit import (
    FitError,
    StepFit,
    acceptance_from_length,
    build_calibration,
    fit_step_model,
    write_calibration,
)
from core.calibrate.stalls import STALL_FACTOR, fit_stalls
from core.calibrate.step_observations import client_overhead_s, noise_cv
from core.calibrate.sweep import median_itl, run_sweep
from core.calibrate.sweep_points import SweepResult, SweepSettings, Timing
from core.calibrate.sweep_targets import SweepTarget, UrlTarget, VllmTarget
from core.durable_files import replace_atomically
from core.events import EventSink, make_event
from core.profile import Calibration, Profile, ProfileError, load_calibration

CALIBRATION_FILE = "calibration.yaml"
# The other timing's fit from the same sweep, for comparison (engine steps when the main fit is end to end).
ALTERNATIVE_FILE = "calibration-{timing}.yaml"
SWEEP_FILE = "sweep.json"


class CalibrationFailed(RuntimeError):
    """The sweep ran but its measurements cannot determine the model (batch exit code 4)."""


@dataclass(slots=True)
class CalibrateResult:
    profile: Profile
    sweep: SweepResult
    fit: StepFit | None
    calibration: Calibration | None
    path: Path | None
    wall_s: float
    interrupted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def make_target(profile: Profile, backend_kind: str, url: str | None) -> SweepTarget:
    if backend_kind == "vllm":
        from core.backends.vllm import VllmBackend

        return VllmTarget(VllmBackend.from_profile(profile))
    if backend_kind == "url":
        if not url:
            raise BackendUnavailable("--backend url needs --url http://HOST:PORT of a running server")
        from core.backends.live import UrlBackend

        return UrlTarget(UrlBackend(url))
    raise ProfileError(
        f"--job calibrate measures a live server; use --backend vllm or --backend url, not {backend_kind!r}"
    )


def _previous_calibration(profile: Profile) -> Calibration | None:
    """The profile's current calibration, for the facts a sweep could not read (none if it cannot load)."""
    try:
        return load_calibration(profile)
    except ProfileError:
        return None


def _hardware(description: dict[str, Any]) -> str:
    hardware = description.get("hardware") or {}
    parts = [str(hardware.get("cpu") or hardware.get("machine") or "unknown CPU")]
    if hardware.get("cpu_count"):
        parts.append(f"{hardware['cpu_count']} cores")
    if hardware.get("gpus"):
        parts.append(", ".join(hardware["gpus"]))
    engine = f"vLLM {description.get('version') or description.get('engine_version') or '?'}"
    if hardware.get("device"):
        engine += f" ({hardware['device']})"
    return f"{'; '.join(parts)}; {engine}"


def _model(description: dict[str, Any]) -> str:
    model = str(description.get("served_model_name") or description.get("model") or "unknown model")
    source = description.get("model_path") or description.get("model_root")
    return f"{model} ({source})" if source and source != model else model


def _acceptance(sweep: SweepResult, fallback: float) -> tuple[float, float | None]:
    """(per-token acceptance, measured mean acceptance length) from the speculation points, else fallback."""
    lengths = [p.mean_acceptance_length for p in sweep.decode_points(spec=True) if p.mean_acceptance_length]
    if not lengths:
        return fallback, None
    length = float(np.median(lengths))
    return acceptance_from_length(length, sweep.settings.spec_width), length


def request_overhead(sweep: SweepResult, fit: StepFit) -> float | None:
    """Per-request latency outside engine steps: fitted from client TTFTs, or client TTFT minus the
    engine's prefill time when the engine timed the prefills."""
    if any(o.with_overhead for o in fit.observations):
        return fit.request_overhead_s
    return client_overhead_s(sweep.points)


def _timing(sweep: SweepResult) -> str:
    sources = sorted({p.timing for p in sweep.points})
    return " and ".join(sources) if sources else "nothing"


def _derivation(
    sweep: SweepResult, fit: StepFit, acceptance_length: float | None, notes: list[str], timing: Timing
) -> str:
    s = sweep.settings
    decode = ", ".join(str(c) for c in s.decode_concurrency)
    parts = [
        f"Measured by `slo-console --job calibrate` on {datetime.now(UTC).date().isoformat()}: closed-loop "
        f"decode at concurrency {decode} (prompt {s.decode_prompt_tokens}) and "
        f"{', '.join(map(str, s.long_prompt_concurrency))} (prompt {s.long_prompt_tokens}), "
        f"{s.output_tokens} output tokens with ignore_eos, max_num_seqs {s.max_num_seqs}; prefill at "
        f"concurrency 1 for prompts {', '.join(map(str, s.prefill_prompt_tokens))}. "
        + (
            "Decode fitted end to end: per point, the step at which the simulator's closed loop gives the "
            "client's median e2e (it takes in the API server's per-token work, which limits this server). "
            if timing == "e2e"
            else "Decode fitted on engine steps. "
        )
        + f"Steps timed by {_timing(sweep)} (engine: mean inter-token latency per point at the mean batch, "
        f"from vLLM's engine-core timestamps; chunk gaps: batch and KV context reconstructed from all "
        f"requests in flight, mixed prefill steps left out, median per batch size).",
    ]
    if acceptance_length is not None:
        parts.append(
            f"Speculation: width {s.spec_width} at concurrency {', '.join(map(str, s.spec_concurrency))} prices "
            f"the draft passes (per_spec_step_s); /metrics gave a mean acceptance length of "
            f"{acceptance_length:.3f} tokens per step, i.e. default_acceptance."
        )
    overhead = request_overhead(sweep, fit)
    parts.append(
        f"Fit: {len(fit.terms)} roofline term(s) (paper 004 sec. 3.1.1), non-negative least squares on "
        f"relative error over {len(fit.observations)} observations, RMS {fit.rms_relative_error:.1%}, max "
        f"{fit.max_relative_error:.1%}."
    )
    if overhead is not None:
        parts.append(
            f"Not in the simulator: a per-request latency outside the engine steps (HTTP, tokenisation, API "
            f"server hand-off) of {overhead * 1000:.1f} ms (median client TTFT minus engine prefill)."
        )
    observed = sum(s.observed_s for s in sweep.stall_samples)
    stalls = fit_stalls(sweep.stall_samples)
    if stalls is not None:
        parts.append(
            f"Stalls (core/calibrate/stalls.py): gaps of over {STALL_FACTOR:g} typical steps in the merged token "
            f"stream of all clients while a request was mid-stream: {stalls.rate_per_s:.3g} per second over "
            f"{observed:.0f} s observed, mean {stalls.mean_s * 1000:.0f} ms, CV {stalls.cv:.2f}; taken out of the "
            f"decode fit, not modelled (copy them into `stalls:` to model them: rate_per_s, mean_s, cv)."
        )
    else:
        parts.append(f"Stalls: too few in {observed:.0f} s observed to model; left out.")
    parts += notes
    return " ".join(parts)


def _fit_event(
    fit: StepFit, calibration: Calibration, acceptance_length: float | None, overhead: float | None
) -> dict[str, Any]:
    return make_event(
        "calibrate_fit",
        terms=[t.model_dump() for t in calibration.terms],
        request_overhead_s=overhead,
        rms_relative_error=fit.rms_relative_error,
        max_relative_error=fit.max_relative_error,
        alternatives=fit.alternatives,
        observations=[
            {"label": o.label, "kind": o.kind, "measured_s": o.step_s, "fitted_s": p}
            for o, p in zip(fit.observations, fit.predictions, strict=True)
        ],
        kv_capacity_tokens=calibration.kv_capacity_tokens,
        block_size=calibration.block_size,
        noise_cv=calibration.noise_cv,
        default_acceptance=calibration.default_acceptance,
        mean_acceptance_length=acceptance_length,
        max_model_len=calibration.max_model_len,
    )


def calibrate_from_sweep(
    profile: Profile, sweep: SweepResult, terms: Literal[1, 2, "auto"] = "auto", timing: Timing = "e2e"
) -> tuple[StepFit, Calibration, float | None]:
    """Fit and assemble the calibration. Raises CalibrationFailed when the sweep cannot determine it."""
    previous = _previous_calibration(profile)
    try:
        fit = fit_step_model(sweep.observations(timing), terms=terms)
    except FitError as exc:
        raise CalibrationFailed(f"the sweep's measurements cannot be fitted: {exc}") from exc
    notes = list(sweep.notes)
    acceptance, acceptance_length = _acceptance(sweep, previous.default_acceptance if previous else 0.6)
    if acceptance_length is None:
        notes.append("default_acceptance was not measured (no speculation in the sweep); kept from the profile.")
    facts = sweep.facts
    kv_tokens = facts.kv_capacity_tokens
    if kv_tokens is None:
        if previous is None:
            raise CalibrationFailed("the server reports no KV cache size (neither /metrics nor its log)")
        kv_tokens = previous.kv_capacity_tokens
        notes.append("kv_capacity_tokens: the server did not report it; kept from the profile's calibration.")
    else:
        notes.append(f"kv_capacity_tokens from {facts.sources.get('kv_capacity_tokens', 'the server')}.")
    max_len = facts.max_model_len or (previous.max_model_len if previous else 4096)
    calibration = build_calibration(
        fit,
        name=profile.name,
        model=_model(sweep.description),
        hardware=_hardware(sweep.description),
        derivation=_derivation(sweep, fit, acceptance_length, notes, timing),
        kv_capacity_tokens=kv_tokens,
        block_size=facts.block_size or (previous.block_size if previous else 16),
        noise_cv=noise_cv(sweep.points),
        default_acceptance=acceptance,
        max_model_len=max_len,
        # No power model: the profile's previous calibration may describe other hardware entirely.
        power=None,
        # Measured and reported (derivation, sweep.json), not modelled by default: with them the simulator
        # over-predicted the grid's p99 by +270% on 2026-11-24 (the calibration's short, repeated runs catch
        # the API process's slow spells far more often than longer runs do). Add `stalls:` by hand to try.
        stalls=None,
    )
    return fit, calibration, acceptance_length


def _header(profile: Profile, command: str) -> str:
    return (
        f"Calibration of the server of profile {profile.name!r}, measured (not derived): see `derivation`.\n"
        f"Written by: {command}"
    )


async def run_calibrate(
    profile: Profile,
    *,
    backend_kind: str,
    sink: EventSink,
    out_dir: Path,
    url: str | None = None,
    settings: SweepSettings | None = None,
    terms: Literal[1, 2, "auto"] = "auto",
    command: str = "slo-console --batch --job calibrate",
    target: SweepTarget | None = None,
    timing: Timing = "e2e",
) -> CalibrateResult:
    """Sweep, fit and write `out_dir/calibration.yaml`. The server started here is stopped before return."""
    settings = settings or SweepSettings.full()
    target = target or make_target(profile, backend_kind, url)
    with_spec = bool(profile.server.draft_model or profile.server.spec_method)
    sink(
        make_event(
            "start",
            job="calibrate",
            profile=profile.name,
            backend=target.name,
            settings={k: getattr(settings, k) for k in settings.__dataclass_fields__},
            speculation=with_spec,
        )
    )
    started = time.perf_counter()
    try:
        sweep = await run_sweep(target, settings, profile.knobs, with_spec=with_spec, sink=sink)
    finally:
        await target.close()
    wall_s = time.perf_counter() - started
    out_dir.mkdir(parents=True, exist_ok=True)
    replace_atomically(out_dir / SWEEP_FILE, json.dumps(_sweep_json(sweep), indent=1) + "\n")
    if sweep.interrupted:
        return CalibrateResult(profile, sweep, None, None, None, wall_s, interrupted=True)
    fit, calibration, acceptance_length = calibrate_from_sweep(profile, sweep, terms, timing)
    overhead = request_overhead(sweep, fit)
    sink(_fit_event(fit, calibration, acceptance_length, overhead))
    path = write_calibration(calibration, out_dir / CALIBRATION_FILE, _header(profile, command))
    other: Timing = "steps" if timing == "e2e" else "e2e"
    try:
        _, alternative, _ = calibrate_from_sweep(profile, sweep, terms, other)
        write_calibration(
            alternative.model_copy(update={"name": f"{profile.name}-{other}"}),
            out_dir / ALTERNATIVE_FILE.format(timing=other),
            _header(profile, command) + f"\nAlternative fit ({other} timing) of the same sweep, for comparison.",
        )
    except CalibrationFailed:
        pass  # the alternative is a comparison aid; the main calibration stands without it
    itl = median_itl(sweep, timing)
    result = CalibrateResult(
        profile,
        sweep,
        fit,
        calibration,
        path,
        wall_s,
        extra={"median_itl_s": itl, "acceptance_length": acceptance_length, "request_overhead_s": overhead},
    )
    sink(
        make_event(
            "calibrate_summary",
            profile=profile.name,
            path=str(path),
            points=len(sweep.points),
            observations=len(fit.observations),
            rms_relative_error=fit.rms_relative_error,
            request_overhead_s=overhead,
            median_itl_s=itl,
            fitted_decode_step_s=decode_step_at_median(fit),
            wall_s=wall_s,
        )
    )
    return result


def decode_step_at_median(fit: StepFit) -> float | None:
    """The fitted step time for the median decode observation's batch and context (compare with the ITL)."""
    decodes = [o for o in fit.observations if o.kind == "decode" and o.spec_steps == 0]
    if not decodes:
        return None
    middle = sorted(decodes, key=lambda o: o.step_s)[len(decodes) // 2]
    return fit.step_time(middle.batched_tokens, middle.context_tokens, 0.0, middle.sequences)


def _sweep_json(sweep: SweepResult) -> dict[str, Any]:
    return {
        "settings": {k: getattr(sweep.settings, k) for k in sweep.settings.__dataclass_fields__},
        "facts": {
            "kv_capacity_tokens": sweep.facts.kv_capacity_tokens,
            "block_size": sweep.facts.block_size,
            "max_model_len": sweep.facts.max_model_len,
            "sources": sweep.facts.sources,
        },
        "server": sweep.description,
        "notes": sweep.notes,
        "interrupted": sweep.interrupted,
        "points": [
            {
                **p.to_dict(),
                "observation_list": [
                    {
                        "label": o.label,
                        "kind": o.kind,
                        "step_s": o.step_s,
                        "batched_tokens": o.batched_tokens,
                        "context_tokens": o.context_tokens,
                        "spec_steps": o.spec_steps,
                        "sequences": o.sequences,
                    }
                    for o in [*p.observations, *([p.e2e_observation] if p.e2e_observation else [])]
                ],
            }
            for p in sweep.points
        ],
    }
