"""Streaming readers of the raw dataset formats.

Every reader is an iterable over *chunks*: dicts of numpy arrays in the batch layout of
:mod:`ebb.data.format` (a chunk holds the rows of a few MB of input), so a file of any
size is read with bounded memory. Parsing is vectorised per block of lines; when a block
does not parse cleanly it is re-parsed line by line, which finds the exact bad row.

A bad row raises :class:`DataError` ``"{path}:{lineno}: {what is wrong}"`` (lines are
counted from 1, header and comments included), or, with ``skip_bad_rows=True``, is
skipped and counted in the reader's ``skipped_rows`` (the first few messages are kept
in ``bad_rows``). Blank lines are ignored.

Chunks per reader:

* :class:`MovieLensReader`: ``user``/``item`` int64 *raw* ids, ``rating`` float32
  (remap the ids with :class:`IdMap`).
* :class:`CriteoReader`, :class:`LibSVMReader`: CSR ``label`` float32 (0/1),
  ``indptr`` int64, ``indices`` int32, ``values`` float32.
* :class:`CSVReader`: ``label`` float32 (0/1), ``x`` float32 ``[rows, features]``.
"""

from __future__ import annotations

import io
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

from ebb.data.format import batch_rows
from ebb.spec import PrepareSpec, field_default

BLOCK_BYTES = 4 << 20  # input read per vectorised parse
KEEP_BAD_ROWS = 5  # messages kept when skipping bad rows

CRITEO_NUMERIC = 13
CRITEO_CATEGORICAL = 26
CRITEO_FIELDS = 1 + CRITEO_NUMERIC + CRITEO_CATEGORICAL
NUMERIC_SCALINGS = ("log", "minmax", "none")

_MAX_INDEX = np.iinfo(np.int32).max - 1  # feature indices are stored as int32
# Values are stored as float32: a finite float64 beyond this would become infinity.
FLOAT32_MAX = float(np.finfo(np.float32).max)
# Raw ids are kept as int64; the vectorised parse reads them as float64, exact below 2**53.
_INT64 = (-(2**63), 2**63 - 1)
_EXACT_IN_FLOAT = 2.0**53
# Dimensions (features, users, items) beyond prepare.max_dimension are refused: a stray
# index of 2,147,483,000 would make every worker 8.6 GB.
MAX_DIMENSION: int = field_default(PrepareSpec, "max_dimension")


# A rating must survive float32 and the squared sums of the dataset's statistics.
MAX_RATING = 1e6


class DataError(ValueError):
    """A malformed input row: ``"{path}:{lineno}: {what is wrong}"``."""


class _BadRow(Exception):
    """Raised by a line parser; the reader adds path and line number."""


MESSAGE_CHARS = 200  # an error message quotes at most this much (a 10 MB line is not echoed)
_TOKEN_CHARS = 40


def _text(token: bytes) -> str:
    text = token[: 4 * _TOKEN_CHARS].strip().decode("utf-8", errors="replace")
    return text if len(text) <= _TOKEN_CHARS and len(token) <= 4 * _TOKEN_CHARS else text[:_TOKEN_CHARS] + "…"


def cut(message: str, limit: int = MESSAGE_CHARS) -> str:
    """``message`` in at most ``limit`` characters."""
    return message if len(message) <= limit else message[: limit - 1] + "…"


def _int_field(token: bytes, what: str) -> int:
    try:
        return _in_int64(int(token), token, what)
    except ValueError:
        pass
    # The vectorised path parses ids as floats, so accept "12.0" here too.
    try:
        number = float(token)
    except ValueError:
        number = float("nan")
    if not number.is_integer():
        raise _BadRow(f"{what} {_text(token)!r} is not an integer")
    return _in_int64(int(number), token, what)


def _in_int64(number: int, token: bytes, what: str) -> int:
    if not _INT64[0] <= number <= _INT64[1]:
        raise _BadRow(f"{what} {_text(token)!r} is out of range (a 64-bit integer)")
    return number


def _fits_float32(values: np.ndarray) -> bool:
    """Every value finite once stored as float32 (a finite float64 may overflow it)."""
    return bool((np.abs(values) <= FLOAT32_MAX).all())  # False for NaN and ±inf too


