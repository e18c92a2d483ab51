"""``ebb.load_model(PATH_or_s3)``: a trained model that scores raw rows, with numpy only.

The artifact is what finalize writes (``ebb.engine.artifact``): ``model.json``,
``model.npz`` and, for PMF, ``id_map.npz`` and ``seen.npz``. Raw ids go in and come out
(the id maps apply both ways); unknown users and items get the bias-only prediction and
are counted (``unknown``).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ebb.models import scoring
from ebb.ports.keys import MODEL_KEY, MODEL_META_KEY
from ebb.ports.objects import ObjectStore, is_s3

USER_BLOCK = 256  # users per matrix product in recommend: 256 × 10k items × 4 B = 10 MB of scores
LANES = 64  # top_k's lanes (the item table is padded to a multiple)


class ArtifactError(ValueError):
    """A model location without a usable artifact (the message says what is missing)."""


def _npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def open_model_store(location: str | os.PathLike) -> ObjectStore:
    """The store holding a model: a run folder or ``s3://`` prefix (a path to one of its
    files, e.g. ``runs/x/model.npz``, names its folder)."""
    from ebb.stores import open_object_store

    text = str(location)
    if text.rstrip("/").endswith((".json", ".npz")):
        text = text.rstrip("/").rsplit("/", 1)[0] if is_s3(text) else str(Path(text).parent)
    return open_object_store(text)


def load_model(location: str | os.PathLike) -> RatingsModel | LogisticModel:
    """The model at ``location`` (a run's folder or ``s3://bucket/prefix``), ready to score."""
    store = open_model_store(location)
    try:
        meta = json.loads(store.get(MODEL_META_KEY))
    except KeyError:
        raise ArtifactError(
            f"{location}: no {MODEL_META_KEY} (a run finished before model artifacts existed, or not a run's "
            "folder); train it again to get one"
        ) from None
    try:
        arrays = _npz(store.get(meta["files"]["model"]))
    except KeyError:
        raise ArtifactError(f"{location}: {MODEL_META_KEY} is there but {MODEL_KEY} is not") from None
    if meta["batch_kind"] == "ratings":
        files = meta["files"]
        return RatingsModel(meta, arrays, _npz(store.get(files["id_map"])), _npz(store.get(files["seen"])))
    return LogisticModel(meta, arrays)


class _IdIndex:
    """Raw id -> contiguous id (vectorised: a sorted copy and a binary search); -1 if unknown."""

    def __init__(self, raw: np.ndarray):
        self.raw = raw.astype(np.int64)
        self._order = np.argsort(self.raw, kind="stable")
        self._sorted = self.raw[self._order]

    def encode(self, raw: np.ndarray) -> np.ndarray:
        raw = np.asarray(raw, dtype=np.int64)
        pos = np.searchsorted(self._sorted, raw).clip(0, max(len(self._sorted) - 1, 0))
        if not len(self._sorted):
            return np.full(raw.shape, -1, dtype=np.int64)
        found = self._sorted[pos] == raw
        return np.where(found, self._order[pos], -1)


def top_k(scores: np.ndarray, k: int, *, lanes: int = LANES) -> tuple[np.ndarray, ...]:
    """The ``k`` highest finite scores of each row, exactly, best first (equal scores by
    column): flat ``(row, column, score, rank)``. Rows with fewer finite scores give fewer.

    Column ``c`` of a row belongs to lane ``c mod lanes``. The k-th highest of a row's lane
    maxima is a lower bound of its k-th highest score (k lanes each hold a score at least
    that high), so only scores at or above it can be in the top ``k``. Two vectorised
    passes (the lanes' maxima: elementwise maxima of contiguous slices; a comparison) leave
    about ``k`` candidates a row, sorted together, in place of a selection over every score.
    ``scores.shape[1]`` must be a multiple of ``lanes`` (pad with -inf)."""
    n, width = scores.shape
    if k >= lanes:  # too few lanes for a bound: sort every score (stable: ties by column)
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        row, col = np.repeat(np.arange(n), top.shape[1]), top.reshape(-1)
    else:
        maxima = scores.reshape(n, width // lanes, lanes).max(axis=1)
        bound = np.partition(maxima, lanes - k, axis=1)[:, lanes - k]
        flat = np.flatnonzero(scores >= bound[:, None])
        row, col = flat // width, flat % width
    value = scores[row, col]
    order = np.lexsort((col, -value, row))
    row, col, value = row[order], col[order], value[order]
    starts = np.searchsorted(row, np.arange(n))
    rank = np.arange(len(row)) - starts[row] + 1
    keep = (rank <= k) & np.isfinite(value)
    return row[keep], col[keep], value[keep], rank[keep].astype(np.int32)


class RatingsModel:
    """A PMF model: ``predict`` scores (user, item) pairs; ``recommend`` the top-K items."""

    kind = "ratings"

    def __init__(self, meta: dict[str, Any], arrays: dict[str, np.ndarray], id_map: dict, seen: dict):
        self.meta = meta
        self.user = np.ascontiguousarray(arrays["user"], dtype=np.float32)
        self.item = np.ascontiguousarray(arrays["item"], dtype=np.float32)
        self.rank = int(meta["dims"]["rank"])
        self.mean = float(meta["scoring"]["global_mean"])
        rr = meta["scoring"]["rating_range"]
        self.rating_range = None if rr is None else (float(rr[0]), float(rr[1]))
        self.users, self.items = _IdIndex(id_map["user"]), _IdIndex(id_map["item"])
        self.seen_indptr, self.seen_items = seen["indptr"], seen["items"]
        # cold_k: pairs of a user or item with ≤ k training ratings score from the biases alone,
        # as the training job scored them (an artifact without the counts has no cold rule).
        self.cold_k = int(meta["scoring"].get("cold_k", 0))
        if self.cold_k > 0 and "train_user_count" in seen:
            self._cold_user = seen["train_user_count"] <= self.cold_k
            self._cold_item = seen["train_item_count"] <= self.cold_k
        else:
            self._cold_user = self._cold_item = None
        # recommend's item side: [V_i, b_i] per row, padded with zero rows to whole lanes.
        self.num_items = len(self.item)
        padded = -(-self.num_items // LANES) * LANES
        self._item_matrix = np.zeros((padded, self.rank + 1), dtype=np.float32)
        self._item_matrix[: self.num_items] = self.item
        self.unknown = {"users": 0, "items": 0}

    @property
    def num_users(self) -> int:
        return len(self.user)

    def predict(self, rows: Any) -> np.ndarray:
        """Predicted ratings (float32) for raw ``(user, item)`` pairs: an ``[n, 2]`` array or a
        dict with ``user`` and ``item``. Unknown ids score with the biases that are known."""
        if isinstance(rows, dict):
            users, items = np.asarray(rows["user"]), np.asarray(rows["item"])
        else:
            pairs = np.asarray(rows).reshape(-1, 2)
            users, items = pairs[:, 0], pairs[:, 1]
        u, i = self.users.encode(users), self.items.encode(items)
        self.unknown["users"] += int((u < 0).sum())
        self.unknown["items"] += int((i < 0).sum())
        cold = None
        if self._cold_user is not None and self._cold_item is not None:
            cold = ((u >= 0) & self._cold_user[np.maximum(u, 0)]) | ((i >= 0) & self._cold_item[np.maximum(i, 0)])
        return scoring.pmf_pairs(
            self.user, self.item, u, i, rank=self.rank, mean=self.mean, rating_range=self.rating_range, cold=cold
        )

    def all_users(self) -> np.ndarray:
        """Every user the model knows, as raw ids (in the model's order)."""
        return self.users.raw.copy()

    def recommend(
        self, user_ids: Sequence[int] | np.ndarray | None, k: int, exclude_seen: bool = True
    ) -> dict[str, np.ndarray]:
        """Top-``k`` items for each raw user id (``None``: every user), exactly: every item is
        scored (blocked matrix products), the best ``k`` found with ``argpartition``.

        Returns flat columns ``user``, ``item`` (raw ids), ``score`` (the model's unclipped
        ``μ + b_u + b_i + U_u·V_i``) and ``rank`` (1 = best), users in the order given. With
        ``exclude_seen`` the items a user rated in training are never returned (a user who
        rated nearly everything gets fewer than ``k``). An unknown user gets the items with
        the highest ``μ + b_i`` and is counted in ``unknown["users"]``."""
        raw = self.all_users() if user_ids is None else np.asarray(user_ids, dtype=np.int64).reshape(-1)
        users = self.users.encode(raw)
        self.unknown["users"] += int((users < 0).sum())
        parts = [self._top_block(raw[s : s + USER_BLOCK], users[s : s + USER_BLOCK], k, exclude_seen)
                 for s in range(0, len(users), USER_BLOCK)]  # fmt: skip
        if not parts:
            return {"user": np.zeros(0, np.int64), "item": np.zeros(0, np.int64),
                    "score": np.zeros(0, np.float32), "rank": np.zeros(0, np.int32)}  # fmt: skip
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def _top_block(self, raw: np.ndarray, users: np.ndarray, k: int, exclude_seen: bool) -> dict[str, np.ndarray]:
        """The block's top ``k``: one matrix product scores every item (the biases ride in it:
        ``[U_u, 1]·[V_i, b_i]``; ``μ + b_u`` is the same for a user's items, so it is added to
        the k kept only), seen items are set to -inf, and ``top_k`` selects."""
        r = self.rank
        known = users >= 0
        rows = self.user[np.where(known, users, 0)]
        rows[~known] = 0.0  # unknown: no factors, no bias
        a = np.empty((len(rows), r + 1), dtype=np.float32)
        a[:, :r], a[:, r] = rows[:, :r], 1.0
        scores = a @ self._item_matrix.T  # [block, padded items]
        scores[:, self.num_items :] = -np.inf  # the padding
        if exclude_seen and known.any():
            row, col = self._seen_cells(users)
            scores[row, col] = -np.inf
        row, item, score, rank = top_k(scores, k)
        score += (rows[:, r] + np.float32(self.mean))[row]
        return {"user": raw[row], "item": self.items.raw[item], "score": score, "rank": rank}

    def _seen_cells(self, users: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row in the block, item) of every item the block's users rated: a vectorised CSR gather."""
        u = np.where(users >= 0, users, 0)
        starts = self.seen_indptr[u]
        lengths = np.where(users >= 0, self.seen_indptr[u + 1] - starts, 0)
        offsets = np.zeros(len(u) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        source = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        return np.repeat(np.arange(len(u)), lengths), self.seen_items[source]

    def seen(self, user_id: int) -> np.ndarray:
        """The raw ids of the items a raw user rated in training (empty if unknown)."""
        u = int(self.users.encode(np.array([user_id]))[0])
        if u < 0:
            return np.zeros(0, dtype=np.int64)
        return self.items.raw[self.seen_items[self.seen_indptr[u] : self.seen_indptr[u + 1]]]


class LogisticModel:
    """A sparse or dense logistic regression: ``predict`` gives probabilities."""

    def __init__(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]):
        self.meta = meta
        self.kind = meta["batch_kind"]  # sparse | dense
        self.weight = arrays["weight"].reshape(-1).astype(np.float32)
        self.bias = float(arrays["bias"].reshape(-1)[0])
        self.preprocessing = meta.get("preprocessing", {})
        self.unknown = {"features": 0}

    @property
    def num_features(self) -> int:
        return len(self.weight)

    def predict(self, rows: Any) -> np.ndarray:
        """Probabilities (float32) for prepared rows: a CSR dict (``indptr``, ``indices``,
        ``values``, as the readers give) for sparse LR, a ``[n, features]`` array (scaled as
        in training) for dense LR. Feature indices the model never had are left out and
        counted (``unknown["features"]``). Raw text lines: ``predict_lines``."""
        if self.kind == "dense":
            x = rows["x"] if isinstance(rows, dict) else np.asarray(rows, dtype=np.float32)
            return scoring.sigmoid(scoring.dense_logits(self.weight, self.bias, np.asarray(x, dtype=np.float32)))
        indptr, indices, values = rows["indptr"], rows["indices"], rows["values"]
        outside = indices >= len(self.weight)
        if outside.any():
            self.unknown["features"] += int(outside.sum())
            keep = ~outside
            row_of = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))[keep]
            indptr = np.zeros(len(indptr), dtype=np.int64)
            np.cumsum(np.bincount(row_of, minlength=len(indptr) - 1), out=indptr[1:])
            indices, values = indices[keep], values[keep]
        return scoring.sigmoid(scoring.sparse_logits(self.weight, self.bias, indptr, indices, values))

    def predict_lines(self, lines: Iterable[str]) -> np.ndarray:
        """Probabilities for raw rows in the training format (Criteo TSV, LibSVM, CSV with
        its header first), preprocessed as in training (hashing, numeric scaling)."""
        from ebb.predict.inputs import lr_reader

        with tempfile.TemporaryDirectory(prefix="ebb-predict-") as tmp:
            path = Path(tmp, "rows")
            path.write_text("".join(line if line.endswith("\n") else line + "\n" for line in lines))
            chunks = [self.predict(chunk) for chunk in lr_reader(self.meta, path)]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
