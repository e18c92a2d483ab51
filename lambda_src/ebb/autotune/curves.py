"""Learning-curve models of the scale-in auto-tuner (MLLess §4.2, Eqs. 2 and 3).

Two non-negative families are fitted to (step, loss) points:

* the reference curve of the fast-convergence region, fitted once at the knee::

      L_P(t) = 1 / (θ0·t^θ1 + θ2) + θ3

* the flatter curve of the slow-convergence region, refitted after every eviction::

      ℓ_p(t) = 1 / (θ0·t² + θ1·t + θ2) + θ3

Fitting is bounded least squares (θ ≥ 0) in the loss space. Both models are linear in
their denominator once θ3 (and, for L_P, θ1) is fixed, so the starting points come from
a small grid over those with a weighted non-negative least squares (NNLS) solve for the
rest; the best few starts are then refined with ``scipy.optimize.least_squares``. Steps
and losses are rescaled to [0, 1] while fitting so that the solver sees well-conditioned
parameters whatever the units.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

# Denominators are clipped here: with θ2 = 0 the models are singular at t = 0.
_MIN_DENOMINATOR = 1e-12
# How many of the best grid starts are refined by the non-linear solver.
_REFINED_STARTS = 3
# Solver evaluations per start. The supervisor fits in its step loop, so a fit must stay
# well inside a worker's patience even on a loaded host (a few hundred evaluations with
# tight tolerances took seconds there, and the waiting workers gave the supervisor up).
_MAX_EVALUATIONS = 100
# Candidate asymptotes θ3, as fractions of the smallest observed (normalised) loss.
_ASYMPTOTE_FRACTIONS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.995)
# Candidate exponents θ1 of the reference curve (SGD: between 1/2 and 1, give it room).
_EXPONENTS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


def _scipy_optimize():
    # Imported at the first fit, not with the module: scipy.optimize costs about a second
    # at import, on every supervisor's cold start, and most jobs never fit a curve.
    import scipy.optimize

    return scipy.optimize


def _reference_den(theta, t: np.ndarray) -> np.ndarray:
    return theta[0] * np.power(t, theta[1]) + theta[2]


def _reference_den_jac(theta, t: np.ndarray) -> np.ndarray:
    power = np.power(t, theta[1])
    # d/dθ1 of t^θ1 is t^θ1·ln t; at t = 0 its limit is 0 (θ1 > 0), so avoid log(0).
    log_t = np.log(np.where(t > 0, t, 1.0))
    return np.column_stack([power, theta[0] * power * log_t, np.ones_like(t)])


def _local_den(theta, t: np.ndarray) -> np.ndarray:
    return theta[0] * t * t + theta[1] * t + theta[2]


def _local_den_jac(theta, t: np.ndarray) -> np.ndarray:
    return np.column_stack([t * t, t, np.ones_like(t)])


@dataclass(frozen=True)
class _FittedCurve:
    """A fitted curve: callable on a step (scalar or array); ``theta`` are θ0..θ3."""

    theta: tuple[float, float, float, float]
    rmse: float = 0.0
    n_points: int = 0

    # The model's denominator as a function of (theta, t); set by each subclass.
    _denominator: ClassVar[Callable[[tuple, np.ndarray], np.ndarray]]

    def __call__(self, t):
        t_arr = np.maximum(np.asarray(t, dtype=float), 0.0)
        den = np.maximum(type(self)._denominator(self.theta, t_arr), _MIN_DENOMINATOR)
        value = 1.0 / den + self.theta[3]
        return float(value) if value.ndim == 0 else value

    def to_dict(self) -> dict:
        """JSON-able form; inverse of ``from_dict``."""
        return {"theta": list(self.theta), "rmse": self.rmse, "n_points": self.n_points}

    @classmethod
    def from_dict(cls, data: dict):
        """Rebuild a curve saved with ``to_dict``."""
        theta = tuple(float(v) for v in data["theta"])
        if len(theta) != 4:
            raise ValueError(f"{cls.__name__} needs 4 parameters, got {len(theta)}")
        return cls(theta=theta, rmse=float(data.get("rmse", 0.0)), n_points=int(data.get("n_points", 0)))


@dataclass(frozen=True)
class ReferenceCurve(_FittedCurve):
    """``L_P(t) = 1/(θ0·t^θ1 + θ2) + θ3``, the loss the full fleet would have reached."""

    _denominator: ClassVar = staticmethod(_reference_den)


@dataclass(frozen=True)
class LocalCurve(_FittedCurve):
    """``ℓ_p(t) = 1/(θ0·t² + θ1·t + θ2) + θ3``, the loss trend with the current fleet."""

    _denominator: ClassVar = staticmethod(_local_den)


def _prepare(steps, losses) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(steps, dtype=float).ravel()
    y = np.asarray(losses, dtype=float).ravel()
    if t.shape != y.shape:
        raise ValueError(f"steps and losses differ in length ({t.size} vs {y.size})")
    keep = np.isfinite(t) & np.isfinite(y)
    t, y = t[keep], y[keep]
    if t.size < 5:
        raise ValueError(f"need at least 5 finite points to fit 4 parameters, got {t.size}")
    if np.any(t < 0):
        raise ValueError("steps must be non-negative")
    if np.any(y <= 0):
        # The families are 1/(positive) + non-negative: they cannot represent losses <= 0.
        raise ValueError("losses must be positive to fit a 1/(...) + θ3 curve")
    if np.ptp(t) == 0:
        raise ValueError("steps must not all be equal")
    return t, y


def _fit(
    t: np.ndarray,
    y: np.ndarray,
    denominator: Callable[[np.ndarray, np.ndarray], np.ndarray],
    denominator_jac: Callable[[np.ndarray, np.ndarray], np.ndarray],
    starts: list[np.ndarray],
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """Refine each start with bounded (weighted) least squares on normalised data; best θ and RMSE."""
    root_w = np.ones_like(t) if weights is None else np.sqrt(weights / np.mean(weights))

    def residuals(theta: np.ndarray) -> np.ndarray:
        den = np.maximum(denominator(theta, t), _MIN_DENOMINATOR)
        return (1.0 / den + theta[3] - y) * root_w

    def jacobian(theta: np.ndarray) -> np.ndarray:
        den = np.maximum(denominator(theta, t), _MIN_DENOMINATOR)
        jac = np.empty((t.size, 4))
        jac[:, :3] = -denominator_jac(theta, t) / (den * den)[:, None]
        jac[:, 3] = 1.0
        return jac * root_w[:, None]

    best_theta, best_cost = None, np.inf
    for start in starts:
        try:
            result = _scipy_optimize().least_squares(
                residuals,
                np.clip(start, 0.0, None),
                jac=jacobian,
                bounds=(0.0, np.inf),
                method="trf",
                x_scale="jac",
                ftol=1e-8,
                xtol=1e-8,
                gtol=1e-8,
                max_nfev=_MAX_EVALUATIONS,
            )
        except (ValueError, FloatingPointError, np.linalg.LinAlgError):
            continue
        if np.all(np.isfinite(result.x)) and result.cost < best_cost:
            best_theta, best_cost = result.x, result.cost
    if best_theta is None:
        raise ValueError("curve fit failed from every starting point")
    return best_theta, float(np.sqrt(2.0 * best_cost / t.size))


def _nnls_starts(
    t: np.ndarray,
    y: np.ndarray,
    denominator: Callable[[np.ndarray, np.ndarray], np.ndarray],
    bases: list[tuple[np.ndarray, Callable[[np.ndarray, float], np.ndarray]]],
) -> list[np.ndarray]:
    """Grid starts: for each fixed asymptote θ3 and basis, solve the denominator by NNLS.

    With θ3 fixed, 1/(y - θ3) is linear in the denominator's coefficients. Rows are
    weighted by (y - θ3)², the first-order map from an error in 1/(y - θ3) back to an
    error in y, so the linear solve approximates the loss-space least squares.
    ``bases`` pairs a design matrix with a function mapping (coefficients, θ3) to θ.
    """
    y_min = float(np.min(y))
    candidates: list[tuple[float, np.ndarray]] = []
    for fraction in _ASYMPTOTE_FRACTIONS:
        asymptote = fraction * y_min
        gap = y - asymptote
        weights = gap * gap
        for basis, assemble in bases:
            coef, _ = _scipy_optimize().nnls(basis * weights[:, None], weights / gap)
            theta = assemble(coef, asymptote)
            den = np.maximum(denominator(theta, t), _MIN_DENOMINATOR)
            sse = float(np.sum((1.0 / den + asymptote - y) ** 2))
            if np.isfinite(sse):
                candidates.append((sse, theta))
    candidates.sort(key=lambda item: item[0])
    return [theta for _, theta in candidates[:_REFINED_STARTS]]


def _normalised(steps, losses):
    """Checked points, and the same scaled to [0, 1] on both axes (better-conditioned fits)."""
    t, y = _prepare(steps, losses)
    t_scale, y_scale = float(np.max(t)), float(np.max(y))
    return t, t / t_scale, y / y_scale, t_scale, y_scale


def fit_reference(steps, losses, recency: float = 0.0) -> ReferenceCurve:
    """Fit ``L_P(t) = 1/(θ0·t^θ1 + θ2) + θ3`` (θ ≥ 0) to losses observed at steps.

    ``recency`` k weights the point at step t by (t / t_last)^k: with k > 0 the fit
    follows the latest part of the history most closely, which is what is extrapolated.
    Raises ValueError when fewer than 5 finite points are given, a loss is not positive,
    or every solver start fails.
    """
    t, tn, yn, t_scale, y_scale = _normalised(steps, losses)

    bases = [
        (
            np.column_stack([np.power(tn, exponent), np.ones_like(tn)]),
            lambda coef, asym, exponent=exponent: np.array([coef[0], exponent, coef[1], asym]),
        )
        for exponent in _EXPONENTS
    ]
    starts = _nnls_starts(tn, yn, _reference_den, bases)
    weights = np.power(tn, recency) + 1e-6 if recency > 0 else None
    theta_n, rmse_n = _fit(tn, yn, _reference_den, _reference_den_jac, starts, weights)
    # Undo the normalisation: y = y_s / (a·(t/t_s)^b + c) + y_s·d.
    a, b, c, d = theta_n
    theta = (a / (y_scale * t_scale**b), b, c / y_scale, d * y_scale)
    return ReferenceCurve(theta=tuple(float(v) for v in theta), rmse=rmse_n * y_scale, n_points=int(t.size))


def fit_local(steps, losses) -> LocalCurve:
    """Fit ``ℓ_p(t) = 1/(θ0·t² + θ1·t + θ2) + θ3`` (θ ≥ 0) to losses observed at steps.

    Raises ValueError when fewer than 5 finite points are given, a loss is not positive,
    or every solver start fails.
    """
    t, tn, yn, t_scale, y_scale = _normalised(steps, losses)

    bases = [
        (
            np.column_stack([tn * tn, tn, np.ones_like(tn)]),
            lambda coef, asym: np.array([coef[0], coef[1], coef[2], asym]),
        )
    ]
    starts = _nnls_starts(tn, yn, _local_den, bases)
    theta_n, rmse_n = _fit(tn, yn, _local_den, _local_den_jac, starts)
    a, b, c, d = theta_n
    theta = (a / (y_scale * t_scale**2), b / (y_scale * t_scale), c / y_scale, d * y_scale)
    return LocalCurve(theta=tuple(float(v) for v in theta), rmse=rmse_n * y_scale, n_points=int(t.size))
