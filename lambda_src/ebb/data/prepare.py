"""Prepare a raw dataset into stored minibatches (see :mod:`ebb.data.format`).

The input is streamed once into ``K`` temporary bucket files, each row to a bucket drawn
by a seeded RNG; every bucket (about ``bucket_bytes`` of input) is then loaded, permuted
in memory with the same RNG and emitted. The concatenation is a uniformly random,
seed-deterministic permutation of all rows (assignment to iid buckets + a uniform
permutation inside each bucket), so files larger than memory are shuffled exactly.

The shuffled rows are split into train/validation/test (in that order of the shuffled
stream, so a validation split takes its rows from what would otherwise be training rows
and leaves the test split as it was), cut into parts of ``batch_size`` rows and written
to the store; ``manifest.json`` is written last, so its presence means the
dataset is complete. Min-max ranges (CSV, Criteo ``minmax``) are gathered during the
bucket pass (the streaming first pass) over the training *input* — which holds the
held-out rows too when the test split is cut from it; a separate ``test_input`` never
contributes — and applied when the parts are written (recorded in the manifest's
``source["scaling"]``).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ebb.data.format import batch_rows, checksum, decode_batch, encode_batch
from ebb.data.readers import (
    CRITEO_NUMERIC,
    KEEP_BAD_ROWS,
    NUMERIC_SCALINGS,
    ColumnRange,
    CriteoReader,
    CSVReader,
    DataError,
    IdMap,
    LibSVMReader,
    MovieLensReader,
)
from ebb.ports.keys import MANIFEST_KEY, part_key
from ebb.ports.manifest import SPLITS, Manifest, PartInfo, SplitInfo
from ebb.ports.objects import ObjectStore
from ebb.spec import PrepareSpec, field_default

FORMAT_KINDS = {"movielens": "ratings", "criteo": "sparse", "libsvm": "sparse", "csv": "dense"}
# prepare_dataset's defaults are the job spec's (``ebb prepare``, a job's prepare section).
_DEFAULT = {
    name: field_default(PrepareSpec, name)
    for name in PrepareSpec.model_fields
    if not PrepareSpec.model_fields[name].is_required()
}
DEFAULT_BUCKET_BYTES = 64 << 20
MAX_BUCKETS = 4096
PROGRESS_EVERY = 100_000
ID_MAP_KEY = "id_map"  # MovieLens: raw user/item id of every contiguous id

Progress = Callable[[int, str], None]


class ChecksumError(ValueError):
    """A stored part does not match the checksum recorded in the manifest."""


# ------------------------------------------------------------------ chunk operations
# A chunk is a dict of arrays in the batch layout of its kind; sparse chunks are CSR.


def slice_chunk(kind: str, chunk: dict[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    """Rows ``start:stop`` (views where possible; sparse ``indptr`` rebased to 0)."""
    if kind != "sparse":
        return {name: array[start:stop] for name, array in chunk.items()}
    indptr = chunk["indptr"]
    lo, hi = indptr[start], indptr[stop]
    return {
        "label": chunk["label"][start:stop],
        "indptr": indptr[start : stop + 1] - lo,
        "indices": chunk["indices"][lo:hi],
        "values": chunk["values"][lo:hi],
    }


def take_rows(kind: str, chunk: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The rows ``rows`` (an index array), in that order."""
    if kind != "sparse":
        return {name: array[rows] for name, array in chunk.items()}
    indptr = chunk["indptr"]
    starts = indptr[rows]
    lengths = indptr[rows + 1] - starts
    new_indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_indptr[1:])
    # Position of every kept entry in the source arrays.
    source = np.repeat(starts - new_indptr[:-1], lengths) + np.arange(new_indptr[-1])
    return {
        "label": chunk["label"][rows],
        "indptr": new_indptr,
        "indices": chunk["indices"][source],
        "values": chunk["values"][source],
    }


