"""Synthetic data: reproducible, planted structure as documented, readable by the real readers."""

import json

import numpy as np
import pytest

from ebb.data.prepare import iter_parts, prepare_dataset
from ebb.data.readers import LibSVMReader, MovieLensReader
from ebb.data.synth import bayes_logloss_on, prepared_weights, synth_logistic, synth_ratings, synth_shaped_ratings
from ebb.stores.local import FolderObjectStore

SMALL = dict(users=300, items=200, ratings=24_000, rank=4)


def read_ratings(path):
    chunks = list(MovieLensReader(path))
    return [np.concatenate([c[name] for c in chunks]) for name in ("user", "item", "rating")]


def test_synth_ratings_is_reproducible(tmp_path):
    meta = synth_ratings(tmp_path / "a.data", seed=5, **SMALL)
    synth_ratings(tmp_path / "b.data", seed=5, **SMALL)
    synth_ratings(tmp_path / "c.data", seed=6, **SMALL)
    assert (tmp_path / "a.data").read_bytes() == (tmp_path / "b.data").read_bytes()
    assert (tmp_path / "a.data").read_bytes() != (tmp_path / "c.data").read_bytes()
    assert json.loads((tmp_path / "a.data.meta.json").read_text()) == meta
    assert meta["kind"] == "ratings" and meta["noise_floor_rmse"] == meta["noise"] == 0.5


def test_synth_ratings_planted_statistics(tmp_path):
    meta = synth_ratings(tmp_path / "u.data", users=500, items=400, ratings=60_000, seed=1)
    user, item, rating = read_ratings(tmp_path / "u.data")
    assert len(rating) == 60_000
    assert len(np.unique(user * 10_000 + item)) == 60_000  # distinct (u, i) pairs
    user_counts, item_counts = np.bincount(user)[1:], np.bincount(item)[1:]  # raw ids are 1-based
    assert len(user_counts) == 500 and user_counts.min() >= meta["min_user_ratings"] == 20
    assert len(item_counts) == 400 and item_counts.min() >= meta["min_item_ratings"] == 10
    # Zipf popularity: the busiest 10 % of users hold far more than 10 % of the ratings.
    assert np.sort(user_counts)[-50:].sum() > 0.2 * 60_000
    # Total std = sqrt(signal² + noise²), signal std ≈ 1; not clipped, not rounded to stars.
    assert meta["signal_std"] == pytest.approx(1.0, abs=0.15)
    assert rating.std() == pytest.approx(np.hypot(meta["signal_std"], 0.5), abs=0.01)
    assert rating.mean() == pytest.approx(3.5, abs=0.15)
    assert rating.min() < 0.5 and rating.max() > 5.5
    assert len(np.unique(rating)) > 50_000


@pytest.mark.parametrize("name", ["ratings.csv", "ratings.dat", "u.data"])
def test_synth_ratings_formats_hold_the_same_data(tmp_path, name):
    meta = synth_ratings(tmp_path / name, seed=2, **SMALL)
    reference = synth_ratings(tmp_path / "ref.data", seed=2, **SMALL)
    assert meta["flavour"] == {"ratings.csv": "csv", "ratings.dat": "dat", "u.data": "tab"}[name]
    for got, want in zip(read_ratings(tmp_path / name), read_ratings(tmp_path / "ref.data")):
        assert np.array_equal(got, want)
    assert meta["signal_std"] == reference["signal_std"]


