"""Ebb's optional compiled kernels: ISP's codec hot loops in one pass each, and the models'
training steps (``ebb.models.compiled``).

numpy costs one pass over the data per operation. Decoding a masked int8 payload takes
five of them (unpack the masks, find the carried positions, scatter the codes, widen,
scale) where BSP's float32 payload takes one, and every worker decodes every peer's
payload every step. ``kernels.c`` does each such loop in one pass. It is built by
``python -m ebb.native`` (``scripts/setup.sh`` and the worker image run it) and loaded
with ctypes. Without it, or with ``EBB_NATIVE=0``, every caller falls back to numpy.
Both paths give bit-identical results, so a fleet may mix them. ``train.c``, built into
the same library, holds the training steps (``ebb.models.compiled``, whose fallback is
the models' torch path) and ``add_rows``, the scatter of a local update into a replica.
``apply_payloads`` adds a whole step's payloads into a replica straight from the wire.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np
import torch

from ebb.native.build import LIBRARY

_FORMS = {None: 0, "q8": 1, "f16": 2}  # the kernel's `quantize` argument

KERNELS_VERSION = 10  # kernels.c's ebb_kernels_version(): a library that says otherwise is stale

_P = ctypes.c_void_p
_I = ctypes.c_int64


def _load(path: Path = LIBRARY) -> ctypes.CDLL | None:
    if os.environ.get("EBB_NATIVE", "1") == "0" or not path.is_file():
        return None
    try:
        lib = ctypes.CDLL(str(path))
        if lib.ebb_kernels_version() != KERNELS_VERSION:
            return None
        lib.ebb_expand_q8.restype = _I
        lib.ebb_expand_q8.argtypes = (_P, _I, _I, _I, _P, _I, _P, _P)
        lib.ebb_mask_elements.restype = _I
        lib.ebb_mask_elements.argtypes = (_P, _I, _I, _I, _P, _I, _P, _P, _P, _P, _P)
        lib.ebb_pack_masked.restype = _I
        lib.ebb_pack_masked.argtypes = (_P, ctypes.c_int, _I, _I, _P, _P)
        lib.ebb_isp_filter.restype = _I
        lib.ebb_isp_filter.argtypes = (_P, _I, _P, _I, _P, _P, ctypes.c_float, ctypes.c_int, _P, _P, _P, _P, _P)
        _F = ctypes.c_float
        lib.ebb_pmf_step.restype = ctypes.c_int
        lib.ebb_pmf_step.argtypes = (_P, _P, _I, _P, _P, _P, _I, _P, _P, _F, _F, ctypes.c_int, _P, _P)
        lib.ebb_sparse_lr_step.restype = ctypes.c_int
        lib.ebb_sparse_lr_step.argtypes = (
            _P,
            _P,
            _P,
            _P,
            _P,
            _I,
            _P,
            _I,
            _F,
            _P,
            ctypes.c_double,
            ctypes.c_double,
            _P,
            _P,
            _P,
        )
        lib.ebb_add_rows.restype = ctypes.c_int
        lib.ebb_add_rows.argtypes = (_P, _I, _I, _P, _I, _P, _F, _P)
        lib.ebb_apply_payloads.restype = _I
        lib.ebb_apply_payloads.argtypes = (_I, _P, _P, _I, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, ctypes.c_int, _F, _I)
    except (OSError, AttributeError):  # built for another machine, or stale: numpy does the work
        return None
    return lib


_lib = _load()


def available() -> bool:
    """Whether the compiled kernels are loaded (else callers use numpy)."""
    return _lib is not None


def expand_q8(masks: np.ndarray, dim: int, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Masked int8 rows to float32 [k, dim]: ``code × scale`` of the row where its mask bit
    is set (codes taken in order), 0 where not. ``masks`` uint8 [k, ceil(dim/8)] (LSB first),
    ``codes`` int8 [n], ``scales`` the rows' bfloat16 bit patterns, uint16 [k].

    Raises ValueError when the masks and the number of codes disagree (a corrupt payload).
    """
    k, width = masks.shape
    masks = np.ascontiguousarray(masks)
    scales = np.ascontiguousarray(scales, dtype=np.uint16)
    n = codes.size
    padded = np.empty(n + 8, dtype=np.int8)  # the kernel reads 8 codes at a time
    padded[:n] = codes
    flat = np.empty(k * dim + 8, dtype=np.float32)  # the kernel may write 8 floats past the last row
    out = flat[: k * dim].reshape(k, dim)
    _check_count(
        _lib.ebb_expand_q8(
            masks.ctypes.data, k, dim, width, padded.ctypes.data, n, scales.ctypes.data, out.ctypes.data
        ),
        n,
    )
    return out


