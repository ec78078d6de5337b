"""A run whose requests fail says so: the verdict counts failures against the 1% the p99 allows, and the
batch names the cause and its fix in one line (prompts past the model's context, the long-prompt case)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from core.metrics.failure_causes import failure_causes, failures_line
from core.metrics.verdict import slo_verdict
from core.profile import load_profile
from core.records import RequestRecord, RequestSLO, Status
from tests.fakes import run_batch

LONG_PROMPTS = """name: long-prompts
seed: 3
workload:
  arrival: {kind: gamma, rate_rps: 0.5, burstiness: 0.01}
  requests: 300
  tasks:
    - name: rag
      prompt_tokens: {dist: lognormal, mean: MEAN, sigma: 0.4, max: 16000}
      output_tokens: {dist: fixed, value: 100}
slo: {e2e_s: 60.0, ttft_s: 10.0}
knobs: {max_num_seqs: 64, max_num_batched_tokens: 2048}
engine: {calibration: calibrations/llama-7b-a100.yaml}
"""


def _summary(failed: dict[str, int], requests: int = 1000, p99: float = 1.0) -> dict:
    return {
        "requests": requests,
        "completed": requests - sum(failed.values()),
        "failed_by_status": failed,
        "p99_s": p99,
        "ttft_p99_s": 0.2,
    }


def test_most_requests_failing_is_a_violation_whatever_the_completed_p99() -> None:
    profile = load_profile("quickstart")  # e2e SLO; p99 1.0 s is well under it
    assert slo_verdict(_summary({}), profile).state == "met"
    verdict = slo_verdict(_summary({"error": 987}), profile)
    assert verdict.state == "violated"
    assert verdict.headline().startswith("SLO violated, 98.7% failed (p99 allows 1%)")
    # At or under 1% the p99 constraint holds; the failure share still shows in the checks.
    met = slo_verdict(_summary({"timeout": 10}), profile)
    assert met.state == "met" and any(c.metric == "requests failed" for _, c in met.all_checks())
    assert slo_verdict(_summary({"timeout": 11}), profile).state == "violated"


def test_policy_decisions_are_not_failures() -> None:
    # Rejected and deferred requests are a mode's decision, judged by attainment; not-sent the client's account.
    profile = load_profile("quickstart")
    verdict = slo_verdict(_summary({"rejected": 300, "deferred": 200, "not_sent": 5}), profile)
    assert verdict.state == "met" and all(c.metric != "requests failed" for _, c in verdict.all_checks())


def _record(status: Status = Status.OK, error: str | None = None) -> RequestRecord:
    return RequestRecord(
        request_id=0,
        task="t",
        slo=RequestSLO(),
        prompt_tokens=1,
        max_tokens=1,
        scheduled_s=0.0,
        arrival_s=0.0,
        status=status,
        end_s=1.0 if status is Status.OK else None,
        chunk_times=np.array([1.0]) if status is Status.OK else None,
        error=error,
    )


def _failed(error: str | None, status: Status = Status.ERROR) -> RequestRecord:
    return _record(status, error)


def test_causes_group_messages_that_differ_only_in_their_numbers() -> None:
    records = [
        _failed("prompt+output 7756 tokens exceeds max_model_len 4096"),
        _failed("server closed the connection"),
        _failed("prompt+output 5120 tokens exceeds max_model_len 4096"),
        _failed(None, Status.TIMEOUT),
        _failed("x", Status.REJECTED),
        _record(),
    ]
    causes = failure_causes(records, limit=2)
    assert [(c.status, c.count) for c in causes] == [("error", 2), ("error", 1)]
    assert causes[0].example == "prompt+output 7756 tokens exceeds max_model_len 4096"
    assert failures_line(causes, 4, 6) == (
        "4 of 6 requests failed: 2 error (prompt+output 7756 tokens exceeds max_model_len 4096); "
        "1 error (server closed the connection); 1 other"
    )


def test_a_batch_run_with_prompts_past_the_context_names_the_cause_and_the_fix(tmp_path: Path) -> None:
    profile = tmp_path / "long.yaml"
    profile.write_text(LONG_PROMPTS.replace("MEAN", "12000"))  # lognormal around 12k: most exceed 4,096
    proc = run_batch("--profile", str(profile))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    cause = next(line for line in lines if "requests failed:" in line)
    assert "exceeds max_model_len 4096" in cause and "lower the profile's prompt_tokens" in cause
    headline = lines[-1]
    assert "SLO violated" in headline and "failed (p99 allows 1%)" in headline
    # The same shape with prompts that fit: no failures, no cause line.
    profile.write_text(LONG_PROMPTS.replace("MEAN", "2000").replace("max: 16000", "max: 3900"))
    proc = run_batch("--profile", str(profile))
    assert proc.returncode == 0 and "requests failed:" not in proc.stderr
