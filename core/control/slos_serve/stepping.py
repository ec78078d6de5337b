"""SLOs-Serve inside the simulator's engine: the replica's `StepPlanner` (core/step_planner_api.py).

Each engine step it forms the batch with Algorithm 2 (batching.form_batch): the tightest TPOT among the
requests decoding sets the batch time and so the batch size; decode tokens go earliest-deadline-first to
the requests whose next token falls due in this batch, each verifying 1 + its tier's speculation length
(sec. 3.2.3, chosen by budget.py for the population now decoding; a request that has fallen behind its
pace verifies the longest allowed, the paper's "strengthen its SLO"); prefill chunks fill the rest,
earliest prefill deadline first, then the best-effort tier. The engine draws how many drafted tokens are
accepted (`accepted`). Queued SLO requests are admitted before queued best-effort ones, and where one needs
KV memory or a sequence slot that best-effort requests hold, the newest of those are preempted (recompute:
their streamed tokens stay delivered, they resume with one prefill) (sec. 4.1: the tier yields to SLO
requests; the admission DP reserves nothing for it, virtual.py).

A request's token deadlines are the ones the metrics judge: its first token by arrival + TTFT SLO (for a
best-effort request: the fresh window it was released with), then token j after the first by
first + j x TPOT.

`sync` copies the replica's true progress into the controller's virtual scheduler before an admission
decision (the simulator can tell it; live, the virtual execution's estimate stands).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from core.control.slos_serve.admission import PlannerSettings, tier_list
from core.control.slos_serve.batching import (
    URGENCY,
    DecodeTask,
    PrefillTask,
    form_batch,
    prefill_beside_every_decode,
    urgent_prefill_tokens,
)
from core.control.slos_serve.budget import BudgetModel
from core.control.slos_serve.step_requests import (
    fill_in_order,
    is_best_effort,
    queued_last,
    request_key,
    stable_order,
)
from core.control.slos_serve.virtual import Tracked, VirtualReplica
from core.controller_api import TIER_BEST_EFFORT
from core.step_planner_api import BatchPlan, PlannedReplica, StepRequest, draw_accepted
from core.step_time import StepTimeModel

# The engine paces decodes at this share of their TPOT SLO: step times are noisy (the calibration's noise_cv)
# and a request at exactly its pace misses its SLO on the first slow step.
PACE_MARGIN = 0.9
# The steps of a stretch of plain decode steps that one budget test covers (plain_decode_check): bench-chat's
# stretches run 5-6 steps between arrivals and engine samples, and a longer range makes the test looser.
DECODE_WINDOW = 32


class SlosServeStepPlanner:
    """Forms every batch of one simulated replica (see the module docstring)."""

    def __init__(
        self,
        model: StepTimeModel,
        settings: PlannerSettings,
        slos: Callable[[Any], tuple[float, float]],
    ) -> None:
        self.model = model
        self.settings = settings
        self.slos = slos  # ControlledRequest -> (TTFT SLO, TPOT SLO)
        self.wants_acceptance = settings.max_spec_len > 0
        # The replica may leave a stretch's tokens owed to the decoding requests (StepRequest.owed_from): `plan`
        # runs only after it settles them, the checks read no decoding request's tokens, and `sync` counts the log.
        self.lazy_timelines = True
        # The StepwiseReplica it last planned for. Typed with the replica's native view (PlannedReplica), as are the
        # methods' `replica` below: compiled, their reads of its queues, clock and KV are native, not generic getattrs.
        self.replica: PlannedReplica | None = None
        # StepRequest -> (its DecodeTask, reused step after step; TPOT, best effort, id, output tokens)
        self._tasks: dict[Any, tuple[DecodeTask, float, bool, int, int]] = {}
        # The stretch checks' last decoding requests' facts (_decode_facts), last tiers (_decode_tiers) and their
        # BudgetModels (_stretch_budget).
        self._last_decodes: tuple[tuple[Any, ...], tuple[set[float], int]] | None = None
        self._last_tiers: tuple[tuple[set[float], int], tuple[Any, ...], tuple[list[float], int]] | None = None
        self._stretch_budgets: dict[tuple[tuple[float, ...], int], BudgetModel] = {}
        self._last_stretch: tuple[list[float], int, BudgetModel] | None = None  # _stretch_budget's last answer
        # (stretch model, decoding tiers' mask, decodes) -> the last KV range plain_decode_check tested, and its answer
        self._decode_proofs: dict[tuple[BudgetModel, int, int], list[Any]] = {}

    def _deadlines(self, item: StepRequest) -> tuple[float, float, bool, int]:
        """(prefill deadline, TPOT, best effort, request id) of a StepRequest. Fixed for as long as the request
        is in the replica (the controller set its SLOs, plan deadline and tier before releasing it), so each
        is worked out once and kept on the request itself (StepRequest.planned: SLOs-Serve keeps nothing else
        there), which leaves the replica with it."""
        known = item.planned
        if known is None:
            req = item.req
            controlled = req.controlled
            ttft, tpot = self.slos(controlled) if controlled is not None else (1.0, 0.1)
            tpot *= PACE_MARGIN
            deadline = req.latency_from_s + ttft
            if controlled is not None:
                deadline = controlled.state.get("plan_deadline_s", deadline)
            known = item.planned = (deadline, tpot, req.tier == TIER_BEST_EFFORT, req.spec.request_id)
        return known

    def _forget(self, replica: PlannedReplica) -> None:
        """Keep `_tasks` to the requests still in the replica (amortised: once they have doubled)."""
        live = len(replica.waiting) + len(replica.prefilling) + len(replica.decoding)
        if len(self._tasks) > 2 * live + 64:
            queues = (replica.waiting, replica.prefilling, replica.decoding)
            tasks = self._tasks
            self._tasks = {item: tasks[item] for queue in queues for item in queue if item in tasks}

    def plan(self, replica: PlannedReplica, now: float) -> BatchPlan:
        self.replica = replica
        self._forget(replica)
        admitting, preempt = self._admissions(replica)
        evicted = {id(item) for item in preempt}
        decodes: list[DecodeTask] = []
        by_id: dict[int, Any] = {}
        tpots: set[float] = set()
        behind: set[int] = set()
        tasks = self._tasks
        decoding: list[StepRequest] = replica.decoding
        for item in decoding:
            if evicted and id(item) in evicted:
                continue
            out_left = item.out_left
            known = tasks.get(item)
            if known is None:  # its task, kept with the fixed figures the loop needs (see _deadlines)
                _, tpot, best_effort, rid = self._deadlines(item)
                task = DecodeTask(rid, tpot, 0.0, out_left, best_effort)
                known = tasks[item] = (task, tpot, best_effort, rid, item.req.spec.output_tokens)
            task, tpot, best_effort, rid, output_tokens = known
            times = item.chunk_times
            due = (times[0] if times else now) + (output_tokens - out_left) * tpot  # item.generated, inline
            # The same request's task from the last step, brought up to date (form_batch only reads it).
            task.next_due_s = due
            task.tokens_left = float(out_left)  # (a float field: the int's value, as an int stored into it gives)
            by_id[rid] = item
            decodes.append(task)
            if not best_effort:
                tpots.add(tpot)
                if due < now:
                    behind.add(rid)
        prefills: list[PrefillTask] = []
        order = [item for item in replica.prefilling if id(item) not in evicted] if evicted else replica.prefilling
        for item in (*order, *admitting):
            deadline, tpot, best_effort, rid = self._deadlines(item)
            by_id[rid] = item
            prefills.append(PrefillTask(rid, deadline, item.prompt_left, best_effort))
            tpots.add(tpot)
        if not decodes and not prefills:
            return BatchPlan()
        tiers = tier_list(tpots) if tpots else [1.0]
        settings = self.settings
        reference: list[float] | None = None  # the population speculation lengths are chosen for (Appendix D)
        if self._speculates():
            tier_of = {t: i for i, t in enumerate(tiers)}
            reference = [0.0] * len(tiers)
            for d in decodes:
                if not d.best_effort:
                    reference[tier_of[d.tpot_s]] += 1.0
        budget = self._budget(tiers, replica.kv_used, replica.running, reference)
        batch = form_batch(now, decodes, prefills, budget)
        plan = BatchPlan(preempt=preempt)
        if budget.max_spec_len:
            longest = settings.max_spec_len
            for rid, verified in batch.decode.items():
                if rid in behind:
                    verified = max(verified, 1 + longest)  # behind its pace: speculate as far as allowed
                plan.decode.append((by_id[rid], verified))
            plan.spec_steps = max((v - 1 for _, v in plan.decode), default=0)
        else:  # no speculation: every decode verifies its one position, no draft pass
            plan.decode = [(by_id[rid], verified) for rid, verified in batch.decode.items()]
        # Already-prefilling requests first, then admissions in deadline order (the replica admits in order).
        admitted = [(by_id[rid], chunk) for rid, chunk in batch.prefill.items()]
        admitted.sort(key=queued_last)
        plan.prefill = admitted
        return plan

    def plain_decode_check(self, replica: PlannedReplica) -> Callable[[float], bool] | None:
        """The replica's stretch hook (PlainDecodePlanner, core/step_planner_api.py). With nothing prefilling,
        nothing to admit and no speculation, `plan` gives every decoding request one token whenever they all
        fit in the batch's token budget (form_batch hands out the budget a token per decode until it runs
        out, whatever their due times), and nothing else. Nothing is admitted while nothing is queued, or
        while every sequence slot is taken and either no best-effort request holds one or only best-effort
        requests are queued (`_admissions` stops at once: no slot, and nobody to preempt for one or nobody
        who may preempt). The budget depends only on the tiers decoding, the
        sequences held and the KV in use, so `fits` asks the same BudgetModel `plan` would for a given KV."""
        if self._speculates() or replica.prefilling:
            return None  # speculation (drafts, acceptance draws) or prefill chunks
        best_effort = self._best_effort
        if replica.waiting and (
            replica.max_seqs > replica.running
            or (self._decode_facts(replica)[1] and not all(map(best_effort, replica.waiting)))
        ):
            return None  # a queued request may be admitted, or a best-effort one preempted for an SLO one
        tiers, mask = self._decode_tiers(replica, ())
        decodes = len(replica.decoding)
        sequences = replica.running

        model = self._stretch_budget(tiers, sequences)
        # One test for the KV of the next DECODE_WINDOW steps (a step adds a token per decode; none starts past
        # the cache's capacity): where the budget holds the decodes at every KV between (holds_decodes_between),
        # the steps there ask nothing more; where it is unsure, each step asks as before. `fits` is a function
        # of the KV alone whichever range was proven (a proof only says True where holds_decodes would), so the
        # last range tested for this model, tiers and decodes is kept from stretch to stretch: a stretch is
        # 1-2 steps between arrivals and wakeups on an overloaded replica, and mostly starts inside it.
        window = decodes * (DECODE_WINDOW - 1)
        top = replica.kv_capacity - decodes
        key = (model, mask, decodes)
        tested = self._decode_proofs.get(key)
        if tested is None:
            tested = self._decode_proofs[key] = [math.inf, -math.inf, False]  # (low, high, proven) last tested

        def fits(kv_used: float) -> bool:
            low, high, proven = tested
            if not low <= kv_used <= high:
                low, high = kv_used, min(kv_used + window, top)
                proven = model.holds_decodes_between(mask, decodes, low, high)
                tested[:] = low, high, proven
            if proven:
                return True
            budget = model.at_context(kv_used)
            return budget.holds_decodes(mask, decodes) or decodes <= int(budget.batch_at(kv_used, mask)[0])

        return fits

    def plain_prefill_check(
        self, replica: PlannedReplica
    ) -> Callable[[float, float], list[tuple[Any, int]] | None] | None:
        """The replica's hook for stretches with prefill chunks (PlainDecodePlanner, core/step_planner_api.py):
        with requests prefilling or queued and no speculation, `plan` gives every decoding request one token and
        the prefills what batching.prefill_beside_every_decode says, whenever it says it and the best-effort
        requests' share works out as below. Returns `prefill_chunks(kv_used, now)`: that step's (request, prompt
        tokens) in `plan`'s order (the prefilling requests, then the queued ones it admits), or None where the
        plan may be another batch.

        As `plan` builds it: the BudgetModel (the same tiers, the sequences held, the KV in use); the queued
        requests it would admit (`_admissions` takes the queue, SLO requests first, while a slot and the KV left
        hold the next one; where a queued SLO request does not fit and a best-effort request is in the replica,
        `_admissions` may preempt it: None) as prefill tasks, the SLO ones beside the prefilling SLO ones in
        deadline order. form_batch gives the best-effort tier (paper 004 sec. 4.1) only what the SLO decodes
        and prefills leave: first its prefills (the prefilling ones, then the admitted ones, each in order),
        then a token to each of its decodes while any is left; the step is one of every decode's token only
        where that rest holds all of them."""
        self.replica = replica  # as `plan` keeps it (for `sync`): a stretch may admit before any plan is asked
        if self._speculates():
            return None
        # (is_best_effort and self._deadlines called directly: native calls, not a bound method called through the
        # interpreter's API per request)
        facts = self._decode_facts(replica)  # asked once: _decode_tiers below reads the same answer
        best_effort_decodes = facts[1]
        prefilling: list[StepRequest] = replica.prefilling  # typed: the loops below read its fields natively
        prefilling_best_effort = [item for item in prefilling if is_best_effort(item)]
        preemptable = bool(best_effort_decodes or prefilling_best_effort)  # `_admissions`' victims
        # _admissions' order, sorted(waiting, key=best effort): a stable sort on False/True is the SLO requests in
        # their order, then the best-effort ones in theirs.
        queued: list[StepRequest] = []
        queued_rest: list[StepRequest] = []
        for item in replica.waiting:
            (queued_rest if is_best_effort(item) else queued).append(item)
        queued_best_effort = [False] * len(queued)
        if queued_rest:
            queued += queued_rest
            queued_best_effort += [True] * len(queued_rest)
        block: int = replica.block  # (the replica's ints, typed: native arithmetic in the loops below)
        needs = [-(-(item.context + item.prompt_left + 1) // block) * block - item.context for item in queued]
        slots: int = replica.max_seqs - replica.running
        capacity: int = replica.kv_capacity
        # Every SLO prefill task `plan` may see, in form_batch's order (a stable sort by deadline of the
        # prefilling requests, then the admitted queue): (task, the request, its place in the queue or -1).
        if prefilling_best_effort:
            entries = [(item, -1) for item in prefilling if not is_best_effort(item)]
        else:
            entries = [(item, -1) for item in prefilling]
        entries += [(item, i) for i, item in enumerate(queued) if not queued_best_effort[i]]
        if len(entries) > 1:  # (one entry is in order: its task below works its deadline out as the key did)
            # sort(key=deadline): the same stable order, from the keys worked out natively (step_requests.stable_order).
            keys = [self._deadlines(item)[0] for item, _ in entries]
            entries = [entries[j] for j in stable_order(keys)]
        tasks = [(self._prefill_task(item), item, i) for item, i in entries]
        # The best-effort prefills in form_batch's order: the prefilling ones, then the queued ones (after every
        # queued SLO one in `queued`), each with its place in the queue or -1.
        leftovers = [(item, -1) for item in prefilling_best_effort]
        if True in queued_best_effort:
            leftovers += [(item, i) for i, item in enumerate(queued) if queued_best_effort[i]]
        tiers, mask = self._decode_tiers(replica, (*prefilling, *queued), facts)
        slo_decodes = len(replica.decoding) - best_effort_decodes
        model = self._stretch_budget(tiers, replica.running)

        def prefill_chunks(kv_used: float, now: float) -> list[tuple[Any, int]] | None:
            batch_tokens, batch_time_s = model.batch_at(kv_used, mask)  # plan(mask)'s, at this KV
            admitted = 0  # _admissions with nobody preempted: how much of the queue it takes
            room, kv_free = slots, capacity - kv_used
            for need in needs:
                if room <= 0 or need > kv_free:
                    if preemptable and not queued_best_effort[admitted]:
                        return None  # an SLO request that does not fit may preempt a best-effort one
                    break
                room -= 1
                kv_free -= need
                admitted += 1
            seen: list[PrefillTask] = []
            left = 0
            for task, item, i in tasks:
                if i < admitted:
                    task.tokens_left = item.prompt_left
                    left += item.prompt_left
                    seen.append(task)
            urgent = urgent_prefill_tokens(now, seen, batch_time_s, URGENCY)
            budget = int(batch_tokens)
            tokens = prefill_beside_every_decode(budget, slo_decodes, urgent, left)
            if tokens is None:
                return None
            rest = budget - slo_decodes - tokens  # what the SLO requests leave the best-effort tier
            # form_batch's fill in deadline order; `plan` lists the prefilling requests first (queued_last).
            prefilling: list[tuple[Any, int]] = []
            admitting: list[tuple[Any, int]] = []
            fill_in_order(entries, admitted, tokens, prefilling, admitting)  # (request, place), the tasks' order
            if rest > 0 and leftovers:  # then the best-effort prefills, each list after its SLO part
                prefilling_rest: list[tuple[Any, int]] = []
                admitting_rest: list[tuple[Any, int]] = []
                rest = fill_in_order(leftovers, admitted, rest, prefilling_rest, admitting_rest)
                prefilling += prefilling_rest
                admitting += admitting_rest
            if rest < best_effort_decodes:
                return None  # some best-effort decodes get no token this step
            return prefilling + admitting

        return prefill_chunks

    def _prefill_task(self, item: StepRequest) -> PrefillTask:
        deadline, _, best_effort, rid = self._deadlines(item)
        return PrefillTask(rid, deadline, item.prompt_left, best_effort)

    def _speculates(self) -> bool:
        """As BudgetModel decides it: drafts only with a length and an acceptance above zero."""
        settings = self.settings
        return settings.max_spec_len > 0 and settings.acceptance > 0.0

    def _decode_tiers(
        self, replica: PlannedReplica, prefilling: tuple[Any, ...], facts: tuple[set[float], int] | None = None
    ) -> tuple[list[float], int]:
        """The tiers `plan` builds its BudgetModel on (the TPOTs of the SLO decodes and of `prefilling`) and the
        mask of the decoding ones. The answer for the same requests is kept (a stretch often ends at an arrival
        or an engine sample with the same requests in the batch, and the next one asks again); each request's
        TPOT and tier are fixed while it is in the replica (`_deadlines`)."""
        if facts is None:  # (the caller's `_decode_facts(replica)` where it has it: the same object)
            facts = self._decode_facts(replica)
        last = self._last_tiers
        # (the facts' set itself, kept by `_last_tiers`: compiled, `facts` is a native pair, boxed afresh each time)
        if last is not None and last[0][0] is facts[0] and last[1] == prefilling:
            return last[2]
        decode_tpots = facts[0]
        if len(decode_tpots) <= 1:
            # One TPOT among the decodes and `prefilling` (bench-chat's one SLO class, and most stretches of the
            # mixed profiles): the set below would hold that one value, the decodes' own where they have it, and
            # tier_list gives it alone, in the mask where the decodes have it. Compared, not hashed (a NaN equals
            # nothing: the sets' path).
            only = math.nan
            for t in decode_tpots:
                only = t
            alone = True
            for item in prefilling:
                tpot: float = self._deadlines(item)[1]
                if not decode_tpots and item is prefilling[0]:
                    only = tpot
                elif tpot != only:
                    alone = False
                    break
            if alone and (decode_tpots or prefilling):
                answer = ([only], 1 if decode_tpots else 0)
                self._last_tiers = (facts, prefilling, answer)
                return answer
        tpots = decode_tpots | {self._deadlines(item)[1] for item in prefilling} if prefilling else decode_tpots
        tiers = tier_list(tpots) if tpots else [1.0]
        mask = 0
        for i, tpot in enumerate(tiers):
            if tpot in decode_tpots:
                mask |= 1 << i
        answer = (tiers, mask)
        self._last_tiers = (facts, prefilling, answer)
        return answer

    def _decode_facts(self, replica: PlannedReplica) -> tuple[set[float], int]:
        """(the TPOTs of the SLO decodes, how many decodes are best-effort), kept while the replica's decoding
        requests are the same ones (every stretch check asks; the list changes at prefill ends, completions and
        preemptions only). The answer is only read."""
        decoding: list[StepRequest] = replica.decoding
        key = tuple(decoding)
        last = self._last_decodes
        if last is not None and last[0] == key:
            return last[1]
        decode_tpots: set[float] = set()
        best_effort = 0
        # The TPOT added last: an equal one adds nothing to the set (compared, not hashed). Typed, the comparison is
        # native; the NaN start equals nothing, as None did (and a NaN TPOT is added each time, as before).
        added = math.nan
        for item in decoding:
            known: tuple[Any, ...] | None = item.planned  # _deadlines' answer, read inline
            if known is None:
                known = self._deadlines(item)
            is_best_effort: bool = known[2]
            if is_best_effort:
                best_effort += 1
            else:
                tpot: float = known[1]
                if tpot != added:
                    decode_tpots.add(tpot)
                    added = tpot
        answer = (decode_tpots, best_effort)
        self._last_decodes = (key, answer)
        return answer

    def _stretch_budget(self, tiers: list[float], sequences: int) -> BudgetModel:
        """`_budget(tiers, any KV, sequences)` for the stretch checks, kept per tiers and sequences: they move it to
        each step's KV themselves (`at_context`, `batch_at`, `holds_decodes_between` all answer as a model
        built for that KV would) and never speculate, so only the tiers and the sequences tell models apart."""
        last = self._last_stretch
        # The same tiers list as the last call's (`_decode_tiers` hands back its kept answer while the requests are the
        # same, and nobody writes into it) with the same sequences: the same key, so the same model, without hashing
        # a tuple of floats (~1k instructions a check).
        if last is not None and last[0] is tiers and last[1] == sequences:
            return last[2]
        key = (tuple(tiers), sequences)
        model = self._stretch_budgets.get(key)
        if model is None:
            model = self._stretch_budgets[key] = self._budget(tiers, 0.0, sequences)
        self._last_stretch = (tiers, sequences, model)
        return model

    def _budget(
        self, tiers: list[float], kv_used: float, sequences: int, reference: list[float] | None = None
    ) -> BudgetModel:
        """The BudgetModel `plan` builds, for the KV in use and the sequences held (`reference`: the decodes per
        tier that speculation lengths are chosen for; None without speculation)."""
        settings = self.settings
        return BudgetModel(
            self.model,
            tiers,
            max_batch_tokens=settings.max_batch_tokens,
            context_tokens=kv_used,
            sequences=sequences,
            max_spec_len=settings.max_spec_len,
            acceptance=settings.acceptance,
            reference_counts=reference,
            knee_efficiency=settings.knee_efficiency,
        )

    def _admissions(self, replica: PlannedReplica) -> tuple[list[Any], list[Any]]:
        """Which queued requests may be admitted this step, SLO requests before best-effort ones, and which
        best-effort requests to preempt (newest first) so that a queued SLO request gets the KV memory or
        the slot it needs (paper 004 sec. 4.1: the tier runs on leftovers and yields to SLO requests)."""
        if not replica.waiting:
            return [], []  # nothing queued: nothing to admit, nobody to preempt for it
        room = replica.max_seqs - replica.running
        kv_free = replica.kv_capacity - replica.kv_used
        victims: list[Any] | None = None  # listed when a queued SLO request first needs them
        reclaimable = 0
        queued = sorted(replica.waiting, key=self._best_effort)  # stable: SLO requests first, each in order
        admitting: list[Any] = []
        preempt: list[Any] = []
        for item in queued:
            # Admit only what the KV cache holds (the replica admits in order and stops at the first that does
            # not fit: a plan that gives its budget to such a request runs nothing).
            need = -(-(item.context + item.prompt_left + 1) // replica.block) * replica.block - item.context
            if (room <= 0 or need > kv_free) and not self._best_effort(item):
                if victims is None:
                    victims = sorted(
                        (held for held in (*replica.prefilling, *replica.decoding) if self._best_effort(held)),
                        key=lambda held: -held.admitted_order,
                    )
                    reclaimable = sum(held.context + held.run_tokens for held in victims)
                if room + len(victims) > 0 and need <= kv_free + reclaimable:  # it fits after preemptions
                    while room <= 0 or need > kv_free:
                        victim = victims.pop(0)
                        freed = victim.context + victim.run_tokens
                        preempt.append(victim)
                        room += 1
                        kv_free += freed
                        reclaimable -= freed
            if room <= 0 or need > kv_free:
                break
            admitting.append(item)
            room -= 1
            kv_free -= need
        return admitting, preempt

    @staticmethod
    def _best_effort(item: StepRequest) -> bool:
        return is_best_effort(item)

    def accepted(self, request: Any, verified: int, rng: np.random.Generator) -> int:
        if verified == 1:  # no draft to verify: draw_accepted's answer, without a call (every plain decode)
            return 1
        return draw_accepted(rng, request.acceptance, verified - 1)

    def sync(self, virtual: VirtualReplica) -> None:
        """Copy the replica's real progress into the controller's virtual scheduler."""
        replica = self.replica
        if replica is None:
            return
        # The engine's real progress, written into the virtual replica's records in place (the one writer: a call
        # per running request per decision, ~18 a decision, cost 0.6% of a run); tests/test_slos_serve_lazy_timelines.py
        # holds the virtual records after each sync to the reference's.
        tracked: dict[Any, Tracked] = virtual.requests  # keyed by `request_key`'s objects (no unboxing)
        # The replica's queues hold StepRequests (typed here, the loops read their fields natively when compiled).
        prefilling: list[StepRequest] = replica.prefilling
        for item in prefilling:
            record = tracked.get(request_key(item))
            if record is not None:
                record.prefill_left = float(item.prompt_left)  # float fields: the ints' values, as stored before
                record.decode_left = float(max(0, item.out_left - 1))
        logged = len(replica.stretch_log)  # the stretch steps each decoding request is owed from its owed_from on
        decoding: list[StepRequest] = replica.decoding
        for item in decoding:
            record = tracked.get(request_key(item))
            if record is not None:
                record.prefill_left = 0.0  # a float field (mypyc stores no int into it)
                record.decode_left = float(item.out_left + item.owed_from - logged)
                times = item.chunk_times
                if times:
                    record.decode_start_s = times[0]