def concat_chunks(kind: str, chunks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(chunks) == 1:
        return chunks[0]
    if kind != "sparse":
        return {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}
    lengths = np.concatenate([np.diff(c["indptr"]) for c in chunks])
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return {
        "label": np.concatenate([c["label"] for c in chunks]),
        "indptr": indptr,
        "indices": np.concatenate([c["indices"] for c in chunks]),
        "values": np.concatenate([c["values"] for c in chunks]),
    }


# ------------------------------------------------------------------ external shuffle


class ExternalShuffle:
    """Seeded shuffle of a row stream through ``n_buckets`` temporary files in ``folder``."""

    def __init__(self, kind: str, folder: str | os.PathLike, n_buckets: int, rng: np.random.Generator):
        self.kind = kind
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.n_buckets = n_buckets
        self.rng = rng
        self.rows = 0

    def _bucket_path(self, bucket: int) -> Path:
        return self.folder / f"bucket-{bucket:05d}.npy"

    def add(self, chunk: dict[str, np.ndarray]) -> None:
        """Send every row of ``chunk`` to a random bucket."""
        rows = batch_rows(chunk)
        if not rows:
            return
        self.rows += rows
        bucket_of_row = self.rng.integers(self.n_buckets, size=rows)
        order = np.argsort(bucket_of_row, kind="stable")
        grouped = take_rows(self.kind, chunk, order)
        ends = np.cumsum(np.bincount(bucket_of_row, minlength=self.n_buckets))
        start = 0
        for bucket, end in enumerate(ends.tolist()):
            if end > start:
                self._append(bucket, slice_chunk(self.kind, grouped, start, end))
            start = end

    def _append(self, bucket: int, chunk: dict[str, np.ndarray]) -> None:
        if self.kind == "sparse":  # row lengths instead of indptr: pieces just concatenate
            chunk = {**chunk, "lengths": np.diff(chunk["indptr"])}
        with open(self._bucket_path(bucket), "ab") as file:
            for name in _BUCKET_ARRAYS[self.kind]:
                np.save(file, np.ascontiguousarray(chunk[name]), allow_pickle=False)

    def _load(self, bucket: int) -> dict[str, np.ndarray] | None:
        path = self._bucket_path(bucket)
        if not path.exists():
            return None
        pieces: dict[str, list[np.ndarray]] = {name: [] for name in _BUCKET_ARRAYS[self.kind]}
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            while file.tell() < size:
                for name in _BUCKET_ARRAYS[self.kind]:
                    pieces[name].append(np.load(file, allow_pickle=False))
        path.unlink()
        arrays = {name: np.concatenate(parts) for name, parts in pieces.items()}
        if self.kind == "sparse":
            lengths = arrays.pop("lengths")
            indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=indptr[1:])
            arrays = {"label": arrays["label"], "indptr": indptr,
                      "indices": arrays["indices"], "values": arrays["values"]}  # fmt: skip
        return arrays

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """Each bucket in turn, permuted; buckets are deleted as they are consumed."""
        for bucket in range(self.n_buckets):
            chunk = self._load(bucket)
            if chunk is not None:
                yield take_rows(self.kind, chunk, self.rng.permutation(batch_rows(chunk)))


_BUCKET_ARRAYS = {
    "ratings": ("user", "item", "rating"),
    "sparse": ("label", "lengths", "indices", "values"),
    "dense": ("label", "x"),
}


def bucket_count(input_bytes: int, bucket_bytes: int) -> int:
    """Buckets for ``input_bytes`` of text so that each holds about ``bucket_bytes``."""
    return max(1, min(MAX_BUCKETS, math.ceil(input_bytes / max(1, bucket_bytes))))


# --------------------------------------------------------------------- part writer


class _PartWriter:
    """Cuts a stream of chunks into parts of ``batch_size`` rows and stores them."""

    def __init__(self, store: ObjectStore, split: str, kind: str, batch_size: int):
        self.store, self.split, self.kind, self.batch_size = store, split, kind, batch_size
        self.info = SplitInfo()
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0
        self._target_sum = 0.0
        self._target_min = math.inf
        self._target_max = -math.inf

    def add(self, chunk: dict[str, np.ndarray]) -> None:
        rows = batch_rows(chunk)
        if not rows:
            return
        self._pending.append(chunk)
        self._pending_rows += rows
        if self._pending_rows < self.batch_size:
            return
        merged = concat_chunks(self.kind, self._pending)
        start = 0
        while self._pending_rows - start >= self.batch_size:
            self._write(slice_chunk(self.kind, merged, start, start + self.batch_size))
            start += self.batch_size
        left = start < self._pending_rows
        self._pending = [slice_chunk(self.kind, merged, start, self._pending_rows)] if left else []
        self._pending_rows -= start

    def close(self) -> SplitInfo:
        """Write the last, partial part; return what was written."""
        if self._pending_rows:
            self._write(concat_chunks(self.kind, self._pending))
        self._pending, self._pending_rows = [], 0
        return self.info

    def _write(self, chunk: dict[str, np.ndarray]) -> None:
        arrays = _batch_arrays(self.kind, chunk)
        target = arrays["rating" if self.kind == "ratings" else "label"].astype(np.float64)
        self._target_sum += float(target.sum())
        self._target_min = min(self._target_min, float(target.min()))
        self._target_max = max(self._target_max, float(target.max()))
        data = encode_batch(arrays)
        key = part_key(self.split, len(self.info.parts))
        self.store.put(key, data)
        rows = batch_rows(arrays)
        self.info.parts.append(PartInfo(key=key, rows=rows, sha256=checksum(data)))
        self.info.rows += rows

    def stats(self, prefix: str) -> dict[str, float]:
        if not self.info.rows:
            return {}
        name = "rating" if self.kind == "ratings" else "label"
        stats = {f"{prefix}{name}_mean": self._target_sum / self.info.rows}
        if self.kind == "ratings":
            stats[f"{prefix}{name}_min"] = self._target_min
            stats[f"{prefix}{name}_max"] = self._target_max
        return stats


