"""`slo-console gateway --tune`: the online tuner (core/tune/online.py) inside the live gateway, in wall time.

The gateway runs the tuner's `OnlinePolicy` (core/tune/online_space.py): fcfs behind a per-replica concurrency
cap (`ConcurrencyCapPolicy`, what vLLM's static `max_num_seqs` does, moved into the gateway), or, with
`modes`, another scheduling mode with its own knobs (SABER's window, SLOs-Serve's timeout and threshold); it
hands every ended request's record to the tuner, and a timer asks the tuner once a second whether a window is
complete. A new cap applies to what the gateway releases from then on (`set_cap`, then `policy_changed`): a
request already at an upstream finishes there, and the queue keeps its order; a new mode or new mode knobs
are a handover (core/control/mode_switch.py): the old mode releases what it holds by its own rules before the
new one releases anything. So a knob change never drops, fails or reorders an admitted request. Each decision
is a `tune_step` event on the gateway's event stream (JSON Lines on stdout in the standalone gateway).

With `--launch` (the gateway started its vLLM, core/backends/launched_replicas.py) the server's flags are
tuned too (max_num_seqs, speculation width and on/off, and max_num_batched_tokens where the profile bounds
it): a trial with other flags is a replica swap, and its window starts once the old server has
drained and stopped. An operator's swap (POST /gateway/swap) waits for no window: its point becomes the
incumbent and the climb goes on from there. GET /gateway/tune shows the steps so far.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field, replace
from typing import Any

from core.backends.launched_replicas import LaunchedReplicas
from core.events import TUNE_STEP, Event, EventSink, online_tune_feed
from core.gateway.admission import AdmissionController
from core.gateway.server import Gateway, SwapRefused
from core.profile import Calibration, KnobsSpec, Profile, ProfileError, load_calibration
from core.tune.knobspace import Point
from core.tune.online import OnlineSettings, OnlineTuner
from core.tune.online_space import FCFS, OnlinePoint, OnlinePolicy, OnlineSpace, online_space

POLL_S = 1.0  # how often the tuner is asked whether its window is complete (wall seconds)


def start_point(profile: Profile, space: OnlineSpace, mode: str = FCFS) -> OnlinePoint:
    """`mode` with the profile's knobs for it, and the profile's cap (`knobs.concurrency`), else the upper bound
    of the tuner's range, clamped into it."""
    knobs = profile.knobs
    cap = knobs.concurrency if knobs.concurrency is not None else space.spec.concurrency_bounds[1]
    return space.point(Point(cap, knobs.max_num_seqs, knobs.spec_width, knobs.spec_on), mode)


def server_flags_to_change(knobs: KnobsSpec, point: OnlinePoint) -> dict[str, Any]:
    """The server flags a replica swap must change so that servers running `knobs` run `point`: empty when the
    point's server is the one running (speculation off at any width is one server, Point.config_key)."""
    update: dict[str, Any] = {}
    if knobs.max_num_seqs != point.max_num_seqs:
        update["max_num_seqs"] = point.max_num_seqs
    if knobs.effective_spec_width != point.effective_width:
        update |= {"spec_on": point.spec_on, "spec_width": point.spec_width}
    tokens = point.max_num_batched_tokens
    if tokens is not None and knobs.max_num_batched_tokens != tokens:
        update["max_num_batched_tokens"] = tokens
    return update


