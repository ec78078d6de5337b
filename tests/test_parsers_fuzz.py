"""Property-based tests of every file parser (issue 25, item 3): profiles, calibrations and traces.

The property: any input gives either a valid result or one `ProfileError` whose message is one line naming
the file (and the place in it) -- never another exception, which the batch CLI would print as a traceback.
The same inputs driven through the batch CLI end in exit code 0 or 2 with that one line on stderr.
The stream parsers (SSE, /metrics) are tests/test_stream_parsers_fuzz.py.

Examples are derandomized (the same ones every run, so CI cannot flake on a new draw); set
SLO_FUZZ_EXAMPLES=10 (a multiplier) and SLO_FUZZ_RANDOM=1 to search further while working on a parser.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import io
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.cli import main as cli_main
from core.exit_codes import ExitCode
from core.profile import PROFILES_DIR, Profile, ProfileError, load_calibration, load_profile
from core.workload import build_load_plan
from tests.fakes import run_batch

SCALE = int(os.environ.get("SLO_FUZZ_EXAMPLES", "1"))
DERANDOMIZE = os.environ.get("SLO_FUZZ_RANDOM") != "1"


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples * SCALE,
        deadline=None,  # a shared, busy machine: wall time per example says nothing
        derandomize=DERANDOMIZE,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def assert_one_line(message: str, names: Path) -> None:
    """The contract of every input error: one line, naming the file it is about."""
    assert len(message.splitlines()) == 1, f"not one line: {message!r}"
    assert names.name in message, f"does not name {names.name}: {message!r}"
    assert len(message) < 1000, f"a {len(message)}-character line: {message[:300]!r}..."


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    """A fresh directory per example (hypothesis runs many examples per test, so no tmp_path)."""
    with tempfile.TemporaryDirectory(prefix="fuzz-") as name:
        yield Path(name)


# ---------------------------------------------------------------- values YAML and JSON can carry

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "1e999", "-0", "nan", "csv", "jsonl", "adaserve", "poisson", "fixed", "saber", "0x10"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(max_size=8) | st.sampled_from(["kind", "dist"]), inner, max_size=3),
    ),
    max_leaves=8,
)

EDGE_NUMBERS = [0, -1, 1, 0.5, 2**31, 2**63, 10**30, 1e-300, 1e308, -0.0, math.inf, -math.inf, math.nan]


def edge_of(value: Any) -> st.SearchStrategy[Any]:
    """Values of the same kind as `value` that sit on an edge (zero, negative, huge, infinite, not a number),
    or a neighbour of it: most bugs are a value of the right type outside the range the code expects."""
    if isinstance(value, bool):
        return st.sampled_from([not value, 0, 1, "yes", None])
    if isinstance(value, int | float):
        return st.one_of(st.sampled_from(EDGE_NUMBERS), st.floats(), st.integers(), st.just(value * -1))
    if isinstance(value, str):
        return st.one_of(
            st.sampled_from(["", " ", value.upper(), value + "x", "../" + value, "\x00"]), st.text(max_size=8)
        )
    if isinstance(value, list):
        return st.one_of(st.just([]), st.just(value * 2), st.just(value[:1]), st.lists(st.sampled_from(EDGE_NUMBERS)))
    return values


FIXED_LENGTH = {"dist": "fixed", "value": 4}
BASE_PROFILE: dict[str, Any] = {
    "name": "fuzz",
    "seed": 1,
    "workload": {
        "arrival": {"kind": "poisson", "rate_rps": 50},
        "requests": 3,
        "tasks": [
            {
                "name": "chat",
                "prompt_tokens": {"dist": "lognormal", "mean": 30, "sigma": 0.5, "max": 64},
                "output_tokens": {"dist": "uniform", "low": 2, "high": 6},
            },
            {
                "name": "code",
                "weight": 2,
                "prompt_tokens": {"dist": "empirical", "values": [5, 9], "weights": [1, 3]},
                "output_tokens": FIXED_LENGTH,
                "slo": {"e2e_s": 2.0},
            },
        ],
    },
    "slo": {"e2e_s": 1.5, "ttft_s": 0.5},
    "knobs": {"max_num_seqs": 8, "max_num_batched_tokens": 512},
    "engine": {"calibration": "calibrations/tinyllama-1.1b-l40s.yaml"},
}
TRACE_PROFILE: dict[str, Any] = {
    "name": "fuzz-trace",
    "workload": {"trace": {"path": "t.csv", "format": "csv", "time_scale": 0.5}},
    "slo": {"e2e_s": 3.0},
}
CALIBRATION = yaml.safe_load((PROFILES_DIR / "calibrations" / "tinyllama-1.1b-l40s.yaml").read_text())


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in a nested document (the places a mutation can hit)."""
    found = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += _paths(child, (*prefix, index))
    return found


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any], max_edits: int = 3) -> dict[str, Any]:
    """`base` with a few edits: a value replaced, a key deleted, or an unknown key added."""
    document = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, max_edits))):
        path = draw(st.sampled_from(_paths(document)[1:]))
        *parents, last = path
        parent = document
        for part in parents:
            parent = parent[part]
        edit = draw(st.sampled_from(["edge", "edge", "edge", "replace", "delete", "add"]))
        if edit == "edge":
            parent[last] = draw(edge_of(parent[last]))
        elif edit == "replace":
            parent[last] = draw(values)
        elif edit == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=10))] = draw(values)
    return document


