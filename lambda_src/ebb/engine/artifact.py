"""The model artifact: ``model.json`` beside ``model.npz``, so a trained model scores raw
rows without its dataset or its training code (``ebb.load_model``, ``ebb predict``).

``model.json`` says what the model is (kind, dimensions, which replica), how to turn a raw
row into what it scores (Criteo hashing and numeric scaling, CSV column order and
min-max ranges, LibSVM's dimension, MovieLens id maps) and which job made it (name,
metric, date). For PMF the dataset's id maps are copied beside the model
(``id_map.npz``) with every user's rated items (``seen.npz``, train and validation
splits) for recommendations that leave them out.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import numpy as np

from ebb.catalogue import entry
from ebb.data.format import encode_batch
from ebb.data.prepare import ID_MAP_KEY, iter_parts
from ebb.models import rating_range
from ebb.ports.keys import ID_MAP_COPY_KEY, MODEL_KEY, MODEL_META_KEY, SEEN_KEY
from ebb.ports.manifest import Manifest
from ebb.ports.objects import ObjectStore
from ebb.spec import JobSpec

ARTIFACT_VERSION = 1


def model_meta(
    spec: JobSpec, manifest: Manifest, report: dict[str, Any], replica: dict[str, np.ndarray]
) -> dict[str, Any]:
    """model.json's content (README, "The model artifact", lists every field)."""
    meta: dict[str, Any] = {
        "version": ARTIFACT_VERSION,
        "model": spec.model,
        "batch_kind": manifest.kind,
        "files": {"model": MODEL_KEY},
        "replica": report.get("model", "merged"),
        "job": {
            "name": spec.name,
            "data": spec.data,
            "status": report.get("status"),
            "loss_name": entry(spec.model).loss_name,
            "test_metrics": report.get("test_metrics", {}),
            "best_val": report.get("best_val"),
            "trained_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        },
        "preprocessing": {"format": manifest.format},
    }
    pre = meta["preprocessing"]
    source = manifest.source
    if manifest.kind == "ratings":
        rank = replica["user"].shape[1] - 1
        meta["dims"] = {"users": manifest.num_users, "items": manifest.num_items, "rank": rank}
        rr = rating_range(manifest)
        meta["scoring"] = {
            "global_mean": float(manifest.stats.get("rating_mean", 0.0)),
            "rating_range": list(rr) if rr else None,
            # Held-out pairs of a user or item with at most this many training ratings score
            # from the biases alone (PMF's cold_k; counts in seen.npz).
            "cold_k": int(spec.hyper.cold_k or 0),
        }
        meta["files"].update({"id_map": ID_MAP_COPY_KEY, "seen": SEEN_KEY})
        meta["id_maps"] = {"file": ID_MAP_COPY_KEY, "dataset": f"{spec.data.rstrip('/')}/{ID_MAP_KEY}"}
        pre["movielens_flavour"] = source.get("movielens_flavour")
    else:
        meta["dims"] = {"features": manifest.num_features}
        options = source.get("options", {})
        if manifest.format == "criteo":
            pre.update(
                {
                    "num_features": options.get("num_features", manifest.num_features),
                    "numeric_scaling": options.get("numeric_scaling", "log"),
                    "hashing": source.get("hashing"),
                }
            )
        if manifest.format == "csv":
            pre["feature_names"] = source.get("feature_names")
        if "scaling" in source:
            pre["scaling"] = source["scaling"]  # min-max ranges: CSV columns, Criteo numeric columns
    return meta


def seen_items(data: ObjectStore, manifest: Manifest) -> dict[str, np.ndarray]:
    """Every user's rated items in the train and validation splits: CSR (``indptr`` over
    contiguous users, ``items`` sorted within a user), for recommendations that skip them;
    and each user's and item's number of training ratings (``train_user_count``,
    ``train_item_count``), which decide who is cold under ``cold_k``."""
    keys = []
    user_count = np.zeros(manifest.num_users, dtype=np.int64)
    item_count = np.zeros(manifest.num_items, dtype=np.int64)
    for split in ("train", "val"):
        for part in iter_parts(data, manifest, split):
            keys.append(part["user"].astype(np.int64) * manifest.num_items + part["item"])
            if split == "train":
                user_count += np.bincount(part["user"], minlength=manifest.num_users)
                item_count += np.bincount(part["item"], minlength=manifest.num_items)
    pairs = np.unique(np.concatenate(keys)) if keys else np.zeros(0, dtype=np.int64)
    users = pairs // max(manifest.num_items, 1)
    indptr = np.zeros(manifest.num_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(users, minlength=manifest.num_users), out=indptr[1:])
    return {
        "indptr": indptr,
        "items": (pairs % max(manifest.num_items, 1)).astype(np.int32),
        "train_user_count": user_count,
        "train_item_count": item_count,
    }


def write_artifact(
    out: ObjectStore,
    data: ObjectStore,
    spec: JobSpec,
    manifest: Manifest,
    report: dict[str, Any],
    replica: dict[str, np.ndarray],
) -> dict[str, str]:
    """Write model.json and, for PMF, id_map.npz and seen.npz into ``out``; returns them as
    report.json's ``files`` names them."""
    written = {}
    if manifest.kind == "ratings":
        out.put(ID_MAP_COPY_KEY, data.get(ID_MAP_KEY))
        out.put(SEEN_KEY, encode_batch(seen_items(data, manifest)))
        written.update({"id_map": ID_MAP_COPY_KEY, "seen": SEEN_KEY})
    out.put(MODEL_META_KEY, json.dumps(model_meta(spec, manifest, report, replica), indent=2).encode())
    return {"model_meta": MODEL_META_KEY, **written}
