"""Reading a figure back from a summary, a compare row or any JSON mapping: a finite number, or None.

A summary writes NaN and infinities as null (core/metrics/summary.py: JSON has no NaN), and a field may be missing
or hold a string in a hand-edited file; every reader (the verdict, the factsheet, the compare and capacity
sections) treats those as unknown, never as zero, through these two functions."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any


def finite_number(value: Any) -> float | None:
    """A finite float, or None for missing, non-numeric (booleans included), NaN or infinite values."""
    if isinstance(value, bool) or value is None:
        return None
    if hasattr(value, "item") and callable(value.item):  # a numpy scalar (np.int64 is not an int)
        value = value.item()
    if not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def whole_number(value: Any) -> int | None:
    """finite_number rounded to an int (a count written as 12.0 reads as 12), or None."""
    number = finite_number(value)
    return None if number is None else round(number)


def read_figures(
    source: Mapping[str, Any], *, numbers: Iterable[str] = (), counts: Iterable[str] = ()
) -> dict[str, float | int | None]:
    """The named figures of `source` by the same names: `numbers` through finite_number, `counts` through
    whole_number (a factsheet section's fields are named as the summary's keys)."""
    figures: dict[str, float | int | None] = {key: whole_number(source.get(key)) for key in counts}
    figures.update((key, finite_number(source.get(key))) for key in numbers)
    return figures
