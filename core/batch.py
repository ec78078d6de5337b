"""Headless batch runner: `slo-console --batch ...`. JSON Lines on stdout, logs on stderr.

Never imports Textual (tests/test_batch.py proves it). Exit codes (also in README):
  0 ok, 2 bad usage or profile, 3 backend unavailable, 4 the run failed, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from core.backends.base import BackendUnavailable
from core.events import Event, make_event, to_json_line
from core.profile import Profile, ProfileError, load_profile

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_BACKEND = 3
EXIT_FAILED = 4
EXIT_INTERRUPTED = 130

log = logging.getLogger("slo_console")


@dataclass(slots=True)
class BatchArgs:
    profile: str
    job: str = "run"
    backend: str = "sim"
    url: str | None = None
    seed: int | None = None
    requests: int | None = None
    duration_s: float | None = None
    out: Path | None = None
    argv: list[str] | None = None
    resume: bool = False  # --job tune: continue the journal in --out instead of starting a new one
    mode: str | None = None  # --mode: the scheduling mode (core/control/modes.py); None: the profile's `mode`


class EventWriter:
    """Writes each event to stdout and, with --out, to events.jsonl as it happens (nothing is lost)."""

    def __init__(self, stream: IO[str], out_dir: Path | None) -> None:
        self.stream = stream
        self.file: IO[str] | None = None
        if out_dir is not None:
            self.file = (out_dir / "events.jsonl").open("w")

    def __call__(self, event: Event) -> None:
        line = to_json_line(event)
        self.stream.write(line + "\n")
        self.stream.flush()
        if self.file is not None:
            self.file.write(line + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _prepare_out(out: Path | None) -> Path | None:
    if out is None:
        return None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProfileError(f"--out {out}: cannot create the directory ({exc.strerror}); choose another") from exc
    return out


async def _run_cancellable(coro_factory: Callable[[], Any]) -> Any:
    """Run the job as a task that Ctrl-C cancels; backends return what they measured when cancelled."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro_factory())
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, task.cancel)
    try:
        return await task
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)


def _request_line(r: Any) -> str:
    return json.dumps(
        {
            "request_id": r.request_id,
            "task": r.task,
            "status": r.status.value,
            "warmup": r.warmup,
            "scheduled_s": round(r.scheduled_s, 6),
            "arrival_s": round(r.arrival_s, 6),
            "sent_s": None if r.sent_s is None else round(r.sent_s, 6),
            "ttft_s": None if r.ttft_s is None else round(r.ttft_s, 6),
            "e2e_s": None if r.e2e_s is None else round(r.e2e_s, 6),
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "preemptions": r.preemptions,
            "error": r.error,
        },
        separators=(",", ":"),
    )


class RequestWriter:
    """requests.jsonl written as requests finish (like events.jsonl), so a killed run loses nothing measured.

    At the end of a run the file is rewritten in request-id order with every record (atomically)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: IO[str] | None = path.open("w")

    def __call__(self, record: Any) -> None:
        if self.file is not None:
            self.file.write(_request_line(record) + "\n")
            self.file.flush()

    def finish(self, records: list[Any]) -> None:
        self.close()
        partial = self.path.with_suffix(".jsonl.tmp")
        with partial.open("w") as fh:
            for record in records:
                fh.write(_request_line(record) + "\n")
        partial.replace(self.path)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _run_job(args: BatchArgs, profile: Profile, sink: EventWriter) -> int:
    from core.backends.factory import make_backend
    from core.jobs import RunOptions, run_workload, summary_event

    profile = _apply_mode(args, profile)
    if args.job == "compare":
        return _run_compare_job(args, profile, sink)
    if args.job == "tune":
        return _run_tune_job(args, profile, sink)
    if args.job == "calibrate":
        return _run_calibrate_job(args, profile, sink)
    if args.job == "capacity":
        return _run_capacity_job(args, profile, sink)
    if args.job != "run":
        raise ProfileError(
            f"--job {args.job}: not available in this version; use --job run, tune, calibrate, compare or capacity"
        )
    backend = make_backend(args.backend, profile, seed=args.seed, url=args.url, mode=args.mode)  # type: ignore[arg-type]
    requests = RequestWriter(args.out / "requests.jsonl") if args.out is not None else None
    options = RunOptions(seed=args.seed, requests=args.requests, duration_s=args.duration_s, on_record=requests)

    async def job() -> Any:
        try:
            return await run_workload(profile, backend, sink, options)
        finally:
            await backend.close()

    try:
        result = asyncio.run(_run_cancellable(job))
    finally:
        if requests is not None:
            requests.close()
    final = summary_event(result)
    rows = result.extra.get("trace_rows")
    log.info(
        "%s: %d requests (%d failed) in %.2f s wall; p99 %.3f s, goodput %.2f req/s%s",
        profile.name,
        result.summary.requests,
        result.summary.failed,
        result.wall_s,
        result.summary.p99_s,
        result.summary.goodput_rps,
        "" if rows is None else f"; trace rows {rows['used']} of {rows['total']}",
    )
    if args.out is not None:
        assert requests is not None
        requests.finish(result.records)
        (args.out / "summary.json").write_text(json.dumps(final, indent=2, sort_keys=True) + "\n")
        _write_factsheet(args, result)
    sink(final)
    if result.interrupted:
        log.warning("interrupted: the summary covers the requests finished before Ctrl-C")
        return EXIT_INTERRUPTED
    if result.summary.requests > 0 and result.summary.completed == 0:
        log.error("every request failed; see the error field in requests.jsonl (--out) for the cause")
        return EXIT_FAILED
    return EXIT_OK


def _apply_mode(args: BatchArgs, profile: Profile) -> Profile:
    """--mode overrides the profile's `mode`; an unknown name (either place) is a usage error (exit 2)."""
    from core.control.modes import MODES

    name = args.mode if args.mode is not None else profile.mode
    if name not in MODES:
        where = "--mode" if args.mode is not None else f"{args.profile}: mode"
        raise ProfileError(f"{where} {name!r} is not a scheduling mode; choose one of: {', '.join(MODES)}")
    return profile if name == profile.mode else profile.model_copy(update={"mode": name})