def als_test_rmse(store, manifest, rank, iterations=12, lam=0.01):
    """Alternating least squares on the prepared train split; RMSE on the test split."""

    def load(split):
        parts = list(iter_parts(store, manifest, split))
        return [np.concatenate([p[name] for p in parts]).astype(np.int64 if name != "rating" else np.float64)
                for name in ("user", "item", "rating")]  # fmt: skip

    user, item, rating = load("train")
    mu = rating.mean()
    rng = np.random.default_rng(0)
    factors = {"u": rng.normal(0, 0.1, (manifest.num_users, rank)), "i": rng.normal(0, 0.1, (manifest.num_items, rank))}

    def solve(owner, other, other_factors, n):
        gram = np.zeros((n, rank, rank))
        rhs = np.zeros((n, rank))
        f = other_factors[other]
        np.add.at(gram, owner, f[:, :, None] * f[:, None, :])
        np.add.at(rhs, owner, f * (rating - mu)[:, None])
        gram += lam * np.maximum(np.bincount(owner, minlength=n), 1)[:, None, None] * np.eye(rank)
        return np.linalg.solve(gram, rhs[:, :, None])[:, :, 0]

    for _ in range(iterations):
        factors["u"] = solve(user, item, factors["i"], manifest.num_users)
        factors["i"] = solve(item, user, factors["u"], manifest.num_items)
    test_user, test_item, test_rating = load("test")
    prediction = mu + np.einsum("nk,nk->n", factors["u"][test_user], factors["i"][test_item])
    return float(np.sqrt(np.mean((prediction - test_rating) ** 2)))


def test_planted_rank_model_reaches_the_noise_floor(tmp_path):
    """A rank-r fit of rank-r data approaches sigma on held-out ratings, and cannot beat it."""
    meta = synth_ratings(tmp_path / "u.data", users=400, items=250, ratings=45_000, rank=4, noise=0.5, seed=3)
    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset("movielens", tmp_path / "u.data", store, batch_size=10_000, val_fraction=0.0)
    rmse = als_test_rmse(store, manifest, rank=4)
    # σ²·r·(users+items)/N_train ≈ 0.064 σ² of estimation error: ≈ 1.03 σ expected
    # (1.01–1.035 σ over seeds 0–7); the test RMSE of 4500 ratings has se ≈ 0.01 σ.
    assert 0.95 * meta["noise"] < rmse < 1.07 * meta["noise"]


def test_synth_logistic_libsvm_round_trips_to_the_bayes_logloss(tmp_path):
    path = tmp_path / "train.svm"
    meta = synth_logistic(path, rows=20_000, features=300, nnz=10, seed=4)
    assert meta["kind"] == "sparse" and 0.4 <= meta["bayes_logloss"] <= 0.55
    weights = np.load(meta["weights_file"])
    assert weights.dtype == np.float32 and weights.shape == (301,) and weights[0] == 0.0
    reader = LibSVMReader(path)
    chunks = list(reader)
    assert all(np.array_equal(np.diff(c["indptr"]), np.full(len(c["label"]), 10)) for c in chunks)
    assert 1 <= min(c["indices"].min() for c in chunks) and reader.num_features <= 301

    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset("libsvm", path, store, batch_size=4096, val_fraction=0.0)
    w, b = prepared_weights(manifest, weights, meta["bias"])
    everything = [a for split in ("train", "test") for a in iter_parts(store, manifest, split)]
    # Realised BCE of the true model ≈ its expected value (the mean entropy): se ≈ 0.004.
    assert bayes_logloss_on(everything, w, b) == pytest.approx(meta["bayes_logloss"], abs=0.015)
    test_loss = bayes_logloss_on(iter_parts(store, manifest, "test"), w, b)
    assert test_loss == pytest.approx(meta["bayes_logloss"], abs=0.04)
    # Any misalignment of indices destroys the signal: the check above is not vacuous.
    assert bayes_logloss_on(everything, np.roll(w, 1), b) > meta["bayes_logloss"] + 0.15


