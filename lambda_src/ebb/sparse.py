"""Sparse model updates and their compact binary encoding.

Every model parameter is a 2-D tensor ``[rows, dim]`` (a weight vector is ``[D, 1]``).
An update touches a few rows of some parameters: per parameter, unique row indices and
the values to *add* to those rows (``rows``). This is the unit that a model step yields,
the significance filter trims and the update store ships, so it is kept binary on the
hot path (no pickle).

Two more things travel with an update:

* ``touched``: the rows its sender touched, when that differs from the rows it carries.
  Under ISP a worker touches rows it does not send yet, and readers divide by the same
  number of touchers BSP would (see ``engine.aggregate``).
* ``elements``: single entries rather than whole rows. The ISP filter keeps only the
  significant entries of a row; a decoded update holds those as (row, flat index,
  value) triples, so applying it costs what it carries, not whole rows.

Wire format (little endian)::

    b"EBU3" | u16 n_entries | per entry:
        u16 name_len, name, u8 kind, u8 flags, u32 k, u32 dim, body
    kind 0, values:   indices, then flags & MASKED ? u8[k][ceil(dim/8)] masks, u32 nnz,
                      float32[nnz] : float32[k*dim]
    kind 1, touched:  indices
    kind 2, touched:  the same rows as entry number k of this update (no body)
    indices: flags & GAPS ? u32 first, u16[k-1] gaps : flags & BITMAP ? u32 n_bits,
             bitmap (LSB first) : int32[k]

The encoder picks the smallest index form and masks a row's entries only when that is
smaller, so a dense update (BSP) pays nothing for the options and a filtered one (ISP)
pays 4 bytes per value it carries plus one bit per entry of the rows it sends.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import torch

_MAGIC = b"EBU3"
_HEAD = struct.Struct("<4sH")
_NAME = struct.Struct("<H")
_ENTRY = struct.Struct("<BBII")
_U32 = struct.Struct("<I")
_VALUES, _TOUCHED, _SAME_ROWS = 0, 1, 2
_GAPS, _MASKED, _BITMAP = 1, 2, 4
# Adding one scalar by flat index costs about this many entries of a whole-row add
# (torch's index_add_ over rows is vectorised); below 1/_ELEMENT_COST of a masked
# entry's values present, a decoded update keeps single entries, above it whole rows.
_ELEMENT_COST = 4

Elements = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (row, flat index into the param, value)


@dataclass
class RowUpdate:
    """Additive update of some rows of some parameters: ``param[idx] += values``."""

    rows: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    touched: dict[str, torch.Tensor] | None = None  # rows the sender touched, when it differs from ``rows``
    elements: dict[str, Elements] | None = None  # single entries (decoded masked rows)

    def is_empty(self) -> bool:
        return (all(idx.numel() == 0 for idx, _ in self.rows.values())
                and all(e[0].numel() == 0 for e in (self.elements or {}).values()))

    def nnz(self) -> int:
        """Number of non-zero scalar values carried."""
        return (sum(int(torch.count_nonzero(vals)) for _, vals in self.rows.values())
                + sum(int(torch.count_nonzero(e[2])) for e in (self.elements or {}).values()))

    def touched_rows(self, name: str) -> torch.Tensor | None:
        """The rows of ``name`` the sender touched (the rows it carries, unless told otherwise)."""
        if self.touched is not None:
            return self.touched.get(name)
        entry = self.rows.get(name)
        return entry[0] if entry is not None else None

    def encode(self) -> bytes:
        touched = list((self.touched or {}).items())
        parts = [_HEAD.pack(_MAGIC, len(self.rows) + len(touched))]
        written: list[torch.Tensor] = []  # index tensors already on the wire, by entry number
        for name, (idx, vals) in self.rows.items():
            _encode_entry(parts, name, _VALUES, idx, vals)
            written.append(idx)
        for name, idx in touched:
            same = next((i for i, w in enumerate(written) if w is idx), None)
            if same is not None:  # e.g. a bias shares its rows with its embedding
                parts += [_NAME.pack(len(name.encode())), name.encode(), _ENTRY.pack(_SAME_ROWS, 0, same, 0)]
            else:
                _encode_entry(parts, name, _TOUCHED, idx, None)
            written.append(idx)
        return b"".join(parts)

    def nbytes(self) -> int:
        """Size of the encoded form."""
        return len(self.encode())

    @classmethod
    def decode(cls, data: bytes | memoryview) -> "RowUpdate":
        buf = memoryview(data)
        magic, n = _HEAD.unpack_from(buf, 0)
        if magic != _MAGIC:
            raise ValueError(f"not an Ebb update (magic {bytes(magic)!r})")
        off = _HEAD.size
        rows: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        touched: dict[str, torch.Tensor] = {}
        elements: dict[str, Elements] = {}
        indices: list[torch.Tensor] = []
        for _ in range(n):
            (name_len,) = _NAME.unpack_from(buf, off)
            off += _NAME.size
            name = bytes(buf[off : off + name_len]).decode()
            off += name_len
            kind, flags, k, dim = _ENTRY.unpack_from(buf, off)
            off += _ENTRY.size
            if kind == _SAME_ROWS:
                touched[name] = indices[k]
                indices.append(indices[k])
                continue
            idx, off = _decode_indices(buf, off, k, flags)
            indices.append(idx)
            if kind == _TOUCHED:
                touched[name] = idx
            elif flags & _MASKED:
                width = (dim + 7) // 8
                masks = np.frombuffer(buf, dtype=np.uint8, count=k * width, offset=off).reshape(k, width)
                off += k * width
                (nnz,) = _U32.unpack_from(buf, off)
                off += _U32.size
                pos = np.flatnonzero(np.unpackbits(masks, axis=1, count=dim, bitorder="little").view(bool))
                carried = np.frombuffer(buf, dtype="<f4", count=nnz, offset=off)
                off += 4 * nnz
                if nnz * _ELEMENT_COST < k * dim:
                    row = idx.numpy()[pos // dim]
                    flat = row * dim + pos % dim
                    elements[name] = (torch.from_numpy(row), torch.from_numpy(flat), torch.from_numpy(carried.copy()))
                else:  # most entries present: whole rows (zeros filled in) apply faster
                    vals = np.zeros(k * dim, dtype=np.float32)
                    vals[pos] = carried
                    rows[name] = (idx, torch.from_numpy(vals.reshape(k, dim)))
            else:
                # A copy: frombuffer views are read-only and tied to the source buffer.
                vals = np.frombuffer(buf, dtype="<f4", count=k * dim, offset=off).reshape(k, dim).copy()
                off += 4 * k * dim
                rows[name] = (idx, torch.from_numpy(vals))
        return cls(rows, touched or None, elements or None)


def _encode_entry(parts: list, name: str, kind: int, idx: torch.Tensor, vals: torch.Tensor | None) -> None:
    raw_name = name.encode()
    k = idx.numel()
    index = idx.numpy() if idx.dtype == torch.int64 else idx.to(torch.int64).numpy()
    flags, index_bytes = 0, None
    if k > 1:
        gaps = np.diff(index)
        if int(gaps.min()) > 0:  # sorted: a bitmap or two-byte gaps may be smaller
            bitmap_size = _U32.size + (int(index[-1]) + 8) // 8
            if bitmap_size < min(4 * k, _U32.size + 2 * (k - 1)):
                bits = np.zeros(int(index[-1]) + 1, dtype=bool)
                bits[index] = True
                flags, index_bytes = _BITMAP, _U32.pack(bits.size) + np.packbits(bits, bitorder="little").tobytes()
            elif int(gaps.max()) < 1 << 16:
                flags, index_bytes = _GAPS, _U32.pack(int(index[0])) + gaps.astype("<u2").tobytes()
    if index_bytes is None:
        index_bytes = index.astype("<i4").tobytes()
    dim = 0
    value_bytes: list[bytes] = []
    if vals is not None:
        v = vals.to(torch.float32).reshape(k, -1).numpy() if k else np.zeros((0, max(1, vals.shape[-1])), np.float32)
        dim = v.shape[1]
        keep = v != 0
        nnz = int(keep.sum())
        width = (dim + 7) // 8
        if 4 * (k * dim - nnz) > k * width + _U32.size:
            flags |= _MASKED
            value_bytes = [np.packbits(keep, axis=1, bitorder="little").tobytes(), _U32.pack(nnz),
                           v[keep].astype("<f4").tobytes()]
        else:
            value_bytes = [np.ascontiguousarray(v, dtype="<f4").tobytes()]
    parts += [_NAME.pack(len(raw_name)), raw_name, _ENTRY.pack(kind, flags, k, dim), index_bytes, *value_bytes]


def _decode_indices(buf: memoryview, off: int, k: int, flags: int) -> tuple[torch.Tensor, int]:
    if flags & _GAPS:
        (first,) = _U32.unpack_from(buf, off)
        idx = np.empty(k, dtype=np.int64)
        idx[0] = first
        np.cumsum(np.frombuffer(buf, dtype="<u2", count=k - 1, offset=off + _U32.size), out=idx[1:])
        idx[1:] += first
        return torch.from_numpy(idx), off + _U32.size + 2 * (k - 1)
    if flags & _BITMAP:
        (n_bits,) = _U32.unpack_from(buf, off)
        off += _U32.size
        nbytes = (n_bits + 7) // 8
        bits = np.unpackbits(np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=off), count=n_bits,
                             bitorder="little")
        idx = np.flatnonzero(bits.view(bool))  # a bool view: numpy counts it several times faster
        if idx.size != k:
            raise ValueError(f"corrupt update: its bitmap holds {idx.size} rows, its header says {k}")
        return torch.from_numpy(idx.astype(np.int64)), off + nbytes
    idx = np.frombuffer(buf, dtype="<i4", count=k, offset=off).astype(np.int64)
    return torch.from_numpy(idx), off + 4 * k


def apply_update(params: dict[str, torch.Tensor], update: RowUpdate, scale: float = 1.0) -> None:
    """Add ``scale * update`` into ``params`` in place (indices within one param are unique)."""
    for name, (idx, vals) in update.rows.items():
        if idx.numel():
            params[name].index_add_(0, idx, vals, alpha=scale)
    for name, (_, flat, vals) in (update.elements or {}).items():
        if flat.numel():
            params[name].view(-1).index_add_(0, flat, vals, alpha=scale)
