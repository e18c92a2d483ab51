"""Synthetic data: reproducible, planted structure as documented, readable by the real readers."""

import json

import numpy as np
import pytest

from ebb.data.prepare import iter_parts, prepare_dataset
from ebb.data.readers import LibSVMReader, MovieLensReader
from ebb.data.synth import bayes_logloss_on, prepared_weights, synth_logistic, synth_ratings
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
    manifest = prepare_dataset("movielens", tmp_path / "u.data", store, batch_size=10_000)
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
    manifest = prepare_dataset("libsvm", path, store, batch_size=4096)
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
    manifest = prepare_dataset("csv", path, store, batch_size=4096)
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
