"""Knee detection on a loss history (MLLess §4.2, "automatic knee detection").

The knee is where loss reduction slows down: the first step at which the smoothed slope
of the loss has risen above a small negative tolerance and stays there. The pipeline,
all causal so the answer on a prefix never changes when more steps arrive:

1. a running median over the last 5 losses removes isolated spikes (an EWMA alone would
   smear one spike over tens of steps and could fake a flat stretch); smoothing starts
   once 5 losses are in, so even a spike on the first step is filtered;
2. a bias-corrected EWMA smooths the loss;
3. its first difference is the slope per step, smoothed again by the same EWMA;
4. the tolerance is *relative*: the slope counts as flat once it is above
   ``-tolerance × steepest smoothed descent seen so far`` (tracked after a short
   warm-up). That makes it independent of the loss units, of any constant offset (BCE
   floors near 0.5, RMSE near 0.8), and of how many steps the fast phase takes.

Smoothing only delays: on a convex, decreasing curve the detected knee comes after the
analytic bend (the step where |L'| falls to ``tolerance ×`` its maximum), late by the
filters' lag plus ``patience`` (about 10 to 50 steps with the defaults).

Defaults: ``alpha=0.1`` (a ~10-step memory, enough to average minibatch noise),
``min_steps=20`` steps of warm-up; ``tolerance`` (flat = the descent has slowed to this
share of its steepest rate: at 0.1, on a ``1/(at+b)`` curve about 70 % of the drop is done,
on an exponential 90 %), ``patience`` and ``min_drop`` (no knee before the smoothed loss
has fallen this share below its level after the warm-up, so an early plateau is not taken
for it) default to the job spec's ``scaling.knee_*``.

``KneeDetector`` does this incrementally (O(1) per step, JSON-able state) for the
supervisor; ``find_knee`` runs it over a whole history.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ebb.spec import ScalingSpec

MEDIAN_WINDOW = 5
_SPEC = ScalingSpec()  # the tuner's defaults live in the job spec (``ebb spec``, scaling.*)

DEFAULT_ALPHA = 0.1
DEFAULT_TOLERANCE = _SPEC.knee_tolerance
DEFAULT_PATIENCE = _SPEC.knee_patience
DEFAULT_MIN_STEPS = 20
# A loss can stall before its real descent (PMF at MovieLens-10M shape sits on a plateau
# while its factors grow out of their small initialisation): a flat stretch is a knee only
# after the loss has fallen by this share. The benchmarks' real knees come after much
# larger drops (docs/RESULTS.md, "The auto-tuner").
DEFAULT_MIN_DROP = _SPEC.knee_min_drop


class _Ewma:
    """Bias-corrected exponentially weighted mean (the Adam correction of a zero start)."""

    __slots__ = ("alpha", "mean", "weight")

    def __init__(self, alpha: float, mean: float = 0.0, weight: float = 0.0):
        self.alpha, self.mean, self.weight = alpha, mean, weight

    def update(self, value: float) -> float:
        self.mean = (1.0 - self.alpha) * self.mean + self.alpha * value
        self.weight = (1.0 - self.alpha) * self.weight + self.alpha
        return self.mean / self.weight


class KneeDetector:
    """Incremental knee finder; feed one loss per step with ``update``.

    ``alpha``: EWMA weight of the newest value (both smoothing passes).
    ``tolerance``: the slope is flat once above ``-tolerance × steepest descent so far``.
    ``patience``: consecutive flat steps needed to confirm a knee.
    ``min_steps``: warm-up; slopes are tracked from this many losses on (the smoothers
    need to settle), so no knee is reported earlier.
    ``min_drop``: no knee before the smoothed loss has fallen by this fraction of its
    level at the end of the warm-up, so a flat start is not mistaken for the knee.
    """

    def __init__(
        self,
        *,
        alpha: float = DEFAULT_ALPHA,
        tolerance: float = DEFAULT_TOLERANCE,
        patience: int = DEFAULT_PATIENCE,
        min_steps: int = DEFAULT_MIN_STEPS,
        min_drop: float = DEFAULT_MIN_DROP,
    ):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        if min_steps < 2:
            raise ValueError(f"min_steps must be >= 2, got {min_steps}")
        if min_drop < 0.0:
            raise ValueError(f"min_drop must be >= 0, got {min_drop}")
        self.alpha, self.tolerance, self.patience = alpha, tolerance, patience
        self.min_steps, self.min_drop = min_steps, min_drop
        self.count = 0  # losses seen
        self.knee: int | None = None  # index (0-based, in update order) of the knee
        self._window: list[float] = []
        self._level = _Ewma(alpha)
        self._slope = _Ewma(alpha)
        self._first_level: float | None = None
        self._previous_level: float | None = None
        self._steepest = 0.0  # largest smoothed descent per step so far (>= 0)
        self._run_start: int | None = None  # index where the current flat run began

    def update(self, loss: float) -> int | None:
        """Add the next loss; returns the knee index once confirmed (then always)."""
        if self.knee is not None:
            self.count += 1
            return self.knee
        index = self.count
        self.count += 1
        self._window.append(float(loss))
        if len(self._window) > MEDIAN_WINDOW:
            self._window.pop(0)
        if len(self._window) < MEDIAN_WINDOW:
            return None  # start from a full median window (see the module doc)
        level = self._level.update(float(np.median(self._window)))
        previous, self._previous_level = self._previous_level, level
        if previous is None:
            return None
        slope = self._slope.update(level - previous)
        if index < self.min_steps - 1:
            # Warm-up: the smoothers have seen too few values for their slope to be
            # trusted (one early spike would set an inflated "steepest descent").
            return None
        if self._first_level is None:
            self._first_level = level
        self._steepest = max(self._steepest, -slope)

        dropped = (self._first_level - level) >= self.min_drop * abs(self._first_level)
        flat = self._steepest > 0.0 and dropped and slope > -self.tolerance * self._steepest
        if not flat:
            self._run_start = None
            return None
        if self._run_start is None:
            self._run_start = index
        if index - self._run_start + 1 >= self.patience:
            self.knee = self._run_start
        return self.knee

    def state_dict(self) -> dict:
        """JSON-able state; ``load_state_dict`` restores it exactly."""
        return {
            "alpha": self.alpha,
            "tolerance": self.tolerance,
            "patience": self.patience,
            "min_steps": self.min_steps,
            "min_drop": self.min_drop,
            "count": self.count,
            "knee": self.knee,
            "window": list(self._window),
            "level": [self._level.mean, self._level.weight],
            "slope": [self._slope.mean, self._slope.weight],
            "first_level": self._first_level,
            "previous_level": self._previous_level,
            "steepest": self._steepest,
            "run_start": self._run_start,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state saved by ``state_dict`` (settings included)."""
        self.__init__(
            alpha=float(state["alpha"]),
            tolerance=float(state["tolerance"]),
            patience=int(state["patience"]),
            min_steps=int(state["min_steps"]),
            min_drop=float(state["min_drop"]),
        )
        self.count = int(state["count"])
        self.knee = None if state["knee"] is None else int(state["knee"])
        self._window = [float(v) for v in state["window"]]
        self._level = _Ewma(self.alpha, *map(float, state["level"]))
        self._slope = _Ewma(self.alpha, *map(float, state["slope"]))
        self._first_level = state["first_level"]
        self._previous_level = state["previous_level"]
        self._steepest = float(state["steepest"])
        self._run_start = state["run_start"]


