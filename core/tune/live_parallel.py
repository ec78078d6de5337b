"""Live segments side by side (issue 24 item 3): `--job tune --backend vllm --executor ray`.

A live segment owns a whole serving engine for a minute or more, so candidates measured one after another
leave a GPU fleet idle. Here each segment is a Ray task that asks for one serving slot, and Ray decides
where and when it runs (no scheduler of our own):

- a GPU cluster: `num_gpus=1`; Ray gives the task its GPU (CUDA_VISIBLE_DEVICES), which vLLM inherits;
- a CPU cluster: the custom resource `vllm_slot` (`ray start --resources '{"vllm_slot": 1}'` per node, or
  N per node with N core sets in SLO_CONSOLE_VLLM_CPU_SLOTS, see `cpu_slot`).

Inside the task the segment is measured exactly as the serial tuner measures it (`LiveSegmentRunner`): the
ordinary launcher starts vLLM with the candidate's flags under its supervisor, the ordinary load client
measures the segment, the server is stopped, and the measurement comes back. The supervisor's lifeline
follows the task's worker process, so a cancelled task (Ctrl-C: Ray cancels with force, which ends the
worker) or a killed worker leaves no vLLM behind. The driver sees a runner whose `parallel` flag lets
`Evaluator.evaluate_many` start a hill-climb step's neighbours at once; the evaluator journals each
segment as it finishes, so `--resume` works as in the serial run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from core.backend_api import Backend, BackendUnavailable
from core.executor import Executor
from core.profile import Profile, TunerSpec
from core.serve.cpu_binding import OMP_BIND_ENV
from core.tune.knobspace import Point
from core.tune.score import Variant
from core.tune.segment import LiveSegmentRunner, Measurement

LIVE_SLOT_RESOURCE = "vllm_slot"  # a CPU node's serving slots (a GPU cluster uses its GPUs instead)
# On a CPU node with several slots: one vLLM core set per slot, whitespace-separated, each in vLLM's
# VLLM_CPU_OMP_THREADS_BIND syntax ("0 1": one core each). Two vLLM CPU servers left to vLLM's own binding
# both take the same core and stall each other (tests/test_replica_swap_live.py saw start-ups of 225 s+).
ENV_CPU_SLOTS = "SLO_CONSOLE_VLLM_CPU_SLOTS"

BackendFactory = Callable[[Profile], Backend]


def vllm_backend(profile: Profile) -> Backend:
    """The backend a segment task starts where it runs: the same one the serial tuner builds."""
    from core.backends.factory import make_backend

    return make_backend("vllm", profile)


def slot_demand(cluster: dict[str, float]) -> dict[str, Any]:
    """Ray task options for one serving slot on this cluster: a GPU where the cluster has any, else a
    `vllm_slot`. Raises BackendUnavailable naming the fix when it has neither."""
    if cluster.get("GPU", 0) >= 1:
        return {"num_gpus": 1}
    if cluster.get(LIVE_SLOT_RESOURCE, 0) >= 1:
        return {"resources": {LIVE_SLOT_RESOURCE: 1}}
    raise BackendUnavailable(
        f"--executor ray with --backend vllm: the Ray cluster has no GPU and no {LIVE_SLOT_RESOURCE!r} resource; "
        f"on CPU nodes start Ray with: ray start --resources '{{\"{LIVE_SLOT_RESOURCE}\": 1}}'"
    )


# How long a segment waits for a core set that is still held: one released a moment ago can stay held for a
# few milliseconds more, and under load for longer, by a child process that another thread of this process
# forked before the release and that has not yet reached exec (the flock goes with the open file, which the
# child shares until exec closes it: a suite run saw "every core set is taken" with two of two slots busy).
SLOT_PATIENCE_S = 5.0
_SLOT_POLL_S = 0.05


@contextlib.contextmanager
def cpu_slot(patience_s: float = SLOT_PATIENCE_S) -> Iterator[str | None]:
    """This node's first free core set from SLO_CONSOLE_VLLM_CPU_SLOTS, held (an exclusive file lock, which
    the kernel drops when the process dies) until the segment ends; None when the variable is unset (vLLM
    binds as it likes). Ray decides how many segments a node runs (its `vllm_slot` count); this only says
    which of the node's cores each one takes, as Ray's CUDA_VISIBLE_DEVICES does for GPUs. With every set
    taken it polls for `patience_s` (SLOT_PATIENCE_S) before saying so: a wait of milliseconds in practice,
    in a segment that lasts minutes."""
    slots = os.environ.get(ENV_CPU_SLOTS, "").split()
    if not slots:
        yield None
        return
    deadline = time.monotonic() + patience_s
    while True:
        taken = _take_free_slot(slots)
        if taken is not None:
            bind, fd = taken
            try:
                yield bind
            finally:
                os.close(fd)  # closing drops the lock
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(_SLOT_POLL_S)
    raise BackendUnavailable(
        f"every core set in {ENV_CPU_SLOTS}={' '.join(slots)!r} is taken on {socket.gethostname()}: give the node "
        f"no more {LIVE_SLOT_RESOURCE!r} resources than {ENV_CPU_SLOTS} has entries"
    )


def _take_free_slot(slots: list[str]) -> tuple[str, int] | None:
    """The first core set whose lock this process gets now, with the lock's descriptor; None if all are held."""
    for bind in slots:
        path = Path(tempfile.gettempdir()) / f"slo-console-vllm-cpu-{re.sub(r'[^0-9A-Za-z]+', '_', bind)}.lock"
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return bind, fd
    return None


