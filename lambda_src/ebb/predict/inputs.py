"""Readers of the rows ``ebb predict`` scores, preprocessed as the model's training data was.

Sparse and dense LR rows use the training readers (``ebb.data.readers``) configured from
``model.json``: Criteo hashing and numeric scaling, CSV min-max ranges, so a row scores
as it trained. Ratings files are MovieLens-style rows of ``user item [rating
[timestamp]]`` (any of the three separators): the rating, when present, makes the RMSE.
"""

from __future__ import annotations

import io
import os
import warnings
from typing import Any

import numpy as np

from ebb.data.readers import (
    ColumnRange,
    CriteoReader,
    CSVReader,
    DataError,
    LibSVMReader,
    MovieLensReader,
    _BadRow,
    _float_field,
    _int_field,
)


def _column_range(scaling: dict[str, Any]) -> ColumnRange:
    lo = np.array([np.inf if v is None else v for v in scaling["min"]], dtype=np.float64)
    hi = np.array([-np.inf if v is None else v for v in scaling["max"]], dtype=np.float64)
    cr = ColumnRange(len(lo))
    cr.lo, cr.hi = lo, hi
    return cr


def lr_reader(meta: dict[str, Any], path: str | os.PathLike, *, skip_bad_rows: bool = False):
    """The training format's reader for ``path``, scaling and hashing as in training."""
    pre = meta.get("preprocessing", {})
    fmt = pre.get("format")
    if fmt == "criteo":
        scaling = pre.get("numeric_scaling", "log")
        return CriteoReader(
            path,
            num_features=pre["num_features"],
            numeric_scaling=scaling,
            numeric_range=_column_range(pre["scaling"]) if scaling == "minmax" else None,
            skip_bad_rows=skip_bad_rows,
        )
    if fmt == "libsvm":
        return LibSVMReader(path, skip_bad_rows=skip_bad_rows)
    if fmt == "csv":
        reader = CSVReader(path, normalize=True, feature_range=_column_range(pre["scaling"]),
                           skip_bad_rows=skip_bad_rows)  # fmt: skip
        if reader.feature_names != pre.get("feature_names"):
            raise DataError(f"{path}:1: feature columns {reader.feature_names} differ from the model's "
                            f"{pre.get('feature_names')}")  # fmt: skip
        return reader
    raise DataError(f"{path}: the model was trained on {fmt!r} data, which ebb predict does not read")


class PairsReader(MovieLensReader):
    """MovieLens-style rows with the rating optional: ``user item [rating [timestamp]]``.
    Chunks hold raw ``user``/``item`` (int64) and ``rating`` (float32, NaN when absent)."""

    def _parse_block(self, block: bytes) -> dict[str, np.ndarray] | None:
        if self._separator != b"\t":
            block = block.replace(self._separator, b"\t")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            table = np.loadtxt(io.BytesIO(block), delimiter="\t", dtype=np.float64, ndmin=2, comments=None)
        if table.shape[1] not in (2, 3, 4) or not np.isfinite(table).all():
            return None
        ids = table[:, :2]
        if not (ids == np.round(ids)).all():
            return None
        rating = table[:, 2] if table.shape[1] > 2 else np.full(len(table), np.nan)
        return {"user": ids[:, 0].astype(np.int64), "item": ids[:, 1].astype(np.int64),
                "rating": rating.astype(np.float32)}  # fmt: skip

    def _parse_line(self, line: bytes) -> tuple[int, int, float]:
        fields = line.split(self._separator)
        if len(fields) not in (2, 3, 4):
            raise _BadRow(f"expected 2 to 4 fields (user, item[, rating[, timestamp]]), got {len(fields)}")
        user = _int_field(fields[0], "user id")
        item = _int_field(fields[1], "item id")
        rating = _float_field(fields[2], "rating") if len(fields) > 2 else float("nan")
        return user, item, rating


def ids_file(path: str | os.PathLike) -> np.ndarray:
    """Raw user ids, one a line (a first line that is not a number is a header)."""
    ids = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            token = line.split(b",")[0].strip()
            if not token:
                continue
            try:
                ids.append(int(token))
            except ValueError:
                if lineno == 1:
                    continue
                raise DataError(
                    f"{path}:{lineno}: user id {token.decode(errors='replace')!r} is not an integer"
                ) from None
    return np.array(ids, dtype=np.int64)
