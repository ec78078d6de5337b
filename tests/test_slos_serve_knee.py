"""SLOs-Serve's knee search (budget.BudgetModel._knee) gives the answer of a bisection over 1..most exactly.

The search solves each roofline term for the knee and then checks the float predicate around it (issue 22:
a bisection of a dozen step times ran twice per engine step); the bisection stays here as the definition.
"""

from __future__ import annotations

import itertools

import pytest
import yaml

from core.control.slos_serve.budget import BudgetModel, bisect_knee
from core.profile import PROFILES_DIR, Calibration
from core.step_time import StepTimeModel
from tests.test_slos_serve_planner import SIX_PER_UNIT

CALIBRATIONS = ["llama-7b-a100", "qwen2.5-1.5b-a100", "qwen2.5-coder-1.5b-l4", "tinyllama-1.1b-l40s", "vllm-cpu-tiny"]


def bisected_knee(budget: BudgetModel, most: float, spec_steps: int) -> float:
    ctx, seqs, model = budget.context_tokens, budget.sequences, budget.model
    goal = budget.knee_efficiency * most / model.step_time(most, ctx, spec_steps, seqs)  # type: ignore[operator]
    return float(bisect_knee(model, goal, int(most), ctx, spec_steps, seqs))


def _models() -> list[StepTimeModel]:
    models = []
    for name in CALIBRATIONS:
        data = yaml.safe_load((PROFILES_DIR / "calibrations" / f"{name}.yaml").read_text())
        models.append(StepTimeModel.from_calibration(Calibration.model_validate(data)))
    # Two terms that cross, and the toy of paper 004 Fig. 3 (no fixed cost at all).
    models.append(StepTimeModel(((0.004, 1e-5, 1e-7, 0.0, 2e-5), (0.0005, 4e-5, 0.0, 0.0, 0.0))))
    models.append(SIX_PER_UNIT)
    return models


@pytest.mark.parametrize("model", _models())
def test_the_knee_is_the_bisections_answer(model: StepTimeModel) -> None:
    checked = 0
    for efficiency, ctx, seqs, spec, most in itertools.product(
        (0.5, 0.8, 0.95, 0.99, 1.0),
        (0.0, 917.0, 40_000.0, 250_000.0),
        (0, 1, 7, 64, 256),
        (0, 3),
        (2.0, 37.0, 512.0, 2048.0, 8192.0),
    ):
        budget = BudgetModel(
            model, [1.0], max_batch_tokens=int(most), context_tokens=ctx, sequences=seqs, knee_efficiency=efficiency
        )
        assert budget._knee(most, spec) == bisected_knee(budget, most, spec), (efficiency, ctx, seqs, spec, most)
        checked += 1
    assert checked == 5 * 4 * 5 * 2 * 5


@pytest.mark.parametrize("model", _models())
def test_holds_decodes_never_promises_a_batch_plan_does_not_give(model: StepTimeModel) -> None:
    """BudgetModel.holds_decodes (the replica's per-step test in a stretch of plain decode steps) is sufficient:
    where it says the plan has room for n decodes, plan's batch has at least n tokens; and it says so for most
    of the cases where that is true (or the stretches would ask plan at every step after all)."""
    promised = room = 0
    for efficiency, ctx, seqs, tiers, decodes in itertools.product(
        (None, 0.5, 0.95, 1.0),
        (0.0, 917.0, 40_000.0, 250_000.0),
        (1, 7, 64, 256),
        ([0.01], [0.045, 0.09], [0.09, 0.5, 2.0]),
        (1, 2, 5, 23, 64, 300),
    ):
        for populated in range(1, 1 << len(tiers)):
            budget = BudgetModel(
                model, tiers, max_batch_tokens=2048, context_tokens=ctx, sequences=seqs, knee_efficiency=efficiency
            )
            holds = budget.holds_decodes(populated, decodes)
            fits = decodes <= int(budget.plan(populated).batch_tokens)
            assert fits or not holds, (efficiency, ctx, seqs, tiers, decodes, populated)
            promised += holds
            room += fits
    if model is not SIX_PER_UNIT:  # no fixed cost: a flat throughput, the knee wherever rounding puts it
        assert promised > 0.5 * room


