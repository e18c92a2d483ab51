"""The scale-in auto-tuner (MLLess §4.2; docs/ARCHITECTURE.md, "The scale-in auto-tuner"):
when to remove one more worker.

The supervisor calls ``observe`` once per completed step and ``decide`` right after; a
returned reason string means "evict one worker now". Which worker goes is the
supervisor's choice (``policies.pick_eviction``).

Timeline:

* before the knee of the loss curve: never evict;
* at the knee: fit the reference curve ``L_P`` to the (smoothed) loss history, take the
  reference step duration ``d_P`` as the mean so far, evict one worker;
* afterwards, at most once per interval ``T``: fit ``ℓ_p`` to the losses observed with
  the current fleet since the last eviction, take ``d_p`` as their mean step duration,
  and evict one more worker when the projected relative loss penalty over the horizon
  ``Δ`` is below the tolerance ``S``::

      s_Δ(t) = (ℓ_p(t + ⌊Δ/d_p⌋) − L_P(t + ⌊Δ/d_P⌋)) / L_P(t + ⌊Δ/d_P⌋)

Sign convention: s_Δ is how much *worse* (higher) the loss projected with p workers is
than the one projected for the full fleet, so s_Δ ≥ S means "removing workers hurts,
keep them" and a negative s_Δ means the smaller fleet is ahead (fewer workers also
make each step faster). This is the sense MLLess describes for Eq. (1) ("can be
negative, which means that system throughput is indeed better"); written literally as
``(L_P − ℓ_p)/L_P < S`` the condition would evict exactly when fewer workers do worse.

Throughput guard (not in MLLess): an interval's eviction also needs the fleet's projected
throughput after it, in minibatches per second ``(p − 1)/d_{p−1}``, to stay within
``throughput_tolerance`` of the full fleet's ``P/d_P``. ``d_{p−1}`` is extrapolated from
the step durations measured at each fleet size so far (a straight line in p: a worker
reads every peer's updates). s_Δ compares fitted curves extrapolated past the knee, and
on a fleet where every worker owns its CPU a sparse model's progress follows the
minibatches it processes: there s_Δ can stay below S down to ``min_workers`` while the
time to target grows (docs/RESULTS.md has the runs).
The guard keeps the evictions that cost (almost) no throughput — the workers a fleet has
beyond the point where its step time grows as fast as its size — and refuses the rest.

Cost guard (issue 27; docs/RESULTS-TOOLS.md, "Planning a job"): with the job's prices given
(``worker_usd_s`` per worker-second, ``fixed_usd_s`` for what bills whatever the fleet:
supervisor, cache node), every eviction, the knee's included, must also pay for itself.
An eviction lasts for the rest of the job: R, the steps left at the current fleet, is
the supervisor's estimate when the job stops at a target (``steps_left``: its held-out
scorings extrapolated to ``stop.target_val``, ``ebb.engine.stopping.steps_to_target``),
else the job's time so far (a job past its knee has typically about as long again to go),
at most the job's time so far, at least one interval. The planner's model predicts the
remaining job's Perf/$ with one worker fewer::

    T = R·d_p                 C = T·(p·w + f)
    T' = R·m_p·d_{p−1} + settle·d_{p−1}      C' = T'·((p−1)·w + f)
    gain = (T·C) / (T'·C')

``m_p`` is how many steps p − 1 workers need for one step of p workers' progress. The
workers' proposals of a step are combined into one update over a batch B ∝ p; McCandlish
et al. (2018, "An Empirical Model of Large-Batch Training") find the steps to a target
scale as 1 + B_noise/B, so with φ = B_noise/B at the current fleet::

    m_p = (1 + φ·p/(p−1)) / (1 + φ)

φ → 0 (signal-dominated: a step's progress is independent of P, the epoch-per-P rule of
``ebb.engine.cadence`` under ``sync.combine`` mean) gives m = 1; φ → ∞ (noise-dominated:
a step's progress is proportional to its batch, as under sum) gives m = p/(p−1). Under sum
m = p/(p−1) always (``progress_exponent`` 1). Under mean the knee is, by construction,
where the progress per step has collapsed to a tenth of its steepest, i.e. where the
updates are noise-dominated, so the guard starts from φ = ∞ (``noise_ratio`` None) and
measures φ online once the fleet has run at a smaller size: over the window since the
last eviction, p workers took n steps to shed the loss from ℓ_p(t0) to ℓ_p(t1); the
reference curve of the P workers takes n_P steps between the same two losses (compared at
the same loss, not the same step: the smaller fleet is behind, where the curve is
steeper), and n_P/n = (1 + φ_P)/(1 + φ_P·P/p) with φ_p = φ_P·P/p. Pooled over the sizes
run so far (one window each), φ_P is the value of a grid from 0 to ∞ that fits them best
(least squares): one window alone is noisy.

``d_{p−1}`` is the measured step time less the step-time slope in p: a straight line through
the sizes measured so far, or, while only one size is measured (at the knee), the part of
the step the workers spend reading and applying their peers' updates over the peers p − 1
(``peer_s``, from the supervisor: it grows with the peers, the rest of the step does not);
kept between "no faster" and "faster in proportion". Should the step times realised after
earlier evictions exceed their predictions, later predictions are scaled up by the mean
excess (``step_bias``). ``settle`` is the steps the fleet needs to re-settle (the eviction
lands a step later and the replicas re-stripe). The eviction is taken only when
``gain > 1 + cost_margin``; each decision records the predicted step time, m and gain, and
the next decision at the smaller fleet the realised ones (the same formula on the measured
step time). An eviction whose realised gain comes out below 1 (the knee's, a probe) or
``1 − cost_margin`` (a later one) is undone: the tuner asks for a worker back
(``last_action`` "join") and never evicts at that size again (``floor``).

Progress judgement (with prices): step time alone does not judge an eviction. At ML-10M
shape under lazy Adam both evictions' step times came out as predicted, yet 6 workers shed
about half the loss per step that 8 did, beyond the noise model's worst case, and the
second eviction, 19 steps after the first, came before the first's effect on progress
could be seen (0.89× Perf/$). So after every eviction the tuner takes no other decision
until the smaller fleet has run a window long enough to measure its progress, and then
judges the eviction on it:

* the window: a least-squares slope over n evenly spaced steps of losses with noise σ has
  standard error σ·√(12/(n(n² − 1))). σ is the residual spread of the raw losses about the
  pre-eviction curve (the reference curve at the knee, the interval's ``ℓ_p`` later), and
  the rate expected after the eviction is that curve's descent per step at the eviction
  over the model's m; n is the smallest window whose slope's standard error is at most
  ``PROGRESS_PRECISION`` (10 %) of that rate, so a drop in progress of 20 % or more (which
  turns the 1.03–1.06× the guard takes into a loss) is two standard errors out. At least
  ``min_fit_points``, at most ``MAX_JUDGE_STEPS``.
* the measure, at the same loss: the window's straight-line fit gives the smaller fleet's
  descent per step and the loss at the window's middle; the pre-eviction curve gives the
  descent per step the larger fleet had *at that loss* (it is behind, where the curve is
  steeper: comparing at the same step would flatter the eviction). Their ratio is the
  realised m; the realised gain is the formula's with the realised m and the measured step
  time, and the undo rule above applies to it. Later predictions scale m up by the mean
  excess of the realised m over the model's (``progress_bias``; never down).

When the job stops at a target, an eviction must also leave room to be judged: R must be
at least ``JUDGE_SHARE`` times the window that judges it (half the rest of the job to measure it, half for an undo to
recover or a kept eviction to pay). An eviction taken with less left is a bet the guard
cannot check; at ML-10M shape under lazy Adam the knee comes with about 90 of 240 steps
left and a 43–89-step window, and the evictions taken there lost 4–9 % (docs/RESULTS-TOOLS.md §9).

Known limit: the larger fleet's descent at the lower loss is its curve extrapolated 40–90
steps. At ML-10M shape under lazy Adam the knee's reference curve under-predicted it by about
a fifth (realised m measured 1.05 where the tuner-off run gives 1.31 over the same steps), and
φ, measured from the same curve, went to 0 (docs/RESULTS-TOOLS.md §9).
"""