def _float_field(token: bytes, what: str, max_abs: float | None = None) -> float:
    try:
        number = float(token)
    except ValueError:
        raise _BadRow(f"{what} {_text(token)!r} is not a number") from None
    if not np.isfinite(number):
        raise _BadRow(f"{what} {_text(token)!r} is not finite")
    if max_abs is not None and abs(number) > max_abs:
        raise _BadRow(f"{what} {_text(token)!r} is out of range (|{what}| ≤ {max_abs:g})")
    if abs(number) > FLOAT32_MAX:
        raise _BadRow(f"{what} {_text(token)!r} is out of range: it is stored as float32 (|x| ≤ {FLOAT32_MAX:.4g})")
    return number


def _label_field(token: bytes) -> float:
    """Binary label: 0/1, or -1/+1 with -1 mapped to 0."""
    try:
        number = float(token)
    except ValueError:
        number = float("nan")
    if number not in (0.0, 1.0, -1.0):
        raise _BadRow(f"label {_text(token)!r} is not 0/1 or -1/+1")
    return 1.0 if number == 1.0 else 0.0


def _binary_labels(raw: np.ndarray) -> np.ndarray | None:
    """Vectorised :func:`_label_field`; None if some label is not -1, 0 or 1."""
    if not np.isin(raw, (0.0, 1.0, -1.0)).all():
        return None
    return (raw == 1.0).astype(np.float32)


def _iter_blocks(file: IO[bytes], first_lineno: int, block_bytes: int) -> Iterator[tuple[int, bytes]]:
    """Yield ``(number of the first line, block of whole lines each ending in b"\\n")``."""
    lineno = first_lineno
    carry = b""
    while True:
        data = file.read(block_bytes)
        if not data:
            break
        data = carry + data
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # a line longer than a block: keep reading
            carry = data
            continue
        block, carry = data[:cut], data[cut:]
        yield lineno, block
        lineno += block.count(b"\n")
    if carry:
        yield lineno, carry + b"\n"


def csr_from_rows(rows: list[tuple[float, list[int], list[float]]]) -> dict[str, np.ndarray]:
    """CSR chunk from ``(label, indices, values)`` rows."""
    lengths = np.fromiter((len(r[1]) for r in rows), dtype=np.int64, count=len(rows))
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return {
        "label": np.array([r[0] for r in rows], dtype=np.float32),
        "indptr": indptr,
        "indices": np.array([i for r in rows for i in r[1]], dtype=np.int32),
        "values": np.array([v for r in rows for v in r[2]], dtype=np.float32),
    }


