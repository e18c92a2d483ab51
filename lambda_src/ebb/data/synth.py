"""Seeded synthetic datasets with planted structure, written in the real input formats.

The truth is known, so a trained model can be compared with the best achievable:
ratings have an exact noise floor (RMSE = ``noise``), logistic data a Bayes log-loss.
Every generator writes the data file, a sidecar ``<out>.meta.json`` describing it, and
returns that description.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ebb.ports.manifest import Manifest

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


# ------------------------------------------------------------- ratings shaped like real ones


@dataclass(frozen=True)
class RatingsPreset:
    """The shape of a public MovieLens file, as documented (the files are never fetched).

    ``user_quantiles``/``item_quantiles`` are ``(p, count)`` points of the ratings-per-
    user/item distribution (the first is the minimum at p = 0, the last the maximum at
    the top user's/item's mid-rank ``1 - 0.5/n``); the generated counts pass through
    them, and a further point at ``p = 0.95`` is solved so they sum to ``ratings``.
    """

    users: int
    items: int
    ratings: int
    step: float  # 1.0: integer stars 1–5; 0.5: half stars 0.5–5
    user_quantiles: tuple[tuple[float, float], ...]
    item_quantiles: tuple[tuple[float, float], ...]
    rating_mean: float  # of the real file: the planted μ is solved to reproduce it
    rating_std: float  # of the real file: ``noise`` was chosen to come within 0.04 of it
    noise: float
    whole_star_share: float = 0.0  # half-star scale: share of ratings by users who rate whole stars only
    # The irregularities of real raters (all off in the documented-shape presets; on in the
    # "-wild" ones): the planted rank and how fast its spectrum falls off (a slower fall-off
    # leaves more of the interaction out of a rank-20 model's reach) ...
    rank: int = 10
    spectrum_decay: float = SPECTRUM_DECAY
    # ... each user's own noise σ_u = noise · e^{s·z − s²/2}, z ~ N(0, 1) (some raters are
    # consistent, others not; the mean σ stays ``noise``) ...
    noise_spread: float = 0.0
    # ... the correlation of a user's bias with the log of their count (negative: the heavy
    # raters are the harsh ones) ...
    activity_bias_corr: float = 0.0
    # ... and rarely rated items' biases spread wider: std × (1 + boost · e^{−(count − 1)/3})
    # (the obscure film is loved or loathed by its few raters, which training barely sees).
    rare_item_bias_boost: float = 0.0

    @property
    def lowest(self) -> float:
        return self.step if self.step < 1 else 1.0


# Sources: the GroupLens READMEs (counts, scales, ≥ 20 ratings per user), the per-user
# and per-item count summaries widely published for ml-100k and ml-latest-small
# (quartiles, maxima, means; 3,446 of ml-latest-small's 9,724 items rated once), KONECT
# (ML-10M means 143.1 per user and 936.6 per item, maxima 7,359 and 34,864) and the
# LensKit data descriptions (ML-10M: users' counts ≈ 18.5 + 48.8·e^{1.60 Z}, items'
# ≈ 0.7 + 140·e^{2.12 Z}, Z standard normal, whose quantiles are used here); the rating
# histograms give each file's mean and std.
RATING_PRESETS: dict[str, RatingsPreset] = {
    # 943 users × 1,682 items, 100,000 ratings 1–5 (6 / 11 / 27 / 34 / 21 %; mean 3.53,
    # std 1.13). Per user: 20, 33, 65, 148 at the quartiles, 737 max, mean 106. Per item:
    # 1, 6, 27, 80, 583 max, mean 59.5; about 140 items (8 %) rated once.
    "ml-100k": RatingsPreset(
        users=943,
        items=1682,
        ratings=100_000,
        step=1.0,
        user_quantiles=((0.0, 20), (0.25, 33), (0.5, 65), (0.75, 148), (1 - 0.5 / 943, 737)),
        item_quantiles=((0.0, 1), (0.084, 1.5), (0.25, 6), (0.5, 27), (0.75, 80), (1 - 0.5 / 1682, 583)),
        rating_mean=3.530,
        rating_std=1.126,
        noise=0.85,
    ),
    # 610 users × 9,724 items, 100,836 half-star ratings (mean 3.50, std 1.04; 30 % on a
    # half star, 4.0 the most common value). Per user: 20, 35, 70.5, 168, 2,698 max, mean
    # 165. Per item: 1, 1, 3, 9, 329 max, mean 10.4: 35 % of items rated once.
    "ml-latest-small": RatingsPreset(
        users=610,
        items=9724,
        ratings=100_836,
        step=0.5,
        user_quantiles=((0.0, 20), (0.25, 35), (0.5, 70.5), (0.75, 168), (1 - 0.5 / 610, 2698)),
        item_quantiles=((0.0, 1), (0.354, 1.5), (0.5, 3), (0.75, 9), (1 - 0.5 / 9724, 329)),
        rating_mean=3.502,
        rating_std=1.043,
        noise=0.72,
        whole_star_share=0.35,
    ),
    # 69,878 users × 10,677 items, 10,000,054 half-star ratings (mean 3.51, std 1.06; 20 %
    # on a half star: half stars came in 2003, earlier users rated whole stars). Per user:
    # 20 min, quartiles ≈ 35, 67, 162, 7,359 max, mean 143. Per item: 1 min, 5 and 10 at
    # the 5th and 10th percentiles (about 1 % rated once), quartiles ≈ 34, 141, 586,
    # 34,864 max, mean 937.
    "ml-10m": RatingsPreset(
        users=69_878,
        items=10_677,
        ratings=10_000_054,
        step=0.5,
        user_quantiles=((0.0, 20), (0.25, 35), (0.5, 67), (0.75, 162), (1 - 0.5 / 69_878, 7359)),
        item_quantiles=(
            (0.0, 1),
            (0.05, 5),
            (0.1, 10),
            (0.25, 34),
            (0.5, 141),
            (0.75, 586),
            (1 - 0.5 / 10_677, 34_864),
        ),
        rating_mean=3.512,
        rating_std=1.060,
        noise=0.72,
        whole_star_share=0.55,
    ),
}
# The same counts and scales with real raters' irregularities (see RatingsPreset): what the
# documented shapes alone do not show, and what defaults must also hold on. ml-latest-small's
# item tail is pinned a little further (57 % of items rated at most 3 times, as in the file).
_WILD = dict(rank=30, spectrum_decay=0.85, noise_spread=0.4, activity_bias_corr=-0.3, rare_item_bias_boost=1.0)
# σ a little lower than the tame presets': the spread of σ_u widens the tails, and the
# wild presets keep the files' histograms (0.5–1.5 stars under 6 % of ml-latest-small).
RATING_PRESETS["ml-100k-wild"] = replace(RATING_PRESETS["ml-100k"], noise=0.82, **_WILD)
RATING_PRESETS["ml-latest-small-wild"] = replace(
    RATING_PRESETS["ml-latest-small"],
    noise=0.68,
    item_quantiles=((0.0, 1), (0.354, 1.5), (0.57, 3.45), (0.75, 9), (1 - 0.5 / 9724, 329)),
    **_WILD,
)
_TAIL_P = 0.95  # where the solved point of the count distribution sits
HIGHEST_RATING = 5.0
# Planted structure of the shaped generator (rating units): a user's and an item's bias,
# a rank-r interaction, and popular items rated higher, as in MovieLens.
USER_BIAS_STD = 0.45
ITEM_BIAS_STD = 0.55
INTERACTION_STD = 0.45
POPULARITY_BIAS_CORR = 0.3
BIAS_SKEW_SHAPE = 2.0


def _quantile_counts(n: int, points: list[tuple[float, float]]) -> np.ndarray:
    """Counts at the mid-ranks ``(k + ½)/n`` of a distribution through ``points``: log
    count linear in ``-log(1 - p)`` between them (a Pareto tail is a straight line there)."""
    p = (np.arange(n) + 0.5) / n
    at = -np.log1p(-np.array([q for q, _ in points]))
    return np.exp(np.interp(-np.log1p(-p), at, np.log([c for _, c in points])))


def _degree_sequence(n: int, quantiles, total: int, cap: int, rng: np.random.Generator, what: str) -> np.ndarray:
    """``n`` integer counts through the ``quantiles`` points that sum to ``total``, none
    above ``cap``, in random order. A point at p = 0.95 is solved for the sum; when the
    points cannot reach it (a scaled-down shape), the counts above the minimum are scaled."""
    points = [(p, c) for p, c in quantiles]
    minimum = points[0][1]
    if not minimum * n <= total <= cap * n:
        raise ValueError(
            f"{total} ratings cannot be spread over {n} {what} with at least {minimum:g} and at most "
            f"{cap} each: change the number of ratings, users or items"
        )
    below = [pt for pt in points if pt[0] < _TAIL_P]
    above = [pt for pt in points if pt[0] > _TAIL_P]

    def counts_with_tail(log_value: float) -> np.ndarray:
        pts = below + [(_TAIL_P, float(np.exp(log_value)))] + above
        return np.minimum(_quantile_counts(n, pts), cap)

    low, high = np.log(below[-1][1]), np.log(above[0][1]) if above else np.log(cap)
    if counts_with_tail(low).sum() <= total <= counts_with_tail(high).sum():
        for _ in range(60):
            mid = 0.5 * (low + high)
            low, high = (mid, high) if counts_with_tail(mid).sum() < total else (low, mid)
        counts = counts_with_tail(0.5 * (low + high))
    else:
        base = _quantile_counts(n, points)
        lo_scale, hi_scale = 0.0, 1.0
        while np.minimum(minimum + hi_scale * (base - minimum), cap).sum() < total:
            hi_scale *= 2
        for _ in range(60):
            mid = 0.5 * (lo_scale + hi_scale)
            if np.minimum(minimum + mid * (base - minimum), cap).sum() < total:
                lo_scale = mid
            else:
                hi_scale = mid
        counts = np.minimum(minimum + hi_scale * (base - minimum), cap)
    # Rounded, and the sum made exact at the top of the distribution (a few counts ±1
    # there), so the low end — how many are rated once — stays as planted.
    whole = np.floor(counts + 0.5).astype(np.int64)
    while (missing := total - int(whole.sum())) != 0:
        movable = np.flatnonzero(whole < cap) if missing > 0 else np.flatnonzero(whole > minimum)
        top = movable[np.argsort(-whole[movable], kind="stable")[: abs(missing)]]
        whole[top] += 1 if missing > 0 else -1
    return rng.permutation(whole)


def _bipartite(
    user_degree: np.ndarray, item_degree: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (user, item) pairs with exactly these counts on both sides.

    Items take their raters in decreasing order of count; each draws its users without
    replacement with weights the odds ``f / (1 - f)`` of ``f`` = the user's remaining
    quota over the items left (sequential conditional-Poisson sampling), and a user whose
    quota equals the items left is taken by each of them. Every user then ends at their
    quota, and the pairs are as random as the two count sequences allow.
    """
    quota = user_degree.astype(np.int64).copy()
    users_out, items_out = [], []
    left = len(item_degree)
    for item in np.argsort(-item_degree, kind="stable").tolist():
        need = int(item_degree[item])
        active = np.flatnonzero(quota)
        share = quota[active] / left
        forced = share >= 1.0
        free = active[~forced]
        k = need - int(forced.sum())
        if k < 0 or k > len(free):
            raise ValueError("these per-user and per-item counts admit no set of distinct pairs")
        if k:
            f = share[~forced]
            keys = np.log(f) - np.log1p(-f) + rng.gumbel(size=len(free))
            chosen = np.concatenate([active[forced], free[np.argpartition(-keys, k - 1)[:k]]])
        else:
            chosen = active[forced]
        quota[chosen] -= 1
        users_out.append(chosen)
        items_out.append(np.full(len(chosen), item, dtype=np.int64))
        left -= 1
    return np.concatenate(users_out), np.concatenate(items_out)


