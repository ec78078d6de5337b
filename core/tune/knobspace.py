"""The tuner's knob space: points K = (concurrency, max_num_seqs, spec width, spec on/off) and neighbours.

Paper 000 sec. II-B ("controller algorithm"): neighbours are deterministic, each numeric knob moved by a
fixed step in both directions and clamped to its bounds, plus the speculation toggle. The order in which
`neighbours` lists them is fixed (concurrency, max_num_seqs, width, toggle; down before up) so that a tie
in score always resolves the same way and a re-run of the search asks for the same segments (resume).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from core.profile import KnobsSpec, TunerSpec


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
    def config_key(self) -> tuple[int, int, int]:
        """What the server and client actually run. Two points with the same key are the same experiment
        (speculation off at width 8 and at width 12 launch the same vLLM), so a search measures it once."""
        return (self.concurrency, self.max_num_seqs, self.effective_width)

    def label(self) -> str:
        spec = f"spec {self.spec_width}" if self.spec_on else f"spec off ({self.spec_width})"
        return f"conc {self.concurrency}, seqs {self.max_num_seqs}, {spec}"

    def as_dict(self) -> dict[str, int | bool]:
        return {
            "concurrency": self.concurrency,
            "max_num_seqs": self.max_num_seqs,
            "spec_width": self.spec_width,
            "spec_on": self.spec_on,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Point:
        return cls(
            concurrency=int(data["concurrency"]),  # type: ignore[arg-type]
            max_num_seqs=int(data["max_num_seqs"]),  # type: ignore[arg-type]
            spec_width=int(data["spec_width"]),  # type: ignore[arg-type]
            spec_on=bool(data["spec_on"]),
        )

    def to_knobs(self, base: KnobsSpec) -> KnobsSpec:
        """The profile's knobs with this point's four values (the other knobs stay as the profile has them)."""
        return base.model_copy(
            update={
                "concurrency": self.concurrency,
                "max_num_seqs": self.max_num_seqs,
                "spec_width": self.spec_width,
                "spec_on": self.spec_on,
            }
        )


def _clamp(value: int, bounds: tuple[int, int]) -> int:
    return max(bounds[0], min(bounds[1], value))


class KnobSpace:
    """Bounds, steps and neighbour rule of a `TunerSpec`."""

    def __init__(self, spec: TunerSpec) -> None:
        self.spec = spec

    def start_point(self, knobs: KnobsSpec, fallback_concurrency: int) -> Point:
        """K0 from the profile's knobs, clamped into the bounds (a profile may start outside them)."""
        concurrency = knobs.concurrency if knobs.concurrency is not None else fallback_concurrency
        return self.clamp(Point(concurrency, knobs.max_num_seqs, knobs.spec_width, knobs.spec_on))

    def clamp(self, point: Point) -> Point:
        spec = self.spec
        return Point(
            concurrency=_clamp(point.concurrency, spec.concurrency_bounds),
            max_num_seqs=_clamp(point.max_num_seqs, spec.max_num_seqs_bounds),
            spec_width=_clamp(point.spec_width, spec.spec_width_bounds),
            spec_on=point.spec_on,
        )

    def neighbours(self, point: Point) -> list[Point]:
        """N(K): +-step per numeric knob, clamped, plus the toggle; the point itself and repeats dropped
        (a clamped move that lands back on K is no move)."""
        spec = self.spec
        moves = [
            Point(point.concurrency - spec.concurrency_step, point.max_num_seqs, point.spec_width, point.spec_on),
            Point(point.concurrency + spec.concurrency_step, point.max_num_seqs, point.spec_width, point.spec_on),
            Point(point.concurrency, point.max_num_seqs - spec.max_num_seqs_step, point.spec_width, point.spec_on),
            Point(point.concurrency, point.max_num_seqs + spec.max_num_seqs_step, point.spec_width, point.spec_on),
            Point(point.concurrency, point.max_num_seqs, point.spec_width - spec.spec_width_step, point.spec_on),
            Point(point.concurrency, point.max_num_seqs, point.spec_width + spec.spec_width_step, point.spec_on),
        ]
        if spec.spec_toggle:
            moves.append(Point(point.concurrency, point.max_num_seqs, point.spec_width, not point.spec_on))
        seen = {point}
        result = []
        for move in moves:
            clamped = self.clamp(move)
            if clamped not in seen:
                seen.add(clamped)
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
        for dc in (-1, 0, 1):
            for ds in (-1, 0, 1):
                for dw in (-1, 0, 1):
                    for on in toggles:
                        candidate = self.clamp(
                            Point(
                                point.concurrency + dc * spec.concurrency_step,
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
