"""Trace replay (CSV, JSON Lines, AdaServe artifact) and the shipped workload profiles."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from core.profile import PROFILES_DIR, Profile, ProfileError, load_profile
from core.records import RequestSLO, RequestSpec
from core.workload import build_load_plan


def trace_profile(path: Path, fmt: str, tmp_path: Path, **extra: Any) -> Profile:
    """A profile file next to the trace, so the relative trace path resolves against it."""
    trace = {"path": path.name, "format": fmt, **extra.pop("trace", {})}
    data = {"name": "trace-test", "slo": {"e2e_s": 5.0}, "workload": {"trace": trace, **extra}}
    profile_path = tmp_path / "trace-test.yaml"
    profile_path.write_text(json.dumps(data))  # JSON is YAML
    return load_profile(profile_path)


def replay(profile: Profile, **kwargs: Any) -> list[RequestSpec]:
    return list(build_load_plan(profile, **kwargs).requests)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_csv_trace_replays_times_lengths_tasks_and_slos(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(
        "timestamp_s,input_length,output_length,task,slo_ttft_s,slo_tpot_s,note\n"
        "100.5,10,5,chat,0.3,0.05,ignored\n"
        "100.0,20,6,,,,\n"
        "\n"
        "102.0,30,7,code,,,x\n"
    )
    tasks = [
        {
            "name": "code",
            "prompt_tokens": {"dist": "fixed", "value": 1},
            "output_tokens": {"dist": "fixed", "value": 1},
            "slo": {"e2e_s": 9.0},
            "acceptance": 0.8,
        }
    ]
    profile = trace_profile(path, "csv", tmp_path, tasks=tasks, trace={"time_scale": 0.5})
    plan = build_load_plan(profile)
    specs = list(plan.requests)
    assert plan.mode == "open" and plan.max_requests == 3
    # Sorted by time, shifted to start at 0, then scaled by time_scale.
    assert [s.arrival_s for s in specs] == [0.0, 0.25, 1.0]
    assert [s.request_id for s in specs] == [0, 1, 2]
    assert [(s.prompt_tokens, s.output_tokens) for s in specs] == [(20, 6), (10, 5), (30, 7)]
    assert [s.task for s in specs] == ["default", "chat", "code"]
    # Row SLO > the named task's SLO > the profile's SLO.
    assert specs[1].slo == RequestSLO(ttft_s=0.3, tpot_s=0.05)
    assert specs[2].slo == RequestSLO(e2e_s=9.0) and specs[2].acceptance == 0.8
    assert specs[0].slo == RequestSLO(e2e_s=5.0) and specs[0].acceptance is None


def test_jsonl_trace_with_alternative_keys(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "trace.jsonl",
        [
            {"emission_time_ms": 0, "prompt_tokens": 8, "output_tokens": 4, "slo_e2e_s": 2.5},
            {"emission_time_ms": 1500, "prompt_tokens": 9, "output_tokens": 3},
        ],
    )
    specs = replay(trace_profile(path, "jsonl", tmp_path))
    assert [s.arrival_s for s in specs] == [0.0, 1.5]
    assert specs[0].slo == RequestSLO(e2e_s=2.5) and specs[1].slo == RequestSLO(e2e_s=5.0)


def test_adaserve_slo_ratio_scales_the_baseline_tpot(tmp_path: Path) -> None:
    rows = [
        {"emission_time_ms": 10.0, "input_length": 100, "output_length": 50, "slo_ratio": 1.2},
        {"emission_time_ms": 30.0, "input_length": 200, "output_length": 60, "slo_ratio": 12},
    ]
    path = write_jsonl(tmp_path / "ada.jsonl", rows)
    specs = replay(trace_profile(path, "adaserve", tmp_path, trace={"baseline_tpot_s": 0.0125}))
    assert [s.slo.tpot_s for s in specs] == [0.015, 0.15]
    assert specs[0].slo.e2e_s is None
    assert [s.arrival_s for s in specs] == pytest.approx([0.0, 0.02])


def test_adaserve_accepts_a_json_document_of_entries(tmp_path: Path) -> None:
    rows = [{"emission_time_ms": t, "input_length": 5, "output_length": 5, "slo_ratio": 2.0} for t in (0, 40)]
    path = tmp_path / "ada.json"
    path.write_text(json.dumps({"entries": rows}, indent=2))
    specs = replay(trace_profile(path, "adaserve", tmp_path, trace={"baseline_tpot_s": 0.02}))
    assert [s.slo.tpot_s for s in specs] == [0.04, 0.04]


def test_adaserve_negative_slo_ratio_is_an_absolute_tpot_in_milliseconds(tmp_path: Path) -> None:
    """The artifact writes Table 2's fixed SLOs as negative ratios: -50 is a 50 ms TPOT, -150 a 150 ms one;
    such rows need no baseline, and they mix with baseline multiples in one file."""
    rows = [
        {"emission_time_ms": 0.0, "input_length": 20, "output_length": 40, "slo_ratio": -50},
        {"emission_time_ms": 5.0, "input_length": 900, "output_length": 70, "slo_ratio": -150},
        {"emission_time_ms": 9.0, "input_length": 120, "output_length": 200, "slo_ratio": 1.2},
    ]
    path = write_jsonl(tmp_path / "ada.jsonl", rows)
    specs = replay(trace_profile(path, "adaserve", tmp_path, trace={"baseline_tpot_s": 0.0105}))
    assert [s.slo.tpot_s for s in specs] == [0.05, 0.15, 0.0126]
    without_baseline = write_jsonl(tmp_path / "abs.jsonl", rows[:2])
    specs = replay(trace_profile(without_baseline, "adaserve", tmp_path))
    assert [s.slo.tpot_s for s in specs] == [0.05, 0.15]


def test_zero_slo_ratio_is_refused_with_both_meanings_named(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "ada.jsonl",
        [{"emission_time_ms": 0, "input_length": 5, "output_length": 5, "slo_ratio": 0}],
    )
    with pytest.raises(ProfileError, match=r"ada\.jsonl:1: 'slo_ratio' is 0; .*milliseconds as a negative"):
        build_load_plan(trace_profile(path, "adaserve", tmp_path, trace={"baseline_tpot_s": 0.01}))


def test_slo_ratio_without_a_baseline_says_how_to_fix_it(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "ada.jsonl",
        [{"emission_time_ms": 0, "input_length": 5, "output_length": 5, "slo_ratio": 1.2}],
    )
    with pytest.raises(ProfileError, match=r"ada\.jsonl:1: .*baseline_tpot_s"):
        build_load_plan(trace_profile(path, "adaserve", tmp_path))


@pytest.mark.parametrize(
    ("bad_row", "problem"),
    [
        ("5.0,abc,3", r"'input_length' must be a number \(got 'abc'\)"),
        ("5.0,12.5,3", r"'input_length' must be a whole number"),
        ("5.0,0,3", r"'input_length' must be a whole number of tokens from 1 to 1e\+09"),
        ("-1,10,3", r"'timestamp_s' is negative"),
        ("5.0,,3", r"no prompt length"),
        ("5.0,10,3,extra", r"more cells than header columns"),
    ],
)
def test_malformed_csv_row_names_file_and_line(tmp_path: Path, bad_row: str, problem: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(f"timestamp_s,input_length,output_length\n1.0,10,3\n{bad_row}\n")
    with pytest.raises(ProfileError, match=rf"bad\.csv:3: {problem}"):
        build_load_plan(trace_profile(path, "csv", tmp_path))


def test_malformed_jsonl_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp_s": 0, "input_length": 3, "output_length": 3}\n\n{"timestamp_s": 1, oops}\n')
    with pytest.raises(ProfileError, match=r"bad\.jsonl:3: not valid JSON"):
        build_load_plan(trace_profile(path, "jsonl", tmp_path))


def test_csv_header_without_length_columns_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("timestamp_s,input_length\n0,5\n")
    with pytest.raises(ProfileError, match=r"bad\.csv:1: .*output length"):
        build_load_plan(trace_profile(path, "csv", tmp_path))


def test_missing_and_empty_traces_are_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ProfileError, match="no requests"):
        build_load_plan(trace_profile(empty, "jsonl", tmp_path))
    missing = trace_profile(tmp_path / "missing.jsonl", "jsonl", tmp_path)
    with pytest.raises(ProfileError, match=r"trace-test\.yaml: 'missing\.jsonl': no such file .*fix the path"):
        build_load_plan(missing)
    # An empty path names the profile's own directory: refused the same way, not as "Is a directory".
    (tmp_path / "blank.yaml").write_text("name: blank\nworkload:\n  trace: {path: '', format: csv}\n")
    with pytest.raises(ProfileError, match=r"blank\.yaml: '': no such file"):
        build_load_plan(load_profile(tmp_path / "blank.yaml"))


def test_a_bare_trace_path_takes_its_format_from_the_extension(tmp_path: Path) -> None:
    (tmp_path / "t.csv.gz").write_bytes(gzip.compress(b"timestamp_s,input_tokens,output_tokens\n2,5,6\n1,3,4\n"))
    write_jsonl(tmp_path / "t.jsonl", [{"timestamp_s": 0, "input_length": 7, "output_length": 8}])
    profile_path = tmp_path / "p.yaml"
    for trace, lengths in (("t.csv.gz", [(3, 4), (5, 6)]), ("{path: t.jsonl}", [(7, 8)])):
        profile_path.write_text(f"name: p\nworkload:\n  trace: {trace}\n")
        profile = load_profile(profile_path)
        assert [(s.prompt_tokens, s.output_tokens) for s in replay(profile)] == lengths
    profile_path.write_text("name: p\nworkload:\n  trace: t.txt\n")
    with pytest.raises(ProfileError, match=r"p\.yaml: workload\.trace: the file name 't\.txt' does not say .*csv"):
        load_profile(profile_path)


def test_trace_replay_respects_requests_duration_and_warmup(tmp_path: Path) -> None:
    rows = [{"timestamp_s": float(t), "input_length": 4, "output_length": 4} for t in range(10)]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    profile = trace_profile(path, "jsonl", tmp_path, warmup_requests=2)
    assert len(replay(profile, requests=4)) == 4
    assert len(replay(profile, duration_s=5.0)) == 5
    specs = replay(profile)
    assert len(specs) == 10 and [s.warmup for s in specs[:3]] == [True, True, False]


# ---------------------------------------------------------------- shipped profiles

SHIPPED = sorted(PROFILES_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[path.stem for path in SHIPPED])
def test_every_shipped_profile_loads_and_builds_a_plan(path: Path) -> None:
    profile = load_profile(path)
    specs = replay(profile, requests=200)
    assert specs and all(s.prompt_tokens >= 1 and s.output_tokens >= 1 for s in specs)


def test_saber_mixes_follow_table_one() -> None:
    """SABER Table I SLAs and the W1-W3 shares of sec. III-A."""
    slas = {"code-qna": 1, "code-generation": 8, "code-summary": 1, "code-translation": 12}
    shares = {
        "saber-w1": {"code-translation": 0.4, "code-generation": 0.4, "code-qna": 0.1, "code-summary": 0.1},
        "saber-w2": {"code-qna": 0.4, "code-summary": 0.4, "code-generation": 0.1, "code-translation": 0.1},
        "saber-w3": dict.fromkeys(slas, 0.25),
    }
    for name, expected in shares.items():
        specs = replay(load_profile(name), requests=20_000)
        for task, share in expected.items():
            of_task = [s for s in specs if s.task == task]
            assert len(of_task) / len(specs) == pytest.approx(share, abs=0.015)
            assert of_task[0].slo == RequestSLO(e2e_s=slas[task])


def test_adaserve_mix_categories_and_trace_agree() -> None:
    mix = replay(load_profile("adaserve-mix"), requests=5000)
    tpot_by_task = {s.task: s.slo.tpot_s for s in mix}
    assert tpot_by_task == {"coding-copilot": 0.0126, "chatbot": 0.05, "summarization": 0.15}
    trace = replay(load_profile("adaserve-trace"))
    assert len(trace) > 200
    for spec in trace:  # the trace states them as slo_ratio x baseline_tpot_s, rounded to 4 digits
        assert spec.slo.tpot_s == pytest.approx(tpot_by_task[spec.task], rel=1e-4)


def test_slos_serve_scenarios_are_all_shipped() -> None:
    names = {path.stem for path in SHIPPED}
    for scenario in ("chatbot", "coder", "summarizer", "mixed", "toolllm", "reasoning"):
        assert f"slos-serve-{scenario}" in names
    for path in SHIPPED:
        if path.stem.startswith("slos-serve-"):
            for task in load_profile(path).workload.tasks:
                assert task.slo is not None and task.slo.ttft_s and task.slo.tpot_s


# ---------------------------------------------------------------- whole replay, compressed and undecodable files


def csv_trace(path: Path, rows: int) -> Path:
    path.write_text("timestamp_s,input_tokens,output_tokens\n" + "".join(f"{i * 0.01:.2f},8,4\n" for i in range(rows)))
    return path


def test_a_trace_replays_whole_unless_a_count_is_given(tmp_path: Path) -> None:
    """The `requests` default (1,000) is for synthetic arrivals; a 1,400-row trace is 1,400 requests unless the
    profile's workload.requests or --requests (the `requests` argument) says otherwise."""
    path = csv_trace(tmp_path / "long.csv", 1400)
    whole = build_load_plan(trace_profile(path, "csv", tmp_path))
    assert whole.max_requests == 1400 and whole.trace_rows == 1400
    assert len(list(whole.requests)) == 1400
    assert len(replay(trace_profile(path, "csv", tmp_path, requests=990))) == 990
    assert len(replay(trace_profile(path, "csv", tmp_path, requests=990), requests=1200)) == 1200


