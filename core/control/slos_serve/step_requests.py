"""What the SLOs-Serve step planner (stepping.py) reads of the engine's requests (StepRequest), as plain functions:
compiled, a module-level function is a native call where a bound method goes through the interpreter's API, and
these run for every request of every stretch check.

`StepRequest.planned` is what the planner's `_deadlines` keeps on a request once it has run: (first-token
deadline, TPOT, best-effort, request id); it is None before.
"""

from __future__ import annotations

from typing import Any

from core.controller_api import TIER_BEST_EFFORT
from core.step_planner_api import StepRequest


def queued_last(pair: tuple[Any, int]) -> bool:
    """Sort key of BatchPlan.prefill entries: already-prefilling requests (admitted) before queued ones."""
    return bool(pair[0].admitted_order < 0)


def request_key(item: StepRequest) -> Any:
    """item.req.spec.request_id as the object it is kept as (a dict key), from what the planner's `_deadlines`
    keeps on the request where it has run: typed int, compiled code unboxes it and boxes it again for each
    lookup, a new int object above 256 (`sync` looks up every running request a decision)."""
    known: tuple[Any, ...] | None = item.planned
    if known is None:
        return item.req.spec.request_id
    return known[3]


def is_best_effort(item: StepRequest) -> bool:
    """Whether a request is of the best-effort tier."""
    known: tuple[Any, ...] | None = item.planned  # `_deadlines` keeps the same answer (the tier is fixed)
    if known is not None:
        return bool(known[2])
    return bool(item.req.tier == TIER_BEST_EFFORT)


def fill_in_order(
    entries: list[tuple[StepRequest, int]],
    admitted: int,
    tokens: int,
    prefilling: list[tuple[Any, int]],
    admitting: list[tuple[Any, int]],
) -> int:
    """form_batch's prefill fill for the planner's `plain_prefill_check`: up to `tokens` prompt tokens, in the
    entries' order, to those (request, its place in the queue or -1) prefilling or among the `admitted` first
    queued; each chunk goes to `prefilling` or `admitting` by which it is. Returns the tokens left."""
    for item, i in entries:
        if tokens <= 0:
            break
        if i < admitted:
            chunk = min(item.prompt_left, tokens)
            tokens -= chunk
            (prefilling if i < 0 else admitting).append((item, chunk))
    return tokens


# Up to this many keys stable_order sorts itself (an insertion sort: quadratic, and most checks have 2-4 entries).
_INSERTION_MAX = 16


def stable_order(keys: list[float]) -> list[int]:
    """sorted(range(len(keys)), key=keys.__getitem__): the positions of `keys` in a stable ascending order. Few keys
    and no NaN among them: an insertion sort in compiled code (`sorted` is the builtin called through the
    interpreter's API with a key function, ~1.5k instructions a check). Each key goes after every earlier one that
    is not greater, which is the stable order wherever `<` orders the keys totally (floats without NaN: -0.0 and
    0.0 are equal to both); with a NaN, or many keys, `sorted` itself."""
    count = len(keys)
    if count > _INSERTION_MAX:
        return sorted(range(count), key=keys.__getitem__)
    order: list[int] = []
    for j in range(count):
        key = keys[j]
        if key != key:  # NaN: `sorted`'s own order, whatever it is
            return sorted(range(count), key=keys.__getitem__)
        i = len(order)
        order.append(j)
        while i > 0 and key < keys[order[i - 1]]:
            order[i] = order[i - 1]
            i -= 1
        order[i] = j
    return order
