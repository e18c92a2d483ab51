"""Seeded synthetic datasets with planted structure, written in the real input formats.

The truth is known, so a trained model can be compared with the best achievable:
ratings have an exact noise floor (RMSE = ``noise``), logistic data a Bayes log-loss.
Every generator writes the data file, a sidecar ``<out>.meta.json`` describing it, and
returns that description.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ebb.data.format import Manifest

# Ratings: std of the planted user and item biases; the factor scale is set so the
# noiseless part has a total std of about SIGNAL_STD.
SIGNAL_STD = 1.0
BIAS_STD = 0.35
# Each further planted component is this much weaker than the one before, as in real
# rating matrices, whose singular values fall off quickly. 1.0 plants a flat spectrum.
SPECTRUM_DECAY = 0.5
# Logistic: the std of the true margin w*·x (before the bias); 2.0 with bias -0.5
# gives a Bayes log-loss near 0.45, informative but far from trivial.
MARGIN_STD = 2.0
_WRITE_VALUES = 2_000_000  # values formatted per string join (bounds memory)
_DRAW_ROWS = 50_000  # rows of feature indices drawn at once (bounds memory)


def _meta_path(out_path: str | os.PathLike) -> Path:
    return Path(f"{out_path}.meta.json")


def _write_meta(out_path: str | os.PathLike, meta: dict[str, Any]) -> dict[str, Any]:
    _meta_path(out_path).write_text(json.dumps(meta, indent=2))
    return meta


def _zipf_weights(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Popularity ``1 / rank**exponent`` over a random permutation of ``0..n-1``, summing to 1."""
    weights = np.empty(n)
    weights[rng.permutation(n)] = 1.0 / np.arange(1, n + 1) ** exponent
    return weights / weights.sum()


