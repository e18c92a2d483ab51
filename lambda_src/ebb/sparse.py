"""Row-sparse model updates and their compact binary encoding.

Every model parameter is a 2-D tensor ``[rows, dim]`` (a weight vector is ``[D, 1]``).
An update touches a few rows of some parameters: per parameter, unique row indices and
the values to *add* to those rows. This is the unit that the significance filter trims
and the update store ships, so it is kept binary on the hot path (no pickle).

Wire format (little endian)::

    b"EBU1" | u16 n_params | per param: u16 name_len, name, u32 k, u32 dim,
                             int32[k] indices, float32[k*dim] values
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import torch

_MAGIC = b"EBU1"
_HEAD = struct.Struct("<4sH")
_PARAM = struct.Struct("<H")
_SHAPE = struct.Struct("<II")


@dataclass
class RowUpdate:
    """Additive update of some rows of some parameters: ``param[idx] += values``."""

    rows: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return all(idx.numel() == 0 for idx, _ in self.rows.values())

    def nnz(self) -> int:
        """Number of scalar values carried."""
        return sum(vals.numel() for _, vals in self.rows.values())

    def nbytes(self) -> int:
        """Size of the encoded form, without encoding it."""
        size = _HEAD.size
        for name, (idx, vals) in self.rows.items():
            size += _PARAM.size + len(name.encode()) + _SHAPE.size + 4 * idx.numel() + 4 * vals.numel()
        return size

    def encode(self) -> bytes:
        parts = [_HEAD.pack(_MAGIC, len(self.rows))]
        for name, (idx, vals) in self.rows.items():
            raw = name.encode()
            k = idx.numel()
            dim = vals.shape[1] if vals.dim() == 2 else 1
            parts.append(_PARAM.pack(len(raw)))
            parts.append(raw)
            parts.append(_SHAPE.pack(k, dim))
            parts.append(idx.to(torch.int32).numpy().tobytes())
            parts.append(vals.to(torch.float32).contiguous().numpy().tobytes())
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes | memoryview) -> "RowUpdate":
        buf = memoryview(data)
        magic, n = _HEAD.unpack_from(buf, 0)
        if magic != _MAGIC:
            raise ValueError(f"not an Ebb update (magic {bytes(magic)!r})")
        off = _HEAD.size
        rows: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for _ in range(n):
            (name_len,) = _PARAM.unpack_from(buf, off)
            off += _PARAM.size
            name = bytes(buf[off : off + name_len]).decode()
            off += name_len
            k, dim = _SHAPE.unpack_from(buf, off)
            off += _SHAPE.size
            idx = np.frombuffer(buf, dtype="<i4", count=k, offset=off)
            off += 4 * k
            vals = np.frombuffer(buf, dtype="<f4", count=k * dim, offset=off)
            off += 4 * k * dim
            # Copies: frombuffer views are read-only and tied to the source buffer.
            rows[name] = (torch.from_numpy(idx.astype(np.int64)), torch.from_numpy(vals.reshape(k, dim).copy()))
        return cls(rows)


def apply_update(params: dict[str, torch.Tensor], update: RowUpdate, scale: float = 1.0) -> None:
    """Add ``scale * update`` into ``params`` in place (indices within one param are unique)."""
    for name, (idx, vals) in update.rows.items():
        if idx.numel() == 0:
            continue
        if scale == 1.0:
            params[name].index_add_(0, idx, vals)
        else:
            params[name].index_add_(0, idx, vals, alpha=scale)
