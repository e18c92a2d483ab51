"""Scoring with numpy only: what a trained model predicts for a batch of rows.

The models' ``predict`` (the report's test metrics, the validation scorings) and ``ebb
predict`` / ``ebb.load_model`` (``ebb.predict``) call these same functions, so scoring
a file reproduces the report's numbers exactly. Each row's score is computed in a fixed
order of its own entries (a column loop, a bincount in entry order), never by a reduction
whose grouping depends on how many rows share the call: a row scores the same alone, in
a minibatch, or in any shard of a file.
"""

from __future__ import annotations

import numpy as np


def pmf_pairs(
    user: np.ndarray,
    item: np.ndarray,
    users: np.ndarray,
    items: np.ndarray,
    *,
    rank: int,
    mean: float,
    rating_range: tuple[float, float] | None,
    cold: np.ndarray | None = None,
) -> np.ndarray:
    """``μ + b_u + b_i + U_u·V_i`` (float32) for every pair ``(users[k], items[k])``, clipped
    to ``rating_range``. ``user``/``item`` are the tables ``[n, rank + 1]`` (bias last). An id
    of -1 is unknown: its row counts as zero, so the prediction falls back to the biases
    that are known (``μ + b_i``, ``μ + b_u``, or ``μ``). Pairs where ``cold`` (bool per pair)
    is set drop the factor term: ``μ + b_u + b_i`` (PMF's ``cold_k``)."""
    U = _rows(user, users)
    V = _rows(item, items)
    if cold is not None and cold.any():
        U[cold, :rank] = 0.0  # U is a copy (_rows): the tables are untouched
    pred = U[:, rank] + V[:, rank]
    for k in range(rank):  # one column at a time: the same order for every row
        pred += U[:, k] * V[:, k]
    pred += np.float32(mean)
    if rating_range is not None:
        np.clip(pred, np.float32(rating_range[0]), np.float32(rating_range[1]), out=pred)
    return pred


def _rows(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    unknown = ids < 0
    rows = table[np.where(unknown, 0, ids)].astype(np.float32, copy=False)  # a copy: safe to zero
    rows[unknown] = 0.0
    return rows


def sigmoid(x: np.ndarray) -> np.ndarray:
    """The logistic function in float32, without overflow for large |x|."""
    x = x.astype(np.float32, copy=False)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(np.float32)


def sparse_logits(
    weight: np.ndarray, bias: float, indptr: np.ndarray, indices: np.ndarray, values: np.ndarray
) -> np.ndarray:
    """``Σ w_f·x_f + b`` per CSR row (float32); each row's sum runs over its entries in order."""
    w = weight.reshape(-1)
    n = len(indptr) - 1
    contrib = w[indices].astype(np.float32) * values.astype(np.float32)
    row_of = np.repeat(np.arange(n), np.diff(indptr))
    return np.bincount(row_of, weights=contrib, minlength=n).astype(np.float32) + np.float32(bias)


def dense_logits(weight: np.ndarray, bias: float, x: np.ndarray) -> np.ndarray:
    """``x·w + b`` per row (float32), one column at a time."""
    w = weight.reshape(-1).astype(np.float32)
    out = np.zeros(len(x), dtype=np.float32)
    for k in range(x.shape[1]):
        out += x[:, k] * w[k]
    return out + np.float32(bias)
