"""What the online tuner may move at the gateway: the knob point it climbs over, its neighbours, and the policy
that puts a point in force.

A point (`OnlinePoint`) is the batch tuner's `Point` (the per-replica concurrency cap, max_num_seqs, ...) plus
the scheduling mode and that mode's own knobs. Its neighbours (`OnlineSpace.neighbours`), as Algorithm 1's
N(K) (paper 000 sec. II-B) extended to the gateway's knobs:
- the cap +-step, in fcfs only: the cap is how fcfs admits at the gateway (`ConcurrencyCapPolicy`); the other
  modes admit by their own rules, and the cap would only sit unused in their points;
- the server's flags, where the gateway launched its servers (a replica swap changes them, issue 23 item 2):
  max_num_seqs +-step, the speculation width +-step and speculation on/off as the batch tuner moves them
  (within the profile's `tuner:` bounds), and max_num_batched_tokens halved and doubled within
  `tuner.max_num_batched_tokens_bounds` when the profile sets them;
- each of the mode's own knobs (`MODE_KNOBS`) halved and doubled within its bounds;
- each other mode of `modes` (the operator's list; the start's mode alone by default), with its knobs as the
  profile sets them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from core.controller_api import Policy
from core.profile import Calibration, Profile, ProfileError
from core.tune.knobspace import KnobSpace, Point

FCFS = "fcfs"  # the mode whose admission at the gateway is the cap


@dataclass(frozen=True, slots=True)
class ModeKnob:
    """One knob of a mode's settings in the profile (`profile.<section>.<name>`), moved by factors of two."""

    section: str  # the profile's attribute: "saber", "slos_serve"
    name: str
    bounds: tuple[float, float]
    integer: bool = True

    def moves(self, value: float) -> list[float]:
        low, high = self.bounds
        out = []
        for moved in (value / 2, value * 2):
            moved = min(high, max(low, round(moved) if self.integer else moved))
            if moved != value and moved not in out:
                out.append(moved)
        return out


# The modes the gateway can tune online, each with the knobs it decides admission by in front of a live server.
# AdaServe is not among them: its knobs shape vLLM's speculation (server flags), not the gateway's admission.
MODE_KNOBS: dict[str, tuple[ModeKnob, ...]] = {
    FCFS: (),
    # SABER samples a window of this many requests at the high tier's head before admitting (paper 001 sec.
    # IV-C step 2; the paper gives no value).
    "saber": (ModeKnob("saber", "window_size", (1, 32)),),
    # SLOs-Serve runs its admission DP when the oldest arrival has waited the timeout or the threshold of arrivals
    # wait (paper 004, Algorithm 1): a longer timeout batches bursts into one plan, a shorter one answers sooner.
    "slos-serve": (
        ModeKnob("slos_serve", "schedule_window_s", (0.0025, 0.32), integer=False),
        ModeKnob("slos_serve", "schedule_batch", (1, 128)),
    ),
}
ONLINE_MODES = tuple(MODE_KNOBS)


@dataclass(frozen=True, slots=True, order=True)
class OnlinePoint(Point):
    """A point of the online climb: the batch tuner's knobs, the scheduling mode, and the mode's own knobs; and
    the server's max_num_batched_tokens where the climb moves it (else None: the server keeps its own)."""

    mode: str = FCFS
    mode_knobs: tuple[tuple[str, float], ...] = ()
    max_num_batched_tokens: int | None = None

    def knobs_point(self) -> Point:
        return Point(self.concurrency, self.max_num_seqs, self.spec_width, self.spec_on)

    def with_knobs(self, point: Point) -> OnlinePoint:
        return OnlinePoint(
            point.concurrency,
            point.max_num_seqs,
            point.spec_width,
            point.spec_on,
            self.mode,
            self.mode_knobs,
            self.max_num_batched_tokens,
        )

    def as_dict(self) -> dict[str, Any]:  # type: ignore[override]
        tokens = {} if self.max_num_batched_tokens is None else {"max_num_batched_tokens": self.max_num_batched_tokens}
        return {**Point.as_dict(self), **tokens, "mode": self.mode, "mode_knobs": dict(self.mode_knobs)}

    def key(self) -> str:
        """Short and unique, for a window's segment key."""
        knobs = "".join(f"-{name}{value:g}" for name, value in self.mode_knobs)
        server = f"-w{self.effective_width}" if self.effective_width else ""
        server += "" if self.max_num_batched_tokens is None else f"-b{self.max_num_batched_tokens}"
        return f"c{self.concurrency or 'inf'}-s{self.max_num_seqs}{server}-{self.mode}{knobs}"


