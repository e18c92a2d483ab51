"""On-store layout of a prepared dataset: minibatch parts plus ``manifest.json``
(``ebb.ports.manifest`` describes and reads the manifest; ``ebb.ports.keys`` names the keys).

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

import numpy as np

KINDS = ("ratings", "sparse", "dense")
BATCH_ARRAYS = {
    "ratings": ("user", "item", "rating"),
    "sparse": ("label", "indptr", "indices", "values"),
    "dense": ("label", "x"),
}


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
