"""Early stopping on a validation split: the model written is the best one seen."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ebb.engine.parts import PartCache
from ebb.local.runner import run_local
from ebb.models import build_model
from ebb.ports.manifest import load_manifest
from ebb.spec import load_spec
from ebb.stores.local import FolderObjectStore
from tests.helpers.data import planted_ratings


@pytest.fixture(scope="module")
def sparse_ratings(tmp_path_factory):
    """Few ratings per user and item, a validation split: a rank-16 model without
    regularisation overfits it within a few epochs."""
    root = tmp_path_factory.mktemp("overfit")
    return planted_ratings(
        root, users=300, items=200, ratings=9000, rank=3, noise=0.4, seed=11, batch_size=500, split_seed=2
    )[0]


def _spec(data, out, **fields):
    base = {
        "model": "pmf",
        "data": data,
        "out": str(out),
        "seed": 1,
        "workers": 2,
        "scaling.policy": "none",
        "hyper.rank": 16,
        "hyper.l2": 0.0,
        "hyper.lr_decay": 1.0,
        "hyper.lr": 0.1,
        "stop.max_epochs": 30,
        "stop.eval_every": 7,
        "sync.mode": "isp",
    }
    base.update(fields)
    return load_spec(overrides=base)


def _val_rmse(data, arrays, spec) -> float:
    store = FolderObjectStore(data)
    manifest = load_manifest(store)
    model = build_model("pmf", manifest, spec.hyper, spec.seed)
    for n, p in model.params.items():
        p.copy_(torch.from_numpy(arrays[n]))
    cache = PartCache(store, manifest, model, split="val")
    return model.evaluate(cache.get(i) for i in range(len(manifest.val.parts)))["rmse"]


def test_a_job_that_overfits_writes_the_model_of_its_best_scoring(sparse_ratings, tmp_path):
    spec = _spec(sparse_ratings, tmp_path, **{"stop.patience_evals": 1000})  # never stops early: runs 30 epochs
    report, model = run_local(spec)
    curve = [(h["step"], h["val"]) for h in report["history"] if "val" in h]
    assert len(curve) >= 5 and all("test" not in h for h in report["history"])  # test: only the final model
    best_step, best_val = min(curve, key=lambda c: c[1])
    assert curve[-1][1] > 1.02 * best_val, "the run overfits: validation gets worse after its best"
    assert report["status"] == "max_epochs" and report["model"] == "best"
    assert report["best_step"] == best_step and report["best_val"] == pytest.approx(best_val)
    assert best_step < report["steps"] - 1 and 0 < report["best_epoch"] < report["epochs"]
    # model.npz is that replica: scoring it on the validation split gives the recorded value.
    assert _val_rmse(sparse_ratings, model, spec) == pytest.approx(best_val, rel=1e-6)
    on_disk = np.load(tmp_path / "model.npz")
    assert all(np.array_equal(on_disk[k], model[k]) for k in model)


def test_early_stopping_stops_after_patience_scorings_without_improvement(sparse_ratings, tmp_path):
    spec = _spec(sparse_ratings, tmp_path / "early", **{"stop.patience_evals": 2, "round_steps": 9})
    report, _ = run_local(spec)
    curve = [h["val"] for h in report["history"] if "val" in h]
    best = min(range(len(curve)), key=curve.__getitem__)
    assert report["status"] == "early_stopped" and report["rounds"] >= 2  # best and patience survive the rounds
    assert len(curve) - 1 - best == 2  # exactly two scorings without a better one
    assert report["best_val"] == pytest.approx(curve[best])
    assert json.loads((tmp_path / "early" / "checkpoints" / "best.json").read_text())["value"] == pytest.approx(
        curve[best]
    )


def test_without_a_validation_split_the_merged_model_is_written(small_ratings, tmp_path):
    data, _ = small_ratings
    report, _ = run_local(_spec(data, tmp_path, **{"stop.max_epochs": 2, "stop.eval_every": None}))
    assert report["model"] == "merged" and "best_step" not in report
    assert all("val" not in h and "test" not in h for h in report["history"])  # no held-out scoring by default