class _LineReader(ABC):
    """Shared machinery: blocks of lines, a fast vectorised parse, a per-line fallback."""

    def __init__(self, path: str | os.PathLike, *, skip_bad_rows: bool = False, block_bytes: int = BLOCK_BYTES):
        self.path = path
        self.skip_bad_rows = skip_bad_rows
        self.block_bytes = block_bytes
        self.rows = 0  # rows yielded by the last (or current) pass
        self.skipped_rows = 0
        self.bad_rows: list[str] = []

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        self.rows, self.skipped_rows, self.bad_rows = 0, 0, []
        with open(self.path, "rb") as file:
            first_lineno = self._read_header(file)
            for lineno, block in _iter_blocks(file, first_lineno, self.block_bytes):
                if b"\r" in block:
                    block = block.replace(b"\r", b"")
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # e.g. loadtxt on blank lines: let the per-line parse judge
                        chunk = self._parse_block(block)
                except ValueError:
                    chunk = None
                if chunk is None:
                    chunk = self._parse_lines(lineno, block)
                chunk = self._finish(chunk)
                rows = batch_rows(chunk)
                if rows:
                    self.rows += rows
                    yield chunk

    def _read_header(self, file: IO[bytes]) -> int:
        """Consume a header if the format has one; return the number of the next line."""
        return 1

    def _parse_block(self, block: bytes) -> dict[str, np.ndarray] | None:
        """Vectorised parse of a block, or None when it needs the per-line parse."""
        return None

    @abstractmethod
    def _parse_line(self, line: bytes):
        """One row from one line, None for a line to ignore; raise :class:`_BadRow`."""

    @abstractmethod
    def _assemble(self, rows: list) -> dict[str, np.ndarray]:
        """A chunk from the rows :meth:`_parse_line` returned."""

    def _finish(self, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Hook applied to every chunk, whichever path parsed it."""
        return chunk

    def _parse_lines(self, first_lineno: int, block: bytes) -> dict[str, np.ndarray]:
        rows = []
        for offset, line in enumerate(block.split(b"\n")[:-1]):
            if not line.strip():
                continue
            try:
                row = self._parse_line(line)
            except _BadRow as err:
                self._bad_row(first_lineno + offset, str(err))
                continue
            if row is not None:
                rows.append(row)
        return self._assemble(rows)

    def _bad_row(self, lineno: int, what: str) -> None:
        message = cut(f"{self.path}:{lineno}: {what}")
        if not self.skip_bad_rows:
            raise DataError(message)
        self.skipped_rows += 1
        if len(self.bad_rows) < KEEP_BAD_ROWS:
            self.bad_rows.append(message)


# --------------------------------------------------------------------------- MovieLens

MOVIELENS_SEPARATORS = {"tab": b"\t", "dat": b"::", "csv": b","}


def detect_movielens_flavour(path: str | os.PathLike) -> str:
    """``"tab"`` (``u.data``), ``"dat"`` (``ratings.dat``, ``::``) or ``"csv"`` (``ratings.csv``).

    Decided by the first line's separator; the file name decides for an empty file.
    """
    with open(path, "rb") as file:
        first = file.readline(65536)
    if b"::" in first:
        return "dat"
    if b"\t" in first:
        return "tab"
    if b"," in first:
        return "csv"
    name = Path(path).name.lower()
    if name.endswith(".csv"):
        return "csv"
    if name.endswith(".dat"):
        return "dat"
    return "tab"


class MovieLensReader(_LineReader):
    """MovieLens ratings: ``user item rating timestamp`` in any of the three flavours.

    Chunks hold raw ids (``user``/``item`` int64) and ``rating`` float32; the timestamp
    must be a number but is not kept.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        flavour: str | None = None,
        skip_bad_rows: bool = False,
        block_bytes: int = BLOCK_BYTES,
    ):
        super().__init__(path, skip_bad_rows=skip_bad_rows, block_bytes=block_bytes)
        self.flavour = flavour or detect_movielens_flavour(path)
        if self.flavour not in MOVIELENS_SEPARATORS:
            raise ValueError(f"unknown MovieLens flavour {self.flavour!r}")
        self._separator = MOVIELENS_SEPARATORS[self.flavour]

    def _read_header(self, file: IO[bytes]) -> int:
        if self.flavour != "csv":
            return 1
        first = file.readline()
        try:
            float(first.split(b",")[0])
        except ValueError:
            return 2  # "userId,movieId,rating,timestamp"
        file.seek(0)
        return 1

    def _parse_block(self, block: bytes) -> dict[str, np.ndarray] | None:
        if self._separator != b"\t":
            block = block.replace(self._separator, b"\t")
        # numpy's C tokenizer: several times faster than splitting in Python.
        table = np.loadtxt(io.BytesIO(block), delimiter="\t", dtype=np.float64, ndmin=2, comments=None)
        if table.shape[1] != 4:
            return None
        ids = table[:, :2]
        if not (
            np.isfinite(table).all()
            and (ids == np.round(ids)).all()
            and (np.abs(ids) < _EXACT_IN_FLOAT).all()
            and (np.abs(table[:, 2]) <= MAX_RATING).all()
        ):
            return None  # the line-by-line path names the bad row
        return {
            "user": ids[:, 0].astype(np.int64),
            "item": ids[:, 1].astype(np.int64),
            "rating": table[:, 2].astype(np.float32),
        }

    def _parse_line(self, line: bytes) -> tuple[int, int, float]:
        fields = line.split(self._separator)
        if len(fields) != 4:
            raise _BadRow(f"expected 4 fields, got {len(fields)}")
        user = _int_field(fields[0], "user id")
        item = _int_field(fields[1], "item id")
        rating = _float_field(fields[2], "rating", max_abs=MAX_RATING)
        _float_field(fields[3], "timestamp")
        return user, item, rating

    def _assemble(self, rows: list[tuple[int, int, float]]) -> dict[str, np.ndarray]:
        return {
            "user": np.array([r[0] for r in rows], dtype=np.int64),
            "item": np.array([r[1] for r in rows], dtype=np.int64),
            "rating": np.array([r[2] for r in rows], dtype=np.float32),
        }


