"""From a profile to a `LoadPlan`: a lazy, seeded stream of `RequestSpec`.

Randomness is split into independent streams (arrivals, task choice, and each task's prompt and output
lengths), all spawned from one `numpy.random.default_rng(seed)`. Same seed, same specs; and because the
streams are independent, changing one part of a workload (say the arrival rate) leaves the others'
draws untouched, so two runs that differ in one knob still see the same requests.

Specs are generated a block at a time with numpy and handed out one by one, so a 100k-request plan
costs a few hundred vectorised draws, and an open-ended closed-loop plan never materialises.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.backend_api import LoadPlan
from core.pickling import reduce_by_fields
from core.profile import (
    ClosedLoopArrival,
    Profile,
    ProfileError,
    SLOSpec,
    profile_source,
    resolve_relative,
)
from core.records import RequestSLO, RequestSpec
from core.workload.arrivals import ArrivalProcess, make_arrival_process
from core.workload.lengths import LengthModelError, LengthSampler, make_length_sampler
from core.workload.sending import within_duration
from core.workload.trace import TraceTable, load_trace

BLOCK_SIZE = 4096
DEFAULT_TASK = "default"


@dataclass(frozen=True, slots=True)
class ResolvedTask:
    """A task of the mix, ready to sample: its share, samplers, and the SLO that applies to it."""

    name: str
    share: float  # weight / sum of weights
    prompt: LengthSampler
    output: LengthSampler
    slo: RequestSLO  # the task's own SLO, else the profile's
    acceptance: float | None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


def request_slo(spec: SLOSpec) -> RequestSLO:
    return RequestSLO(e2e_s=spec.e2e_s, ttft_s=spec.ttft_s, tpot_s=spec.tpot_s)


def _where(profile: Profile) -> str:
    source = profile_source(profile)
    return str(source) if source is not None else f"profile {profile.name!r}"


def resolve_tasks(profile: Profile) -> list[ResolvedTask]:
    """The profile's tasks with samplers built and SLOs resolved (a task without `slo` uses the profile's).

    Raises ProfileError for length models that pass field validation but cannot be sampled.
    """
    tasks = profile.workload.tasks
    total_weight = sum(task.weight for task in tasks)
    resolved = []
    for index, task in enumerate(tasks):
        samplers = []
        for field_name in ("prompt_tokens", "output_tokens"):
            try:
                samplers.append(make_length_sampler(getattr(task, field_name)))
            except LengthModelError as exc:
                raise ProfileError(f"{_where(profile)}: workload.tasks.{index}.{field_name}: {exc}") from None
        resolved.append(
            ResolvedTask(
                name=task.name,
                share=task.weight / total_weight,
                prompt=samplers[0],
                output=samplers[1],
                slo=request_slo(task.slo if task.slo is not None else profile.slo),
                acceptance=task.acceptance,
            )
        )
    return resolved


def request_limit(profile: Profile, requests: int | None, duration_s: float | None) -> int | None:
    """How many requests to send at most (the one definition: the load plan and the factsheet use it).

    An explicit count wins (argument, then the profile). A profile that sets only a duration is
    time-bound, and a trace is as long as its file, so the `requests` default must not silently cut either
    short; None means no count limit.
    """
    if requests is not None:
        return requests
    workload = profile.workload
    if "requests" in workload.model_fields_set:
        return workload.requests
    if workload.trace is not None or duration_s is not None:
        return None
    return workload.requests


def _synthetic_specs(
    tasks: list[ResolvedTask],
    arrivals: ArrivalProcess | None,
    root_rng: np.random.Generator,
    limit: int | None,
    duration_s: float | None,
    warmup_requests: int,
    warmup_s: float,
) -> Iterator[RequestSpec]:
    task_rng, *length_rngs = root_rng.spawn(1 + 2 * len(tasks))
    shares = np.array([task.share for task in tasks])
    slos = [task.slo for task in tasks]
    names = [task.name for task in tasks]
    acceptances = [task.acceptance for task in tasks]
    next_id = 0
    while limit is None or next_id < limit:
        n = BLOCK_SIZE if limit is None else min(BLOCK_SIZE, limit - next_id)
        task_index = np.zeros(n, dtype=np.intp) if len(tasks) == 1 else task_rng.choice(len(tasks), size=n, p=shares)
        prompts = np.empty(n, dtype=np.int64)
        outputs = np.empty(n, dtype=np.int64)
        for k, task in enumerate(tasks):
            chosen = task_index == k
            count = int(chosen.sum())
            if count:
                prompts[chosen] = task.prompt.sample(length_rngs[2 * k], count)
                outputs[chosen] = task.output.sample(length_rngs[2 * k + 1], count)
        # Plain Python numbers: specs end up in JSON events and records, where numpy scalars do not belong.
        times = arrivals.next_block(n).tolist() if arrivals is not None else [0.0] * n
        for i, (k, prompt, output, arrival_s) in enumerate(
            zip(task_index.tolist(), prompts.tolist(), outputs.tolist(), times, strict=True)
        ):
            if arrivals is not None and not within_duration(arrival_s, duration_s):
                return  # open loop: nothing is sent at or after the end of the window
            request_id = next_id + i
            row: int = k  # (compiled: a native int indexes the lists below natively; tolist()'s items are Any)
            # Positionally, in RequestSpec's field order (request_id, prompt_tokens, output_tokens, arrival_s,
            # task, slo, acceptance, warmup): 0.7 us a spec against 1.5 with keywords, 100k times a run.
            yield RequestSpec(
                request_id,
                prompt,
                output,
                arrival_s,
                names[row],
                slos[row],
                acceptances[row],
                request_id < warmup_requests or (arrivals is not None and arrival_s < warmup_s),
            )
        next_id += n


def _trace_specs(
    profile: Profile,
    trace: TraceTable,
    tasks: list[ResolvedTask],
    limit: int | None,
    duration_s: float | None,
    warmup_requests: int,
    warmup_s: float,
) -> Iterator[RequestSpec]:
    # A row's own SLO wins; else the SLO of the profile task it names; else the profile's.
    by_name = {task.name: task for task in tasks}
    profile_slo = request_slo(profile.slo)
    count = len(trace) if limit is None else min(limit, len(trace))
    arrivals = trace.arrival_s.tolist()
    prompts = trace.prompt_tokens.tolist()
    outputs = trace.output_tokens.tolist()
    for request_id in range(count):
        arrival_s = arrivals[request_id]
        if not within_duration(arrival_s, duration_s):
            return
        task_name = trace.tasks[request_id]
        task = by_name.get(task_name) if task_name is not None else None
        slo = trace.slos[request_id] or (task.slo if task is not None else profile_slo)
        yield RequestSpec(
            request_id=request_id,
            prompt_tokens=prompts[request_id],
            output_tokens=outputs[request_id],
            arrival_s=arrival_s,
            task=task_name if task_name is not None else DEFAULT_TASK,
            slo=slo,
            acceptance=task.acceptance if task is not None else None,
            warmup=request_id < warmup_requests or arrival_s < warmup_s,
        )


def build_load_plan(
    profile: Profile,
    *,
    seed: int | None = None,
    requests: int | None = None,
    duration_s: float | None = None,
) -> LoadPlan:
    """The load a profile describes, as a lazy plan of request specs.

    seed: overrides `profile.seed`. requests: caps the count (default: the profile's `workload.requests`;
    a profile that sets only `duration_s`, or replays a trace without a count, is not capped by the
    default). duration_s: overrides the profile's window; open-loop specs arriving at or after it are not
    generated. The first `warmup_requests` specs (and open-loop specs arriving before `warmup_s`) are
    flagged `warmup`. Request ids run 0..N-1 in send order.

    Everything that can be wrong with the profile (length models, trace rows) is checked here, before the
    first spec is drawn, and raised as ProfileError.
    """
    workload = profile.workload
    window_s = duration_s if duration_s is not None else workload.duration_s
    rng = np.random.default_rng(seed if seed is not None else profile.seed)
    tasks = resolve_tasks(profile)
    limit = request_limit(profile, requests, window_s)

    if workload.trace is not None:
        trace = load_trace(workload.trace, resolve_relative(profile, workload.trace.path))
        specs = _trace_specs(profile, trace, tasks, limit, window_s, workload.warmup_requests, workload.warmup_s)
        return LoadPlan(
            requests=specs,
            mode="open",
            concurrency=profile.knobs.concurrency,
            max_requests=len(trace) if limit is None else min(limit, len(trace)),
            duration_s=window_s,
            warmup_s=workload.warmup_s,
            warmup_requests=workload.warmup_requests,
            trace_rows=len(trace),
        )

    arrival = workload.arrival
    assert arrival is not None  # WorkloadSpec guarantees exactly one of arrival / trace
    arrival_rng, mix_rng = rng.spawn(2)
    if isinstance(arrival, ClosedLoopArrival):
        specs = _synthetic_specs(tasks, None, mix_rng, limit, window_s, workload.warmup_requests, 0.0)
        return LoadPlan(
            requests=specs,
            mode="closed",
            concurrency=arrival.clients,
            think_time_s=arrival.think_time_s,
            max_requests=limit,
            duration_s=window_s,
            warmup_s=workload.warmup_s,
            warmup_requests=workload.warmup_requests,
        )
    process = make_arrival_process(arrival, arrival_rng)
    specs = _synthetic_specs(tasks, process, mix_rng, limit, window_s, workload.warmup_requests, workload.warmup_s)
    return LoadPlan(
        requests=specs,
        mode="open",
        concurrency=profile.knobs.concurrency,
        max_requests=limit,
        duration_s=window_s,
        warmup_s=workload.warmup_s,
        warmup_requests=workload.warmup_requests,
    )
