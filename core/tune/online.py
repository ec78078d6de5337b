"""Online tuning: SLO-Tuner's hill-climb (paper 000 sec. II-B, Algorithm 1) run on the traffic being served.

The batch tuner measures each knob point in a segment of its own (a restarted server, synthetic load). A
server that serves users cannot stop for that, so here the segment is a *window* of the live traffic: the
requests that ended while a knob setting was in force, scored with the batch tuner's eq. 3
(`core.tune.score.score`: goodput against the profile's per-request SLOs, the p99 penalty, the hardware
proxy). This object is only the decision logic; it knows no clock and no server. Whoever runs it (the
gateway in wall time, core/tune/online_sim.py in the simulator's virtual time) feeds it each ended
request's record (`observe`) and asks it at any time `poll(now)`: when a window is complete it scores it
and answers the knob point to run from now on (or None: keep what runs).

The climb, one trial at a time. Algorithm 1 measures the current point K and every neighbour N(K)
(`OnlineSpace.neighbours`, core/tune/online_space.py: the cap and max_num_seqs +-step as `KnobSpace`
moves them, the mode's own knobs halved and doubled, the other modes the operator allows) in one step;
online, every measurement costs real users their latency, so a trial is one neighbour for one window,
compared with a window of the incumbent just before it (the traffic drifts; adjacent windows see the same
load). After a trial window, Algorithm 1's
move rule (`move_decision`) decides, with the gain it needs raised to the noise the windows measured:
- a trial that scores higher beyond the noise becomes the incumbent, and the climb goes on from it;
- one that scores lower beyond the noise is rolled back at once;
- one inside the noise is measured again, incumbent then trial, and decided on the pooled pairs as soon as
  their difference leaves the noise (a sequential comparison: the windows keep their length, and a close
  comparison takes more of them, up to `max_pairs` pairs); still inside the noise after that, it is rolled
  back (nothing showed it is better). Lengthening the windows instead (doubling them after 3 pairs, the rule
  until 2026-11-26; `max_window_requests`) made every later trial as long, a trial of a neighbour that is
  plainly worse included, and restarted the control variate's fit at each new length (docs/gateway.md).
  Only a noise that could not be measured at all (a slice of a window with no request completed) lengthens
  them: the comparison is rolled back at once and the windows double, since more such pairs cannot bound it.
When every neighbour of the incumbent has measured worse beyond the noise in turn, the incumbent is held
for `hold_windows` windows (doubling with each such round in a row) before the next round: the load may
change. A round that left some neighbour inside the noise decided nothing, so the next round starts at once:
holding then kept the climb below the plateau for thousands of seconds on
saber-w1 (docs/gateway.md). The incumbent is always known (`incumbent`).

Noise. Two points differ beyond the noise when their (pooled) scores differ by more than `z` standard errors
of the difference. Eq. 3 is mostly a window's p99, and that p99 is mostly *which* long requests the window
happened to hold (on saber-w1 it correlates 0.90-0.96 with the p99 of the window's output tokens, which the
knobs do not choose; benchmarks/online_window_noise.py). So the score is taken with a control variate (Law &
Kelton, "Simulation Modeling and Analysis", ch. 11): the window's p99 of output tokens (of its completed
requests), with the slope of the score on it fitted within each point over the windows of this length so far
(`_control`); a window's score is its measured score minus slope x (its p99 of tokens - their mean), and its
standard error is the residual spread of that fit, once the fit has `CONTROL_MIN_DOF` degrees of freedom
(windows less points less one). Until then, and for a window with no completed request, the window is also
scored on `batches` consecutive slices of its requests (batch means), and its standard error is their spread
/ sqrt(batches): on 200-request windows half of what such windows really spread (eq. 3's p99 of a 25-request
slice is its maximum), which let noise pass for gains (docs/gateway.md, "Online tuning").

Settling. Requests admitted under the previous setting finish after a switch; the window starts
`settle` later: the 99th percentile of the previous window's latency (all but 1% of those requests have
ended by then), at most the window's minimum duration. The 90th percentile, capped at half a window, let the
tail of the previous setting into the next window: on saber-w1 a cap raised from an overloaded one inherits
the requests that queued under it (p99 30-50 s there), and that p99 is most of eq. 3's score, so a raise
measured worse than it was and the climb drifted down (docs/gateway.md, "Online tuning").
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.events import TUNE_STEP, EventSink, make_event
from core.metrics import Summary, summarize
from core.profile import Profile, TunerSpec
from core.records import RequestRecord
from core.tune.hillclimb import StepRecord, move_decision
from core.tune.online_space import OnlinePoint, OnlineSpace
from core.tune.score import FAILED_SCORE, Segment, score

ONLINE_ALGORITHM = "online"
SETTLE_QUANTILE = 99
MAX_HOLD_DOUBLINGS = 3  # the hold after quiet rounds grows to at most 8 x hold_windows
# The control variate's fit needs this many degrees of freedom (windows of one length, less the points they
# measured, less the slope) before it replaces batch means: a slope and a spread from fewer would be noise.
CONTROL_MIN_DOF = 8
# Windows whose noise could not be measured double up to this many times their length (16: 200 -> 3200
# requests, the bound the doubling had when every comparison left inside the noise doubled them).
UNMEASURED_WINDOW_GROWTH = 16
SCORE_QUANTILE = 99  # eq. 3's percentile: the control is the same percentile of the window's output tokens


@dataclass(frozen=True, slots=True)
class OnlineSettings:
    """How long a window is and how sure a decision must be. Fixed before the first window."""

    window_requests: int = 200  # a window ends once this many requests ended in it ...
    window_s: float = 60.0  # ... and it lasted this long (tuner clock seconds)
    # None: windows keep their length. A number: a comparison still inside the noise after `max_pairs` pairs
    # doubles the windows, up to this (the rule until 2026-11-26, with max_pairs 3: 3200).
    max_window_requests: int | None = None
    batches: int = 8  # batch means per window, for the standard error of its score
    # A difference counts beyond the noise when it exceeds z standard errors of the difference. One: on
    # saber-w1 the p99 term of eq. 3 is so noisy that z = 2 left the climb at cap 24 of 64 after 20000 s
    # (docs/gateway.md, "online tuning"); a false step is cheap online, it is measured again and rolled back.
    z: float = 1.0
    hold_windows: int = 3  # windows at the incumbent after a round in which no neighbour won
    # (incumbent, trial) window pairs a comparison may take while it stays inside the noise: 8 pairs of 200
    # requests measure each point on 1600, the length the doubled windows reached on saber-w1 (docs/gateway.md)
    max_pairs: int = 8
    # A move to a trial whose windows measured a lower goodput than the incumbent's needs, before the last pair,
    # a gain beyond z x sqrt(max_pairs / pairs) standard errors (O'Brien and Fleming's group-sequential boundary,
    # Biometrics 35(3), 1979); other moves and every rollback need z. Aimed at the false moves down the plateau
    # that a single pair made at z = 1 (seed 8: 32 -> 24 three times; docs/gateway.md). False: z for all.
    obrien_fleming_down: bool = False

    def __post_init__(self) -> None:
        if self.window_requests < self.batches * 2:
            raise ValueError(f"window_requests must be at least {self.batches * 2} (two per batch)")
        if self.batches < 2:
            raise ValueError("batches must be at least 2 (a standard error needs two)")
        if self.max_window_requests is not None and self.max_window_requests < self.window_requests:
            raise ValueError("max_window_requests must be at least window_requests")


@dataclass(slots=True)
class Window:
    """One measured window: the point that ran, its segment (the batch tuner's shape), its standard error."""

    index: int
    point: OnlinePoint
    segment: Segment
    score_se: float
    start_s: float
    end_s: float
    settle_s: float  # the 99th percentile of its completed requests' latency (0 when none completed)
    size: int = 0  # the window length in force (requests) when it closed
    tokens_p99: float = math.nan  # the 99th percentile of its completed requests' output tokens (the control)


def pooled(windows: list[Window]) -> tuple[float, float]:
    """Mean score of windows of one point and its standard error (independent windows)."""
    scores = [w.segment.score for w in windows]
    if not scores or not all(math.isfinite(x) for x in scores):
        return FAILED_SCORE, math.inf
    return float(np.mean(scores)), math.sqrt(sum(w.score_se**2 for w in windows)) / len(windows)


@dataclass(slots=True)
class OnlineTuner:
    """The online hill-climb's decisions over windows of ended requests, on whatever clock feeds it."""

    space: OnlineSpace
    start: OnlinePoint
    profile: Profile
    settings: OnlineSettings = field(default_factory=OnlineSettings)
    sink: EventSink | None = None
    world: str = "live"  # the `world` field of tune_step events: where the traffic is served
    # --- state
    incumbent: OnlinePoint = field(init=False)
    current: OnlinePoint = field(init=False)
    incumbent_window: Window | None = field(init=False, default=None)
    windows: list[Window] = field(init=False, default_factory=list)
    steps: list[StepRecord] = field(init=False, default_factory=list)
    window_requests: int = field(init=False)
    _records: deque[RequestRecord] = field(init=False, default_factory=deque)
    _window_start_s: float = field(init=False, default=0.0)
    _pending: list[OnlinePoint] = field(init=False, default_factory=list)  # neighbours not yet tried this round
    _hold_left: int = field(init=False, default=0)
    _quiet_rounds: int = field(init=False, default=0)  # rounds in a row in which no neighbour won
    _round_undecided: bool = field(init=False, default=False)  # a neighbour of this round ended inside the noise
    _incumbent_windows: list[Window] = field(init=False, default_factory=list)  # of the comparison under way
    _trial_windows: list[Window] = field(init=False, default_factory=list)
    _paused_s: float = field(init=False, default=0.0)  # arrivals held for replica restarts since the last step
    _held: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.incumbent = self.current = self.start
        self.window_requests = self.settings.window_requests

    @property
    def spec(self) -> TunerSpec:
        return self.space.spec

    @property
    def slo_s(self) -> float:
        """The p99 target of eq. 3: the profile's SLO, as the batch tuner takes it (core/tune/job.py)."""
        return math.inf if self.profile.slo.e2e_s is None else self.profile.slo.e2e_s

    # ------------------------------------------------------------------ feeding

    def begin(self, now: float) -> OnlinePoint:
        """Start the first window at `now`; returns the point to run (the start)."""
        self._window_start_s = now
        return self.current

    def observe(self, record: RequestRecord) -> None:
        """A request ended (completed, rejected or failed; `end_s` on the tuner's clock)."""
        end = record.end_s
        if end is not None and end >= self._window_start_s:
            self._records.append(record)

    def poll(self, now: float) -> OnlinePoint | None:
        """If the window is complete at `now`, score it and decide. Returns the point to run from now on when it
        changes (a trial, a move or a rollback), else None."""
        if now - self._window_start_s < self.settings.window_s or len(self._records) < self.window_requests:
            return None
        window = self._close_window(now)
        before = self.current
        if window.point == self.incumbent:
            self._after_incumbent_window(window)
        else:
            self._after_trial_window(window)
        self._start_window(now, window)
        return None if self.current == before else self.current

    def restart_window(self, now: float) -> None:
        """Start the window afresh at `now` (what ended before is dropped): after a replica swap, whose
        requests ran on the old server."""
        self._records.clear()
        self._window_start_s = now

    def jump(self, point: OnlinePoint, now: float) -> None:
        """The operator put `point` in force (a replica swap they asked for): it becomes the incumbent, the
        comparison under way is dropped (its windows ran on another server), and a window starts at `now`."""
        self.incumbent = self.current = point
        self.incumbent_window = None
        self._incumbent_windows, self._trial_windows, self._pending = [], [], []
        self._hold_left = 0
        self.restart_window(now)

    def note_pause(self, paused_s: float, held: int) -> None:
        """A replica swap held arrivals at the gateway for `paused_s` (drain-and-restart: two servers did not
        fit); the next tune_step event carries the pauses and held arrivals since the previous one."""
        self._paused_s += paused_s
        self._held += held

    def trial_failed(self, now: float, error: str) -> OnlinePoint | None:
        """The trial's point could not be put in force (its server did not start): it scores as failed, is
        rolled back, and the next window starts at `now`. Returns the point to run (the incumbent)."""
        segment = self._segment(FAILED_SCORE, error=error)
        window = Window(len(self.windows), self.current, segment, math.inf, now, now, 0.0)
        self.windows.append(window)
        self._after_trial_window(window)
        self.restart_window(now)
        return self.current

    # ------------------------------------------------------------------ windows

    def _segment(self, window_score: float, **measured: Any) -> Segment:
        """The window at the point in force as the batch tuner's `Segment` (what a tune_step event reports)."""
        point = self.current
        return Segment(
            key=f"{ONLINE_ALGORITHM}:{len(self.windows)}:{point.key()}",
            point=point,
            phase=ONLINE_ALGORITHM,
            step=len(self.steps) + 1,
            score=window_score,
            **measured,
        )

    def _close_window(self, now: float) -> Window:
        records = list(self._records)
        self._records.clear()
        summary = self._summarize(records, now - self._window_start_s)
        window_score = self._score(summary)
        scores = self._batch_scores(records, now)
        score_se = float(np.std(scores, ddof=1)) / math.sqrt(len(scores)) if np.isfinite(scores).all() else math.inf
        index = len(self.windows)
        segment = self._segment(
            window_score,
            p50_s=summary.p50_s,
            p95_s=summary.p95_s,
            p99_s=summary.p99_s,
            goodput_rps=summary.goodput_rps,
            throughput_rps=summary.throughput_rps,
            requests=summary.requests,
            completed=summary.completed,
            failed=summary.failed,
            window_s=summary.window_s,
            error=None if math.isfinite(window_score) else "no request completed in the window",
        )
        e2e = [r.e2e_s for r in records if r.ok and r.e2e_s is not None]
        settle = float(np.percentile(e2e, SETTLE_QUANTILE)) if e2e else 0.0
        tokens = [r.output_tokens for r in records if r.ok and r.e2e_s is not None]
        tokens_p99 = float(np.percentile(tokens, SCORE_QUANTILE)) if tokens else math.nan
        window = Window(
            index, self.current, segment, score_se, self._window_start_s, now, settle, self.window_requests, tokens_p99
        )
        self.windows.append(window)
        return window

    def _control(self, size: int) -> tuple[float, float, float] | None:
        """The control variate over the windows of length `size` measured so far: (slope of the score on the
        window's p99 of output tokens within each point, that p99's mean, the residual standard deviation of
        one window's score), or None while too few windows say it."""
        history = [
            w for w in self.windows if w.size == size and math.isfinite(w.segment.score) and math.isfinite(w.tokens_p99)
        ]
        by_point: dict[OnlinePoint, list[Window]] = {}
        for w in history:
            by_point.setdefault(w.point, []).append(w)
        dof = len(history) - len(by_point) - 1
        if dof < CONTROL_MIN_DOF:
            return None
        xs, ys = [], []
        for group in by_point.values():
            x = np.array([w.tokens_p99 for w in group])
            y = np.array([w.segment.score for w in group])
            xs.append(x - x.mean())
            ys.append(y - y.mean())
        x, y = np.concatenate(xs), np.concatenate(ys)
        if not float(x @ x) > 0:
            return None
        slope = float(x @ y) / float(x @ x)
        residual = y - slope * x
        return slope, float(np.mean([w.tokens_p99 for w in history])), math.sqrt(float(residual @ residual) / dof)

    def _pooled(self, windows: list[Window]) -> tuple[float, float]:
        """Mean score of windows of one point and its standard error: with the control variate once the windows
        of this length say it, else as measured (`pooled`)."""
        control = self._control(windows[0].size) if windows else None
        if control is None or not all(math.isfinite(w.segment.score) and math.isfinite(w.tokens_p99) for w in windows):
            return pooled(windows)
        slope, mean_tokens, sd = control
        adjusted = [w.segment.score - slope * (w.tokens_p99 - mean_tokens) for w in windows]
        return float(np.mean(adjusted)), sd / math.sqrt(len(windows))

    def _start_window(self, now: float, closed: Window) -> None:
        """The next window starts now, or after the settle time when the point just changed."""
        settle = min(self.settings.window_s, closed.settle_s) if self.current != closed.point else 0.0
        self._window_start_s = now + settle

    def _summarize(self, records: list[RequestRecord], span_s: float) -> Summary:
        return summarize(records, slo=self.profile.slo, smooth=self.profile.smooth_goodput, window_s=span_s)

    def _score(self, summary: Summary) -> float:
        # Scored as the batch tuner scores a live segment: eq. 3 with lambda (not the simulator's 10 x lambda).
        if summary.completed == 0:
            return FAILED_SCORE
        return score(summary.goodput_rps, summary.p99_s, self.slo_s, self.current, self.spec, "live")

    def _batch_scores(self, records: list[RequestRecord], now: float) -> np.ndarray:
        """Eq. 3 on `batches` consecutive slices of the window (by end time): batch means."""
        ordered = sorted(records, key=lambda r: r.end_s or 0.0)
        edges = np.linspace(0, len(ordered), self.settings.batches + 1).astype(int)
        scores = []
        start = self._window_start_s
        for b in range(self.settings.batches):
            chunk = ordered[edges[b] : edges[b + 1]]
            end = now if b == self.settings.batches - 1 else float(chunk[-1].end_s or now)
            summary = self._summarize(chunk, max(end - start, 1e-9))
            scores.append(self._score(summary))
            start = end
        return np.asarray(scores, dtype=float)

    # ------------------------------------------------------------------ decisions

    def _after_incumbent_window(self, window: Window) -> None:
        self.incumbent_window = window
        if self._trial_windows:  # a comparison under way: this is its next incumbent window; the trial again
            self._incumbent_windows.append(window)
            self.current = self._trial_windows[-1].point
            return
        if self._hold_left > 0:
            self._hold_left -= 1
            return
        if not self._pending:
            self._pending = self.space.neighbours(self.incumbent)
        self._incumbent_windows = [window]
        self.current = self._pending.pop(0)

    def _after_trial_window(self, trial: Window) -> None:
        self._trial_windows.append(trial)
        inc_score, inc_se = self._pooled(self._incumbent_windows)
        trial_score, trial_se = self._pooled(self._trial_windows)
        noise = self.settings.z * math.hypot(inc_se, trial_se)
        gain = trial_score - inc_score if math.isfinite(trial_score) and math.isfinite(inc_score) else math.nan
        pairs = len(self._trial_windows)
        to_move = noise * math.sqrt(self.settings.max_pairs / pairs) if self._down(trial) else noise
        if math.isfinite(gain) and -noise <= gain <= to_move and noise < math.inf and pairs < self.settings.max_pairs:
            # Inside the noise: measure both again (incumbent, then trial) and decide on the pooled windows.
            self.current = self.incumbent
            return
        inc_p99 = float(np.mean([w.segment.p99_s for w in self._incumbent_windows]))
        moved, reason = move_decision(inc_score, trial_score, inc_p99, self.slo_s, max(self.spec.min_gain, to_move))
        if math.isfinite(gain) and abs(gain) <= noise:
            # Still inside the noise after max_pairs: nothing shows the trial is better, so the incumbent stays
            # (and, under the old rule, the windows double). An unbounded noise (a slice of a window with no
            # request completed: its score cannot be measured) is decided at once: more pairs of such windows
            # cannot bound it, longer ones can, so the windows double.
            moved = False
            reason = f"rolled back: {gain:+.3f} is inside the noise {noise:.3f} after {pairs} pairs of windows"
            limit = self.settings.max_window_requests
            if limit is None and not math.isfinite(noise):
                limit = UNMEASURED_WINDOW_GROWTH * self.settings.window_requests
            if limit is not None:
                self.window_requests = min(limit, self.window_requests * 2)
            self._round_undecided = True
        elif not moved and math.isfinite(gain) and gain < -noise:
            reason = f"rolled back: {gain:.3f} below the incumbent, beyond the noise {noise:.3f}"
        elif not moved:
            reason = f"rolled back: {reason}"
        incumbent = self._incumbent_windows[-1]
        record = StepRecord(
            step=len(self.steps) + 1,
            point=self.incumbent,
            segment=incumbent.segment,
            p99_used_s=inc_p99,
            score_used=inc_score,
            best_neighbour=trial.point,
            best_neighbour_score=trial_score,
            moved=moved,
            reason=reason,
        )
        self.steps.append(record)
        self._trial_windows = []
        if moved:
            came_from = self.incumbent
            self.incumbent = trial.point
            self.incumbent_window = trial
            self._incumbent_windows = [trial]
            self._quiet_rounds = 0
            self._round_undecided = False
            # Onward from the new incumbent; the point it came from was just measured worse.
            self._pending = [n for n in self.space.neighbours(self.incumbent) if n != came_from]
            self.current = self._pending.pop(0) if self._pending else self.incumbent
        else:
            self.current = self.incumbent  # the rollback: the next window re-measures the incumbent
            if not self._pending and self._round_undecided:
                # A round that left some neighbour inside the noise decided nothing: no hold, the next round
                # measures again at once.
                self._round_undecided = False
            elif not self._pending:
                # A round in which every neighbour measured worse beyond the noise: hold the incumbent, longer
                # after each such round in a row (converged: trials cost the users served during them), until
                # the next round probes again.
                self._quiet_rounds += 1
                self._hold_left = self.settings.hold_windows * 2 ** min(self._quiet_rounds - 1, MAX_HOLD_DOUBLINGS)
        self._emit(record, noise, trial)

    def _down(self, trial: Window) -> bool:
        """Does the comparison under way move down the goodput (`obrien_fleming_down`)? The trial's windows
        measured a lower mean goodput than the incumbent's."""
        if not self.settings.obrien_fleming_down:
            return False
        inc = [w.segment.goodput_rps for w in self._incumbent_windows]
        return float(np.mean([w.segment.goodput_rps for w in self._trial_windows])) < float(np.mean(inc))

    def _emit(self, record: StepRecord, noise: float, trial: Window) -> None:
        paused_s, held = self._paused_s, self._held
        self._paused_s, self._held = 0.0, 0
        if self.sink is None:
            return
        self.sink(
            make_event(
                TUNE_STEP,
                algorithm=ONLINE_ALGORITHM,
                world=self.world,
                **record.as_event_fields(),
                incumbent=self.incumbent.as_dict(),
                noise=noise,
                window_requests=trial.segment.requests,
                window_s=trial.segment.window_s,
                paused_s=paused_s,
                held=held,
            )
        )

    def describe(self) -> dict[str, Any]:
        return {
            "incumbent": self.incumbent.as_dict(),
            "current": self.current.as_dict(),
            "windows": len(self.windows),
            "steps": len(self.steps),
            "window_requests": self.window_requests,
        }