@dataclass(slots=True)
class OnlineGatewayTuning:
    """A running online tune: the tuner, the policy it moves, and the timer task that polls it."""

    tuner: OnlineTuner
    policy: OnlinePolicy
    gateway: AdmissionController
    replicas: LaunchedReplicas | None = None  # --launch: the server's flags move too, by replica swap
    task: asyncio.Task[None] | None = None
    swap: asyncio.Task[None] | None = None
    steps: list[Event] = field(default_factory=list)  # its tune_step events, for GET /gateway/tune

    def record(self, event: Event) -> None:
        if event.get("event") == TUNE_STEP:
            self.steps.append(event)

    def knobs_in_force(self) -> dict[str, Any]:
        knobs = self.replicas.current_knobs(self.gateway) if self.replicas is not None else None
        server = knobs.model_dump() if knobs is not None else {"max_num_seqs": self.tuner.current.max_num_seqs}
        return {**server, "concurrency": self.policy.cap, "mode": self.policy.point.mode,
                "mode_knobs": dict(self.policy.point.mode_knobs)}  # fmt: skip

    def feed(self, since: int) -> Event:
        """GET /gateway/tune's answer (core.events.online_tune_feed)."""
        swapping = self.swap is not None or (self.replicas is not None and self.replicas.swapping)
        return online_tune_feed(
            self.steps,
            since,
            tuner=self.tuner.describe(),
            world=self.tuner.world,
            incumbent=self.tuner.incumbent.as_dict(),
            current=self.tuner.current.as_dict(),
            knobs=self.knobs_in_force(),
            swapping=swapping,
            slo_p99_s=self.tuner.slo_s,
        )

    async def operator_swap(self, update: dict[str, Any]) -> dict[str, Any]:
        """POST /gateway/swap while tuning: the replica swap the tuner uses; the new point becomes the incumbent
        (ProfileError when a server flag is outside the tuner's range: the climb could not go on from it)."""
        assert self.replicas is not None
        knobs = self.replicas.edited_knobs(self.gateway, update)
        current = self.tuner.current
        point = replace(
            current,
            max_num_seqs=knobs.max_num_seqs,
            spec_width=knobs.spec_width,
            spec_on=knobs.spec_on,
            max_num_batched_tokens=None if current.max_num_batched_tokens is None else knobs.max_num_batched_tokens,
        )
        clamped = self.tuner.space.clamp(point)
        if clamped != point:
            name = next(n for n in ("max_num_seqs", "spec_width", "max_num_batched_tokens")
                        if getattr(clamped, n) != getattr(point, n))  # fmt: skip
            bounds = self.tuner.space.batched_tokens_bounds if name == "max_num_batched_tokens" else None
            low, high = bounds or getattr(self.tuner.spec, f"{name}_bounds")
            raise ProfileError(f"{name} {getattr(point, name)} is outside the online tuner's range {low}..{high}")
        if self.swap is not None:
            raise SwapRefused("the online tuner's replica swap is under way; ask again when it is done")
        swaps = self.replicas.swaps
        in_force = await self.replicas.swap_knobs(self.gateway, knobs)
        if self.replicas.swaps > swaps:
            self._note_pause()
            self.tuner.jump(point, self.gateway.now())
        return in_force | {"concurrency": self.policy.cap, "mode": self.policy.point.mode}

    def poll(self) -> None:
        if self.swap is not None or (self.replicas is not None and self.replicas.swapping):
            return  # a replica swap is under way: no window runs until it is done
        change = self.tuner.poll(self.gateway.now())
        if change is None:
            return
        self.apply(change)
        if self.replicas is not None:
            update = server_flags_to_change(self.replicas.current_knobs(self.gateway), change)
            if update:
                new = self.replicas.current_knobs(self.gateway).model_copy(update=update)
                self.swap = asyncio.get_running_loop().create_task(self._swap(new))

    def apply(self, point: OnlinePoint) -> None:
        """Put `point`'s admission in force at the gateway (a cap in place, or a mode handover)."""
        self.policy.apply(point, self.gateway.now())
        self.gateway.policy_changed()

    async def _swap(self, knobs: KnobsSpec) -> None:
        assert self.replicas is not None
        self.replicas.last_swap = {}
        try:
            await self.replicas.swap(self.gateway, knobs)
        except Exception as exc:  # the new server did not start: the old one still serves; roll the trial back
            self._note_pause()
            point = self.tuner.trial_failed(self.gateway.now(), f"replica swap failed: {exc}")
            if point is not None:
                self.apply(point)
        else:
            self._note_pause()
            self.tuner.restart_window(self.gateway.now())
        finally:
            self.swap = None

    def _note_pause(self) -> None:
        """A drain-and-restart swap held arrivals at the gateway: the tuner's next tune_step event says so."""
        assert self.replicas is not None
        last = self.replicas.last_swap
        self.tuner.note_pause(float(last.get("paused_s") or 0.0), int(last.get("held") or 0))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            self.poll()

    async def stop(self) -> None:
        self.gateway.record_sink = None
        if isinstance(self.gateway, Gateway):
            self.gateway.tune_feed = None
        if self.swap is not None:
            self.swap.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.swap
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None


def attach_online_tuner(
    gateway: AdmissionController,
    profile: Profile,
    *,
    settings: OnlineSettings | None = None,
    sink: EventSink | None = None,
    max_queue: int | None = None,
    start: OnlinePoint | None = None,
    replicas: LaunchedReplicas | None = None,
    modes: tuple[str, ...] | None = None,
) -> OnlineGatewayTuning:
    """Put the gateway under online tuning (call on its running loop, before traffic or during it). The climb
    starts in the gateway's mode (fcfs: behind the cap the tuner moves) with the profile's knobs for it, and
    switches among `modes` (default: that mode alone, whose own knobs it tunes)."""
    mode = FCFS if gateway.policy.name == "concurrency-cap" else gateway.policy.name
    modes = modes or (mode,)
    space = online_space(profile, server_flags=replicas is not None, modes=tuple(dict.fromkeys((mode, *modes))))
    point = start or start_point(profile, space, mode)
    calibration: list[Calibration] = []

    def engine_calibration() -> Calibration:  # loaded once, when a mode other than fcfs is first built
        if not calibration:
            calibration.append(load_calibration(profile))
        return calibration[0]

    policy = OnlinePolicy(point, profile, engine_calibration, replicas=len(gateway.routable), max_queue=max_queue)
    gateway.swap_policy(policy.switch)
    tuner = OnlineTuner(space, point, profile, settings or OnlineSettings(), world="live")
    tuning = OnlineGatewayTuning(tuner, policy, gateway, replicas)

    def emit(event: Event) -> None:
        tuning.record(event)
        if sink is not None:
            sink(event)

    tuner.sink = emit
    tuner.begin(gateway.now())
    gateway.record_sink = tuner.observe
    if isinstance(gateway, Gateway):  # the HTTP gateway (not the simulator's admission): its endpoints
        gateway.tune_feed = tuning.feed
        if replicas is not None:
            gateway.replica_swap = tuning.operator_swap
    tuning.task = asyncio.get_running_loop().create_task(tuning._run())
    return tuning
