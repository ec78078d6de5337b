"""Trace replay: recorded arrivals and lengths from CSV, JSON Lines, or the AdaServe artifact format.

Columns (CSV header) or keys (JSON), one request per row:

  arrival time   `timestamp_s` (seconds) or `emission_time_ms` (milliseconds) or `arrival_s`
  prompt length  `input_length`, `prompt_tokens` or `input_tokens`
  output length  `output_length` or `output_tokens`
  task           `task` (optional; matched against the profile's tasks for SLO and acceptance)
  SLO            `slo_e2e_s`, `slo_ttft_s`, `slo_tpot_s` (optional, seconds), or `slo_ratio`
  anything else  ignored, so traces exported by other tools replay without editing

`slo_ratio` is how the AdaServe artifact states a request's TPOT objective, with two meanings:
- positive: a multiple of the deployment's per-token latency at near-zero load (AdaServe sec. 6.1, Table 2:
  coding copilot requests get 1.2x that baseline). The profile's `trace.baseline_tpot_s` supplies the
  baseline, so slo_tpot_s = slo_ratio * baseline_tpot_s;
- negative: an absolute TPOT target in milliseconds, the artifact's way of writing Table 2's fixed SLOs
  (-50 is the 50 ms chatbot TPOT, -150 the 150 ms summarisation TPOT), so slo_tpot_s = -slo_ratio / 1000.
  These rows need no baseline. Zero means neither and is refused.

A file may be gzip-compressed (`.csv.gz`, `.jsonl.gz`; recognised by its first bytes, whatever its name);
text must be UTF-8. A file that is neither is refused with one line naming it and the fix.

Times are multiplied by `time_scale` and shifted so the earliest request arrives at 0 (traces taken
from production carry wall-clock offsets that a run should not sit idle through). Rows are replayed in
time order. Any bad row stops the load with `ProfileError` naming file, line and the fix.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.profile import MAX_TOKENS, ProfileError, TraceSpec
from core.records import RequestSLO

TIME_KEYS_S = ("timestamp_s", "arrival_s")
TIME_KEYS_MS = ("emission_time_ms",)
# `input_tokens` beside `output_tokens`: the pair many providers' usage records and exports name.
PROMPT_KEYS = ("input_length", "prompt_tokens", "input_tokens")
OUTPUT_KEYS = ("output_length", "output_tokens")
SLO_KEYS = {"slo_e2e_s": "e2e_s", "slo_ttft_s": "ttft_s", "slo_tpot_s": "tpot_s"}
GZIP_MAGIC = b"\x1f\x8b"
# Other compressions a trace may arrive in: refused by name, since reading them as text would only say
# "binary" (first bytes of each format).
OTHER_COMPRESSION = (
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"PK\x03\x04", "zip"),
)
# A JSON document (not JSON Lines) keeps its rows under one of these keys, or is a bare list.
DOCUMENT_ROW_KEYS = ("entries", "requests", "trace")


@dataclass(slots=True)
class TraceTable:
    """A trace, parsed and sorted by arrival. Row i is request i of the replay."""

    arrival_s: np.ndarray  # float64, non-decreasing, first = 0
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    tasks: list[str | None]  # None: the row named no task
    slos: list[RequestSLO | None]  # None: the row stated no SLO (the task's or profile's applies)
    source: Path

    def __len__(self) -> int:
        return len(self.arrival_s)


@dataclass(slots=True)
class _Row:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    task: str | None
    slo: RequestSLO | None


class _RowReader:
    """Turns one raw row into a `_Row`, or raises ProfileError at `where` (file:line)."""

    def __init__(self, spec: TraceSpec, path: Path) -> None:
        self._spec = spec
        self._path = path
        self._slo_cache: dict[tuple[float | None, float | None, float | None], RequestSLO] = {}

    def read(self, raw: Mapping[str, Any], where: str) -> _Row:
        arrival_s = self._arrival(raw, where) * self._spec.time_scale
        if not math.isfinite(arrival_s):
            raise ProfileError(
                f"{where}: the arrival time times time_scale {self._spec.time_scale:g} is not a finite number; "
                "fix this row's time or lower workload.trace.time_scale"
            )
        prompt = self._length(raw, PROMPT_KEYS, "prompt length", where)
        output = self._length(raw, OUTPUT_KEYS, "output length", where)
        task_value = raw.get("task")
        task = None if _is_blank(task_value) else str(task_value)
        return _Row(arrival_s, prompt, output, task, self._slo(raw, where))

    def _arrival(self, raw: Mapping[str, Any], where: str) -> float:
        for key in TIME_KEYS_S + TIME_KEYS_MS:
            if key in raw and not _is_blank(raw[key]):
                value = _number(raw[key], key, where)
                if value < 0:
                    raise ProfileError(f"{where}: '{key}' is negative ({value}); arrival times must be >= 0")
                return value / 1000.0 if key in TIME_KEYS_MS else value
        raise ProfileError(
            f"{where}: no arrival time; give 'timestamp_s' (seconds) or 'emission_time_ms' (milliseconds)"
        )

    def _length(self, raw: Mapping[str, Any], keys: tuple[str, ...], what: str, where: str) -> int:
        for key in keys:
            if key in raw and not _is_blank(raw[key]):
                value = _number(raw[key], key, where)
                if not 1 <= value <= MAX_TOKENS or value != math.floor(value):
                    raise ProfileError(
                        f"{where}: '{key}' must be a whole number of tokens from 1 to {MAX_TOKENS:.0e} "
                        f"(got {raw[key]!r}); fix or delete this row"
                    )
                return int(value)
        raise ProfileError(f"{where}: no {what}; give {_one_of(keys)} (tokens)")

    def _slo(self, raw: Mapping[str, Any], where: str) -> RequestSLO | None:
        objectives: dict[str, float | None] = {"e2e_s": None, "ttft_s": None, "tpot_s": None}
        stated = False
        for key, field_name in SLO_KEYS.items():
            if key in raw and not _is_blank(raw[key]):
                objectives[field_name] = self._positive(raw[key], key, where)
                stated = True
        if "slo_ratio" in raw and not _is_blank(raw["slo_ratio"]):
            if objectives["tpot_s"] is not None:
                raise ProfileError(f"{where}: both 'slo_ratio' and 'slo_tpot_s' given; keep one of them")
            objectives["tpot_s"] = self._tpot_from_ratio(raw["slo_ratio"], where)
            stated = True
        if not stated:
            return None
        key = (objectives["e2e_s"], objectives["ttft_s"], objectives["tpot_s"])
        # Traces repeat a handful of SLO classes; share one frozen object per class.
        slo = self._slo_cache.get(key)
        if slo is None:
            slo = self._slo_cache[key] = RequestSLO(*key)
        return slo

    def _tpot_from_ratio(self, value: Any, where: str) -> float:
        """TPOT objective (seconds) of an AdaServe `slo_ratio` (module docstring: two meanings by sign)."""
        ratio = _number(value, "slo_ratio", where)
        if ratio == 0:
            raise ProfileError(
                f"{where}: 'slo_ratio' is 0; give a multiple of the baseline TPOT (> 0) "
                "or an absolute TPOT in milliseconds as a negative number (-50 = 50 ms)"
            )
        if ratio < 0:
            # Rounded to 12 significant digits so -150 reads 0.15 s exactly.
            return float(f"{-ratio / 1000.0:.12g}")
        baseline = self._spec.baseline_tpot_s
        if baseline is None:
            raise ProfileError(
                f"{where}: a positive 'slo_ratio' needs a baseline; set workload.trace.baseline_tpot_s "
                "in the profile to the per-token latency at near-zero load (seconds), or write the row's "
                "TPOT in milliseconds as a negative slo_ratio (-50 = 50 ms)"
            )
        # Rounded to 12 significant digits so 12 x 0.0125 reads 0.15, not 0.15000000000000002.
        return float(f"{ratio * baseline:.12g}")

    @staticmethod
    def _positive(value: Any, key: str, where: str) -> float:
        number = _number(value, key, where)
        if number <= 0:
            raise ProfileError(f"{where}: '{key}' must be > 0 (got {value!r}); fix or delete this row")
        return number


def _one_of(keys: tuple[str, ...]) -> str:
    quoted = [f"'{key}'" for key in keys]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _is_blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "")


def _number(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool):  # JSON true/false would otherwise pass as 1/0
        raise ProfileError(f"{where}: '{key}' must be a number (got {value!r}); fix or delete this row")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ProfileError(f"{where}: '{key}' must be a number (got {value!r}); fix or delete this row") from None
    if not math.isfinite(number):
        raise ProfileError(f"{where}: '{key}' must be finite (got {value!r}); fix or delete this row")
    return number


def _csv_rows(path: Path, text: str) -> Iterator[tuple[Mapping[str, Any], str]]:
    reader = csv.DictReader(text.splitlines())
    header = [name.strip() for name in (reader.fieldnames or [])]
    if not header:
        raise ProfileError(f"{path}:1: no header row; the first line must name the columns")
    reader.fieldnames = header
    missing = [
        what
        for what, keys in (
            ("an arrival time ('timestamp_s' or 'emission_time_ms')", TIME_KEYS_S + TIME_KEYS_MS),
            (f"a prompt length ({_one_of(PROMPT_KEYS)})", PROMPT_KEYS),
            (f"an output length ({_one_of(OUTPUT_KEYS)})", OUTPUT_KEYS),
        )
        if not any(key in header for key in keys)
    ]
    if missing:
        raise ProfileError(f"{path}:1: the header has no column for {' or '.join(missing)}; add it")
    for raw in reader:
        if None in raw:  # more cells than header names
            raise ProfileError(f"{path}:{reader.line_num}: more cells than header columns; fix this row")
        if all(_is_blank(value) for value in raw.values()):
            continue
        yield raw, f"{path}:{reader.line_num}"


def _json_lines_rows(path: Path, text: str) -> Iterator[tuple[Mapping[str, Any], str]]:
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{line_number}"
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{where}: not valid JSON ({exc.msg}); each line must be one JSON object") from None
        if not isinstance(raw, dict):
            raise ProfileError(f"{where}: expected a JSON object per line, got {type(raw).__name__}")
        yield raw, where


def _adaserve_rows(path: Path, text: str) -> Iterator[tuple[Mapping[str, Any], str]]:
    """The AdaServe artifact's rows, as JSON Lines or as one JSON document holding a list of rows."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        document = None  # more than one JSON value: JSON Lines
    rows: Any = None
    if isinstance(document, list):
        rows = document
    elif isinstance(document, dict):
        rows = next((document[key] for key in DOCUMENT_ROW_KEYS if isinstance(document.get(key), list)), None)
    if rows is None:
        yield from _json_lines_rows(path, text)
        return
    for index, raw in enumerate(rows):
        where = f"{path}: entry {index}"
        if not isinstance(raw, dict):
            raise ProfileError(f"{where}: expected a JSON object per entry, got {type(raw).__name__}")
        yield raw, where