def mode_knob_values(profile: Profile, mode: str) -> tuple[tuple[str, float], ...]:
    """The mode's knobs as the profile sets them, clamped into their online bounds."""
    values = []
    for knob in MODE_KNOBS[mode]:
        value = getattr(getattr(profile, knob.section), knob.name)
        values.append((knob.name, min(knob.bounds[1], max(knob.bounds[0], value))))
    return tuple(values)


def check_online_modes(modes: tuple[str, ...]) -> None:
    for mode in modes:
        if mode not in MODE_KNOBS:
            raise ProfileError(
                f"mode {mode!r} cannot be tuned online (its knobs are server flags, not the gateway's admission); "
                f"choose among {', '.join(ONLINE_MODES)}"
            )


def online_knob_space(profile: Profile, *, server_flags: bool = False) -> KnobSpace:
    """The batch tuner's knobs the gateway owns: the concurrency cap, within the profile's tuner bounds and step;
    with `server_flags` (the gateway launched its servers, so it can swap one for another) max_num_seqs and
    speculation too, within the profile's tuner bounds. Otherwise both are pinned to the profile's values (no
    neighbour moves them)."""
    knobs = profile.knobs
    update: dict[str, Any] = {}
    if not server_flags:
        update = {
            "max_num_seqs_bounds": (knobs.max_num_seqs, knobs.max_num_seqs),
            "spec_width_bounds": (knobs.spec_width, knobs.spec_width),
            "spec_toggle": False,
        }
    spec = profile.tuner.model_copy(update=update)
    return KnobSpace(spec, open_loop=False)


@dataclass(frozen=True, slots=True)
class OnlineSpace:
    """The online climb's knob space (module docstring)."""

    knobs: KnobSpace
    profile: Profile
    modes: tuple[str, ...] = (FCFS,)
    server_flags: bool = False  # the gateway launched its servers: a replica swap changes their flags

    def __post_init__(self) -> None:
        check_online_modes(self.modes)

    @property
    def spec(self):  # type: ignore[no-untyped-def]
        return self.knobs.spec

    @property
    def batched_tokens_bounds(self) -> tuple[int, int] | None:
        """max_num_batched_tokens' range when the climb moves it (launched servers and bounds in the profile)."""
        return self.spec.max_num_batched_tokens_bounds if self.server_flags else None

    def point(self, knobs: Point, mode: str) -> OnlinePoint:
        """`knobs` in `mode`, with the mode's knobs as the profile sets them (and the profile's
        max_num_batched_tokens where the climb moves it)."""
        check_online_modes((mode,))
        tokens = self.profile.knobs.max_num_batched_tokens if self.batched_tokens_bounds is not None else None
        return self.clamp(OnlinePoint(knobs.concurrency, knobs.max_num_seqs, knobs.spec_width, knobs.spec_on, mode,
                                      mode_knob_values(self.profile, mode), tokens))  # fmt: skip

    def clamp(self, point: OnlinePoint) -> OnlinePoint:
        clamped = point.with_knobs(self.knobs.clamp(point.knobs_point()))
        bounds = self.batched_tokens_bounds
        if bounds is None or point.max_num_batched_tokens is None:
            return replace(clamped, max_num_batched_tokens=None)
        return replace(clamped, max_num_batched_tokens=min(bounds[1], max(bounds[0], point.max_num_batched_tokens)))

    def neighbours(self, point: OnlinePoint) -> list[OnlinePoint]:
        base = point.knobs_point()
        result = [
            point.with_knobs(n)
            for n in self.knobs.neighbours(base)
            if point.mode == FCFS or n.concurrency == base.concurrency
        ]
        values = dict(point.mode_knobs)
        for knob in MODE_KNOBS[point.mode]:
            for moved in knob.moves(values[knob.name]):
                result.append(replace(point, mode_knobs=tuple({**values, knob.name: moved}.items())))
        tokens = point.max_num_batched_tokens
        if self.batched_tokens_bounds is not None and tokens is not None:
            batched = ModeKnob("knobs", "max_num_batched_tokens", self.batched_tokens_bounds)
            result += [replace(point, max_num_batched_tokens=int(moved)) for moved in batched.moves(tokens)]
        result += [replace(self.point(base, mode), max_num_batched_tokens=tokens) for mode in self.modes
                   if mode != point.mode]  # fmt: skip
        return result