@pytest.mark.parametrize("model", _models())
def test_batch_at_is_the_plans_batch(model: StepTimeModel) -> None:
    """BudgetModel.batch_at (the prefill stretches' per-step budget, one model moved from KV to KV) gives the
    batch tokens and time of a model built for that KV, asked `plan`: every tier mask (0: the idle plan), KV
    going up and down, TPOTs too tight for one token (plan's fallback to the idle batch)."""
    checked = 0
    for efficiency, seqs, tiers in itertools.product(
        (None, 0.5, 0.95, 1.0), (0, 7, 64), ([0.01], [1e-6, 0.09], [0.045, 0.09, 2.0])
    ):
        moved = BudgetModel(model, tiers, max_batch_tokens=2048, sequences=seqs, knee_efficiency=efficiency)
        for ctx, populated in itertools.product((917.0, 0.0, 250_000.0, 40_000.0, 41_000.0), range(1 << len(tiers))):
            fresh = BudgetModel(
                model, tiers, max_batch_tokens=2048, context_tokens=ctx, sequences=seqs, knee_efficiency=efficiency
            )
            plan = fresh.plan(populated)
            assert moved.batch_at(ctx, populated) == (plan.batch_tokens, plan.batch_time_s), (ctx, populated, tiers)
            checked += 1
    assert checked == 4 * 3 * 5 * (2 + 4 + 8)


@pytest.mark.parametrize("model", _models())
def test_holds_decodes_between_answers_for_every_context_between(model: StepTimeModel) -> None:
    """BudgetModel.holds_decodes_between (one test for a whole stretch of plain decode steps) never says True
    where holds_decodes says False at a context in the range (every one of them is tried, as the stretch's
    steps each move the KV by a token per decode), and says True for most ranges of a few steps where
    holds_decodes holds at each."""
    proven = held = 0
    for efficiency, seqs, tiers, decodes, low, steps in itertools.product(
        (None, 0.5, 0.95, 1.0),
        (1, 7, 64),
        ([0.01], [0.045, 0.09]),
        (1, 2, 5, 23, 64),
        (0.0, 917.0, 40_000.0, 250_000.0),
        (1, 6, 40),
    ):
        budget = BudgetModel(model, tiers, max_batch_tokens=2048, sequences=seqs, knee_efficiency=efficiency)
        high = low + decodes * (steps - 1)
        every = [budget.at_context(low + decodes * i).holds_decodes(1, decodes) for i in range(steps)]
        between = budget.holds_decodes_between(1, decodes, low, high)
        assert all(every) or not between, (efficiency, seqs, tiers, decodes, low, steps)
        proven += between
        held += all(every)
    if model is not SIX_PER_UNIT:
        assert proven > 0.8 * held


@pytest.mark.parametrize("model", _models())
def test_a_batchs_time_is_its_step_time(model: StepTimeModel) -> None:
    """BudgetModel._batch takes the batch's duration from the knee search's own step times where it has them
    (`_knee_timed`); it must be step_time of the batch it chose, whichever way the search went."""
    checked = 0
    for efficiency, ctx, seqs, spec, limit in itertools.product(
        (None, 0.5, 0.95, 1.0), (0.0, 917.0, 40_000.0), (0, 7, 64), (0, 3), (None, 0.002, 0.02, 0.2)
    ):
        budget = BudgetModel(
            model, [1.0], max_batch_tokens=2048, context_tokens=ctx, sequences=seqs, knee_efficiency=efficiency
        )
        tokens, duration = budget._batch(limit, spec)
        assert duration == max(model.step_time(tokens, ctx, spec, seqs), 1e-9), (efficiency, ctx, seqs, spec, limit)
        checked += 1
    assert checked == 4 * 3 * 3 * 2 * 4