def _batch_arrays(kind: str, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The chunk with the exact dtypes of the stored format, contiguous."""
    dtypes = {
        "ratings": {"user": np.int32, "item": np.int32, "rating": np.float32},
        "sparse": {"label": np.float32, "indptr": np.int64, "indices": np.int32, "values": np.float32},
        "dense": {"label": np.float32, "x": np.float32},
    }[kind]
    return {name: np.ascontiguousarray(chunk[name], dtype=dtype) for name, dtype in dtypes.items()}


# ------------------------------------------------------------------------ ingestion


class _Progress:
    def __init__(self, callback: Progress | None, note: str):
        self.callback, self.note = callback, note
        self.rows = 0
        self._next = PROGRESS_EVERY

    def tick(self, rows: int) -> None:
        self.rows += rows
        if self.callback is not None and self.rows >= self._next:
            self.callback(self.rows, self.note)
            self._next = (self.rows // PROGRESS_EVERY + 1) * PROGRESS_EVERY

    def done(self) -> None:
        if self.callback is not None and self.rows:
            self.callback(self.rows, f"{self.note}: done")


class _Ingest:
    """Reads one format into chunks of the stored kind, and keeps what the manifest
    needs: id maps, feature ranges and dimension, skipped-row counts."""

    def __init__(self, fmt: str, *, skip_bad_rows: bool, num_features: int, numeric_scaling: str, max_dimension: int):
        self.fmt = fmt
        self.max_dimension = max_dimension
        self.skip_bad_rows = skip_bad_rows
        self.num_features = num_features
        self.numeric_scaling = numeric_scaling
        self.users, self.items = IdMap(), IdMap()
        self.feature_range: ColumnRange | None = None
        self.feature_names: list[str] | None = None
        self.max_index = -1
        self.movielens_flavour: str | None = None
        self.skipped_rows = 0
        self.bad_rows: list[str] = []
        self.dropped_unseen = 0

    def _reader(self, path: str | os.PathLike):
        skip = self.skip_bad_rows
        if self.fmt == "movielens":
            return MovieLensReader(path, skip_bad_rows=skip)
        if self.fmt == "criteo":
            # min-max needs the whole input's range: scale when writing parts instead.
            scaling = "none" if self.numeric_scaling == "minmax" else self.numeric_scaling
            return CriteoReader(path, num_features=self.num_features, numeric_scaling=scaling, skip_bad_rows=skip)
        if self.fmt == "libsvm":
            return LibSVMReader(path, skip_bad_rows=skip, max_dimension=self.max_dimension)
        return CSVReader(path, normalize=False, skip_bad_rows=skip)

    def read(self, path: str | os.PathLike, *, is_train: bool) -> Iterator[dict[str, np.ndarray]]:
        reader = self._reader(path)
        if self.fmt == "movielens":
            self.movielens_flavour = self.movielens_flavour or reader.flavour
        if self.fmt == "csv":
            if self.feature_names is None:
                self.feature_names = reader.feature_names
                self.feature_range = ColumnRange(reader.num_features)
            elif reader.feature_names != self.feature_names:
                raise DataError(f"{path}:1: feature columns {reader.feature_names} differ from {self.feature_names}")
        if self.fmt == "criteo" and self.numeric_scaling == "minmax" and self.feature_range is None:
            self.feature_range = ColumnRange(CRITEO_NUMERIC)
        for chunk in reader:
            if self.fmt == "movielens":
                chunk = self._remap(chunk, grow=is_train)
                for name, ids in (("users", self.users), ("items", self.items)):
                    if len(ids) > self.max_dimension:
                        raise DataError(
                            f"{path}:{reader.rows + batch_rows(chunk)}: more than {self.max_dimension:,} distinct "
                            f"{name} by this line (prepare.max_dimension, --max-dimension)"
                        )
            elif is_train and self.fmt == "csv":
                self.feature_range.update(chunk["x"])
            elif is_train and self.feature_range is not None:  # criteo minmax
                numeric = chunk["indices"] < CRITEO_NUMERIC
                self.feature_range.update_entries(chunk["indices"][numeric], chunk["values"][numeric])
            yield chunk
        if self.fmt == "libsvm":
            self.max_index = max(self.max_index, reader.max_index)
        self.skipped_rows += reader.skipped_rows
        self.bad_rows.extend(reader.bad_rows[: KEEP_BAD_ROWS - len(self.bad_rows)])

    def _remap(self, chunk: dict[str, np.ndarray], *, grow: bool) -> dict[str, np.ndarray]:
        user = self.users.encode(chunk["user"], grow=grow)
        item = self.items.encode(chunk["item"], grow=grow)
        if not grow:  # test rows of users/items never seen in training are unusable
            seen = (user >= 0) & (item >= 0)
            self.dropped_unseen += int(len(seen) - seen.sum())
            user, item, rating = user[seen], item[seen], chunk["rating"][seen]
            return {"user": user, "item": item, "rating": rating}
        return {"user": user, "item": item, "rating": chunk["rating"]}

    def finish(self, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Apply the min-max scaling (known only after the training pass) to a chunk."""
        if self.feature_range is None:
            return chunk
        if self.fmt == "csv":
            return {"label": chunk["label"], "x": self.feature_range.scale(chunk["x"])}
        values = chunk["values"].copy()
        numeric = chunk["indices"] < CRITEO_NUMERIC
        values[numeric] = self.feature_range.scale(values[numeric], chunk["indices"][numeric])
        return {**chunk, "values": values}

    def dimension(self) -> int:
        if self.fmt == "criteo":
            return self.num_features
        if self.fmt == "libsvm":
            return self.max_index + 1
        if self.fmt == "csv":
            return len(self.feature_names or ())
        return 0


# ------------------------------------------------------------------------- prepare


def prepare_dataset(
    fmt: str,
    input_path: str | os.PathLike,
    store: ObjectStore,
    *,
    test_input: str | os.PathLike | None = None,
    batch_size: int = _DEFAULT["batch_size"],
    test_fraction: float = _DEFAULT["test_fraction"],
    val_fraction: float = _DEFAULT["val_fraction"],
    seed: int = _DEFAULT["seed"],
    skip_bad_rows: bool = _DEFAULT["skip_bad_rows"],
    num_features: int = _DEFAULT["num_features"],
    numeric_scaling: str = _DEFAULT["numeric_scaling"],
    max_dimension: int = _DEFAULT["max_dimension"],
    progress: Progress | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    tmp_dir: str | os.PathLike | None = None,
    input_name: str | None = None,
    test_input_name: str | None = None,
) -> Manifest:
    """Parse, shuffle (seeded), split and store ``input_path`` as minibatch parts.

    ``fmt`` is movielens | criteo | libsvm | csv. The test split is ``test_input`` when
    given (MovieLens rows of users/items unseen in training are dropped and counted),
    else the last ``test_fraction`` of the shuffled rows. The validation split is the
    ``val_fraction`` of the input's shuffled rows just before the test rows: no row is in
    two splits, and the test split does not depend on it. The defaults are the job spec's
    (``ebb.spec.PrepareSpec``). ``num_features`` (hashing dimension) and ``numeric_scaling``
    (log | minmax | none) apply to Criteo; LibSVM's dimension is its largest index + 1 (at
    most ``max_dimension``, as are MovieLens's distinct users and items); CSV
    features are min-max scaled with the range of ``input_path``. ``bucket_bytes`` is the
    input per shuffle bucket (memory bound); ``progress(rows, note)`` is called about every
    100k rows. Deterministic for a given
    input, seed and ``bucket_bytes``. The manifest is written last and returned.
    ``input_name`` and ``test_input_name`` are what the manifest records as the inputs
    (default: their paths), e.g. the ``s3://`` URL a local copy was fetched from.
    """
    if fmt not in FORMAT_KINDS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {sorted(FORMAT_KINDS)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if test_input is None and test_fraction + val_fraction >= 1.0:
        raise ValueError(f"test_fraction + val_fraction must be below 1, got {test_fraction} + {val_fraction}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    if numeric_scaling not in NUMERIC_SCALINGS:
        raise ValueError(f"numeric_scaling must be one of {NUMERIC_SCALINGS}, got {numeric_scaling!r}")
    if fmt == "criteo" and num_features > max_dimension:
        raise ValueError(f"num_features {num_features:,} is more than max_dimension {max_dimension:,}")
    kind = FORMAT_KINDS[fmt]
    ingest = _Ingest(
        fmt,
        skip_bad_rows=skip_bad_rows,
        num_features=num_features,
        numeric_scaling=numeric_scaling,
        max_dimension=max_dimension,
    )
    # Independent streams, so adding a test file does not change the training order.
    train_rng, test_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))

    with tempfile.TemporaryDirectory(prefix="ebb-prepare-", dir=tmp_dir) as tmp:
        train_buckets = bucket_count(os.path.getsize(input_path), bucket_bytes)
        train_shuffle = ExternalShuffle(kind, Path(tmp, "train"), train_buckets, train_rng)
        _fill(train_shuffle, ingest.read(input_path, is_train=True), _Progress(progress, "reading train"))
        test_shuffle = None
        if test_input is not None:
            test_buckets = bucket_count(os.path.getsize(test_input), bucket_bytes)
            test_shuffle = ExternalShuffle(kind, Path(tmp, "test"), test_buckets, test_rng)
            _fill(test_shuffle, ingest.read(test_input, is_train=False), _Progress(progress, "reading test"))

        total = train_shuffle.rows
        test_rows = 0 if test_shuffle is not None else int(round(total * test_fraction))
        val_rows = round(total * val_fraction)
        train_rows = total - val_rows - test_rows
        if train_rows <= 0:
            raise ValueError(f"{input_name or input_path}: no training rows")
        # Reading succeeded; from here parts are overwritten, so an interrupted run must
        # not leave the old manifest describing half-new parts.
        store.delete(MANIFEST_KEY)
        train = _PartWriter(store, "train", kind, batch_size)
        val = _PartWriter(store, "val", kind, batch_size)
        test = _PartWriter(store, "test", kind, batch_size)
        # Row ranges of the shuffled input stream: [0, train_rows) → train, then val, then test.
        ranges = [
            (train, 0, train_rows),
            (val, train_rows, train_rows + val_rows),
            (test, train_rows + val_rows, total),
        ]
        writing = _Progress(progress, "writing parts")
        emitted = 0
        for chunk in train_shuffle:
            chunk = ingest.finish(chunk)
            rows = batch_rows(chunk)
            for writer, lo, hi in ranges:
                start, stop = max(lo - emitted, 0), min(hi - emitted, rows)
                if start < stop:
                    writer.add(slice_chunk(kind, chunk, start, stop))
            emitted += rows
            writing.tick(rows)
        for chunk in test_shuffle or ():
            test.add(ingest.finish(chunk))
            writing.tick(batch_rows(chunk))
        writing.done()

    source: dict[str, Any] = {
        "input": input_name or str(input_path),
        "test_input": None if test_input is None else test_input_name or str(test_input),
        "options": {
            "test_fraction": test_fraction,
            "val_fraction": val_fraction,
            "skip_bad_rows": skip_bad_rows,
            "num_features": num_features,
            "numeric_scaling": numeric_scaling,
            "bucket_bytes": bucket_bytes,
        },
        "shuffle_buckets": {"train": train_shuffle.n_buckets, "test": test_shuffle.n_buckets if test_shuffle else 0},
        "skipped_rows": ingest.skipped_rows,
        "bad_row_examples": ingest.bad_rows,
    }
    train_info, val_info, test_info = train.close(), val.close(), test.close()
    manifest = Manifest(
        format=fmt,
        kind=kind,
        batch_size=batch_size,
        seed=seed,
        train=train_info,
        test=test_info,
        val=val_info,
        stats={**train.stats(""), **val.stats("val_"), **test.stats("test_")},
        source=source,
    )
    if kind == "ratings":
        manifest.num_users, manifest.num_items = len(ingest.users), len(ingest.items)
        source["movielens_flavour"] = ingest.movielens_flavour
        source["test_rows_dropped_unseen"] = ingest.dropped_unseen
        source["id_map_key"] = ID_MAP_KEY
        store.put(ID_MAP_KEY, encode_batch({"user": ingest.users.raw_ids(), "item": ingest.items.raw_ids()}))
    else:
        manifest.num_features = ingest.dimension()
    if fmt == "criteo":
        source["hashing"] = (
            f"I{{j}} -> j-1; C{{j}}=v -> 13 + fnv1a64(b'C{{j}}=' + v) mod {num_features - CRITEO_NUMERIC}"
        )
    if ingest.feature_range is not None:
        source["scaling"] = {"method": "minmax", **ingest.feature_range.to_json()}
    if fmt == "csv":
        source["feature_names"] = ingest.feature_names

    _delete_stale_parts(store, manifest)
    store.put(MANIFEST_KEY, manifest.to_json().encode())
    return manifest


def _fill(shuffle: ExternalShuffle, chunks: Iterator[dict[str, np.ndarray]], progress: _Progress) -> None:
    for chunk in chunks:
        shuffle.add(chunk)
        progress.tick(batch_rows(chunk))
    progress.done()


def _delete_stale_parts(store: ObjectStore, manifest: Manifest) -> None:
    """Remove parts left by an earlier, larger preparation under the same prefix."""
    current = {p.key for split in SPLITS for p in getattr(manifest, split).parts}
    for split in SPLITS:
        for key in store.list(f"{split}/"):
            if key not in current:
                store.delete(key)


# -------------------------------------------------------------------------- reading


def load_part(store: ObjectStore, part: PartInfo) -> dict[str, np.ndarray]:
    """One stored part, decoded after checking its sha256 against the manifest."""
    data = store.get(part.key)
    digest = checksum(data)
    if digest != part.sha256:
        raise ChecksumError(
            f"part {part.key} is corrupt: its sha256 is {digest}, the manifest says {part.sha256}; "
            "prepare the dataset again"
        )
    return decode_batch(data)


def iter_parts(store: ObjectStore, manifest: Manifest, split: str) -> Iterator[dict[str, np.ndarray]]:
    """Every part of ``split`` ("train", "val" or "test") in order, checksums verified."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    for part in getattr(manifest, split).parts:
        yield load_part(store, part)


class InputError(ValueError):
    """An input of a prepare job cannot be read (``field`` names which: input, test_input)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def prepare_from_spec(prep, store: ObjectStore, progress: Progress | None = None) -> Manifest:
    """Prepare a dataset as a job spec's ``prepare`` section (``ebb.spec.PrepareSpec``) says.

    Inputs may be local files or ``s3://`` objects (fetched to a temporary copy, deleted
    afterwards); errors name the input as given, never the temporary copy. An unreadable
    input is an ``InputError``; a bad row a ``DataError`` (``file:line: what is wrong``).
    """
    from contextlib import ExitStack

    from ebb.ports.objects import is_s3
    from ebb.stores import local_copy

    with ExitStack() as fetched:
        local: dict[str, str] = {}
        for field, location in (("input", prep.input), ("test_input", prep.test_input)):
            if location is None:
                continue
            if not is_s3(location) and not Path(location).is_file():
                raise InputError(field, f"no such file: {location}")
            try:
                local[location] = str(fetched.enter_context(local_copy(location)))
            except KeyError as exc:
                raise InputError(field, exc.args[0]) from None
            except (ValueError, OSError) as exc:
                raise InputError(field, str(exc)) from None
        try:
            return prepare_dataset(
                prep.format,
                local[prep.input],
                store,
                test_input=local.get(prep.test_input),
                input_name=prep.input,
                test_input_name=prep.test_input,
                batch_size=prep.batch_size,
                test_fraction=prep.test_fraction,
                val_fraction=prep.val_fraction,
                seed=prep.seed,
                skip_bad_rows=prep.skip_bad_rows,
                num_features=prep.num_features,
                numeric_scaling=prep.numeric_scaling,
                max_dimension=prep.max_dimension,
                progress=progress,
            )
        except ValueError as exc:  # a bad row, or no rows at all: name the input as given
            message = str(exc)
            for location, path in local.items():
                message = message.replace(path, location)
            raise DataError(message) from None