def _dump(document: Any) -> str:
    # Floats YAML cannot write as plain text (inf, nan) come out as .inf / .nan, which YAML reads back.
    return yaml.safe_dump(document, allow_unicode=True, sort_keys=False)


# ---------------------------------------------------------------- profiles


def load_whole(path: Path) -> Profile:
    """Everything a run reads from a profile before it starts: the profile, its calibration, its load."""
    profile = load_profile(path)
    load_calibration(profile)
    plan = build_load_plan(profile, requests=5)
    specs = list(plan.requests)
    for spec in specs:
        assert spec.prompt_tokens >= 1 and spec.output_tokens >= 1
        assert math.isfinite(spec.arrival_s) and spec.arrival_s >= 0
    return profile


def check_profile_text(text: str, traces: dict[str, bytes] | None = None) -> None:
    with scratch() as root:
        path = root / "profile.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        for name, data in (traces or {}).items():
            (root / name).write_bytes(data)
        try:
            load_whole(path)
        except ProfileError as exc:
            assert_one_line(str(exc), path if "t.csv" not in str(exc) else root / "t.csv")


@fuzz(150)
@given(mutated(BASE_PROFILE))
def test_a_mutated_profile_loads_or_is_one_line(document: dict[str, Any]) -> None:
    check_profile_text(_dump(document))


@fuzz(60)
@given(st.text(max_size=200))
def test_any_text_as_a_profile_loads_or_is_one_line(text: str) -> None:
    check_profile_text(text)


@fuzz(60)
@given(mutated(CALIBRATION))
def test_a_mutated_calibration_loads_or_is_one_line(document: dict[str, Any]) -> None:
    with scratch() as root:
        (root / "cal.yaml").write_text(_dump(document))
        profile_path = root / "profile.yaml"
        profile_path.write_text(_dump({**BASE_PROFILE, "engine": {"calibration": "cal.yaml"}}))
        try:
            load_whole(profile_path)
        except ProfileError as exc:
            assert_one_line(str(exc), root / "cal.yaml")


# ---------------------------------------------------------------- traces

TIME_KEYS = ["timestamp_s", "emission_time_ms", "arrival_s"]
LENGTH_KEYS = ["input_length", "prompt_tokens", "input_tokens", "output_length", "output_tokens"]
OTHER_KEYS = ["task", "slo_e2e_s", "slo_ttft_s", "slo_tpot_s", "slo_ratio", "note"]
cells = st.one_of(
    st.integers(-5, 10**6).map(str),
    st.sampled_from([2**63, 10**20, 10**9, 10**9 + 1]).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "1.5", "-50", "0", "1e308", "1e-320", "true", "inf", "NaN", '"', "a,b"]),
    st.text(max_size=6),
)


@st.composite
def csv_traces(draw: st.DrawFn) -> bytes:
    header = draw(st.lists(st.sampled_from(TIME_KEYS + LENGTH_KEYS + OTHER_KEYS), min_size=0, max_size=7, unique=True))
    rows = draw(st.lists(st.lists(cells, min_size=0, max_size=len(header) + 1), max_size=6))
    lines = [",".join(header), *(",".join(row) for row in rows)]
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    return newline.join(lines).encode("utf-8", errors="surrogatepass")


json_rows = st.dictionaries(st.sampled_from(TIME_KEYS + LENGTH_KEYS + OTHER_KEYS), values, max_size=6)
good_rows = st.fixed_dictionaries(
    {
        "timestamp_s": st.floats(0, 1e6),
        "prompt_tokens": st.integers(1, 10**5),
        "output_tokens": st.integers(1, 10**4),
    },
    optional={"slo_ratio": st.sampled_from([-50, -150, 1.2]), "task": st.sampled_from(["chat", "code", ""])},
)


@st.composite
def json_traces(draw: st.DrawFn) -> bytes:
    rows = draw(st.lists(st.one_of(good_rows, json_rows, values), max_size=6))
    if draw(st.booleans()):
        lines = [json.dumps(row) for row in rows]
        if draw(st.booleans()):
            lines.append(draw(st.text(max_size=10)))
        return "\n".join(lines).encode("utf-8", errors="surrogatepass")
    document = draw(st.sampled_from(["list", "entries", "requests", "trace"]))
    return json.dumps(rows if document == "list" else {document: rows}).encode()