def _read_text(path: Path) -> str:
    """The trace's text: gzip-compressed or plain, UTF-8. Compression is recognised by the file's first bytes,
    not its name, so `trace.csv` that is really gzip loads and `trace.csv.gz` that was decompressed in place
    loads too. Anything else that cannot be decoded is one ProfileError naming the file and the fix."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the trace ({exc.strerror}); check workload.trace.path") from exc
    if data.startswith(GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise ProfileError(
                f"{path}: a gzip file that does not decompress ({exc}); re-create it with `gzip -k` "
                "or point workload.trace.path at the uncompressed trace"
            ) from None
    else:
        for magic, name in OTHER_COMPRESSION:
            if data.startswith(magic):
                raise ProfileError(
                    f"{path}: compressed with {name}, which traces do not accept; decompress it, "
                    "or recompress it with gzip (.csv.gz and .jsonl.gz load as they are)"
                )
    if b"\x00" in data:
        raise ProfileError(
            f"{path}: a binary file, not a text trace; give a CSV or JSON Lines file (plain or gzip), "
            "e.g. exported with a header timestamp_s,prompt_tokens,output_tokens"
        )
    try:
        return data.decode("utf-8-sig")  # -sig: a byte-order mark some spreadsheet exports put first
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ProfileError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "save the trace as UTF-8 (e.g. `iconv -f latin1 -t utf-8`), plain or gzip"
        ) from None


def load_trace(spec: TraceSpec, path: Path) -> TraceTable:
    """Read and validate a whole trace (eagerly, so a bad row fails before the run starts)."""
    text = _read_text(path)
    row_source = {"csv": _csv_rows, "jsonl": _json_lines_rows, "adaserve": _adaserve_rows}[spec.format]
    reader = _RowReader(spec, path)
    rows = [reader.read(raw, where) for raw, where in row_source(path, text)]
    if not rows:
        raise ProfileError(f"{path}: the trace has no requests; add rows or point workload.trace.path elsewhere")
    arrival = np.fromiter((row.arrival_s for row in rows), dtype=float, count=len(rows))
    # A stable sort keeps the file's order among requests sent at the same instant.
    order = np.argsort(arrival, kind="stable")
    rows = [rows[i] for i in order]
    arrival = arrival[order] - arrival[order[0]]
    return TraceTable(
        arrival_s=arrival,
        prompt_tokens=np.fromiter((row.prompt_tokens for row in rows), dtype=np.int64, count=len(rows)),
        output_tokens=np.fromiter((row.output_tokens for row in rows), dtype=np.int64, count=len(rows)),
        tasks=[row.task for row in rows],
        slos=[row.slo for row in rows],
        source=path,
    )
