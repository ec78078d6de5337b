"""The tuner's knob space: points K = (concurrency, max_num_seqs, spec width, spec on/off) and neighbours.

Paper 000 sec. II-B ("controller algorithm"): neighbours are deterministic, each numeric knob moved by a
fixed step in both directions and clamped to its bounds, plus the speculation toggle. The order in which
`neighbours` lists them is fixed (concurrency, max_num_seqs, width, toggle; down before up) so that a tie
in score always resolves the same way and a re-run of the search asks for the same segments (resume).

Two points that run the same server and client (`Point.config_key`: any width with speculation off) are
one configuration: a neighbour that only changes what a switched-off knob holds is no move and is not
listed. For an open-loop workload the concurrency knob is a client-side in-flight cap, and "no cap"
(`UNLIMITED`) is a point of the space: one step above the upper bound, and the start when the profile sets
no cap. The start is the profile's knobs as given (not clamped): the baseline is the user's configuration.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from core.profile import KnobsSpec, TunerSpec

UNLIMITED = 0  # concurrency of an open-loop point without an in-flight cap (KnobsSpec.concurrency None)


@dataclass(frozen=True, slots=True, order=True)
class Point:
    """One knob vector K. `spec_width` is kept even when speculation is off, as the paper's vector is."""

    concurrency: int
    max_num_seqs: int
    spec_width: int
    spec_on: bool

    @property
    def effective_width(self) -> int:
        """Speculative tokens the server really uses: off, or on with width 0, both mean none."""
        return self.spec_width if self.spec_on else 0

    @property
    def unlimited(self) -> bool:
        return self.concurrency == UNLIMITED

    @property
    def config_key(self) -> tuple[int, int, int]:
        """What the server and client actually run. Two points with the same key are the same experiment
        (speculation off at width 8 and at width 12 launch the same vLLM), so a search measures it once."""
        return (self.concurrency, self.max_num_seqs, self.effective_width)

    def label(self) -> str:
        spec = f"spec {self.spec_width}" if self.spec_on else f"spec off ({self.spec_width})"
        conc = "unlimited" if self.unlimited else str(self.concurrency)
        return f"conc {conc}, seqs {self.max_num_seqs}, {spec}"

    def as_dict(self) -> dict[str, int | bool | None]:
        """JSON form; an unlimited concurrency is None, as in the profile's knobs."""
        return {
            "concurrency": None if self.unlimited else self.concurrency,
            "max_num_seqs": self.max_num_seqs,
            "spec_width": self.spec_width,
            "spec_on": self.spec_on,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Point:
        return cls(
            concurrency=UNLIMITED if data["concurrency"] is None else int(data["concurrency"]),  # type: ignore[arg-type]
            max_num_seqs=int(data["max_num_seqs"]),  # type: ignore[arg-type]
            spec_width=int(data["spec_width"]),  # type: ignore[arg-type]
            spec_on=bool(data["spec_on"]),
        )

    def to_knobs(self, base: KnobsSpec) -> KnobsSpec:
        """The profile's knobs with this point's four values (the other knobs stay as the profile has them)."""
        return base.model_copy(
            update={
                "concurrency": None if self.unlimited else self.concurrency,
                "max_num_seqs": self.max_num_seqs,
                "spec_width": self.spec_width,
                "spec_on": self.spec_on,
            }
        )


def _clamp(value: int, bounds: tuple[int, int]) -> int:
    return max(bounds[0], min(bounds[1], value))


class KnobSpace:
    """Bounds, steps and neighbour rule of a `TunerSpec`. `open_loop`: the concurrency knob is an in-flight
    cap, and no cap (`UNLIMITED`) is one of its values."""

    def __init__(self, spec: TunerSpec, *, open_loop: bool = False) -> None:
        self.spec = spec
        self.open_loop = open_loop

    def start_point(self, knobs: KnobsSpec, clients: int | None = None) -> Point:
        """K0 = the profile's knobs as given. Concurrency: the knob if set, else the closed-loop clients,
        else (open loop) no cap."""
        concurrency = knobs.concurrency if knobs.concurrency is not None else clients
        if concurrency is None:
            concurrency = UNLIMITED
        return Point(concurrency, knobs.max_num_seqs, knobs.spec_width, knobs.spec_on)

    def clamp(self, point: Point) -> Point:
        spec = self.spec
        return Point(
            concurrency=point.concurrency if point.unlimited else _clamp(point.concurrency, spec.concurrency_bounds),
            max_num_seqs=_clamp(point.max_num_seqs, spec.max_num_seqs_bounds),
            spec_width=_clamp(point.spec_width, spec.spec_width_bounds),
            spec_on=point.spec_on,
        )

    def _concurrency_moves(self, concurrency: int) -> tuple[int, int]:
        """(down, up) for the concurrency knob; the same value where the move clamps onto the point."""
        step, (low, high) = self.spec.concurrency_step, self.spec.concurrency_bounds
        if concurrency == UNLIMITED:
            return (high if self.open_loop else UNLIMITED), UNLIMITED
        up = UNLIMITED if self.open_loop and concurrency >= high else _clamp(concurrency + step, (low, high))
        return _clamp(concurrency - step, (low, high)), up

    def _toggle(self, point: Point) -> Point:
        """Speculation on/off. Switching on from a width of 0 would run the same server, so it switches on
        at one width step (clamped)."""
        if point.spec_on:
            return Point(point.concurrency, point.max_num_seqs, point.spec_width, False)
        width = point.spec_width if point.spec_width > 0 else point.spec_width + self.spec.spec_width_step
        return Point(point.concurrency, point.max_num_seqs, width, True)

    def steps_between(self, a: Point, b: Point) -> float:
        """How many knob steps apart two points are (no cap counts one step above the upper bound; a
        switch of speculation one step): a distance that knows nothing but the space."""
        spec = self.spec

        def conc(point: Point) -> int:
            return spec.concurrency_bounds[1] + spec.concurrency_step if point.unlimited else point.concurrency

        return (
            abs(conc(a) - conc(b)) / spec.concurrency_step
            + abs(a.max_num_seqs - b.max_num_seqs) / spec.max_num_seqs_step
            + abs(a.effective_width - b.effective_width) / spec.spec_width_step
        )

    def neighbours(self, point: Point) -> list[Point]:
        """N(K): +-step per numeric knob, clamped, plus the toggle. Dropped: a move that clamps back onto
        K, and one that runs K's configuration (a width move with speculation off), or a configuration
        already listed."""
        spec = self.spec
        down, up = self._concurrency_moves(point.concurrency)
        moves = [
            Point(down, point.max_num_seqs, point.spec_width, point.spec_on),
            Point(up, point.max_num_seqs, point.spec_width, point.spec_on),
            Point(point.concurrency, point.max_num_seqs - spec.max_num_seqs_step, point.spec_width, point.spec_on),
            Point(point.concurrency, point.max_num_seqs + spec.max_num_seqs_step, point.spec_width, point.spec_on),
            Point(point.concurrency, point.max_num_seqs, point.spec_width - spec.spec_width_step, point.spec_on),
            Point(point.concurrency, point.max_num_seqs, point.spec_width + spec.spec_width_step, point.spec_on),
        ]
        if spec.spec_toggle:
            moves.append(self._toggle(point))
        seen = {point.config_key}
        result = []
        for move in moves:
            clamped = self.clamp(move)
            if clamped.config_key not in seen:
                seen.add(clamped.config_key)
                result.append(clamped)
        return result

    def compound_neighbours(self, point: Point) -> list[Point]:
        """Every combination of -step / 0 / +step on the three numeric knobs, with and without the toggle:
        the paper's moves plus the diagonals. Too many to measure (up to 53), but cheap to rank on the
        simulator; they let a search cross a ridge where no single knob helps on its own (more clients are
        useless without more batch slots, and the other way round)."""
        spec = self.spec
        toggles = (point.spec_on, not point.spec_on) if spec.spec_toggle else (point.spec_on,)
        seen = {point.config_key}
        result = [n for n in self.neighbours(point)]
        seen.update(n.config_key for n in result)
        down, up = self._concurrency_moves(point.concurrency)
        for concurrency in (down, point.concurrency, up):
            for ds in (-1, 0, 1):
                for dw in (-1, 0, 1):
                    for on in toggles:
                        candidate = self.clamp(
                            Point(
                                concurrency,
                                point.max_num_seqs + ds * spec.max_num_seqs_step,
                                point.spec_width + dw * spec.spec_width_step,
                                on,
                            )
                        )
                        if candidate.config_key not in seen:
                            seen.add(candidate.config_key)
                            result.append(candidate)
        return result

    def reachable(self, start: Point) -> Iterator[Point]:
        """Every point the neighbour rule can reach from `start` (breadth-first): the space an exhaustive
        grid must cover to be the fair optimum for a search that only ever moves by neighbours."""
        queue = deque([start])
        seen = {start}
        while queue:
            point = queue.popleft()
            yield point
            for nxt in self.neighbours(point):
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)

    def distinct_configs(self, start: Point) -> list[Point]:
        """The reachable space with one representative per real configuration (`Point.config_key`)."""
        chosen: dict[tuple[int, int, int], Point] = {}
        for point in self.reachable(start):
            chosen.setdefault(point.config_key, point)
        return sorted(chosen.values())