def test_gzipped_traces_load_by_their_first_bytes_not_their_name(tmp_path: Path) -> None:
    plain = csv_trace(tmp_path / "t.csv", 5)
    expected = [(s.arrival_s, s.prompt_tokens) for s in replay(trace_profile(plain, "csv", tmp_path))]
    for name in ("t.csv.gz", "t-renamed.csv"):  # gzip under a plain name loads too
        packed = tmp_path / name
        packed.write_bytes(gzip.compress(plain.read_bytes()))
        assert [(s.arrival_s, s.prompt_tokens) for s in replay(trace_profile(packed, "csv", tmp_path))] == expected
    rows = [{"timestamp_s": 0.5 * i, "prompt_tokens": 3, "output_tokens": 2} for i in range(3)]
    jsonl = tmp_path / "t.jsonl.gz"
    jsonl.write_bytes(gzip.compress("".join(json.dumps(row) + "\n" for row in rows).encode()))
    assert [s.arrival_s for s in replay(trace_profile(jsonl, "jsonl", tmp_path))] == [0.0, 0.5, 1.0]


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        (
            "latin1.csv",
            "timestamp_s,input_tokens,output_tokens,task\n0,5,5,caf\xe9\n".encode("latin-1"),
            r"latin1\.csv:2: not UTF-8 text .*iconv",
        ),
        ("binary.csv", bytes(range(256)) * 4, r"binary\.csv: a binary file, not a text trace"),
        (
            "cut.csv.gz",
            gzip.compress(b"timestamp_s,input_tokens,output_tokens\n" * 50)[:30],
            r"cut\.csv\.gz: a gzip file that does not decompress",
        ),
        ("t.csv.zst", b"\x28\xb5\x2f\xfd" + b"\x00" * 20, r"t\.csv\.zst: compressed with zstd"),
    ],
)
def test_an_undecodable_trace_is_one_profile_error_naming_file_and_fix(
    tmp_path: Path, name: str, content: bytes, problem: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ProfileError, match=problem):
        build_load_plan(trace_profile(path, "csv", tmp_path))