def _run_compare_job(args: BatchArgs, profile: Profile, sink: EventWriter) -> int:
    """--job compare: every mode and the best static max_num_seqs on the same arrivals (core/compare.py)."""
    from core.compare import compare_summary_event, format_table, run_compare

    if args.backend != "sim":
        raise ProfileError("--job compare runs on the simulator; drop --backend (live modes: --job run --mode NAME)")
    if args.mode is not None:
        log.info("--job compare runs every mode; --mode %s is ignored", args.mode)
    result = asyncio.run(
        _run_cancellable(
            lambda: run_compare(profile, seed=args.seed, requests=args.requests, duration_s=args.duration_s, sink=sink)
        )
    )
    final = compare_summary_event(result)
    log.info("%s: compare, seed %d, %.1f s wall\n%s", profile.name, result.seed, result.wall_s, format_table(result))
    for mode, reason in result.skipped.items():
        log.warning("mode %s skipped: %s", mode, reason)
    if args.out is not None:
        (args.out / "summary.json").write_text(json.dumps(final, indent=2, sort_keys=True) + "\n")
    sink(final)
    if result.interrupted:
        log.warning("interrupted: the table covers the modes finished before Ctrl-C")
        return EXIT_INTERRUPTED
    return EXIT_OK


def _run_capacity_job(args: BatchArgs, profile: Profile, sink: EventWriter) -> int:
    """--job capacity: each mode's highest rate at >= 90% SLO attainment, by bisection on the simulator."""
    from core.capacity import format_table, run_capacity

    if args.backend != "sim":
        raise ProfileError("--job capacity bisects on the simulator; drop --backend")
    # --mode NAME: that mode beside the fcfs baseline; without it, every mode.
    modes = None if args.mode is None else list(dict.fromkeys(["fcfs", args.mode]))
    results = asyncio.run(
        _run_cancellable(lambda: run_capacity(profile, modes=modes, seed=args.seed, requests=args.requests, sink=sink))
    )
    table = format_table(profile, results)
    log.info("%s", table)
    final = make_event(
        "summary",
        job="capacity",
        profile=profile.name,
        replicas=profile.replicas,
        modes={r.mode: r.fields() for r in results},
    )
    if args.out is not None:
        (args.out / "summary.json").write_text(json.dumps(final, indent=2, sort_keys=True) + "\n")
    sink(final)
    return EXIT_OK


