"""On-store layout of a prepared dataset: minibatch parts plus ``manifest.json``.

A prepared dataset is a prefix in an object store holding::

    manifest.json
    train/part-000000, train/part-000001, ...   fixed-size training minibatches
    test/part-000000, ...                       the held-out split, same encoding
    val/part-000000, ...                        a validation split (optional), same encoding

Each part is an uncompressed ``.npz`` (numpy arrays only, loaded with
``allow_pickle=False``). Three kinds of batch exist:

* ``ratings`` (MovieLens → PMF): ``user`` int32, ``item`` int32, ``rating`` float32,
  with users and items remapped to contiguous ids ``0..n-1``.
* ``sparse`` (Criteo, LibSVM → sparse LR): CSR rows: ``label`` float32 (0/1),
  ``indptr`` int64 (B+1), ``indices`` int32, ``values`` float32.
* ``dense`` (CSV → dense LR): ``label`` float32 (0/1), ``x`` float32 ``[B, D]``.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

MANIFEST_KEY = "manifest.json"
KINDS = ("ratings", "sparse", "dense")
SPLITS = ("train", "val", "test")
BATCH_ARRAYS = {
    "ratings": ("user", "item", "rating"),
    "sparse": ("label", "indptr", "indices", "values"),
    "dense": ("label", "x"),
}


def part_key(split: str, index: int) -> str:
    """Object key of minibatch ``index`` of ``split`` ("train", "val" or "test")."""
    return f"{split}/part-{index:06d}"


def encode_batch(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def decode_batch(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an encoded batch (an .npz)."""
    try:
        return _decode_npz(data)
    except SystemError as exc:
        # numpy reads each .npy header with ast.literal_eval, and Python 3.11's AST
        # constructor can raise a spurious "AST constructor recursion depth mismatch"
        # (CPython gh-106905; seen once in a forked worker process). Each call starts
        # its count afresh, and decoding is pure: one retry.
        if "recursion depth mismatch" not in str(exc):
            raise
        return _decode_npz(data)


def _decode_npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def checksum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def batch_rows(arrays: dict[str, np.ndarray]) -> int:
    """Number of samples in a decoded batch, whatever its kind."""
    if "rating" in arrays:
        return int(arrays["rating"].shape[0])
    return int(arrays["label"].shape[0])


@dataclass
class PartInfo:
    key: str
    rows: int
    sha256: str


@dataclass
class SplitInfo:
    rows: int = 0
    parts: list[PartInfo] = field(default_factory=list)


@dataclass
class Manifest:
    """What a prepared dataset holds; written last, so its presence means complete."""

    format: str  # movielens | criteo | libsvm | csv
    kind: str  # ratings | sparse | dense
    batch_size: int
    seed: int
    train: SplitInfo
    test: SplitInfo
    # Held out for choosing hyper-parameters and when to stop; empty unless prepared with
    # a validation fraction (manifests written before it existed have none).
    val: SplitInfo = field(default_factory=SplitInfo)
    num_users: int = 0  # ratings
    num_items: int = 0  # ratings
    num_features: int = 0  # sparse / dense
    stats: dict[str, Any] = field(default_factory=dict)  # e.g. rating_mean, label_mean
    source: dict[str, Any] = field(default_factory=dict)  # input paths, options, skipped rows
    version: int = 1

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        for split in SPLITS:
            if split in raw:  # no "val" in manifests written before it existed
                s = raw[split]
                raw[split] = SplitInfo(rows=s["rows"], parts=[PartInfo(**p) for p in s["parts"]])
        return cls(**raw)