class IdMap:
    """Raw ids → contiguous ids ``0..n-1``, assigned as new raw ids are met."""

    def __init__(self) -> None:
        self._index: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._index)

    def encode(self, raw: np.ndarray, *, grow: bool = True) -> np.ndarray:
        """Contiguous int32 ids of ``raw``; unseen ids get new ids, or -1 if not ``grow``."""
        uniques, inverse = np.unique(raw, return_inverse=True)
        index = self._index
        if grow:
            # setdefault evaluates len() before inserting: the next free id.
            mapped = [index.setdefault(r, len(index)) for r in uniques.tolist()]
        else:
            mapped = [index.get(r, -1) for r in uniques.tolist()]
        return np.asarray(mapped, dtype=np.int32)[inverse.reshape(-1)]

    def raw_ids(self) -> np.ndarray:
        """The raw id of every contiguous id, in order (int64)."""
        return np.fromiter(self._index.keys(), dtype=np.int64, count=len(self._index))


# ----------------------------------------------------------------------------- ranges


class ColumnRange:
    """Running per-column min/max, and the min-max scaling to [0, 1] it defines."""

    def __init__(self, width: int):
        self.lo = np.full(width, np.inf)
        self.hi = np.full(width, -np.inf)

    def update(self, x: np.ndarray) -> None:
        """Fold in the rows of a dense ``[rows, width]`` array."""
        if len(x):
            np.minimum(self.lo, x.min(axis=0), out=self.lo)
            np.maximum(self.hi, x.max(axis=0), out=self.hi)

    def update_entries(self, columns: np.ndarray, values: np.ndarray) -> None:
        """Fold in sparse entries ``(column, value)``."""
        np.minimum.at(self.lo, columns, values)
        np.maximum.at(self.hi, columns, values)

    def scale(self, values: np.ndarray, columns: np.ndarray | None = None) -> np.ndarray:
        """``(x - lo) / (hi - lo)`` per column (0 for a constant or unseen column), float32.

        ``values`` is dense ``[rows, width]``, or flat entries of ``columns``.
        """
        lo, hi = (self.lo, self.hi) if columns is None else (self.lo[columns], self.hi[columns])
        span = hi - lo
        ok = np.isfinite(span) & (span > 0)
        scaled = np.where(ok, (values - np.where(ok, lo, 0.0)) / np.where(ok, span, 1.0), 0.0)
        return scaled.astype(np.float32)

    def to_json(self) -> dict[str, list[float | None]]:
        def clean(a: np.ndarray) -> list[float | None]:
            return [float(v) if np.isfinite(v) else None for v in a]

        return {"min": clean(self.lo), "max": clean(self.hi)}


# ------------------------------------------------------------------------------ Criteo


_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


def fnv1a64(data: bytes, state: int = _FNV_OFFSET) -> int:
    """64-bit FNV-1a hash of ``data``, continuing from ``state``."""
    for byte in data:
        state = ((state ^ byte) * _FNV_PRIME) & _MASK64
    return state


def _fnv1a64_array(values: np.ndarray, state: np.ndarray) -> np.ndarray:
    """:func:`fnv1a64` of every string of a bytes array (``S`` dtype), vectorised:
    one pass per byte position, ``state`` broadcast against ``values``."""
    values = np.ascontiguousarray(values)
    width = values.dtype.itemsize
    raw = values.view(np.uint8).reshape(*values.shape, width)
    length = np.char.str_len(values)
    hashed = np.broadcast_to(state, values.shape).astype(np.uint64)
    prime = np.uint64(_FNV_PRIME)
    for k in range(width):
        # uint64 arithmetic wraps modulo 2**64, as FNV requires.
        hashed = np.where(length > k, (hashed ^ raw[..., k]) * prime, hashed)
    return hashed


def criteo_category_index(column: int, value: bytes, num_features: int) -> int:
    """Hashed feature index of categorical column ``C{column}`` (1..26) holding ``value``.

    ``13 + fnv1a64(b"C{column}=" + value) mod (num_features - 13)``: stable across
    processes and machines, unlike Python's ``hash()``, and vectorisable in numpy.
    """
    return CRITEO_NUMERIC + fnv1a64(f"C{column}=".encode() + value) % (num_features - CRITEO_NUMERIC)