def test_synth_logistic_dense_csv_through_minmax_scaling(tmp_path):
    path = tmp_path / "train.csv"
    meta = synth_logistic(path, rows=20_000, seed=5)
    assert meta["kind"] == "dense" and meta["features"] == 30
    assert 0.4 <= meta["bayes_logloss"] <= 0.55
    store = FolderObjectStore(tmp_path / "store")
    manifest = prepare_dataset("csv", path, store, batch_size=4096, val_fraction=0.0)
    assert manifest.num_features == 30
    w, b = prepared_weights(manifest, np.load(meta["weights_file"]), meta["bias"])
    everything = [a for split in ("train", "test") for a in iter_parts(store, manifest, split)]
    assert bayes_logloss_on(everything, w, b) == pytest.approx(meta["bayes_logloss"], abs=0.015)
    # Raw-space weights on scaled features would be wrong: the rescale matters.
    raw = np.load(meta["weights_file"]).astype(np.float64)
    assert bayes_logloss_on(everything, raw, meta["bias"]) > meta["bayes_logloss"] + 0.05


def test_synth_logistic_is_reproducible(tmp_path):
    first = synth_logistic(tmp_path / "a.svm", rows=2000, seed=9)
    synth_logistic(tmp_path / "b.svm", rows=2000, seed=9)
    assert (tmp_path / "a.svm").read_bytes() == (tmp_path / "b.svm").read_bytes()
    assert np.array_equal(np.load(tmp_path / "a.svm.weights.npy"), np.load(tmp_path / "b.svm.weights.npy"))
    assert json.loads((tmp_path / "a.svm.meta.json").read_text()) == first
    synth_logistic(tmp_path / "c.svm", rows=2000, seed=10)
    assert (tmp_path / "a.svm").read_bytes() != (tmp_path / "c.svm").read_bytes()


# ---------------------------------------------------------------- shaped like real files
# The documented shapes (see RATING_PRESETS): counts exact, every user ≥ 20 ratings,
# quartiles of ratings per user and item within 5 % (or 1 rating), the share of items
# rated once within 2 points, the scale and its step exact, mean rating within 0.02 and
# its std within 0.05 of the real file's.
REAL_SHAPES = {
    "ml-100k": {
        "users": 943,
        "items": 1682,
        "ratings": 100_000,
        "user_q": (33, 65, 148),
        "user_max": 737,
        "item_q": (6, 27, 80),
        "item_max": 583,
        "rated_once": 0.084,
        "values": [1, 2, 3, 4, 5],
        "half_star_share": 0.0,
        "mean": 3.53,
        "std": 1.126,
    },
    "ml-latest-small": {
        "users": 610,
        "items": 9724,
        "ratings": 100_836,
        "user_q": (35, 70.5, 168),
        "user_max": 2698,
        "item_q": (1, 3, 9),
        "item_max": 329,
        "rated_once": 0.354,
        "values": [0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5],
        "half_star_share": 0.301,
        "mean": 3.502,
        "std": 1.043,
    },
}


@pytest.mark.parametrize("preset, name", [("ml-100k", "u.data"), ("ml-latest-small", "ratings.csv")])
def test_shaped_presets_match_the_real_files(tmp_path, preset, name):
    real = REAL_SHAPES[preset]
    meta = synth_shaped_ratings(tmp_path / name, preset=preset, seed=0)
    user, item, rating = read_ratings(tmp_path / name)
    assert len(rating) == real["ratings"] and len(np.unique(user * 100_000 + item)) == real["ratings"]
    user_counts, item_counts = np.bincount(user)[1:], np.bincount(item)[1:]  # raw ids are 1-based
    assert len(user_counts) == real["users"] and len(item_counts) == real["items"]
    assert user_counts.min() == 20 and item_counts.min() == 1
    for counts, quartiles, top in (
        (user_counts, real["user_q"], real["user_max"]),
        (item_counts, real["item_q"], real["item_max"]),
    ):
        for got, want in zip(np.percentile(counts, [25, 50, 75]), quartiles):
            assert abs(got - want) <= max(1, 0.05 * want), (got, want)
        assert counts.max() == pytest.approx(top, rel=0.05)
    assert np.mean(item_counts == 1) == pytest.approx(real["rated_once"], abs=0.02)
    assert sorted(np.unique(rating).tolist()) == real["values"]
    assert np.mean(rating % 1 != 0) == pytest.approx(real["half_star_share"], abs=0.03)
    assert rating.mean() == pytest.approx(real["mean"], abs=0.02)
    assert rating.std() == pytest.approx(real["std"], abs=0.05)
    # The sidecar: the preset, the realised shape, and a floor no model can beat.
    assert meta["preset"] == preset and meta["profile"] == "shaped" and meta["ratings"] == real["ratings"]
    assert meta["shape"]["per_item"]["share_1"] == pytest.approx(np.mean(item_counts == 1))
    assert meta["scale"]["step"] == (1.0 if preset == "ml-100k" else 0.5)
    assert 0.6 < meta["noise_floor_rmse"] < meta["planted_mean_rmse"] < rating.std()
    assert meta["noise_floor_rmse"] == pytest.approx(meta["expected_floor_rmse"], abs=0.01)