def online_space(profile: Profile, *, server_flags: bool = False, modes: tuple[str, ...] = (FCFS,)) -> OnlineSpace:
    """The online tuner's space for `profile`: see `online_knob_space` and `OnlineSpace`."""
    return OnlineSpace(online_knob_space(profile, server_flags=server_flags), profile, modes, server_flags)


def build_policy(
    point: OnlinePoint,
    profile: Profile,
    calibration: Calibration | None,
    *,
    replicas: int = 1,
    max_queue: int | None = None,
) -> Policy:
    """The policy that puts `point`'s mode and mode knobs in force (fcfs: the cap in front of fcfs)."""
    from core.control.concurrency_cap import ConcurrencyCapPolicy

    if point.mode == FCFS:
        return ConcurrencyCapPolicy(point.concurrency, max_queue)
    from core.modes import ModeContext, make_policy

    if calibration is None:
        raise ProfileError(f"mode {point.mode} needs the engine's calibration")
    update: dict[str, Any] = {}
    for knob in MODE_KNOBS[point.mode]:
        section = update.get(knob.section, getattr(profile, knob.section))
        update[knob.section] = section.model_copy(update={knob.name: dict(point.mode_knobs)[knob.name]})
    if point.mode == "slos-serve":
        # Admission only, in front of the engine's own batching: the gateway cannot form vLLM's batches, and the
        # simulator's engine takes its step planner once, at its start (so a mode switched in has none there).
        update["slos_serve"] = update["slos_serve"].model_copy(update={"batch_formation": False})
    tuned = profile.model_copy(update=update)
    return make_policy(point.mode, ModeContext(tuned, calibration, replicas=replicas, seed=profile.seed))  # type: ignore[arg-type]


class OnlinePolicy:
    """The policy the controller runs under online tuning (the gateway, or the simulator's engine): a
    `ModeSwitch` (core/control/mode_switch.py) whose mode and knobs follow the tuner's points. A new cap in fcfs is
    set in place (`ConcurrencyCapPolicy.set_cap`); another mode or other mode knobs are a switch, whose handover
    drops, fails and reorders nothing."""

    def __init__(
        self,
        point: OnlinePoint,
        profile: Profile,
        calibration: Callable[[], Calibration] | None = None,
        *,
        replicas: int = 1,
        max_queue: int | None = None,
    ) -> None:
        from core.control.mode_switch import ModeSwitch

        self.profile = profile
        self.replicas = replicas
        self.max_queue = max_queue
        self._calibration = calibration
        self.point = point
        self.switch = ModeSwitch(self._build(point))

    def _build(self, point: OnlinePoint) -> Policy:
        calibration = self._calibration() if self._calibration is not None and point.mode != FCFS else None
        return build_policy(point, self.profile, calibration, replicas=self.replicas, max_queue=self.max_queue)

    @property
    def cap(self) -> int | None:
        """The cap in force (fcfs), else None."""
        return getattr(self.switch.current, "cap", None) if self.point.mode == FCFS else None

    def apply(self, point: OnlinePoint, now: float) -> None:
        """Put `point`'s admission in force from `now` (its server flags are the replica swap's business)."""
        same_mode = point.mode == self.point.mode and point.mode_knobs == self.point.mode_knobs
        if same_mode and point.mode == FCFS:
            self.switch.current.set_cap(point.concurrency)  # type: ignore[attr-defined]
        elif not same_mode:
            self.switch.switch(self._build(point), now)
        self.point = point