def mask_elements(
    masks: np.ndarray,
    dim: int,
    idx: np.ndarray,
    n: int,
    codes: np.ndarray | None = None,
    scales: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The set bits of masked rows as single entries: (row, flat index ``row × dim + entry``)
    int64 [n] each, and with int8 ``codes`` their values ``code × scale`` float32 [n]
    (else None). ``idx``: the rows' indices, int64 [k]; the rest as ``expand_q8``."""
    k, width = masks.shape
    masks = np.ascontiguousarray(masks)
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    rows, flat = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    vals = None
    args = (None, None, None)
    if codes is not None:
        codes = np.ascontiguousarray(codes, dtype=np.int8)
        scales = np.ascontiguousarray(scales, dtype=np.uint16)
        vals = np.empty(n, dtype=np.float32)
        args = (codes.ctypes.data, scales.ctypes.data, vals.ctypes.data)
    _check_count(
        _lib.ebb_mask_elements(
            masks.ctypes.data, k, dim, width, idx.ctypes.data, n, rows.ctypes.data, flat.ctypes.data, *args
        ),
        n,
    )
    return rows, flat, vals


def pack_masked(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows [k, dim] (int8, float16 or float32) in the wire's masked form, in one pass: each
    row's mask of its non-zero entries (uint8 [k, ceil(dim/8)], LSB first) and those
    entries in order [nnz]; what ``np.packbits(v != 0, axis=1, bitorder="little")`` and
    ``v[v != 0]`` give."""
    k, dim = v.shape
    v = np.ascontiguousarray(v)
    masks = np.empty((k, (dim + 7) // 8), dtype=np.uint8)
    carried = np.empty(k * dim + 8 // v.itemsize, dtype=v.dtype)  # the kernel writes 8 bytes at a time
    nnz = _lib.ebb_pack_masked(v.ctypes.data, v.itemsize, k, dim, masks.ctypes.data, carried.ctypes.data)
    return masks, carried[:nnz]


def _check_count(carried: int, n: int) -> None:
    if carried != n:
        raise ValueError(f"corrupt update: its row masks carry {carried} values, its header says {n}")


def _address(a: np.ndarray | torch.Tensor) -> int:
    """Where a contiguous array's data start (a torch tensor's is cheaper to ask: numpy's
    ``.ctypes.data`` builds an object each time)."""
    return a.data_ptr() if isinstance(a, torch.Tensor) else a.ctypes.data


def _contiguous(a: np.ndarray | torch.Tensor, dtype: np.dtype) -> np.ndarray | torch.Tensor:
    if isinstance(a, torch.Tensor) and a.dtype == _TORCH[dtype] and a.is_contiguous():
        return a
    return np.ascontiguousarray(a, dtype=dtype)


_TORCH = {np.dtype(np.float32): torch.float32, np.dtype(np.int64): torch.int64}


def isp_filter(
    table: np.ndarray,
    rows: np.ndarray | torch.Tensor,
    vals: np.ndarray | torch.Tensor,
    x: np.ndarray | torch.Tensor,
    v: np.float32,
    form: str | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None] | None:
    """The ISP significance filter on one parameter's touched rows, in one pass (see
    ``ebb.engine.isp``): ``table`` (the pending δ, float32 [N, dim], updated in place),
    ``rows`` int64 [k], ``vals`` and ``x`` (the update and the parameter's rows) float32
    [k, dim] (numpy arrays or torch tensors), threshold ``v``; ``form`` as
    ``ebb.sparse.quantize_rows`` would pick it: "q8" (int8 codes with bfloat16 row
    scales), "f16" (float16) or None (float32 as is).

    Returns the sent rows' positions among ``rows`` [q], their float32 values [q, dim]
    and, when quantised, their codes [q, dim] (int8 or float16) and the scales' bit
    patterns [q] (None for float16); or None, with ``table`` untouched, when a row holds
    NaN or infinity (the caller runs numpy).
    """
    if not (table.flags.c_contiguous and table.dtype == np.float32):  # written through a raw pointer
        raise ValueError(f"isp_filter needs a C-contiguous float32 table, not {table.dtype} {table.strides}")
    k, dim = vals.shape
    vals, x = _contiguous(vals, np.dtype(np.float32)), _contiguous(x, np.dtype(np.float32))
    rows = _contiguous(rows, np.dtype(np.int64))
    mode = _FORMS[form]
    # Every output and the scratch in one allocation: the rows as they were (put back on
    # NaN), the sent values, the positions, the codes and the scales, each 8-byte aligned.
    n = k * dim
    code_bytes = 0 if mode == 0 else (n if mode == 1 else 2 * n)
    sizes = (4 * n, 4 * n, 8 * k, code_bytes, 2 * k if mode == 1 else 0)
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + (size + 7) // 8 * 8)
    buf = np.empty(offsets[-1], dtype=np.uint8)
    base = buf.ctypes.data
    sent = buf[offsets[1] : offsets[1] + 4 * n].view(np.float32).reshape(k, dim)
    at = buf[offsets[2] : offsets[2] + 8 * k].view(np.int64)
    codes = None if mode == 0 else buf[offsets[3] : offsets[3] + code_bytes].view(np.int8 if mode == 1 else np.float16)
    scales = buf[offsets[4] : offsets[4] + 2 * k].view(np.uint16) if mode == 1 else None
    q = _lib.ebb_isp_filter(
        table.ctypes.data,
        dim,
        _address(rows),
        k,
        _address(vals),
        _address(x),
        v,
        mode,
        base,
        base + offsets[1],
        None if codes is None else base + offsets[3],
        None if scales is None else base + offsets[4],
        base + offsets[2],
    )
    if q < 0:
        return None
    if codes is not None:
        codes = codes.reshape(k, dim)[:q]
    return at[:q], sent[:q], codes, None if scales is None else scales[:q]


class Optim(ctypes.Structure):
    """train.c's ebb_optim: an optimiser's scalars, rounded as torch rounds them (see
    ``ebb.models.compiled``)."""

    _fields_ = [
        ("kind", ctypes.c_int32),
        ("fused_axpy", ctypes.c_int32),
        ("fused_addcmul", ctypes.c_int32),
        ("nesterov", ctypes.c_int32),
        ("lr_neg", ctypes.c_float),
        ("momentum", ctypes.c_float),
        ("beta1", ctypes.c_float),
        ("beta2", ctypes.c_float),
        ("one_minus_beta1", ctypes.c_float),
        ("one_minus_beta2", ctypes.c_float),
        ("step", ctypes.c_float),
        ("eps", ctypes.c_float),
        ("lr", ctypes.c_double),
        ("eps_d", ctypes.c_double),
        ("bias_terms", ctypes.c_void_p),
        ("bias_len", ctypes.c_int64),
        ("beta1_d", ctypes.c_double),
        ("beta2_d", ctypes.c_double),
    ]


@cache
def torch_fuses() -> tuple[bool, bool]:
    """Whether torch rounds ``x.add(y, alpha=a)`` (and ``index_add_``) and ``x.addcmul(y, z,
    value=a)`` once, as a fused multiply-add (its AVX2 and AVX-512 kernels), or twice (its
    portable ones): asked of torch itself, on 64 values (its vector loop and its tail) where
    the two differ."""
    near_one = torch.full((64,), 1.0 + 2.0**-12)  # squared: 1 + 2^-11 + 2^-24, a tie in float32
    axpy = torch.full((64,), -1.0).add_(near_one, alpha=1.0 + 2.0**-12)
    addcmul = torch.full((64,), -1.0).addcmul_(near_one, near_one, value=1.0)
    once = 2.0**-11 + 2.0**-24
    return bool((axpy == once).all()), bool((addcmul == once).all())


def add_rows(table: torch.Tensor, rows: torch.Tensor, vals: torch.Tensor, scale: float = 1.0) -> bool:
    """``table.index_add_(0, rows, vals, alpha=scale)`` for unique ``rows``, rounded as torch
    rounds it, in one pass. False (nothing done) where the kernels do not run or the
    tensors are not contiguous float32 [N, dim], int64 [k] and float32 [k, dim]: the caller
    runs torch. Raises IndexError, having written nothing, for a row not in ``table``."""
    if (
        _lib is None
        or table.dtype != torch.float32
        or vals.dtype != torch.float32
        or rows.dtype != torch.int64
        or table.dim() != 2
        or vals.shape != (rows.numel(), table.shape[1])
        or not (table.is_contiguous() and rows.is_contiguous() and vals.is_contiguous())
    ):
        return False
    opt = Optim(fused_axpy=torch_fuses()[0])
    if _lib.ebb_add_rows(
        table.data_ptr(),
        table.shape[0],
        table.shape[1],
        rows.data_ptr(),
        rows.numel(),
        vals.data_ptr(),
        scale,
        ctypes.addressof(opt),
    ):
        raise IndexError(f"an update's row is out of range of a table of {table.shape[0]} rows")
    return True


_APPLY_ERRORS = {
    -1: (ValueError, "corrupt update: a payload's entries run past its end or disagree with their header"),
    -2: (IndexError, "an update's row is out of range of its table"),
    -3: (ValueError, "an update's rows are not as wide as its table's"),
    -4: (MemoryError, "no memory to decode a step's updates"),
}


_TABLES_ARGS: dict[tuple, tuple] = {}  # per replica: ebb_apply_payloads' arguments that name its tables


def _tables_args(names: tuple[str, ...], tables: tuple[torch.Tensor, ...], counts: tuple[torch.Tensor, ...]) -> tuple:
    """(names, name lengths, table pointers, rows, widths, count pointers) as the kernel takes
    them, built once per replica (a worker's tables stay where they are, updated in place)."""
    key = (names, *(t.data_ptr() for t in tables), *(t.shape for t in tables), *(c.data_ptr() for c in counts))
    args = _TABLES_ARGS.get(key)
    if args is None:
        raw = [name.encode() for name in names]
        p = len(names)
        ptrs, ints = ctypes.c_void_p * p, ctypes.c_int64 * p
        args = (
            b"".join(raw),
            ints(*map(len, raw)),
            ptrs(*(t.data_ptr() for t in tables)),
            ints(*(t.shape[0] for t in tables)),
            ints(*(t.shape[1] for t in tables)),
            ptrs(*(c.data_ptr() for c in counts)),
        )
        if len(_TABLES_ARGS) >= 64:  # (replicas come and go: a bounded cache)
            _TABLES_ARGS.clear()
        _TABLES_ARGS[key] = args
    return args


def apply_payloads(
    tables: dict[str, torch.Tensor],
    counts: dict[str, torch.Tensor],
    sources: Sequence[bytes | bytearray | memoryview | dict[str, tuple[torch.Tensor, torch.Tensor]]],
    divide: bool,
    per: float,
    element_cost: int,
) -> bool:
    """Add a step's updates into ``tables`` in one compiled call, decoding each payload
    straight from the wire: what ``RowMean.apply`` does with each payload's
    ``RowUpdate.decode``, bit for bit (see kernels.c, ``ebb_apply_payloads``).

    ``sources`` in order: encoded payloads (``bytes``), and at most one in-memory update
    as {name: (rows int64 [k], values float32 [k, dim])}. ``counts``: RowMean's zeroed
    per-row float32 scratch. False (nothing done) where the kernels do not run or a table
    is not a contiguous float32 [N, dim]: the caller decodes and applies in Python.
    Raises ValueError, IndexError or MemoryError, having written nothing, for a payload
    it cannot apply.
    """
    if _lib is None:
        return False
    names = list(tables)
    for name in names:
        t, c = tables[name], counts[name]
        if t.dtype != torch.float32 or t.dim() != 2 or not t.is_contiguous() or c.dtype != torch.float32:
            return False
    tabled = _tables_args(tuple(names), tuple(tables[m] for m in names), tuple(counts[m] for m in names))
    n, p = len(sources), len(names)
    # A payload's bytes are passed by address (c_char_p: no copy; another buffer type is
    # copied to bytes first); the own slot stays NULL.
    wire = [None if isinstance(s, dict) else s if type(s) is bytes else bytes(s) for s in sources]
    bufs = (ctypes.c_char_p * n)(*wire)
    lens = (ctypes.c_int64 * n)(*(0 if w is None else len(w) for w in wire))
    own_at, keep = -1, []
    own_rows, own_vals, own_k = (ctypes.c_void_p * p)(), (ctypes.c_void_p * p)(), (ctypes.c_int64 * p)(*([-1] * p))
    for s, source in enumerate(sources):
        if isinstance(source, dict):
            if own_at >= 0:
                return False
            own_at = s
            for i, name in enumerate(names):
                entry = source.get(name)
                if entry is None or not entry[0].numel():
                    continue
                rows = entry[0].to(torch.int64).contiguous()
                vals = entry[1].to(torch.float32).reshape(rows.numel(), -1).contiguous()
                if vals.shape[1] != tables[name].shape[1]:
                    return False
                keep += [rows, vals]
                own_rows[i], own_vals[i], own_k[i] = rows.data_ptr(), vals.data_ptr(), rows.numel()
    status = _lib.ebb_apply_payloads(
        n, bufs, lens, own_at, p, *tabled, own_rows, own_vals, own_k, int(divide), per, element_cost
    )
    if status:
        error, message = _APPLY_ERRORS.get(status, (RuntimeError, f"ebb_apply_payloads returned {status}"))
        raise error(message)
    return True