from __future__ import annotations

import math

import numpy as np

from ebb.spec import ScalingSpec

from .curves import LocalCurve, ReferenceCurve, fit_local, fit_reference
from .knee import DEFAULT_ALPHA, DEFAULT_MIN_DROP, DEFAULT_PATIENCE, DEFAULT_TOLERANCE, KneeDetector, smooth_points

_SPEC = ScalingSpec()  # the tuner's defaults live in the job spec (``ebb spec``, scaling.*)

# Tolerance S. s_Δ is relative to the *absolute* loss, which includes the irreducible
# floor, so after the knee the whole remaining improvement is a few percent of it and S
# must be small; but fit noise alone puts s_Δ near 1% right after an eviction, so S must
# sit above that or each decision is a coin flip (docs/RESULTS.md, "The auto-tuner").
DEFAULT_S = _SPEC.tolerance

# Fitting L_P at the knee weights the point at step t by (t / t_knee)^k with this k:
# fitted with equal weights, the steep early part sets the curve's shape and its
# extrapolation past the knee drifts by more than S; k = 2 kept it within a fraction of a
# percent on the benchmark's runs and on exact synthetic curves (docs/RESULTS.md).
DEFAULT_REFERENCE_RECENCY = 2.0

# Throughput tolerance: the time to target may grow by at most about 1/(1 − this) on the
# part of the job after the knee.
DEFAULT_THROUGHPUT_TOLERANCE = _SPEC.throughput_tolerance

# Steps a fleet size needs before its mean step duration counts (durations vary far
# less than losses do, so fewer than the fits' min_fit_points).
MIN_TIMED_STEPS = 3

# Cost guard: an eviction must improve the predicted Perf/$ of the remaining work by
# more than this share, and the fleet is taken to lose this many steps re-settling.
DEFAULT_COST_MARGIN = 0.02
DEFAULT_SETTLE_STEPS = 2.0

# Progress judgement: the window after an eviction is sized so that the measured descent
# per step has at most this relative standard error (the module docstring), within bounds.
PROGRESS_PRECISION = 0.1
# ... and an eviction needs at least this many judgement windows of the job left.
JUDGE_SHARE = 2.0
MAX_JUDGE_STEPS = 2000
# Raw losses before an eviction whose spread about its curve sizes the window.
NOISE_POINTS = 100

# The noise ratios φ_P the online measurement chooses from (0: signal-, ∞: noise-dominated).
NOISE_GRID = (0.0, *np.logspace(-2, 3, 26).tolist(), math.inf)

# Fits use at most this many evenly spaced smoothed points: the smoothed curve carries
# no more information at a finer spacing, and the solver's cost grows with the count.
MAX_FIT_POINTS = 200