class CriteoReader(_LineReader):
    """Criteo TSV: ``label``, 13 integer columns I1..I13, 26 hex categorical columns C1..C26.

    Numeric column ``I{j+1}`` is feature ``j`` (0..12): ``log1p(max(x, 0))`` with
    ``numeric_scaling="log"``, min-max scaled with ``"minmax"`` (over ``numeric_range``,
    or a first pass over the file), raw with ``"none"``. Categorical values are hashed
    into ``[13, num_features)`` with value 1 (:func:`criteo_category_index`). An empty
    field is an absent feature.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        num_features: int = 100_000,
        numeric_scaling: str = "log",
        numeric_range: ColumnRange | None = None,
        skip_bad_rows: bool = False,
        block_bytes: int = BLOCK_BYTES,
    ):
        super().__init__(path, skip_bad_rows=skip_bad_rows, block_bytes=block_bytes)
        if num_features <= CRITEO_NUMERIC:
            raise ValueError(f"num_features must exceed {CRITEO_NUMERIC}, got {num_features}")
        if numeric_scaling not in NUMERIC_SCALINGS:
            raise ValueError(f"numeric_scaling must be one of {NUMERIC_SCALINGS}, got {numeric_scaling!r}")
        self.num_features = num_features
        self.numeric_scaling = numeric_scaling
        self.numeric_range = numeric_range
        self._buckets = num_features - CRITEO_NUMERIC
        # Hash state after each column's "C{j}=" prefix.
        self._prefix_state = np.array(
            [fnv1a64(f"C{j}=".encode()) for j in range(1, CRITEO_CATEGORICAL + 1)], dtype=np.uint64
        )

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.numeric_scaling == "minmax" and self.numeric_range is None:
            self.numeric_range = criteo_numeric_range(self.path, skip_bad_rows=self.skip_bad_rows)
        return super().__iter__()

    def _finish(self, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.numeric_scaling == "none":
            return chunk
        numeric = chunk["indices"] < CRITEO_NUMERIC
        values = chunk["values"]
        if self.numeric_scaling == "log":
            values[numeric] = np.log1p(np.maximum(values[numeric], 0.0))
        else:
            values[numeric] = self.numeric_range.scale(values[numeric], chunk["indices"][numeric])
        return chunk

    def _parse_block(self, block: bytes) -> dict[str, np.ndarray] | None:
        buf = np.frombuffer(block, dtype=np.uint8)
        newlines = np.flatnonzero(buf == ord("\n"))
        tabs_per_line = np.diff(np.searchsorted(np.flatnonzero(buf == ord("\t")), newlines), prepend=0)
        if (tabs_per_line != CRITEO_FIELDS - 1).any():
            return None
        rows = len(newlines)
        # One split of the whole block into a [rows, 40] table of byte strings.
        tokens = block.replace(b"\n", b"\t").split(b"\t")
        tokens.pop()
        table = np.array(tokens).reshape(rows, CRITEO_FIELDS)
        labels = table[:, 0].astype(np.float64)
        if not np.isin(labels, (0.0, 1.0)).all():
            return None  # Criteo labels are 0/1 only
        # [rows, 39] index and value tables; absent entries are masked out at the end.
        index = np.empty((rows, CRITEO_FIELDS - 1), dtype=np.int64)
        value = np.ones((rows, CRITEO_FIELDS - 1), dtype=np.float64)
        numeric = table[:, 1 : 1 + CRITEO_NUMERIC]
        numeric_present = numeric != b""
        value[:, :CRITEO_NUMERIC][numeric_present] = numeric[numeric_present].astype(np.float64)
        index[:, :CRITEO_NUMERIC] = np.arange(CRITEO_NUMERIC)
        categorical = table[:, 1 + CRITEO_NUMERIC :]
        hashed = _fnv1a64_array(categorical, self._prefix_state)
        index[:, CRITEO_NUMERIC:] = CRITEO_NUMERIC + (hashed % np.uint64(self._buckets)).astype(np.int64)
        mask = np.concatenate([numeric_present, categorical != b""], axis=1)
        if not _fits_float32(value[mask]):
            return None
        indptr = np.zeros(rows + 1, dtype=np.int64)
        np.cumsum(mask.sum(axis=1), out=indptr[1:])
        return {
            "label": labels.astype(np.float32),
            "indptr": indptr,
            "indices": index[mask].astype(np.int32),
            "values": value[mask].astype(np.float32),
        }

    def _parse_line(self, line: bytes) -> tuple[float, list[int], list[float]]:
        fields = line.split(b"\t")
        if len(fields) != CRITEO_FIELDS:
            raise _BadRow(f"expected {CRITEO_FIELDS} fields, got {len(fields)}")
        try:
            label = float(fields[0])
        except ValueError:
            label = float("nan")
        if label not in (0.0, 1.0):
            raise _BadRow(f"label {_text(fields[0])!r} is not 0 or 1")
        indices, values = [], []
        for j in range(CRITEO_NUMERIC):
            token = fields[1 + j]
            if token:
                indices.append(j)
                values.append(_float_field(token, f"I{j + 1} value"))
        for j, state in enumerate(self._prefix_state.tolist()):
            token = fields[1 + CRITEO_NUMERIC + j]
            if token:
                indices.append(CRITEO_NUMERIC + fnv1a64(token, state) % self._buckets)
                values.append(1.0)
        return label, indices, values

    def _assemble(self, rows: list) -> dict[str, np.ndarray]:
        return csr_from_rows(rows)


def criteo_numeric_range(path: str | os.PathLike, *, skip_bad_rows: bool = False) -> ColumnRange:
    """Min/max of each raw numeric column of a Criteo file (a streaming pass)."""
    numeric_range = ColumnRange(CRITEO_NUMERIC)
    for chunk in CriteoReader(path, numeric_scaling="none", skip_bad_rows=skip_bad_rows):
        numeric = chunk["indices"] < CRITEO_NUMERIC
        numeric_range.update_entries(chunk["indices"][numeric], chunk["values"][numeric])
    return numeric_range


# ------------------------------------------------------------------------------ LibSVM

_DIGITS = np.frombuffer(b"0123456789", dtype=np.uint8)


class LibSVMReader(_LineReader):
    """LibSVM / SVMlight: ``label idx:val idx:val ... [# comment]``.

    Labels 0/1 or -1/+1 (-1 becomes 0). Indices are kept as written (1-based files
    simply never use index 0), so the dimension is ``max_index + 1`` once read:
    :attr:`num_features`.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        skip_bad_rows: bool = False,
        block_bytes: int = BLOCK_BYTES,
        max_dimension: int = MAX_DIMENSION,
    ):
        super().__init__(path, skip_bad_rows=skip_bad_rows, block_bytes=block_bytes)
        self.max_index = -1
        self.index_limit = min(_MAX_INDEX, max_dimension - 1)

    @property
    def num_features(self) -> int:
        return self.max_index + 1

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        self.max_index = -1
        return super().__iter__()

    def _finish(self, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if len(chunk["indices"]):
            self.max_index = max(self.max_index, int(chunk["indices"].max()))
        return chunk

    def _parse_block(self, block: bytes) -> dict[str, np.ndarray] | None:
        if b"#" in block:
            return None
        buf = np.frombuffer(block, dtype=np.uint8)
        newlines = np.flatnonzero(buf == ord("\n"))
        colons = np.flatnonzero(buf == ord(":"))
        # Every colon must join two tokens ("3:1.5"), as the per-line parse requires.
        if len(colons) and not (np.isin(buf[colons - 1], _DIGITS).all() and (buf[colons + 1] > ord(" ")).all()):
            return None
        nnz = np.diff(np.searchsorted(colons, newlines), prepend=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # older numpy only warns on trailing garbage
            numbers = np.fromstring(block.replace(b":", b" "), dtype=np.float64, sep=" ")
        row_length = 1 + 2 * nnz
        if numbers.size != row_length.sum():
            return None  # blank lines, missing labels, stray tokens: per-line parse
        starts = np.cumsum(row_length) - row_length
        is_label = np.zeros(numbers.size, dtype=bool)
        is_label[starts] = True
        labels = _binary_labels(numbers[starts])
        pairs = numbers[~is_label].reshape(-1, 2)
        indices, values = pairs[:, 0], pairs[:, 1]
        if (
            labels is None
            or not _fits_float32(values)
            or not ((indices == np.round(indices)) & (indices >= 0) & (indices <= self.index_limit)).all()
        ):
            return None
        indptr = np.zeros(len(nnz) + 1, dtype=np.int64)
        np.cumsum(nnz, out=indptr[1:])
        return {
            "label": labels,
            "indptr": indptr,
            "indices": indices.astype(np.int32),
            "values": values.astype(np.float32),
        }

    def _parse_line(self, line: bytes) -> tuple[float, list[int], list[float]] | None:
        tokens = line.split(b"#", 1)[0].split()
        if not tokens:
            return None  # comment line
        label = _label_field(tokens[0])
        indices, values = [], []
        for token in tokens[1:]:
            index_text, colon, value_text = token.partition(b":")
            if not colon:
                raise _BadRow(f"feature {_text(token)!r} is not of the form index:value")
            try:
                index = int(index_text)
            except ValueError:
                raise _BadRow(f"feature index {_text(index_text)!r} is not an integer") from None
            if not 0 <= index <= self.index_limit:
                raise _BadRow(
                    f"feature index {index} is out of range [0, {self.index_limit}] "
                    "(at most prepare.max_dimension features, --max-dimension)"
                )
            indices.append(index)
            values.append(_float_field(value_text, "feature value"))
        return label, indices, values

    def _assemble(self, rows: list) -> dict[str, np.ndarray]:
        return csr_from_rows(rows)


# --------------------------------------------------------------------------------- CSV


class CSVReader(_LineReader):
    """Dense CSV with a header: the column named ``label`` (else the first) is the 0/1
    (or -1/+1) label; every other column is a numeric feature.

    With ``normalize`` each feature is min-max scaled to [0, 1] over ``feature_range``,
    or over the file itself (a streaming first pass).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        normalize: bool = True,
        feature_range: ColumnRange | None = None,
        skip_bad_rows: bool = False,
        block_bytes: int = BLOCK_BYTES,
    ):
        super().__init__(path, skip_bad_rows=skip_bad_rows, block_bytes=block_bytes)
        self.normalize = normalize
        self.feature_range = feature_range
        with open(path, "rb") as file:
            self.columns = [name.strip().decode("utf-8", errors="replace") for name in file.readline().split(b",")]
        if len(self.columns) < 2:
            raise DataError(f"{path}:1: a CSV header with a label and at least one feature column is required")
        self.label_column = self.columns.index("label") if "label" in self.columns else 0
        self.feature_names = [c for k, c in enumerate(self.columns) if k != self.label_column]
        self._feature_columns = [k for k in range(len(self.columns)) if k != self.label_column]

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.normalize and self.feature_range is None:
            self.feature_range = csv_feature_range(self.path, skip_bad_rows=self.skip_bad_rows)
        return super().__iter__()

    def _read_header(self, file: IO[bytes]) -> int:
        file.readline()
        return 2

    def _finish(self, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.normalize:
            chunk["x"] = self.feature_range.scale(chunk["x"])
        return chunk

    def _parse_block(self, block: bytes) -> dict[str, np.ndarray] | None:
        table = np.loadtxt(io.BytesIO(block), delimiter=",", dtype=np.float64, ndmin=2, comments=None)
        if table.shape[1] != len(self.columns) or not _fits_float32(table):
            return None
        labels = _binary_labels(table[:, self.label_column])
        if labels is None:
            return None
        return {"label": labels, "x": table[:, self._feature_columns].astype(np.float32)}

    def _parse_line(self, line: bytes) -> tuple[float, list[float]]:
        fields = line.split(b",")
        if len(fields) != len(self.columns):
            raise _BadRow(f"expected {len(self.columns)} fields, got {len(fields)}")
        label = _label_field(fields[self.label_column])
        features = [_float_field(fields[k], f"column {self.columns[k]!r} value") for k in self._feature_columns]
        return label, features

    def _assemble(self, rows: list[tuple[float, list[float]]]) -> dict[str, np.ndarray]:
        x = np.array([r[1] for r in rows], dtype=np.float32).reshape(len(rows), self.num_features)
        return {"label": np.array([r[0] for r in rows], dtype=np.float32), "x": x}


def csv_feature_range(path: str | os.PathLike, *, skip_bad_rows: bool = False) -> ColumnRange:
    """Min/max of every raw feature column of a CSV file (a streaming pass)."""
    reader = CSVReader(path, normalize=False, skip_bad_rows=skip_bad_rows)
    feature_range = ColumnRange(reader.num_features)
    for chunk in reader:
        feature_range.update(chunk["x"])
    return feature_range