def test_shaped_ml10m_counts_follow_the_documented_shape():
    """The 10M preset's per-user and per-item counts, at full size (the pairs take a minute: not here)."""
    from ebb.data.synth import RATING_PRESETS, _degree_sequence

    shape = RATING_PRESETS["ml-10m"]
    assert (shape.users, shape.items, shape.ratings, shape.step) == (69_878, 10_677, 10_000_054, 0.5)
    rng = np.random.default_rng(0)
    users = _degree_sequence(shape.users, shape.user_quantiles, shape.ratings, shape.items, rng, "users")
    items = _degree_sequence(shape.items, shape.item_quantiles, shape.ratings, shape.users, rng, "items")
    assert users.sum() == items.sum() == 10_000_054 and users.min() == 20 and items.min() == 1
    assert np.percentile(users, [25, 50, 75]) == pytest.approx([35, 67, 162], rel=0.05)
    assert np.percentile(items, [25, 50, 75]) == pytest.approx([34, 141, 586], rel=0.05)
    assert users.max() == pytest.approx(7359, rel=0.01) and items.max() == pytest.approx(34_864, rel=0.01)
    assert 0.005 < np.mean(items == 1) < 0.03


def test_shaped_ratings_rescaled_and_reproducible(tmp_path):
    small = dict(preset="ml-latest-small", users=100, items=1600, ratings=16_000)
    meta = synth_shaped_ratings(tmp_path / "a.dat", seed=4, **small)
    synth_shaped_ratings(tmp_path / "b.dat", seed=4, **small)
    synth_shaped_ratings(tmp_path / "c.dat", seed=5, **small)
    assert (tmp_path / "a.dat").read_bytes() == (tmp_path / "b.dat").read_bytes()
    assert (tmp_path / "a.dat").read_bytes() != (tmp_path / "c.dat").read_bytes()
    assert json.loads((tmp_path / "a.dat.meta.json").read_text()) == meta
    user, item, rating = read_ratings(tmp_path / "a.dat")
    assert len(np.unique(user * 10_000 + item)) == len(rating) == 16_000
    user_counts, item_counts = np.bincount(user)[1:], np.bincount(item)[1:]
    assert len(user_counts) == 100 and len(item_counts) == 1600 and user_counts.min() >= 20 and item_counts.min() >= 1
    # The shape survives the rescale: a long tail of items rated once, a few heavy users.
    assert 0.3 < np.mean(item_counts == 1) < 0.4 and user_counts.max() > 3 * np.median(user_counts)
    assert set(np.unique(rating).tolist()) <= {v / 2 for v in range(1, 11)}
    # Too many ratings for the users' and items' counts to hold: a clear error.
    with pytest.raises(ValueError, match="cannot be spread over 100 users"):
        synth_shaped_ratings(tmp_path / "d.dat", preset="ml-latest-small", users=100, items=200, ratings=8000)
    with pytest.raises(ValueError, match="unknown preset"):
        synth_shaped_ratings(tmp_path / "d.dat", preset="ml-1b")