@st.composite
def trace_files(draw: st.DrawFn) -> tuple[str, bytes]:
    fmt = draw(st.sampled_from(["csv", "jsonl", "adaserve"]))
    data = draw(st.one_of(csv_traces(), json_traces(), st.binary(max_size=40)))
    wrap = draw(st.sampled_from(["plain", "plain", "gzip", "cut-gzip", "bom"]))
    if wrap == "gzip":
        data = gzip.compress(data)
    elif wrap == "cut-gzip":
        data = gzip.compress(data)[: draw(st.integers(2, 30))]
    elif wrap == "bom":
        data = b"\xef\xbb\xbf" + data
    return fmt, data


@fuzz(200)
@given(trace_files(), st.sampled_from([None, 0.0125]), st.sampled_from([1.0, 0.5, 3.0, 1e-300]), st.booleans())
def test_any_trace_loads_or_is_one_line(
    trace: tuple[str, bytes], baseline: float | None, time_scale: float, bare: bool
) -> None:
    fmt, data = trace
    spec: dict[str, Any] = {"path": "t.csv", "format": fmt, "time_scale": time_scale}
    if baseline is not None:
        spec["baseline_tpot_s"] = baseline
    document = {**TRACE_PROFILE, "workload": {"trace": "t.csv" if bare else spec}}
    with scratch() as root:
        path = root / "profile.yaml"
        path.write_text(_dump(document))
        (root / "t.csv").write_bytes(data)
        try:
            profile = load_profile(path)
            plan = build_load_plan(profile)
        except ProfileError as exc:
            assert_one_line(str(exc), root / "t.csv")
            return
        specs = list(plan.requests)
        assert specs and plan.trace_rows == len(specs)
        arrivals = [spec.arrival_s for spec in specs]
        assert arrivals[0] == 0.0 and arrivals == sorted(arrivals) and all(math.isfinite(a) for a in arrivals)
        assert all(spec.prompt_tokens >= 1 and spec.output_tokens >= 1 for spec in specs)
        for spec in specs:
            for objective in (spec.slo.e2e_s, spec.slo.ttft_s, spec.slo.tpot_s):
                assert objective is None or (math.isfinite(objective) and objective > 0)


# ---------------------------------------------------------------- through the batch CLI


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run_cli(argv: list[str]) -> tuple[int, list[str]]:
    """`slo-console ARGV` in this process: its exit code and the error lines it logged or printed."""
    handler = _Lines()
    logger = logging.getLogger("slo_console")
    logger.addHandler(handler)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
            code = cli_main(argv)
    finally:
        logger.removeHandler(handler)
    return code, handler.lines + stderr.getvalue().splitlines()


@fuzz(8)
@given(st.one_of(mutated(BASE_PROFILE, max_edits=2), mutated(TRACE_PROFILE, max_edits=2)), csv_traces())
def test_the_batch_cli_exits_0_or_2_with_one_line(document: dict[str, Any], trace: bytes) -> None:
    with scratch() as root:
        path = root / "profile.yaml"
        path.write_text(_dump(document))
        (root / "t.csv").write_bytes(trace)
        code, errors = run_cli(["--batch", "--profile", str(path), "--requests", "3"])
    assert code in (ExitCode.OK, ExitCode.USAGE), (code, errors)
    if code == ExitCode.USAGE:
        assert len(errors) == 1, errors
        assert_one_line(errors[0], root / ("t.csv" if "t.csv" in errors[0] else "profile.yaml"))


def test_a_real_process_exits_2_with_one_line_and_no_traceback() -> None:
    """The same contract from outside, for the three kinds of file a run reads before it starts."""
    with scratch() as root:
        (root / "t.csv").write_bytes(b"timestamp_s,input_tokens,output_tokens\n0,5,nan\n")
        (root / "cal.yaml").write_text("name: c\nterms: []\n")
        cases = {
            "bad-yaml.yaml": ("name: [unclosed\n", "bad-yaml.yaml"),
            "bad-trace.yaml": ("name: t\nworkload:\n  trace: t.csv\n", "t.csv:2"),
            "bad-cal.yaml": (_dump({**BASE_PROFILE, "engine": {"calibration": "cal.yaml"}}), "cal.yaml"),
        }
        for name, (text, named) in cases.items():
            (root / name).write_text(text)
            done = run_batch("--profile", str(root / name), "--requests", "3")
            lines = done.stderr.splitlines()
            assert done.returncode == ExitCode.USAGE and len(lines) == 1, done.stderr
            assert named in lines[0] and "Traceback" not in done.stderr