def find_knee(
    losses: Iterable[float],
    *,
    alpha: float = DEFAULT_ALPHA,
    tolerance: float = DEFAULT_TOLERANCE,
    patience: int = DEFAULT_PATIENCE,
    min_steps: int = DEFAULT_MIN_STEPS,
    min_drop: float = DEFAULT_MIN_DROP,
) -> int | None:
    """Index of the knee in a loss history (one loss per step), or None if not reached.

    The knee is the first index whose smoothed slope is above ``-tolerance ×`` the
    steepest smoothed descent so far and stays so for ``patience`` consecutive steps; it
    is confirmed ``patience - 1`` steps after the returned index. See the module doc.
    """
    detector = KneeDetector(alpha=alpha, tolerance=tolerance, patience=patience, min_steps=min_steps, min_drop=min_drop)
    for loss in losses:
        if detector.update(loss) is not None:
            return detector.knee
    return None


def _causal_median(values: np.ndarray) -> np.ndarray:
    """Median of the last ``MEDIAN_WINDOW`` values at each position (fewer at the start)."""
    padded = np.concatenate([np.full(MEDIAN_WINDOW - 1, values[0]), values])
    medians = np.median(np.lib.stride_tricks.sliding_window_view(padded, MEDIAN_WINDOW), axis=1)
    for i in range(min(MEDIAN_WINDOW - 1, values.size)):
        medians[i] = np.median(values[: i + 1])
    return medians


def _ewma(values: np.ndarray, alpha: float) -> np.ndarray:
    """Bias-corrected EWMA (vectorised twin of ``_Ewma``)."""
    # Imported here: scipy.signal costs about a second at import, on every supervisor's cold start.
    from scipy.signal import lfilter

    raw = lfilter([alpha], [1.0, -(1.0 - alpha)], values)
    return raw / (1.0 - (1.0 - alpha) ** np.arange(1, values.size + 1))


def smooth_points(steps, losses, alpha: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """Outlier-filtered (step, loss) points to fit a curve to.

    Losses go through a causal running median (window 5) and a bias-corrected EWMA
    (MLLess smooths before fitting; the median stops one spike from biasing the fit).
    Both filters lag: a smoothed value describes the loss a few steps *earlier*. Fitting
    it at its own step would shift the whole curve right and overstate the loss, most
    in the steep region (so a reference curve fitted there would look pessimistic and
    make every eviction look free). The same filters are therefore applied to the step
    numbers, which places each smoothed value at its effective step; for a linear trend
    this is exact.
    """
    t = np.asarray(steps, dtype=float).ravel()
    y = np.asarray(losses, dtype=float).ravel()
    if t.shape != y.shape:
        raise ValueError(f"steps and losses differ in length ({t.size} vs {y.size})")
    if y.size == 0:
        return t, y
    return _ewma(_causal_median(t), alpha), _ewma(_causal_median(y), alpha)
