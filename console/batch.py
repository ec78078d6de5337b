"""Headless batch runner: `slo-console --batch ...`. JSON Lines on stdout, logs on stderr.

Every job comes from the jobs registry (core/jobs/registry.py); this front end streams its events, writes
--out (events.jsonl, requests.jsonl for a run, summary.json, factsheet.json/.md), logs the job's report and
ends stderr with the verdict line (SLO met or violated, by how much). Never imports Textual
(tests/test_batch.py proves it). Exit codes: core/exit_codes.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from core.backend_api import BackendUnavailable
from core.durable_files import JsonlAppender, replace_atomically
from core.events import Event, to_json_line
from core.exit_codes import ExitCode
from core.job_registry import JOBS, JobContext, JobFailed, JobSpec
from core.jobs.options import OperatorOptions
from core.jobs.run import RunResult
from core.profile import ProfileError

log = logging.getLogger("slo_console")

# Allocations between two young-generation collections in a batch `run` (Python's default is 700). A run
# keeps nearly all it allocates (each request's spec, record and timeline live to the summary), so the
# default scanned them about 400 times and the whole heap 3 times in a 100k-request fcfs run, 0.5 of its
# 6.5 CPU-s, collecting next to nothing (the peak memory is the same either way). Only for `run`: a tune
# under it peaked at 195 MB instead of 91 MB (its garbage cycles waited longer to be collected).
RUN_GC_YOUNG_THRESHOLD = 100_000


class EventWriter:
    """Writes each event to stdout and, with --out, to events.jsonl as it happens (nothing is lost)."""

    def __init__(self, stream: IO[str], out_dir: Path | None) -> None:
        self.stream = stream
        self.file: JsonlAppender | None = None
        if out_dir is not None:
            self.file = JsonlAppender(out_dir / "events.jsonl", truncate=True)

    def __call__(self, event: Event) -> None:
        line = to_json_line(event)
        self.stream.write(line + "\n")
        self.stream.flush()
        if self.file is not None:
            self.file.write_line(line)

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
        self.file: JsonlAppender | None = JsonlAppender(path, truncate=True)

    def __call__(self, record: Any) -> None:
        if self.file is not None:
            self.file.write_line(_request_line(record))

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


def _write_json(path: Path, data: dict[str, Any]) -> None:
    replace_atomically(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def run_batch(options: OperatorOptions, stdout: IO[str] | None = None) -> int:
    """Run `options.job` headless; returns the exit code (core/exit_codes.py)."""
    thresholds = gc.get_threshold()
    if options.job == "run":
        gc.set_threshold(RUN_GC_YOUNG_THRESHOLD, *thresholds[1:])
    try:
        return _run_batch(options, stdout)
    finally:
        gc.set_threshold(*thresholds)  # an embedding caller (the tests) gets its collector back as it was


def _run_batch(options: OperatorOptions, stdout: IO[str] | None) -> int:
    logging.basicConfig(level=logging.INFO, format="slo-console: %(message)s", stream=sys.stderr)
    # httpx and httpcore log every request at INFO; a live run sends thousands.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if options.backend == "vllm":
        # SIGTERM/SIGHUP unwind like Ctrl-C, so the atexit hook stops the vLLM process group we start.
        from core.serve.process import install_termination_handlers

        with contextlib.suppress(ValueError):  # not the main thread (an embedding caller): keep its handlers
            install_termination_handlers()
    stdout = stdout or sys.stdout
    try:
        options.check()
        spec = JOBS[options.job]
        spec.check(options)
        profile = options.load_profile()
        options.out = _prepare_out(options.out)
        # The job's own files (a tune's journal, a calibration) without --out: runs/<job>-<profile>/, so
        # that `--resume` with the same command finds them.
        job_dir = options.out if options.out is not None else _prepare_out(spec.default_out(profile))
        sink = EventWriter(stdout, options.out)
    except ProfileError as exc:
        log.error("%s", exc)
        return ExitCode.USAGE
    try:
        return _run_job(
            spec, JobContext(profile, options, sink, out_dir=job_dir, engine_events_with_progress=True), sink
        )
    finally:
        sink.close()


def _run_job(spec: JobSpec, ctx: JobContext, sink: EventWriter) -> int:
    out = ctx.options.out
    requests = RequestWriter(out / "requests.jsonl") if out is not None and spec.name == "run" else None
    ctx.on_record = requests
    try:
        result = asyncio.run(_run_cancellable(lambda: spec.run(ctx)))
    except ProfileError as exc:
        log.error("%s", exc)
        return ExitCode.USAGE
    except BackendUnavailable as exc:
        log.error("backend unavailable: %s", exc)
        return ExitCode.BACKEND
    except JobFailed as exc:
        log.error("%s", exc)
        return ExitCode.FAILED
    except (KeyboardInterrupt, asyncio.CancelledError):  # a job that ends by its cancellation (Ctrl-C)
        log.warning("interrupted")
        return ExitCode.INTERRUPTED
    finally:
        if requests is not None:
            requests.close()
    final = spec.summary(result)
    report = spec.report(result, ctx)
    for line in report.info:
        log.info("%s", line)
    if out is not None:
        if requests is not None and isinstance(result, RunResult):
            requests.finish(result.records)
        _write_json(out / "summary.json", final)
        _write_factsheet(spec.factsheet(result, ctx), out)
    sink(final)  # the summary is the last line on stdout and in events.jsonl (the batch contract)
    for line in report.warnings:
        log.warning("%s", line)
    for line in report.errors:
        log.error("%s", line)
    # The last line on stderr: the verdict, the factsheet's headline.
    log.info("%s: %s: %s", ctx.profile.name, spec.name, report.verdict)
    return report.status


def _write_factsheet(factsheet: Any, out: Path) -> None:
    from core.factsheet.render import write_factsheet

    paths = write_factsheet(factsheet, out)
    log.info("factsheet written: %s", ", ".join(str(p) for p in paths))
