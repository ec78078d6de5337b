"""The one event stream: batch prints it as JSON Lines, the console renders it, the factsheet sums it up.

An event is a flat JSON object with an `event` name. Floats are rounded so the same run gives the same
bytes (a summary must not differ in the 17th digit between two identical runs on different platforms).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

Event = dict[str, Any]
EventSink = Callable[[Event], None]

FLOAT_DIGITS = 6


_UNCHANGED = frozenset({int, str, bool, type(None)})


def _clean(value: Any) -> Any:
    # Exact types first: a batch run cleans tens of thousands of engine events, and the isinstance checks
    # against the Mapping ABC dominated; anything else (subclasses, numpy scalars) takes the general path.
    kind = type(value)
    if kind is float:
        return round(value, FLOAT_DIGITS) if math.isfinite(value) else None
    if kind in _UNCHANGED:
        return value
    if kind is dict:
        return {str(k): _clean(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_clean(v) for v in value]
    return _clean_general(value)


def _clean_general(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None  # JSON has no NaN/inf; null reads as "undefined" (e.g. p99 of zero requests)
        return round(value, FLOAT_DIGITS)
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return _clean(value.item())
    return value


def make_event(name: str, **fields: Any) -> Event:
    return {"event": name, **_clean(fields)}


def to_json_line(event: Event) -> str:
    return json.dumps(_clean(event), separators=(",", ":"), ensure_ascii=False)


def null_sink(event: Event) -> None:
    """A sink that drops events (for library use without a listener)."""


TUNE_STEP = "tune_step"  # one decision of a tuner (batch: core/tune/hillclimb.py; online: core/tune/online.py)


def online_tune_feed(steps: list[Event], since: int, **state: Any) -> Event:
    """The online tuner's state over HTTP (GET /gateway/tune?since=N, core/gateway/server.py): `state` (the
    incumbent, the point and knobs in force), its `tune_step` events from index `since` on, and `next`, the
    index to ask from next time; the console's Tuner tab reads it (console/app_gateway.py)."""
    since = min(max(0, since), len(steps))
    return {"event": "online_tune", **_clean(state), "since": since, "next": len(steps), "steps": steps[since:]}