def _write_rows(path: Path, header: str | None, line_format: str, columns: list[np.ndarray]) -> None:
    """Write rows with a printf ``line_format`` (ending in a newline), in bulk."""
    rows = len(columns[0])
    step = max(1, _WRITE_VALUES // len(columns))
    with open(path, "w") as file:
        if header is not None:
            file.write(header + "\n")
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            # One % over a repeated format: the formatting loop runs in C.
            flat = np.stack([c[start:stop].astype(object) for c in columns], axis=1).ravel().tolist()
            file.write((line_format * (stop - start)) % tuple(flat))


# ----------------------------------------------------------------------------- ratings


def _isin_sorted(values: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """``np.isin`` against a sorted array (binary search; much faster for int64 keys)."""
    if not len(sorted_keys):
        return np.zeros(len(values), dtype=bool)
    position = np.minimum(np.searchsorted(sorted_keys, values), len(sorted_keys) - 1)
    return sorted_keys[position] == values


def _distinct_in_order(keys: np.ndarray) -> np.ndarray:
    """``keys`` without repeats, first occurrences in their original (random) order."""
    _, first = np.unique(keys, return_index=True)
    return keys[np.sort(first)]


def _sample_pairs(rng: np.random.Generator, user_p: np.ndarray, item_p: np.ndarray, count: int) -> np.ndarray:
    """``count`` distinct keys ``user * items + item`` drawn from ``user_p × item_p``;
    repeats are dropped and redrawn (so saturated heavy users spill over to others)."""
    items = len(item_p)
    chosen = np.empty(0, dtype=np.int64)  # sorted
    new_parts = []
    while len(chosen) < count:
        missing = count - len(chosen)
        draws = int(missing * 1.2) + 64
        keys = rng.choice(len(user_p), size=draws, p=user_p) * items + rng.choice(items, size=draws, p=item_p)
        keys = _distinct_in_order(keys)
        keys = keys[~_isin_sorted(keys, chosen)][:missing]
        new_parts.append(keys)
        chosen = np.sort(np.concatenate([chosen, keys]))
    return np.concatenate(new_parts)


def _top_up(
    rng: np.random.Generator, keys: np.ndarray, owner_p: np.ndarray, other_p: np.ndarray,
    minimum: int, by_user: bool,
) -> np.ndarray:  # fmt: skip
    """Add pairs so every user (``by_user``) or item has at least ``minimum`` of them;
    the partner of each new pair is drawn by popularity ``other_p``."""
    items = len(other_p) if by_user else len(owner_p)
    while True:
        owners = keys // items if by_user else keys % items
        deficit = np.maximum(minimum - np.bincount(owners, minlength=len(owner_p)), 0)
        if not deficit.any():
            return keys
        owner = np.repeat(np.arange(len(owner_p)), deficit * 2 + 4)
        partner = rng.choice(len(other_p), size=len(owner), p=other_p)
        new = owner * items + partner if by_user else partner * items + owner
        _, first = np.unique(new, return_index=True)
        first = np.sort(first)
        new, owner = new[first], owner[first]
        fresh = ~_isin_sorted(new, np.sort(keys))
        new, owner = new[fresh], owner[fresh]
        # Keep at most the deficit of each owner: rank of each pair within its owner.
        order = np.argsort(owner, kind="stable")
        group_start = np.searchsorted(owner[order], owner[order])
        rank = np.empty(len(owner), dtype=np.int64)
        rank[order] = np.arange(len(owner)) - group_start
        keys = np.concatenate([keys, new[rank < deficit[owner]]])


def _trim(rng: np.random.Generator, keys: np.ndarray, excess: int, items: int, min_user: int, min_item: int):
    """Remove ``excess`` random pairs without taking any user or item below its minimum."""
    user_count = np.bincount(keys // items)
    item_count = np.bincount(keys % items, minlength=items)
    keep = np.ones(len(keys), dtype=bool)
    for row in rng.permutation(len(keys)).tolist():
        if not excess:
            break
        user, item = divmod(int(keys[row]), items)
        if user_count[user] > min_user and item_count[item] > min_item:
            keep[row] = False
            user_count[user] -= 1
            item_count[item] -= 1
            excess -= 1
    if excess:
        raise ValueError("cannot honour the minimum ratings per user/item with this many ratings")
    return keys[keep]


def synth_ratings(
    out_path: str | os.PathLike,
    *,
    users: int = 2000,
    items: int = 1500,
    ratings: int = 200_000,
    rank: int = 10,
    noise: float = 0.5,
    zipf: float = 0.6,
    spectrum_decay: float = SPECTRUM_DECAY,
    min_user_ratings: int = 20,
    min_item_ratings: int = 10,
    mu: float = 3.5,
    seed: int = 0,
) -> dict[str, Any]:
    """MovieLens-style ratings from a planted rank-``rank`` model, written to ``out_path``.

    ``r_ui = mu + b_u + b_i + U_u·V_i + N(0, noise²)``, neither clipped nor rounded, so
    the noise floor RMSE is exactly ``noise``. The biases are planted *inside* the rank
    budget (two of the ``rank`` factor pairs are ``(b_u, 1)`` and ``(1, b_i)``), so
    ``r - mu`` has rank exactly ``rank`` and a rank-``rank`` model fits it with or
    without explicit bias terms. The noiseless part has a std of about 1.

    Users and items of the distinct (u, i) pairs are drawn with Zipf popularity
    ``1/k**zipf`` (k = popularity position, over a random permutation of the ids);
    every user gets at least ``min_user_ratings`` and every item ``min_item_ratings``
    (MovieLens guarantees 20 per user), and the count is exact. The format follows the
    extension: ``.csv`` → ``ratings.csv`` with header, ``.dat`` → ``::`` separated,
    else ``u.data`` (tabs). Raw ids are 1-based.

    Learnability: a fitted rank-r model's held-out MSE is about
    ``noise² · (1 + r·(users+items)/N_train)``, whatever the skew. The defaults give
    r·(U+I)/N_train ≈ 0.046: ALS reaches ≈ 1.02·noise and SGD ≈ 1.03·noise on a 90/10
    split (2000×1500×200k would stop near 1.11·noise).
    """
    if ratings > 0.5 * users * items:
        raise ValueError(f"{ratings} ratings is more than half of the {users}×{items} matrix")
    if min_user_ratings * users > ratings or min_item_ratings * items > ratings:
        raise ValueError("the minimum ratings per user/item exceed the number of ratings")
    if min_user_ratings > items or min_item_ratings > users:
        raise ValueError("a user (item) cannot have more ratings than there are items (users)")
    rng = np.random.default_rng(seed)
    user_p = _zipf_weights(users, zipf, rng)
    item_p = _zipf_weights(items, zipf, rng)

    keys = _sample_pairs(rng, user_p, item_p, ratings)
    keys = _top_up(rng, keys, user_p, item_p, min_user_ratings, by_user=True)
    keys = _top_up(rng, keys, item_p, user_p, min_item_ratings, by_user=False)
    keys = _trim(rng, keys, len(keys) - ratings, items, min_user_ratings, min_item_ratings)
    keys = rng.permutation(keys)  # file order is random, like u.data
    user, item = keys // items, keys % items

    bias_pairs = 2 if rank >= 3 else 0
    # Free component j contributes a product of std a·decay^j; the total interaction
    # variance stays SIGNAL² − biases², whatever the decay.
    product_std = spectrum_decay ** np.arange(rank, dtype=float)
    product_std[:bias_pairs] = 0.0
    product_std *= np.sqrt((SIGNAL_STD**2 - bias_pairs * BIAS_STD**2) / (product_std**2).sum())
    user_factors = rng.normal(0.0, 1.0, size=(users, rank)) * np.sqrt(product_std)
    item_factors = rng.normal(0.0, 1.0, size=(items, rank)) * np.sqrt(product_std)
    if bias_pairs:
        user_factors[:, 0], item_factors[:, 0] = rng.normal(0.0, BIAS_STD, users), 1.0
        user_factors[:, 1], item_factors[:, 1] = 1.0, rng.normal(0.0, BIAS_STD, items)
    signal = np.einsum("nk,nk->n", user_factors[user], item_factors[item])
    rating = mu + signal + rng.normal(0.0, noise, size=ratings)

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    suffix = out.suffix.lower()
    timestamp = 900_000_000 + np.arange(ratings)
    columns = [user + 1, item + 1, rating, timestamp]
    if suffix == ".csv":
        _write_rows(out, "userId,movieId,rating,timestamp", "%d,%d,%.6f,%d\n", columns)
        flavour = "csv"
    elif suffix == ".dat":
        _write_rows(out, None, "%d::%d::%.6f::%d\n", columns)
        flavour = "dat"
    else:
        _write_rows(out, None, "%d\t%d\t%.6f\t%d\n", columns)
        flavour = "tab"
    return _write_meta(out, {
        "kind": "ratings", "path": str(out), "flavour": flavour, "seed": seed,
        "users": users, "items": items, "ratings": ratings, "rank": rank, "noise": noise,
        "noise_floor_rmse": noise, "zipf": zipf, "spectrum_decay": spectrum_decay, "mu": mu,
        "min_user_ratings": min_user_ratings, "min_item_ratings": min_item_ratings,
        "signal_std": float(signal.std()), "rating_std": float(rating.std()),
    })  # fmt: skip


# ---------------------------------------------------------------------------- logistic


def _binary_entropy_of_logits(z: np.ndarray) -> np.ndarray:
    """H(sigmoid(z)) in nats, stable for large |z|."""
    return np.logaddexp(0.0, z) - _sigmoid(z) * z


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow, unlike 1 / (1 + exp(-z))


def _distinct_per_row(rng: np.random.Generator, rows: int, nnz: int, p: np.ndarray) -> np.ndarray:
    """``[rows, nnz]`` feature indices, distinct within each row, drawn by popularity ``p``."""
    if rows > _DRAW_ROWS:
        return np.concatenate([
            _distinct_per_row(rng, min(_DRAW_ROWS, rows - start), nnz, p) for start in range(0, rows, _DRAW_ROWS)
        ])  # fmt: skip
    out = np.empty((rows, nnz), dtype=np.int64)
    todo = np.arange(rows)
    while len(todo):
        draws = rng.choice(len(p), size=(len(todo), nnz + 4 + nnz // 4), p=p)
        # Mark later repeats of an index within a row, keep the first nnz distinct.
        order = np.argsort(draws, axis=1, kind="stable")
        ordered = np.take_along_axis(draws, order, axis=1)
        repeat = np.zeros_like(draws, dtype=bool)
        np.put_along_axis(repeat, order[:, 1:], ordered[:, 1:] == ordered[:, :-1], axis=1)
        distinct = ~repeat
        keep = distinct & (np.cumsum(distinct, axis=1, dtype=np.int32) <= nnz)
        done = keep.sum(axis=1) == nnz
        out[todo[done]] = draws[done][keep[done]].reshape(-1, nnz)
        todo = todo[~done]
    return out


def _weights(rng: np.random.Generator, count: int, scale: float, *, exact: bool) -> np.ndarray:
    """``count`` weights N(0, scale²); with ``exact`` their RMS is exactly ``scale``, so
    the Bayes log-loss does not wander with a few features."""
    weights = rng.normal(0.0, scale, size=count)
    if exact:
        weights *= scale / np.sqrt(np.mean(weights**2))
    return weights


def synth_logistic(
    out_path: str | os.PathLike,
    *,
    rows: int = 200_000,
    features: int | None = None,
    nnz: int = 20,
    seed: int = 0,
    weight_scale: float | None = None,
    bias: float = -0.5,
    zipf: float = 0.5,
) -> dict[str, Any]:
    """Binary classification rows with labels ~ Bernoulli(sigmoid(w*·x + bias)).

    ``.svm``/``.libsvm``/``.txt`` → sparse LibSVM: ``nnz`` distinct features per row
    (default 1000 features, Zipf popularity ``zipf``), values uniform in [0.1, 1],
    written 1-based — :class:`~ebb.data.readers.LibSVMReader` keeps indices as written,
    so ``weights[k]`` is the weight of written index ``k`` (``weights[0] = 0``).
    ``.csv`` → dense CSV (default 30 features N(0, 1), ``label`` first column), weights
    in raw feature space (prepare's min-max scaling: see :func:`prepared_weights`).

    ``w* ~ N(0, weight_scale²)``; by default the scale makes the margin std 2.0 (the
    weights are rescaled to that exact RMS), for a Bayes log-loss near 0.45. Writes
    ``<out>.weights.npy`` (float32) and the sidecar, whose ``bayes_logloss`` is the mean
    binary entropy of the true probabilities (the expected log-loss of the true model).
    """
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    dense = out.suffix.lower() == ".csv"
    if not dense and out.suffix.lower() not in (".svm", ".libsvm", ".txt"):
        raise ValueError(f"{out}: the extension must be .svm, .libsvm, .txt (LibSVM) or .csv (dense)")
    features = features or (30 if dense else 1000)
    rng = np.random.default_rng(seed)
    if dense:
        # Rounded as written, so the truth is computed on exactly what the reader sees.
        x = np.round(rng.normal(size=(rows, features)), 4)
        scale = weight_scale if weight_scale is not None else MARGIN_STD / np.sqrt(features)
        weights = _weights(rng, features, scale, exact=weight_scale is None)
        logits = x @ weights + bias
    else:
        if nnz > features:
            raise ValueError(f"nnz={nnz} exceeds features={features}")
        index = _distinct_per_row(rng, rows, nnz, _zipf_weights(features, zipf, rng)) + 1  # 1-based
        values = np.round(rng.uniform(0.1, 1.0, size=(rows, nnz)), 3)
        mean_square = (1.0**3 - 0.1**3) / (3 * 0.9)  # E[v²] for v ~ U(0.1, 1)
        scale = weight_scale if weight_scale is not None else MARGIN_STD / np.sqrt(nnz * mean_square)
        weights = np.zeros(features + 1)
        weights[1:] = _weights(rng, features, scale, exact=weight_scale is None)
        logits = (weights[index] * values).sum(axis=1) + bias
    labels = (rng.random(rows) < _sigmoid(logits)).astype(np.int64)

    if dense:
        header = ",".join(["label"] + [f"f{k}" for k in range(features)])
        _write_rows(out, header, "%d" + ",%.4f" * features + "\n", [labels] + list(x.T))
    else:
        pairs = " %d:%.3f" * nnz
        columns = [labels] + [c for k in range(nnz) for c in (index[:, k], values[:, k])]
        _write_rows(out, None, "%d" + pairs + "\n", columns)
    weights_file = Path(f"{out}.weights.npy").resolve()
    np.save(weights_file, weights.astype(np.float32))
    return _write_meta(out, {
        "kind": "dense" if dense else "sparse", "path": str(out), "seed": seed, "rows": rows,
        "features": features, "nnz": features if dense else nnz, "bias": bias,
        "weight_scale": float(scale), "zipf": None if dense else zipf,
        "label_mean": float(labels.mean()),
        "bayes_logloss": float(_binary_entropy_of_logits(logits).mean()),
        "weights_file": str(weights_file),
        "index_base": 0 if dense else 1,
    })  # fmt: skip


def prepared_weights(manifest: Manifest, weights: np.ndarray, bias: float) -> tuple[np.ndarray, float]:
    """The true model expressed on prepared features (``num_features`` long).

    Dense CSV features are min-max scaled by prepare, ``x = lo + x'·(hi - lo)``, so
    ``w·x + b = (w·(hi - lo))·x' + (b + w·lo)``. Sparse indices are kept as written.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if manifest.kind == "dense":
        scaling = manifest.source["scaling"]
        lo = np.array([0.0 if v is None else v for v in scaling["min"]])
        hi = np.array([0.0 if v is None else v for v in scaling["max"]])
        return weights * (hi - lo), float(bias + weights @ lo)
    sized = np.zeros(max(manifest.num_features, len(weights)))
    sized[: len(weights)] = weights
    return sized, float(bias)


def bayes_logloss_on(arrays_list: Iterable[dict[str, np.ndarray]], weights: np.ndarray, bias: float) -> float:
    """Mean log-loss (BCE against the actual labels) of the true model on prepared
    sparse or dense batches; use :func:`prepared_weights` for weights that fit them."""
    weights = np.asarray(weights, dtype=np.float64)
    total, count = 0.0, 0
    for arrays in arrays_list:
        label = arrays["label"].astype(np.float64)
        if "x" in arrays:
            logits = arrays["x"].astype(np.float64) @ weights + bias
        else:
            row = np.repeat(np.arange(len(label)), np.diff(arrays["indptr"]))
            contributions = weights[arrays["indices"]] * arrays["values"].astype(np.float64)
            logits = np.bincount(row, weights=contributions, minlength=len(label)) + bias
        # -[y log p + (1-y) log(1-p)] = log(1 + e^z) - y z, computed stably.
        total += float((np.logaddexp(0.0, logits) - label * logits).sum())
        count += len(label)
    if not count:
        raise ValueError("no rows")
    return total / count
