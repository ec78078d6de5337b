"""AdaServe's closest honest approximation on a live vLLM (issue item 5; README says where it falls short).

A vLLM server verifies one speculation setting for the whole batch: it cannot give each request its own
token tree. What it can do, and what slo-console uses:
- per-request urgency through the gateway: `AdaServePolicy.upstream_priority` sends each request's TPOT
  SLO (ms) as vLLM's `priority` (with `--scheduling-policy priority`, lower values are scheduled first and
  preempt higher ones): the strict requests go first, as Algorithm 2's SLO-customized phase serves them first;
- a batch-size-dependent speculation length where the installed vLLM has one
  (`num_speculative_tokens_per_batch_size` in `--speculative-config`): eq. 8's depth as a function of the
  batch size, for a chain (width 1, the only shape vLLM verifies), capped at the deployed speculative tokens.
"""

from __future__ import annotations

from core.control.adaserve.scheduler import roofline_budget
from core.control.adaserve.trees import adaptive_shape
from core.profile import AdaServeSpec, Calibration, Profile, load_calibration
from core.step_time import StepTimeModel

SCHEDULE_CONFIG_KEY = "num_speculative_tokens_per_batch_size"


def speculation_schedule(
    spec: AdaServeSpec, calibration: Calibration, *, max_num_seqs: int, max_width: int
) -> list[tuple[int, int, int]]:
    """vLLM's batch-size schedule, [(first batch size, last batch size, speculative tokens), ...] covering
    1..max_num_seqs: eq. 8's depth d(n) with B the profile's budget or the calibration's roofline knee at no
    context (the live server's KV context is not known in advance), capped at `max_width`."""
    budget = spec.budget if spec.budget is not None else roofline_budget(StepTimeModel.from_calibration(calibration))
    schedule: list[tuple[int, int, int]] = []
    for n in range(1, max_num_seqs + 1):
        depth, _ = adaptive_shape(
            n,
            verify_budget=budget,
            draft_budget=spec.draft_budget,
            depth_bounds=spec.depth_bounds,
            max_width=spec.max_width,
            c1=spec.c1,
            c2=spec.c2,
        )
        tokens = min(depth, max_width)
        if schedule and schedule[-1][2] == tokens:
            schedule[-1] = (schedule[-1][0], n, tokens)
        else:
            schedule.append((n, n, tokens))
    return schedule


def live_speculation_extra(profile: Profile) -> dict[str, object]:
    """The --speculative-config keys `--backend vllm --mode adaserve` adds: the batch-size schedule, when the
    profile turns speculation on (its spec_width is the most speculative tokens any batch size gets)."""
    width = profile.knobs.effective_spec_width
    if width <= 0 or not profile.adaserve.live_schedule:
        return {}
    schedule = speculation_schedule(
        profile.adaserve, load_calibration(profile), max_num_seqs=profile.knobs.max_num_seqs, max_width=width
    )
    return {SCHEDULE_CONFIG_KEY: [list(entry) for entry in schedule]}