def test_cli_synth_ratings_preset(tmp_path, capsys):
    from ebb.cli import main

    out = tmp_path / "u.data"
    assert (
        main(
            [
                "synth",
                "ratings",
                "--preset",
                "ml-100k",
                "--out",
                str(out),
                "--users",
                "200",
                "--items",
                "300",
                "--ratings",
                "12000",
            ]
        )
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed["preset"] == "ml-100k" and printed["ratings"] == 12_000
    assert {line.split("\t")[2] for line in out.read_text().splitlines()} == {"1", "2", "3", "4", "5"}


def test_wild_preset_reproduces_the_real_files_statistics(tmp_path):
    """ml-latest-small-wild: the statistics issue 25 lists for the real file, and held-out
    rows on items training has rarely (or never) seen after an 80/10/10 split."""
    meta = synth_shaped_ratings(tmp_path / "ratings.csv", preset="ml-latest-small-wild", seed=0)
    user, item, rating = read_ratings(tmp_path / "ratings.csv")
    user_counts, item_counts = np.bincount(user)[1:], np.bincount(item)[1:]
    # Heavy-tailed users: every one ≥ 20, the median about 70, the top 10 % about half.
    assert user_counts.min() >= 20 and np.median(user_counts) == pytest.approx(70, abs=3)
    top = np.sort(user_counts)[::-1][: len(user_counts) // 10]
    assert top.sum() / user_counts.sum() == pytest.approx(0.5, abs=0.05)
    # Half-star scale with the real skew: 4.0 then 3.0 most common, 0.5–1.5 under 6 %.
    values, counts = np.unique(rating, return_counts=True)
    assert values[np.argsort(-counts)[:2]].tolist() == [4.0, 3.0]
    assert np.mean(rating <= 1.5) < 0.06 and 0.25 < np.mean(rating % 1 != 0) < 0.35
    # Long item tail: 57 % of items ≤ 3 ratings, 35 % exactly one.
    assert np.mean(item_counts <= 3) == pytest.approx(0.57, abs=0.02)
    assert np.mean(item_counts == 1) == pytest.approx(0.35, abs=0.02)
    # The wild irregularities are recorded, and the floor accounts for the users' own σ.
    assert meta["noise_spread"] > 0 and meta["rank"] == 30 and meta["rare_item_bias_boost"] > 0
    assert meta["noise_floor_rmse"] == pytest.approx(meta["expected_floor_rmse"], abs=0.01)
    # Held out at random, a tenth of the test rows fall on items seen ≤ 3 times in training.
    store = FolderObjectStore(tmp_path / "prepared")
    manifest = prepare_dataset(
        "movielens", tmp_path / "ratings.csv", store, batch_size=5000, test_fraction=0.1, val_fraction=0.1, seed=0
    )

    def load(split):
        parts = list(iter_parts(store, manifest, split))
        return np.concatenate([p["item"] for p in parts])

    seen = np.bincount(load("train"), minlength=manifest.num_items)
    test_items = load("test")
    assert 0.05 < np.mean(seen[test_items] <= 3) < 0.25
    assert np.mean(seen[test_items] == 0) > 0.01  # some never seen at all


def test_wild_presets_leave_the_documented_shapes_as_they_were(tmp_path):
    """The irregularities only change what they name: the counts are the tame preset's."""
    tame = synth_shaped_ratings(tmp_path / "a.data", preset="ml-100k", seed=3, users=200, items=300, ratings=12_000)
    wild = synth_shaped_ratings(
        tmp_path / "b.data", preset="ml-100k-wild", seed=3, users=200, items=300, ratings=12_000
    )
    a, b = read_ratings(tmp_path / "a.data"), read_ratings(tmp_path / "b.data")
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])  # the same pairs
    assert not np.array_equal(a[2], b[2])
    assert tame["noise_spread"] == 0 and wild["noise_spread"] > 0 and wild["activity_bias_corr"] < 0