class ScaleInTuner:
    """MLLess scale-in scheduler over a stream of (step, elapsed, loss, workers).

    ``interval_s`` (T): seconds between decisions after the knee (MLLess: 20 s).
    ``horizon_s`` (Δ ≤ T): look-ahead used to project both curves (MLLess: 10 s).
    ``tolerance`` (S in [0, 1]): evict while s_Δ < S; see ``DEFAULT_S``.
    ``knee_alpha``/``knee_tolerance``/``knee_patience``/``knee_min_drop``: the knee detector's settings.
    ``min_workers``: never suggest an eviction at or below this fleet size.
    ``min_fit_points``: steps needed since the last eviction before ``ℓ_p`` is fitted.
    ``fit_alpha``: EWMA weight of the outlier filter applied before every fit; lighter
    than the knee's smoothing because least squares already averages noise and a
    heavier EWMA lags the curve.
    ``reference_recency``: how much more the fit of ``L_P`` weights recent steps
    (see ``DEFAULT_REFERENCE_RECENCY``).
    ``throughput_tolerance``: after the knee, evict only while the projected minibatches
    per second with one worker fewer stay within this share of the full fleet's (1
    turns the guard off; see the module docstring).
    """

    def __init__(
        self,
        *,
        interval_s: float = _SPEC.interval_s,
        horizon_s: float = _SPEC.horizon_s,
        tolerance: float = DEFAULT_S,
        knee_alpha: float = DEFAULT_ALPHA,
        knee_tolerance: float = DEFAULT_TOLERANCE,
        knee_patience: int = DEFAULT_PATIENCE,
        knee_min_drop: float = DEFAULT_MIN_DROP,
        min_workers: int = 1,
        min_fit_points: int = 10,
        fit_alpha: float = 0.3,
        reference_recency: float = DEFAULT_REFERENCE_RECENCY,
        throughput_tolerance: float = DEFAULT_THROUGHPUT_TOLERANCE,
        worker_usd_s: float = 0.0,
        fixed_usd_s: float = 0.0,
        progress_exponent: float = 0.0,
        noise_ratio: float | None = None,
        cost_margin: float = DEFAULT_COST_MARGIN,
        settle_steps: float = DEFAULT_SETTLE_STEPS,
    ):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        if not 0 < horizon_s <= interval_s:
            raise ValueError(f"horizon_s must be in (0, interval_s={interval_s}], got {horizon_s}")
        if not 0.0 <= tolerance <= 1.0:
            raise ValueError(f"tolerance S must be in [0, 1], got {tolerance}")
        if min_workers < 1:
            raise ValueError(f"min_workers must be >= 1, got {min_workers}")
        if min_fit_points < 5:
            raise ValueError(f"min_fit_points must be >= 5 (4 parameters are fitted), got {min_fit_points}")
        if not 0.0 < fit_alpha <= 1.0:
            raise ValueError(f"fit_alpha must be in (0, 1], got {fit_alpha}")
        if not reference_recency >= 0.0:
            raise ValueError(f"reference_recency must be >= 0, got {reference_recency}")
        if not 0.0 <= throughput_tolerance <= 1.0:
            raise ValueError(f"throughput_tolerance must be in [0, 1], got {throughput_tolerance}")
        if worker_usd_s < 0 or fixed_usd_s < 0 or not 0.0 <= progress_exponent <= 1.0 or settle_steps < 0:
            raise ValueError("cost guard: prices and settle_steps must be >= 0 and progress_exponent in [0, 1]")
        if noise_ratio is not None and not noise_ratio >= 0:
            raise ValueError(f"noise_ratio must be >= 0 or None (noise-dominated), got {noise_ratio}")
        self.noise_ratio = None if noise_ratio is None else float(noise_ratio)
        self.worker_usd_s, self.fixed_usd_s = float(worker_usd_s), float(fixed_usd_s)
        self.progress_exponent, self.cost_margin = float(progress_exponent), float(cost_margin)
        self.settle_steps = float(settle_steps)
        self.reference_recency = float(reference_recency)
        self.throughput_tolerance = float(throughput_tolerance)
        self.interval_s = float(interval_s)
        self.horizon_s = float(horizon_s)
        self.tolerance = float(tolerance)
        self.min_workers = int(min_workers)
        self.min_fit_points = int(min_fit_points)
        self.fit_alpha = float(fit_alpha)
        self.knee = KneeDetector(
            alpha=knee_alpha, tolerance=knee_tolerance, patience=knee_patience, min_drop=knee_min_drop
        )
        # Observations kept for fitting: all of them until the knee, then only those
        # since the last eviction decision (older ones are never needed again).
        self._steps: list[int] = []
        self._elapsed: list[float] = []
        self._losses: list[float] = []
        self._workers: list[int] = []
        self.knee_step: int | None = None
        self.reference: ReferenceCurve | None = None
        self.reference_step_s: float | None = None  # d_P
        self.reference_workers: int | None = None  # P
        self.next_decision_s: float | None = None
        self.last_s_delta: float | None = None
        self.evictions: list[dict] = []  # one record per eviction decision
        self.decisions: list[dict] = []  # one record per interval check after the knee (why it did or did not evict)
        # Step durations per fleet size, {p: [seconds, steps]}, for the throughput guard,
        # and the last observation (step, elapsed, workers) they are measured from.
        self.step_time: dict[int, list[float]] = {}
        self.steps_left: float | None = None  # the supervisor's estimate of the steps to the target
        self._last: tuple[int, float, int] | None = None
        # Seconds per step spent on the peers' updates, per fleet size ({p: [seconds, steps]}),
        # and φ_P, the noise ratio at the full fleet measured since (None: not yet).
        self.peer_time: dict[int, list[float]] = {}
        self.measured_noise: float | None = None
        # {p: [the reference's steps to shed what p workers shed, the steps they took]}
        self.shed: dict[int, list[float]] = {}
        # After an eviction that measured as losing money is undone: never evict at or
        # below this size again. ``last_action``: what the last returned reason asks for.
        self.floor: int | None = None
        self.last_action = "evict"

    # -- feeding -----------------------------------------------------------------------

    def observe(
        self,
        step: int,
        elapsed_s: float,
        loss: float,
        workers: int,
        peer_s: float | None = None,
        steps_left: float | None = None,
    ) -> None:
        """Record the global training loss of a completed step (and ``peer_s``, the part of
        its time the workers spent reading and applying their peers' updates, if known;
        ``steps_left``, the supervisor's estimate of the steps to the job's target, if any:
        the cost guard's R, refreshed every step and so not checkpointed).

        Non-finite losses are ignored (a diverging run is the stop criteria's business,
        and one NaN would poison every fit).
        """
        self._tally_step_time(int(step), float(elapsed_s), int(workers))
        self.steps_left = None if steps_left is None or not math.isfinite(steps_left) else max(0.0, float(steps_left))
        if peer_s is not None and math.isfinite(peer_s) and peer_s >= 0:
            tally = self.peer_time.setdefault(int(workers), [0.0, 0])
            tally[0] += float(peer_s)
            tally[1] += 1
        loss = float(loss)
        if not math.isfinite(loss):
            return
        if self.knee_step is None and self.knee.update(loss) is not None:
            # The detector counts the losses fed to it, which are exactly the kept
            # observations until the knee; the knee may be this very step.
            knee_index = self.knee.knee
            self.knee_step = self._steps[knee_index] if knee_index < len(self._steps) else int(step)
        self._steps.append(int(step))
        self._elapsed.append(float(elapsed_s))
        self._losses.append(loss)
        self._workers.append(int(workers))

    def _tally_step_time(self, step: int, elapsed_s: float, workers: int) -> None:
        # Only intervals wholly at one fleet size: the step a change takes effect in
        # carries the new count, so its duration is the first of the new size.
        if self._last is not None:
            last_step, last_elapsed, last_workers = self._last
            if last_workers == workers and step > last_step and elapsed_s >= last_elapsed:
                tally = self.step_time.setdefault(workers, [0.0, 0])
                tally[0] += elapsed_s - last_elapsed
                tally[1] += step - last_step
        self._last = (step, elapsed_s, workers)

    # -- deciding ----------------------------------------------------------------------

    def decide(self, elapsed_s: float, workers: int) -> str | None:
        """A reason string if the fleet should change by one worker now, else None: an
        eviction, or (``last_action`` "join") the undoing of one that measured as losing."""
        self.last_action = "evict"
        if workers <= max(self.min_workers, self.floor or 0) or not self._steps:
            return None
        if self.reference is None:
            return self._decide_at_knee(elapsed_s, workers)
        if self.next_decision_s is not None and elapsed_s < self.next_decision_s:
            return None
        return self._decide_on_interval(elapsed_s, workers)

    def _decide_at_knee(self, elapsed_s: float, workers: int) -> str | None:
        if self.knee_step is None:
            return None
        try:
            points = _thin(*smooth_points(self._steps, self._losses, self.fit_alpha))
            reference = fit_reference(*points, recency=self.reference_recency)
        except ValueError:
            return None  # e.g. too few points or a degenerate history; retry next step
        step_s = _mean_step_duration(self._steps, self._elapsed)
        self.reference = reference
        self.reference_step_s = step_s
        self.reference_workers = int(workers)
        judge = self._judge_fields(reference, "reference", self._steps, self._losses, self._model_progress(workers))
        guard = self.cost_guard(workers, elapsed_s, judge["judge_steps"])
        if guard is not None and not guard["pays"]:
            self._settle_realised(workers)
            self._knee_decision(workers, elapsed_s, guard, evict=False)
            self.next_decision_s = float(elapsed_s) + self.interval_s
            self._steps, self._elapsed, self._losses, self._workers = [], [], [], []
            return None
        reason = (
            f"knee at step {self.knee_step}: reference curve fitted on {len(self._steps)} steps, "
            f"d_P={step_s:.4g}s, P={workers}"
        )
        if guard is not None:
            reason += f", predicted Perf/$ gain {guard['predicted_gain']:.3f}"
            self._knee_decision(workers, elapsed_s, guard, evict=True)
            self.decisions[-1].update(judge)
        self._record_eviction(elapsed_s, workers, reason, s_delta=None)
        return reason

    def _decide_on_interval(self, elapsed_s: float, workers: int) -> str | None:
        # Losses of the current fleet since the last eviction decision: observations
        # between the decision and the eviction taking effect still carry the old count.
        window = [i for i, count in enumerate(self._workers) if count == workers]
        if len(window) < self.min_fit_points:
            return None  # keep waiting; the interval clock is not reset
        steps = [self._steps[i] for i in window]
        elapsed = [self._elapsed[i] for i in window]
        losses = [self._losses[i] for i in window]
        pending = self._pending_judgement(workers)
        if pending is not None and len(window) < pending["judge_steps"]:
            # The last eviction's effect on progress is not measurable yet: no other
            # decision; only its step time may already show it losing (cheap, no fit).
            self._settle_realised(workers)
            return self._undo_losing_eviction(elapsed_s, workers, steps[-1])
        try:
            local = fit_local(*_thin(*smooth_points(steps, losses, self.fit_alpha)))
        except ValueError:
            return None
        self.next_decision_s = float(elapsed_s) + self.interval_s
        s_delta = self.s_delta(steps[-1], local, _mean_step_duration(steps, elapsed))
        self.last_s_delta = s_delta
        throughput = self.throughput_after_eviction(workers)
        keeps_pace = throughput is None or throughput >= 1.0 - self.throughput_tolerance
        self._settle_realised(workers)
        if pending is not None:
            self._judge_progress(pending, steps, losses, workers)
        if (undo := self._undo_losing_eviction(elapsed_s, workers, steps[-1])) is not None:
            return undo
        self._measure_noise(steps, local, workers)
        judge = self._judge_fields(local, "local", steps, losses, self._model_progress(workers))
        guard = self.cost_guard(workers, elapsed_s, judge["judge_steps"])
        pays = guard is None or guard["pays"]
        evict = s_delta is not None and s_delta < self.tolerance and keeps_pace and pays
        self.decisions.append(
            {
                "step": steps[-1],
                "elapsed_s": round(float(elapsed_s), 3),
                "workers": int(workers),
                "s_delta": s_delta,
                "throughput": None if throughput is None else round(throughput, 4),
                "evict": evict,
                **({} if guard is None else _guard_fields(guard)),
            }
        )
        if not evict:
            return None
        reason = f"s_delta={s_delta:.4f} < S={self.tolerance:g} at step {steps[-1]} with {workers} workers"
        if throughput is not None:
            reason += f", throughput after {throughput:.3f} of the full fleet's"
        if guard is not None:
            reason += f", predicted Perf/$ gain {guard['predicted_gain']:.3f}"
            self.decisions[-1].update(judge)
        self._record_eviction(elapsed_s, workers, reason, s_delta=s_delta)
        return reason

    def s_delta(self, step: int, local: LocalCurve, step_s: float) -> float | None:
        """Projected relative loss penalty of the current fleet (None if undefined)."""
        if self.reference is None or self.reference_step_s is None:
            return None
        ahead_reference = _steps_in(self.horizon_s, self.reference_step_s)
        ahead_local = _steps_in(self.horizon_s, step_s)
        expected_full = self.reference(step + ahead_reference)
        expected_now = local(step + ahead_local)
        if not (math.isfinite(expected_full) and math.isfinite(expected_now)) or expected_full <= 0:
            return None
        return (expected_now - expected_full) / expected_full

    def throughput_after_eviction(self, workers: int) -> float | None:
        """Projected minibatches per second with ``workers − 1``, as a share of the full
        fleet's; None while either is unmeasured or the guard is off.

        The step duration at ``p − 1`` is the one measured at ``p`` less the slope of a
        straight line through every size measured so far, kept between "no faster"
        (slope 0: a CPU-bound step) and "faster in proportion" (the fleet's throughput
        unchanged), the range a step whose reads grow with the fleet can take.
        """
        if self.throughput_tolerance >= 1.0 or self.reference_workers is None:
            return None
        measured = {
            p: seconds / count
            for p, (seconds, count) in self.step_time.items()
            if count >= MIN_TIMED_STEPS and seconds > 0
        }
        full, now = measured.get(self.reference_workers), measured.get(workers)
        if full is None or now is None or workers < 2:
            return None
        slope = 0.0
        if len(measured) >= 2:
            sizes = np.array(sorted(measured), dtype=float)
            slope = float(np.polyfit(sizes, [measured[int(p)] for p in sizes], 1)[0])
        after = min(now, max(now - slope, now * (workers - 1) / workers))
        return ((workers - 1) / after) / (self.reference_workers / full)

    def _step_times(self) -> dict[int, float]:
        return {
            p: seconds / count
            for p, (seconds, count) in self.step_time.items()
            if count >= MIN_TIMED_STEPS and seconds > 0
        }

    def _step_after(self, workers: int, measured: dict[int, float]) -> float | None:
        """The step duration predicted at ``workers - 1`` (the module docstring: the slope
        through the sizes measured so far, else the peers' part over the peers; between
        "no faster" and "faster in proportion"), times ``step_bias``."""
        now = measured.get(workers)
        if now is None:
            now = self.reference_step_s if workers == self.reference_workers else None
        if now is None or now <= 0 or workers < 2:
            return None
        slope = 0.0
        if len(measured) >= 2:
            sizes = np.array(sorted(measured), dtype=float)
            slope = float(np.polyfit(sizes, [measured[int(p)] for p in sizes], 1)[0])
        elif (peer := self.peer_time.get(workers)) is not None and peer[1] >= MIN_TIMED_STEPS:
            slope = peer[0] / peer[1] / (workers - 1)
        return min(now, max(now - slope, now * (workers - 1) / workers)) * self.step_bias()

    def step_bias(self) -> float:
        """How much the step times realised after earlier evictions exceeded their
        predictions, on average (1 when they did not: predictions are never made faster)."""
        ratios = [
            d["realised_step_s"] / d["predicted_step_s"]
            for d in self.decisions
            if d.get("realised_step_s") and d.get("predicted_step_s")
        ]
        return max(1.0, float(np.mean(ratios))) if ratios else 1.0

    def progress_bias(self) -> float:
        """How much the m measured after earlier evictions exceeded the model's, on average
        (1 when it did not: the model is never made more optimistic)."""
        ratios = [
            d["realised_progress_steps"] / d["progress_model"]
            for d in self.decisions
            if d.get("realised_progress_steps") is not None and d.get("progress_model")
        ]
        return max(1.0, float(np.mean(ratios))) if ratios else 1.0

    def _judge_fields(self, curve, kind: str, steps: list[int], losses: list[float], progress: float) -> dict:
        """What an eviction's progress judgement needs, kept in its decision record: the
        pre-eviction curve, the losses' spread about it, its descent per step at the
        eviction, and the window that measures the rate after it to ``PROGRESS_PRECISION``
        (the module docstring)."""
        t = np.asarray(steps[-NOISE_POINTS:], dtype=float)
        y = np.asarray(losses[-NOISE_POINTS:], dtype=float)
        sigma = float(np.std(y - curve(t), ddof=1)) if t.size > 2 else 0.0
        rate = _descent(curve, float(steps[-1]))
        return {
            "pre_curve": {"kind": kind, **curve.to_dict()},
            "loss_noise": round(sigma, 8),
            "pre_rate": rate,
            "judge_steps": judge_window(sigma, rate / max(progress, 1e-9), self.min_fit_points),
        }

    def _pending_judgement(self, workers: int) -> dict | None:
        """The last eviction's record, if it led to this fleet size and its progress is
        not judged yet (None otherwise, or without prices: no judgement)."""
        evicted = [d for d in self.decisions if d.get("evict")]
        if not evicted:
            return None
        last = evicted[-1]
        if last["workers"] != workers + 1 or last.get("undone") or "judge_steps" not in last:
            return None
        return None if "realised_progress_steps" in last else last

    def _judge_progress(self, record: dict, steps: list[int], losses: list[float], workers: int) -> None:
        """The realised m of the eviction ``record`` at the same loss (the module docstring),
        and its realised gain with it and the measured step time."""
        t, y = np.asarray(steps, dtype=float), np.asarray(losses, dtype=float)
        slope, intercept = np.polyfit(t, y, 1)
        middle = 0.5 * (t[0] + t[-1])
        level = float(slope * middle + intercept)
        data = record["pre_curve"]
        curve = (ReferenceCurve if data["kind"] == "reference" else LocalCurve).from_dict(data)
        at = _step_at(curve, level, float(record["step"]))
        model = float(record["progress_steps"])
        if at is None:
            m = model  # below where the old fleet's curve levels off: no worse than the model says
        elif slope >= 0:
            m = math.inf  # no descent at all since the eviction
        else:
            m = _descent(curve, at) / -float(slope)
        record["progress_model"] = round(model / float(record.get("progress_bias", 1.0)), 6)
        record["realised_progress_steps"] = _json_float(m if math.isinf(m) else round(m, 4))
        measured = self._step_times().get(workers, float(record["predicted_step_s"]))
        gain = (
            0.0
            if math.isinf(m)
            else self.predicted_gain(workers + 1, record["step_s"], measured, record["remaining_s"], m)
        )
        record["realised_gain"] = round(gain, 4)

    def noise(self, workers: int) -> float:
        """φ = B_noise/B at ``workers`` (math.inf: noise-dominated; the module docstring)."""
        full = self.measured_noise if self.measured_noise is not None else self.noise_ratio
        if full is None or not math.isfinite(full):
            return math.inf
        return full * (self.reference_workers or workers) / workers

    def progress_steps(self, workers: int) -> float:
        """m_p: steps ``workers - 1`` need for one step of ``workers``' progress."""
        p = workers
        if self.progress_exponent > 0:  # sum: a step is its workers' steps
            return (p / (p - 1)) ** self.progress_exponent
        phi = self.noise(p)
        if not math.isfinite(phi):
            return p / (p - 1)
        return (1.0 + phi * p / (p - 1)) / (1.0 + phi)

    def _measure_noise(self, steps: list[int], local: LocalCurve, workers: int) -> None:
        """φ_P from the steps the reference curve takes to shed what the current fleet shed
        over its window, pooled over the sizes run so far (the module docstring)."""
        P = self.reference_workers
        if self.reference is None or P is None or workers >= P or len(steps) < 2 or steps[-1] <= steps[0]:
            return
        start, end = self._reference_step_at(local(steps[0])), self._reference_step_at(local(steps[-1]))
        if start is None or end is None or end <= start:
            return
        # The window since the last eviction only grows: its latest measure replaces the last.
        self.shed[int(workers)] = [float(end - start), float(steps[-1] - steps[0])]
        sizes = np.array(sorted(self.shed), dtype=float)
        equivalent = np.array([self.shed[int(p)][0] for p in sizes])
        taken = np.array([self.shed[int(p)][1] for p in sizes])

        def misfit(phi: float) -> float:
            share = sizes / P if math.isinf(phi) else (1.0 + phi) / (1.0 + phi * P / sizes)
            return float(np.sum((equivalent - taken * share) ** 2))

        self.measured_noise = min(NOISE_GRID, key=misfit)

    def _reference_step_at(self, loss: float) -> float | None:
        """The step at which the reference curve (decreasing) reaches ``loss`` (None: never
        within a million times the knee's step, or the loss is not finite)."""
        curve = self.reference
        if curve is None or not math.isfinite(loss):
            return None
        low, high = 0.0, float(max(1, self.knee_step or 1))
        while curve(high) > loss:
            low, high = high, 2.0 * high
            if high > 1e6 * max(1, self.knee_step or 1):
                return None
        for _ in range(60):
            mid = 0.5 * (low + high)
            low, high = (mid, high) if curve(mid) > loss else (low, mid)
        return high

    def predicted_gain(
        self, workers: int, step_now: float, step_after: float, remaining_s: float, progress: float | None = None
    ) -> float:
        """The remaining work's Perf/$ with ``workers - 1`` over that with ``workers``
        (the module docstring's formula; > 1: the eviction pays). ``progress``: m, if
        measured (default: the model's, times ``progress_bias``)."""
        p, w, f = workers, self.worker_usd_s, self.fixed_usd_s
        m = self.progress_steps(p) * self.progress_bias() if progress is None else progress
        work = max(1.0, remaining_s / step_now)  # R (``remaining_s`` has its floor)
        t_now = work * step_now
        t_after = work * m * step_after + self.settle_steps * step_after
        return (t_now * t_now * (p * w + f)) / (t_after * t_after * ((p - 1) * w + f))

    def _knee_decision(self, workers: int, elapsed_s: float, guard: dict, *, evict: bool) -> None:
        """Record the knee's eviction decision with the cost guard's prediction."""
        self.decisions.append(
            {
                "step": self._steps[-1],
                "elapsed_s": round(float(elapsed_s), 3),
                "workers": int(workers),
                "s_delta": None,
                "throughput": None,
                "evict": evict,
                "at_knee": True,
                **_guard_fields(guard),
            }
        )

    def _model_progress(self, workers: int) -> float:
        """The m the guard prices an eviction from ``workers`` with (the model's, times ``progress_bias``)."""
        return self.progress_steps(workers) * self.progress_bias() if workers >= 2 else 1.0

    def remaining_s(self, elapsed_s: float, step_s: float) -> float:
        """R in seconds (the module docstring): the supervisor's steps to the target (at least
        one step), else the job's time so far (at least one interval); never more than the latter."""
        rest = max(self.interval_s, float(elapsed_s))
        if self.steps_left is not None:
            rest = min(rest, max(step_s, self.steps_left * step_s))
        return rest

    def cost_guard(self, workers: int, elapsed_s: float, judge_steps: int | None = None) -> dict | None:
        """Whether evicting one of ``workers`` pays for itself and leaves ``JUDGE_SHARE`` times
        ``judge_steps`` (its judgement window) of the job to judge it (None: no prices, guard off)."""
        if self.worker_usd_s <= 0 or workers < 2:
            return None
        measured = self._step_times()
        now = measured.get(workers, self.reference_step_s if workers == self.reference_workers else None)
        after = self._step_after(workers, measured)
        if now is None or after is None or now <= 0:
            return None
        remaining = self.remaining_s(elapsed_s, now)
        gain = self.predicted_gain(workers, now, after, remaining)
        # Judged only against an estimated rest: the time so far is too rough a guess to refuse on.
        judgeable = judge_steps is None or self.steps_left is None or remaining / now >= JUDGE_SHARE * judge_steps
        return {
            "pays": gain > 1.0 + self.cost_margin and judgeable,
            "judgeable": judgeable,
            "predicted_gain": gain,
            "progress_steps": self.progress_steps(workers) * self.progress_bias(),
            "progress_bias": self.progress_bias(),
            "noise": self.noise(workers) if self.progress_exponent == 0 else math.inf,
            "step_s": now,
            "predicted_step_s": after,
            "remaining_s": remaining,
        }

    def _undo_losing_eviction(self, elapsed_s: float, workers: int, step: int) -> str | None:
        """Ask for the last eviction's worker back when, timed at the smaller fleet, its
        realised gain came out below 1 for the knee's eviction, ``1 − cost_margin`` for a
        later one: it is losing money for the rest of the job. The knee's is a probe,
        predicted from the peers' share of the step alone (one size timed; at ML-10M shape
        it promised 1.021 and realised 0.98); a later one was predicted from measured step
        times, and undoing it costs a worker's cold start and re-settling, so it needs the
        same margin as taking one (a 0.99 undone cost PMF at 16 workers a tenth of its
        time). The tuner then keeps that fleet size."""
        evicted = [d for d in self.decisions if d.get("evict") and d.get("realised_gain") is not None]
        if not evicted or evicted[-1]["workers"] != workers + 1 or evicted[-1].get("undone"):
            return None
        last = evicted[-1]
        if last["realised_gain"] >= (1.0 if last.get("at_knee") else 1.0 - self.cost_margin):
            return None
        last["undone"] = True
        self.floor = workers + 1
        self.decisions.append(
            {"step": int(step), "elapsed_s": round(float(elapsed_s), 3), "workers": int(workers), "join": True}
        )
        self.next_decision_s = float(elapsed_s) + self.interval_s
        self._steps, self._elapsed, self._losses, self._workers = [], [], [], []
        self.last_action = "join"
        return (
            f"undo the eviction at step {last['step']}: realised Perf/$ gain {last['realised_gain']:.3f} "
            f"(predicted {last['predicted_gain']:.3f}); keeping {workers + 1} workers"
        )

    def _settle_realised(self, workers: int) -> None:
        """Fill the last eviction's realised effect once the smaller fleet has been timed:
        its measured step duration, and the gain the formula gives with it."""
        evicted = [d for d in self.decisions if d.get("evict") and d.get("predicted_gain") is not None]
        if not evicted or evicted[-1].get("realised_gain") is not None or evicted[-1]["workers"] != workers + 1:
            return
        last = evicted[-1]
        measured = self._step_times().get(workers)
        if measured is None:
            return
        last["realised_step_s"] = round(measured, 6)
        last["realised_gain"] = round(
            self.predicted_gain(workers + 1, last["step_s"], measured, last["remaining_s"], last["progress_steps"]), 4
        )

    def _record_eviction(self, elapsed_s: float, workers: int, reason: str, s_delta: float | None) -> None:
        self.evictions.append(
            {
                "step": self._steps[-1],
                "elapsed_s": float(elapsed_s),
                "workers": int(workers),
                "s_delta": s_delta,
                "reason": reason,
            }
        )
        self.next_decision_s = float(elapsed_s) + self.interval_s
        # Fits after this use only later observations; drop the rest to keep state small.
        self._steps, self._elapsed, self._losses, self._workers = [], [], [], []

    # -- checkpointing -----------------------------------------------------------------

    def config(self) -> dict:
        """Constructor arguments of this tuner."""
        return {
            "interval_s": self.interval_s,
            "horizon_s": self.horizon_s,
            "tolerance": self.tolerance,
            "knee_alpha": self.knee.alpha,
            "knee_tolerance": self.knee.tolerance,
            "knee_patience": self.knee.patience,
            "knee_min_drop": self.knee.min_drop,
            "min_workers": self.min_workers,
            "min_fit_points": self.min_fit_points,
            "fit_alpha": self.fit_alpha,
            "reference_recency": self.reference_recency,
            "throughput_tolerance": self.throughput_tolerance,
            "worker_usd_s": self.worker_usd_s,
            "fixed_usd_s": self.fixed_usd_s,
            "progress_exponent": self.progress_exponent,
            "noise_ratio": self.noise_ratio,
            "cost_margin": self.cost_margin,
            "settle_steps": self.settle_steps,
        }

    def state_dict(self) -> dict:
        """JSON-able snapshot (configuration included) for checkpointing across rounds."""
        return {
            "config": self.config(),
            "knee": self.knee.state_dict(),
            "steps": list(self._steps),
            "elapsed": list(self._elapsed),
            "losses": list(self._losses),
            "workers": list(self._workers),
            "knee_step": self.knee_step,
            "reference": None if self.reference is None else self.reference.to_dict(),
            "reference_step_s": self.reference_step_s,
            "reference_workers": self.reference_workers,
            "next_decision_s": self.next_decision_s,
            "last_s_delta": self.last_s_delta,
            "evictions": [dict(record) for record in self.evictions],
            "decisions": [dict(record) for record in self.decisions],
            "step_time": {str(p): list(tally) for p, tally in self.step_time.items()},
            "last": None if self._last is None else list(self._last),
            "peer_time": {str(p): list(tally) for p, tally in self.peer_time.items()},
            "measured_noise": _json_float(self.measured_noise),
            "shed": {str(p): list(v) for p, v in self.shed.items()},
            "floor": self.floor,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a snapshot from ``state_dict``; later decisions are identical."""
        self.__init__(**state["config"])
        self.knee.load_state_dict(state["knee"])
        self._steps = [int(v) for v in state["steps"]]
        self._elapsed = [float(v) for v in state["elapsed"]]
        self._losses = [float(v) for v in state["losses"]]
        self._workers = [int(v) for v in state["workers"]]
        self.knee_step = state["knee_step"]
        self.reference = None if state["reference"] is None else ReferenceCurve.from_dict(state["reference"])
        self.reference_step_s = state["reference_step_s"]
        self.reference_workers = state["reference_workers"]
        self.next_decision_s = state["next_decision_s"]
        self.last_s_delta = state["last_s_delta"]
        self.evictions = [dict(record) for record in state["evictions"]]
        self.decisions = [dict(record) for record in state.get("decisions", [])]
        self.step_time = {int(p): [float(t[0]), int(t[1])] for p, t in state.get("step_time", {}).items()}
        last = state.get("last")
        self._last = None if last is None else (int(last[0]), float(last[1]), int(last[2]))
        self.peer_time = {int(p): [float(t[0]), int(t[1])] for p, t in state.get("peer_time", {}).items()}
        noise = state.get("measured_noise")
        self.measured_noise = None if noise is None else float(noise)
        self.shed = {int(p): [float(v[0]), float(v[1])] for p, v in state.get("shed", {}).items()}
        self.floor = state.get("floor")

    @classmethod
    def from_state_dict(cls, state: dict) -> ScaleInTuner:
        """A new tuner restored from ``state_dict``."""
        tuner = cls(**state["config"])
        tuner.load_state_dict(state)
        return tuner


def _guard_fields(guard: dict) -> dict:
    return {
        "step_s": round(guard["step_s"], 6),
        "predicted_step_s": round(guard["predicted_step_s"], 6),
        "predicted_gain": round(guard["predicted_gain"], 4),
        "progress_steps": round(guard["progress_steps"], 4),
        "progress_bias": round(guard["progress_bias"], 4),
        "noise": _json_float(guard["noise"] if math.isinf(guard["noise"]) else round(guard["noise"], 4)),
        "remaining_s": round(guard["remaining_s"], 3),
        "judgeable": guard["judgeable"],
    }


def _json_float(value: float | None) -> float | str | None:
    """A float for JSON: infinity as the string "inf" (``float("inf")`` reads it back)."""
    return "inf" if value is not None and math.isinf(value) else value


def _mean_step_duration(steps: list[int], elapsed: list[float]) -> float:
    """Mean seconds per step over the observations (robust to unobserved steps)."""
    if len(steps) < 2 or steps[-1] == steps[0]:
        return 0.0
    return max(0.0, (elapsed[-1] - elapsed[0]) / (steps[-1] - steps[0]))


def _thin(steps: np.ndarray, losses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most ``MAX_FIT_POINTS`` evenly spaced points, always keeping the newest."""
    if steps.size <= MAX_FIT_POINTS:
        return steps, losses
    keep = np.unique(np.linspace(0, steps.size - 1, MAX_FIT_POINTS).round().astype(int))
    return steps[keep], losses[keep]


def _steps_in(horizon_s: float, step_s: float) -> int:
    """⌊Δ/d⌋: steps completed within the horizon (0 when the duration is unknown)."""
    if step_s <= 0.0:
        return 0
    return int(math.floor(horizon_s / step_s))


def judge_window(noise: float, rate: float, min_steps: int) -> int:
    """Steps after an eviction that measure the descent per step ``rate`` (expected) of
    losses with spread ``noise`` to ``PROGRESS_PRECISION``: the smallest n with
    noise·√(12/(n(n² − 1))) ≤ PROGRESS_PRECISION·rate, within [min_steps, MAX_JUDGE_STEPS]."""
    if rate <= 0:
        return MAX_JUDGE_STEPS  # no descent expected: nothing to measure against
    n = min_steps
    if noise > 0:
        n = max(n, math.ceil((12.0 * noise * noise / (PROGRESS_PRECISION * rate) ** 2) ** (1.0 / 3.0)) + 1)
    return int(min(n, MAX_JUDGE_STEPS))


def _descent(curve, step: float) -> float:
    """The curve's descent per step at ``step`` (a central difference over one step)."""
    return float(curve(max(0.0, step - 0.5)) - curve(step + 0.5))


def _step_at(curve, loss: float, start: float) -> float | None:
    """The step at which a decreasing curve reaches ``loss`` (None: not within a million
    times ``start``, or the loss is not finite)."""
    if not math.isfinite(loss):
        return None
    if curve(0.0) <= loss:
        return 0.0
    low, high = 0.0, max(1.0, start)
    while curve(high) > loss:
        low, high = high, 2.0 * high
        if high > 1e6 * max(1.0, start):
            return None
    for _ in range(60):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if curve(mid) > loss else (low, mid)
    return high
