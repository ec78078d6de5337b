"""Smooth goodput (paper 003): benefit tokens per second, judged by how long the reader sat idle.

A user reads a streamed answer at `reading_speed_tps` V. Token i of a request that arrived at a is due at
d_i = a + i/V (eq. 4), or, with a first-token allowance (`ttft_allow_s`), at a + allowance + (i - 1)/V. The
user idle latency l_r (eq. 6) is how late the latest token came against its due time (0 if none was late),
and the request's benefit (eq. 7) is its tokens minus alpha * f(l_r), with the penalty map f of `PENALTIES`.
Smooth goodput is the summed benefit over the measurement window (core/metrics/summary.py); the per-record
pass that finds each request's latest lateness is core/metrics/outcomes.py, which calls in here.

Failed requests keep the tokens they delivered, judged by their idle latency, and the user is also taken to
have waited for the next token until the failure was reported (end_s). So a request dropped after a long
queue wait costs benefit, while one rejected at once costs nothing: abandoning late work is never free, which
is the flaw of plain goodput that paper 003 (sec. 4.1) points at.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from core.profile import SmoothGoodputSpec

NAN = float("nan")

# Penalty maps f(l) of paper 003 eq. 7, l in seconds. "linear" is the default: it is the simplest
# monotone map, and with it alpha reads directly as "tokens of benefit forfeited per second the reader sat
# idle", which makes alpha easy to choose and to explain. "quadratic" punishes long stalls far more than
# short ones; "log1p" saturates, for readers who stop caring once they have waited at all.
PENALTIES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "linear": lambda idle_s: idle_s,
    "quadratic": np.square,
    "log1p": np.log1p,
}


def penalty(idle_s: np.ndarray | float, kind: str) -> np.ndarray:
    """f(l) of paper 003 eq. 7 for idle latencies in seconds."""
    try:
        func = PENALTIES[kind]
    except KeyError:
        raise ValueError(f"unknown smooth-goodput penalty {kind!r}; use one of {sorted(PENALTIES)}") from None
    return func(np.asarray(idle_s, dtype=float))


def token_due_s(arrival_s: np.ndarray, tokens_before: np.ndarray, smooth: SmoothGoodputSpec) -> np.ndarray:
    """When a token is due (paper 003 eq. 4): `tokens_before` tokens of the same request come before it."""
    return arrival_s + smooth.first_token_due_s + tokens_before / smooth.reading_speed_tps


def chunk_due_s(
    arrival_s: np.ndarray, counts: np.ndarray, tokens_before: np.ndarray, smooth: SmoothGoodputSpec
) -> np.ndarray:
    """token_due_s of each chunk's first token, `counts[j]` chunks for request j arriving at `arrival_s[j]`,
    `tokens_before` (float64, one per chunk; overwritten and returned) tokens of its request before it.

    The same doubles as token_due_s over the repeated arrivals, (a + first) + before / V (x + y is y + x),
    in fewer passes over the chunks: a + first once per request, then in place."""
    tokens_before /= smooth.reading_speed_tps
    tokens_before += np.repeat(arrival_s + smooth.first_token_due_s, counts)
    return tokens_before


def idle_and_benefit(
    max_late: np.ndarray,
    ok: np.ndarray,
    arrival_s: np.ndarray,
    end_s: np.ndarray,
    output_tokens: np.ndarray,
    delivered: np.ndarray,
    smooth: SmoothGoodputSpec,
    *,
    all_ok: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """User idle latency (eq. 6; NaN when nothing can be said) and benefit (eq. 7; 0 where idle is NaN) per
    request, from each request's latest token lateness `max_late` (NaN: no token seen) and `delivered` tokens.

    `all_ok`: the caller knows every request completed (`ok` all True), the usual live-window batch: the same
    values in fewer passes (no failure waits; a NaN idle becomes 0, so no NaN is left for the benefit)."""
    if all_ok:
        idle = np.where(np.isnan(max_late), 0.0, np.maximum(max_late, 0.0))
        with np.errstate(invalid="ignore"):
            return idle, output_tokens - smooth.alpha * penalty(idle, smooth.penalty)
    idle = np.where(np.isnan(max_late), NAN, np.maximum(max_late, 0.0))
    # A failure leaves the reader waiting for token k+1 (due a + first + k/V) until the error arrives.
    failed_wait = end_s - token_due_s(arrival_s, delivered, smooth)
    waited = ~ok & ~np.isnan(end_s)
    idle = np.where(waited, np.fmax(idle, np.maximum(failed_wait, 0.0)), idle)
    # A completed request that produced no token leaves nothing to wait for.
    idle = np.where(ok & np.isnan(idle), 0.0, idle)
    tokens_for_benefit = np.where(ok, output_tokens, delivered)
    with np.errstate(invalid="ignore"):
        benefit = tokens_for_benefit - smooth.alpha * penalty(idle, smooth.penalty)
    benefit = np.where(np.isnan(idle), 0.0, benefit)
    return idle, benefit