@pytest.mark.parametrize("model", _models())
def test_batch_at_kept_answers_equal_the_plans_batch_along_a_stretch(model: StepTimeModel) -> None:
    """batch_at keeps its answer per tier mask with the bounds under which another KV gives the same one
    (BudgetModel._remember): one model moved along the KVs of long stretches (up through the KV where the
    memory term overtakes the knee's compute time, back down, and jumping) answers as a model built for each
    KV, asked `plan`; and on llama-7b-a100 (a memory and a compute term) most answers come from the memo."""
    kept = asked = 0
    kvs = [float(kv) for kv in range(0, 110_000, 733)]
    kvs += [*kvs[::-3], 917.0, 250_000.0, 40_000.0, 40_001.0, 0.0, 61_000.0]
    for efficiency, seqs, tiers in itertools.product((None, 0.95, 1.0), (7, 64), ([0.09], [0.045, 0.09, 2.0])):
        moved = BudgetModel(model, tiers, max_batch_tokens=2048, sequences=seqs, knee_efficiency=efficiency)
        for kv, populated in itertools.product(kvs, range(1, 1 << len(tiers))):
            fresh = BudgetModel(
                model, tiers, max_batch_tokens=2048, context_tokens=kv, sequences=seqs, knee_efficiency=efficiency
            )
            plan = fresh.plan(populated)
            computed = moved._search = None
            answer = moved.batch_at(kv, populated)
            assert answer == (plan.batch_tokens, plan.batch_time_s), (kv, populated, tiers, seqs, efficiency)
            computed = moved._search is not None
            asked += 1
            kept += efficiency is not None and not computed
    if model.terms == _models()[0].terms:
        assert kept > 0.3 * asked
    # KV by KV where the memory term crosses the compute time at the knee (each bound binds there in turn).
    for seqs in (7, 64):
        moved = BudgetModel(model, [0.09], max_batch_tokens=2048, sequences=seqs, knee_efficiency=0.95)
        for kv in range(30_000, 80_000, 3):
            fresh = BudgetModel(
                model, [0.09], max_batch_tokens=2048, context_tokens=kv, sequences=seqs, knee_efficiency=0.95
            )
            plan = fresh.plan(1)
            assert moved.batch_at(float(kv), 1) == (plan.batch_tokens, plan.batch_time_s), (kv, seqs)


@pytest.mark.parametrize("model", _models())
def test_models_sharing_kept_batches_plan_as_fresh_ones(model: StepTimeModel) -> None:
    """The admission DP's and the virtual replica's BudgetModels share their kept batches (`memo`, one per
    tiers): a model built on a memo that models at other KVs and sequence counts filled plans as a model
    built without one, for every tier mask; and on llama-7b-a100 most plans come from the memo."""
    for efficiency, tiers in itertools.product((None, 0.95), ([0.09], [0.045, 0.09, 2.0])):
        memo: dict[tuple[int, int], tuple[object, ...]] = {}
        kept = asked = 0
        for kv, seqs in itertools.product(range(0, 120_000, 2_741), (3, 7, 64)):
            shared = BudgetModel(
                model,
                tiers,
                max_batch_tokens=2048,
                context_tokens=kv,
                sequences=seqs,
                knee_efficiency=efficiency,
                memo=memo,
            )
            fresh = BudgetModel(
                model, tiers, max_batch_tokens=2048, context_tokens=kv, sequences=seqs, knee_efficiency=efficiency
            )
            for populated in range(1 << len(tiers)):
                shared._search = None
                assert shared.plan(populated) == fresh.plan(populated), (kv, seqs, populated, tiers, efficiency)
                asked += 1
                kept += populated > 0 and shared._search is None and efficiency is not None
        if model.terms == _models()[0].terms and efficiency is not None:
            assert kept > 0.15 * asked, (kept, asked)