def _task_profile(profile: Profile, bind: str | None) -> Profile:
    """The profile as a segment task serves it: a free port of its own (another slot's server may share
    the node) and, on a CPU slot, vLLM bound to the slot's cores unless the profile binds it itself."""
    env = dict(profile.server.env)
    if bind is not None:
        env.setdefault(OMP_BIND_ENV, bind)
    return profile.model_copy(update={"server": profile.server.model_copy(update={"port": 0, "env": env})})


async def live_segment_task(
    profile: Profile, spec: TunerSpec, point: Point, seed: int, fraction: float, make_server: BackendFactory
) -> Measurement:
    """One live segment where Ray placed it (an executor task): start vLLM with the point's knobs, measure,
    stop it, hand back the measurement with the node and slot it ran on."""
    wall_start, started_at = time.perf_counter(), time.time()
    with cpu_slot() as bind:
        served = _task_profile(profile, bind)
        runner = LiveSegmentRunner(served, make_server(served), spec)
        try:
            measurement = await runner.measure(point, seed=seed, fraction=fraction)
        finally:
            await runner.close()
    placement = {
        "node": socket.gethostname(),
        "cpu_slot": bind,
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "started_at": started_at,  # epoch seconds: when segments overlapped, across nodes
        "ended_at": time.time(),
        "task_wall_s": time.perf_counter() - wall_start,
    }
    measurement.notes = {**(measurement.notes or {}), **placement}
    return measurement


class RayLiveSegmentRunner:
    """Live segments as Ray tasks, one serving slot each (see the module docstring). `parallel`: the
    evaluator may measure a step's points at once; Ray runs as many as the cluster has slots and queues the
    rest."""

    variant: Variant = "live"
    parallel = True

    def __init__(
        self, profile: Profile, spec: TunerSpec, executor: Executor, make_server: BackendFactory = vllm_backend
    ) -> None:
        ray = getattr(executor, "ray", None)
        if ray is None:
            raise BackendUnavailable("live segments side by side need --executor ray")
        self.ray_error: type[BaseException] | tuple[()] = getattr(getattr(ray, "exceptions", None), "RayError", ())
        self.profile = profile
        self.spec = spec
        self.executor = executor
        self.make_server = make_server
        cluster = ray.cluster_resources()
        self.demand = slot_demand(cluster)
        slot = "GPU" if "num_gpus" in self.demand else LIVE_SLOT_RESOURCE
        self.description = {
            **make_server(profile).describe(),
            "executor": "ray",
            "slot": slot,
            "slots": int(cluster.get(slot, 0)),
        }

    async def measure(self, point: Point, *, seed: int, fraction: float = 1.0) -> Measurement:
        args = (self.profile, self.spec, point, seed, fraction, self.make_server)
        label = f"live segment {point.label()} x{fraction:.3g}"
        try:
            return await self.executor.run(label, live_segment_task, *args, demand=self.demand)
        except self.ray_error as exc:
            # A task's own exception comes back wrapped (RayTaskError); the cause is what the serial tuner
            # would have seen. A worker that died (killed, out of memory) is a failed segment: scored -inf.
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None
            return Measurement(None, 0.0, error=f"the Ray task ended without a result: {type(exc).__name__}: {exc}")

    async def close(self) -> None:
        return None