def _run_tune_job(args: BatchArgs, profile: Profile, sink: EventWriter) -> int:
    """--job tune: SLO-Tuner (core/tune). The journal goes to --out, else runs/tune-<profile>/, so that
    `--resume` with the same command finds it."""
    from core.tune.job import run_tune, tune_batch_summary
    from core.tune.journal import JOURNAL_NAME

    out_dir = args.out if args.out is not None else _prepare_out(Path("runs") / f"tune-{profile.name}")
    assert out_dir is not None
    # A live tune sends thousands of requests; httpx would log each one at INFO on stderr.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    result = asyncio.run(
        _run_cancellable(
            lambda: run_tune(
                profile,
                backend_kind=args.backend,
                sink=sink,
                seed=args.seed,
                journal_path=out_dir / JOURNAL_NAME,
                resume=args.resume,
            )
        )
    )
    final = tune_batch_summary(result)
    if args.out is not None:
        (args.out / "summary.json").write_text(json.dumps(final, indent=2, sort_keys=True) + "\n")
    sink(final)
    log.info("tune journal: %s", out_dir / JOURNAL_NAME)
    if result.interrupted:
        log.warning("interrupted: finished segments are in the journal; run again with --resume to continue")
        return EXIT_INTERRUPTED
    tuned = result.tuned
    if tuned is None or not tuned.ok:
        log.error("no configuration could be measured; see the error field of the tune_segment events")
        return EXIT_FAILED
    baseline = result.baseline
    slo_s = profile.slo.e2e_s
    log.info(
        "%s: tuned %s: p99 %.3f s (%s the %.3g s SLO), goodput %.2f req/s, x%.2f the baseline's; baseline = the "
        "profile's knobs (%s): p99 %s s, goodput %s req/s; %d segments",
        profile.name,
        tuned.point.label(),
        tuned.p99_s,
        "meets" if slo_s is not None and tuned.p99_s <= slo_s else "misses",
        slo_s,
        tuned.goodput_rps,
        result.goodput_gain(),
        result.start.label(),
        "n/a" if baseline is None else f"{baseline.p99_s:.3f}",
        "n/a" if baseline is None else f"{baseline.goodput_rps:.2f}",
        result.segments_used,
    )
    return EXIT_OK


def _run_calibrate_job(args: BatchArgs, profile: Profile, sink: EventWriter) -> int:
    """--job calibrate: sweep the live server, fit the simulator's model (core/calibrate); the calibration
    YAML goes to --out, else runs/calibrate-<profile>/."""
    from core.calibrate.job import CalibrationFailed, run_calibrate

    out_dir = args.out if args.out is not None else _prepare_out(Path("runs") / f"calibrate-{profile.name}")
    assert out_dir is not None
    command = " ".join(args.argv) if args.argv else "slo-console --batch --job calibrate"
    try:
        result = asyncio.run(
            _run_cancellable(
                lambda: run_calibrate(
                    profile, backend_kind=args.backend, url=args.url, sink=sink, out_dir=out_dir, command=command
                )
            )
        )
    except CalibrationFailed as exc:
        log.error("calibration failed: %s", exc)
        return EXIT_FAILED
    if result.interrupted or result.calibration is None or result.fit is None:
        log.warning("interrupted: no calibration written; the points measured so far are in %s", out_dir)
        return EXIT_INTERRUPTED
    log.info(
        "%s: calibration written to %s (%d observations, RMS error %.1f%%)",
        profile.name,
        result.path,
        len(result.fit.observations),
        100 * result.fit.rms_relative_error,
    )
    return EXIT_OK


def _write_factsheet(args: BatchArgs, result: Any) -> None:
    from core.factsheet.run import write_run_factsheet

    paths = write_run_factsheet(result, args.out, args.argv or [])
    log.info("factsheet written: %s", ", ".join(str(p) for p in paths))


def run_batch(args: BatchArgs, stdout: IO[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="slo-console: %(message)s", stream=sys.stderr)
    # httpx and httpcore log every request at INFO; a live run sends thousands.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.backend == "vllm":
        # SIGTERM/SIGHUP unwind like Ctrl-C, so the atexit hook stops the vLLM process group we start.
        from core.serve.process import install_termination_handlers

        with contextlib.suppress(ValueError):  # not the main thread (an embedding caller): keep its handlers
            install_termination_handlers()
    stdout = stdout or sys.stdout
    try:
        profile = load_profile(args.profile)
        args.out = _prepare_out(args.out)
        sink = EventWriter(stdout, args.out)
    except ProfileError as exc:
        log.error("%s", exc)
        return EXIT_USAGE
    try:
        return _run_job(args, profile, sink)
    except ProfileError as exc:
        log.error("%s", exc)
        return EXIT_USAGE
    except BackendUnavailable as exc:
        log.error("backend unavailable: %s", exc)
        return EXIT_BACKEND
    except KeyboardInterrupt:
        log.warning("interrupted")
        return EXIT_INTERRUPTED
    finally:
        sink.close()
