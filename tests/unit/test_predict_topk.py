"""`top_k` (ebb.predict.artifact) is exact: the brute-force top K, ties by column, -inf never."""

from __future__ import annotations

import numpy as np
import pytest

from ebb.predict.artifact import LANES, top_k


def brute(scores: np.ndarray, k: int) -> list[list[int]]:
    out = []
    for row in scores:
        cols = [c for c in np.lexsort((np.arange(len(row)), -row)) if np.isfinite(row[c])]
        out.append(cols[:k])
    return out


@pytest.mark.parametrize("k", [1, 10, LANES - 1, LANES, 200])
def test_top_k_is_the_brute_force_top_k(k):
    rng = np.random.default_rng(k)
    scores = rng.normal(size=(40, LANES * 5)).astype(np.float32)
    scores[:, ::7] = np.round(scores[:, ::7], 1)  # ties
    scores[3, :] = 1.0  # a row of ties
    scores[5, 10:] = -np.inf  # a row with fewer than k finite scores
    scores[6, :] = -np.inf  # none at all
    scores[7, rng.choice(scores.shape[1], 100, replace=False)] = -np.inf  # seen items
    row, col, value, rank = top_k(scores, k)
    got = [col[row == r].tolist() for r in range(len(scores))]
    assert got == brute(scores, k)
    assert np.array_equal(value, scores[row, col]) and np.isfinite(value).all()
    assert all(rank[row == r].tolist() == list(range(1, len(got[r]) + 1)) for r in range(len(scores)))
