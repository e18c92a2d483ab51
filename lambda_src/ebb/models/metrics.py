"""Evaluation metrics: RMSE for ratings; log-loss, accuracy and AUC for classifiers."""

from __future__ import annotations

import numpy as np


def _mean(values: np.ndarray) -> float:
    """The mean of ``values`` summed in sorted order: the same number whatever order the
    rows came in (a test split's shuffled parts, or the raw file ``ebb predict`` scores)."""
    return float(np.sort(values).sum() / max(len(values), 1))


def rmse(pred: np.ndarray, target: np.ndarray) -> float:
    return float(np.sqrt(_mean((pred.astype(np.float64) - target) ** 2)))


def logloss(prob: np.ndarray, label: np.ndarray, eps: float = 1e-7) -> float:
    p = np.clip(prob.astype(np.float64), eps, 1 - eps)
    return -_mean(label * np.log(p) + (1 - label) * np.log1p(-p))


def accuracy(prob: np.ndarray, label: np.ndarray) -> float:
    return float(np.mean((prob >= 0.5) == (label >= 0.5)))


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties averaged); NaN with one class only."""
    pos = label >= 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = _rankdata(score)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def classification_metrics(prob: np.ndarray, label: np.ndarray) -> dict[str, float]:
    return {"logloss": logloss(prob, label), "accuracy": accuracy(prob, label), "auc": auc(prob, label)}


def _rankdata(values: np.ndarray) -> np.ndarray:
    # Imported here: scipy.stats costs about a second at import, on every Lambda cold start.
    from scipy.stats import rankdata

    return rankdata(values)