def _rounded(latent: np.ndarray, step: np.ndarray, lowest: np.ndarray) -> np.ndarray:
    """Ratings as users enter them: the nearest star (or half star), within the scale."""
    return np.clip(np.floor(latent / step + 0.5) * step, lowest, HIGHEST_RATING)


def _rating_moments(
    mean: np.ndarray, noise: float | np.ndarray, step: np.ndarray, lowest: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """E and Var of the entered rating given its planted mean, exactly (normal CDFs)."""
    from scipy.special import ndtr

    first, second = np.zeros_like(mean), np.zeros_like(mean)
    for value in np.arange(0.5, HIGHEST_RATING + 0.25, 0.5):
        # P(rounded to `value`) for users of each step; values off a user's grid get 0.
        lower = np.where(np.isclose(value, lowest), -np.inf, value - step / 2)
        upper = np.where(np.isclose(value, HIGHEST_RATING), np.inf, value + step / 2)
        on_grid = (value >= lowest - 1e-9) & np.isclose(np.round(value / step) * step, value)
        prob = np.where(on_grid, ndtr((upper - mean) / noise) - ndtr((lower - mean) / noise), 0.0)
        first += prob * value
        second += prob * value**2
    return first, second - first**2


def synth_shaped_ratings(
    out_path: str | os.PathLike,
    *,
    preset: str = "ml-latest-small",
    users: int | None = None,
    items: int | None = None,
    ratings: int | None = None,
    rank: int | None = None,
    noise: float | None = None,
    spectrum_decay: float | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Ratings shaped like a public MovieLens file (``preset``), with planted structure.

    The real files (shapes in :data:`RATING_PRESETS`) are sparse in a way the planted
    generator (:func:`synth_ratings`) is not: every user has at least 20 ratings and a
    few have thousands (users' counts are heavy-tailed: the median user rates 65–70, the
    mean is 1.6–2.4× that); items' counts have a long tail (ml-latest-small: 35 % of items
    rated once, median 3; ml-100k: median 27, 8 % rated once; ML-10M: median ≈ 140, the
    top item rated by half the users). Ratings are whole stars 1–5 (ml-100k) or half
    stars 0.5–5, where a whole star is far more common than a half one (30 % half stars
    in ml-latest-small, 20 % in ML-10M: a share of the users rate whole stars only).

    Here the per-user and per-item counts pass through the documented quantiles and sum
    exactly to ``ratings``; the pairs are drawn with exactly those counts
    (:func:`_bipartite`). Each rating is ``μ + b_u + b_i + U_u·V_i + N(0, noise²)``,
    rounded to the user's step and clipped to the scale: biases of std 0.45 (users) and
    0.55 (items, correlated 0.3 with the log of the item's count: popular items are rated
    higher), both skewed to the left (the harsh rater, the bad film), and a rank-``rank``
    interaction of std 0.45 whose components fall off by ``spectrum_decay``; μ is solved
    so the mean rating is the real file's. The best any model can do is to predict each
    rating's expected value given the planted mean: the sidecar's ``noise_floor_rmse`` is
    that predictor's RMSE on the generated ratings (``expected_floor_rmse`` its
    expectation), and ``shape`` the realised counts and rating histogram.

    ``users``/``items``/``ratings`` rescale the shape (counts above the minimum scaled
    so that they sum to ``ratings``). The format follows the extension, as for
    :func:`synth_ratings`; raw ids are 1-based.
    """
    if preset not in RATING_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {sorted(RATING_PRESETS)}")
    shape = RATING_PRESETS[preset]
    users, items, ratings = users or shape.users, items or shape.items, ratings or shape.ratings
    noise = shape.noise if noise is None else noise
    rank = shape.rank if rank is None else rank
    spectrum_decay = shape.spectrum_decay if spectrum_decay is None else spectrum_decay
    if ratings > 0.5 * users * items:
        raise ValueError(f"{ratings} ratings is more than half of the {users}×{items} matrix")
    rng = np.random.default_rng(seed)
    # Rescaled counts keep the shape: every point above the minimum moves with the mean.
    user_points = _rescaled(shape.user_quantiles, ratings / users, shape.ratings / shape.users)
    item_points = _rescaled(shape.item_quantiles, ratings / items, shape.ratings / shape.items)
    # The busiest user (item) covers the same share of the items (users) as in the real file.
    user_cap = min(items, max(20, round(shape.user_quantiles[-1][1] / shape.items * items)))
    item_cap = min(users, max(1, round(shape.item_quantiles[-1][1] / shape.users * users)))
    user_degree = _degree_sequence(users, user_points, ratings, user_cap, rng, "users")
    item_degree = _degree_sequence(items, item_points, ratings, item_cap, rng, "items")
    user, item = _bipartite(user_degree, item_degree, rng)
    order = rng.permutation(ratings)  # file order is random, like u.data
    user, item = user[order], item[order]

    # Planted structure.
    user_bias = USER_BIAS_STD * _left_skewed(rng, users)
    log_count = np.log(item_degree)
    popularity = (log_count - log_count.mean()) / max(log_count.std(), 1e-12)
    item_bias = ITEM_BIAS_STD * (
        POPULARITY_BIAS_CORR * popularity + np.sqrt(1 - POPULARITY_BIAS_CORR**2) * _left_skewed(rng, items)
    )
    if shape.activity_bias_corr:
        log_activity = np.log(user_degree)
        activity = (log_activity - log_activity.mean()) / max(log_activity.std(), 1e-12)
        c = shape.activity_bias_corr
        user_bias = c * USER_BIAS_STD * activity + np.sqrt(1 - c**2) * user_bias
    if shape.rare_item_bias_boost:
        item_bias = item_bias * (1 + shape.rare_item_bias_boost * np.exp(-(item_degree - 1) / 3.0))
    product_std = spectrum_decay ** np.arange(rank, dtype=float)
    product_std *= INTERACTION_STD**2 / product_std.sum()  # variances of the components
    user_factors = rng.normal(0.0, 1.0, (users, rank)) * product_std**0.25
    item_factors = rng.normal(0.0, 1.0, (items, rank)) * product_std**0.25
    signal = user_bias[user] + item_bias[item] + np.einsum("nk,nk->n", user_factors[user], item_factors[item])
    # Who rates in whole stars: a random set of users holding whole_star_share of the ratings.
    whole_star = np.zeros(users, dtype=bool)
    if shape.step < 1:
        by_user = rng.permutation(users)
        whole_star[by_user[np.cumsum(user_degree[by_user]) <= shape.whole_star_share * ratings]] = True
    step = np.where(whole_star[user] | (shape.step >= 1), 1.0, 0.5)
    lowest = np.where(step >= 1, 1.0, 0.5)
    # One σ per user (all ``noise`` unless the preset spreads them), drawn after the rest so
    # the presets without a spread generate what they always did.
    user_noise = np.full(users, noise)
    if shape.noise_spread:
        s = shape.noise_spread
        user_noise = noise * np.exp(s * rng.normal(size=users) - s * s / 2)
    noise_draw = rng.normal(0.0, 1.0, ratings) * user_noise[user]
    mu = _solve_mu(signal, noise_draw, step, lowest, shape.rating_mean)
    mean = mu + signal
    rating = _rounded(mean + noise_draw, step, lowest)
    expected, variance = _rating_moments(mean, user_noise[user], step, lowest)

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    suffix = out.suffix.lower()
    timestamp = 900_000_000 + np.arange(ratings)
    value = "%d" if shape.step >= 1 else ("%.1f" if suffix == ".csv" else "%g")
    columns = [user + 1, item + 1, rating, timestamp]
    if suffix == ".csv":
        _write_rows(out, "userId,movieId,rating,timestamp", f"%d,%d,{value},%d\n", columns)
        flavour = "csv"
    elif suffix == ".dat":
        _write_rows(out, None, f"%d::%d::{value}::%d\n", columns)
        flavour = "dat"
    else:
        _write_rows(out, None, f"%d\t%d\t{value}\t%d\n", columns)
        flavour = "tab"
    user_count, item_count = np.bincount(user, minlength=users), np.bincount(item, minlength=items)
    return _write_meta(out, {
        "kind": "ratings", "profile": "shaped", "preset": preset, "path": str(out), "flavour": flavour,
        "seed": seed, "users": users, "items": items, "ratings": ratings,
        "scale": {"lowest": shape.lowest, "highest": HIGHEST_RATING, "step": shape.step},
        "whole_star_share": shape.whole_star_share if shape.step < 1 else 1.0,
        "rank": rank, "noise": noise, "spectrum_decay": spectrum_decay, "mu": mu,
        "noise_spread": shape.noise_spread, "activity_bias_corr": shape.activity_bias_corr,
        "rare_item_bias_boost": shape.rare_item_bias_boost,
        "user_bias_std": USER_BIAS_STD, "item_bias_std": ITEM_BIAS_STD, "interaction_std": INTERACTION_STD,
        "popularity_bias_corr": POPULARITY_BIAS_CORR,
        # The RMSE of the best possible predictor, E[rating | planted mean]; and of the
        # planted mean itself (what a model that ignores the rounding and clipping aims at).
        "noise_floor_rmse": float(np.sqrt(np.mean((rating - expected) ** 2))),
        "expected_floor_rmse": float(np.sqrt(variance.mean())),
        "planted_mean_rmse": float(np.sqrt(np.mean((rating - mean) ** 2))),
        "signal_std": float(signal.std()),
        "shape": _shape_summary(user_count, item_count, rating),
        "target": {"rating_mean": shape.rating_mean, "rating_std": shape.rating_std,
                   "user_quantiles": [list(q) for q in user_points], "item_quantiles": [list(q) for q in item_points]},
    })  # fmt: skip


def _left_skewed(rng: np.random.Generator, count: int) -> np.ndarray:
    """Mean 0, std 1, skewness ``-2/sqrt(BIAS_SKEW_SHAPE)``: a mirrored standardised gamma.
    Real users and items have a long tail of low means (the harsh rater, the bad film)."""
    draw = rng.gamma(BIAS_SKEW_SHAPE, 1.0, count)
    return (BIAS_SKEW_SHAPE - draw) / np.sqrt(BIAS_SKEW_SHAPE)


def _rescaled(points, mean: float, preset_mean: float) -> list[tuple[float, float]]:
    """Quantile points whose counts above the minimum are scaled by the ratio of the means."""
    minimum = points[0][1]
    ratio = (mean - minimum) / (preset_mean - minimum)
    return [(p, c if i == 0 else minimum + ratio * (c - minimum)) for i, (p, c) in enumerate(points)]


def _solve_mu(signal, noise_draw, step, lowest, target_mean: float) -> float:
    """μ such that the mean entered rating is ``target_mean`` (bisection on a sample)."""
    sample = slice(0, min(len(signal), 200_000))
    low, high = target_mean - 3.0, target_mean + 3.0
    for _ in range(40):
        mid = 0.5 * (low + high)
        mean = _rounded(mid + signal[sample] + noise_draw[sample], step[sample], lowest[sample]).mean()
        low, high = (mid, high) if mean < target_mean else (low, mid)
    return float(0.5 * (low + high))


def _shape_summary(user_count: np.ndarray, item_count: np.ndarray, rating: np.ndarray) -> dict[str, Any]:
    """The realised shape: counts per user and item, and the rating histogram."""

    def counts(c):
        q = np.percentile(c, [25, 50, 75])
        return {"min": int(c.min()), "q1": float(q[0]), "median": float(q[1]), "q3": float(q[2]),
                "max": int(c.max()), "mean": float(c.mean()),
                "share_1": float(np.mean(c == 1)), "share_le_2": float(np.mean(c <= 2)),
                "share_le_5": float(np.mean(c <= 5))}  # fmt: skip

    values, hist = np.unique(rating, return_counts=True)
    return {
        "per_user": counts(user_count),
        "per_item": counts(item_count),
        "rating_mean": float(rating.mean()),
        "rating_std": float(rating.std()),
        "half_star_share": float(np.mean(rating % 1 != 0)),
        "histogram": {f"{v:g}": round(float(h) / len(rating), 4) for v, h in zip(values, hist)},
    }


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
