"""PMF's and sparse LR's training steps in one compiled pass each (``train.c``).

``pmf_update`` and ``sparse_lr_update`` return what ``Model.local_update`` returns — (loss
sum, samples, the unapplied ``RowUpdate``) — and advance the optimiser as its ``delta``
would, in place. Torch computes the same step in about ten passes over the batch, each
with its own temporaries; the kernel makes one pass over the ratings (or non-zeros) and
one over the rows they touch.

They return None where the kernels do not run — not built, stale, ``EBB_NATIVE=0``, or a
case they leave to torch (a rank of 512 or more, where torch sums a row in another order;
an optimiser or a tensor layout they do not know) — and the model takes its torch path,
which stays the reference. The kernels round as that path does (docs/ARCHITECTURE.md,
"Compiled kernels"): on x86-64, PMF under SGD gives torch's bits; lazy Adam's per-row bias
correction and sparse LR's sigmoid, which torch computes with its own vectorised pow and
exp, may differ in the last bit; the loss is summed in float64 and reported in float32.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import torch

from ebb import native
from ebb.models.optim import SparseAdam, SparseSGD
from ebb.sparse import RowUpdate

_SGD, _ADAM = 0, 1
_BAD_ROW = 1  # train.c's outcomes: EBB_DONE 0, EBB_BAD_ROW 1, EBB_BAD_POSITION 2
MAX_RANK = 511  # from 512 on, torch sums a dot product in cascades the kernel does not mirror
_BIAS_ROW = torch.zeros(1, dtype=torch.int64)


class _Param(ctypes.Structure):  # train.c's ebb_param
    _fields_ = [
        ("table", ctypes.c_void_p),
        ("n_rows", ctypes.c_int64),
        ("dim", ctypes.c_int64),
        ("rows", ctypes.c_void_p),
        ("k", ctypes.c_int64),
        ("state0", ctypes.c_void_p),
        ("state1", ctypes.c_void_p),
        ("row_steps", ctypes.c_void_p),
        ("base", ctypes.c_void_p),
        ("delta", ctypes.c_void_p),
    ]


def _usable(dtype: torch.dtype, *tensors: torch.Tensor) -> bool:
    """Whether the kernel can read ``tensors`` through raw pointers as ``dtype`` arrays."""
    return all(t.dtype == dtype and t.is_contiguous() for t in tensors)


def _known(opt, steps_per_row: bool) -> bool:
    """Whether the kernel mirrors ``opt``: SparseSGD, or SparseAdam counting steps as the model does."""
    return isinstance(opt, SparseSGD) or (isinstance(opt, SparseAdam) and (opt.row_steps is not None) == steps_per_row)


def _optimiser(opt) -> native.Optim:
    """The kernel's view of ``opt`` at its current step (after ``begin_step``)."""
    fused_axpy, fused_addcmul = native.torch_fuses()
    o = native.Optim(fused_axpy=fused_axpy, fused_addcmul=fused_addcmul)
    if isinstance(opt, SparseSGD):
        o.kind, o.lr_neg, o.momentum, o.nesterov = _SGD, -opt.lr, opt.momentum, opt.nesterov
        return o
    o.kind, o.beta1, o.beta2 = _ADAM, opt.beta1, opt.beta2
    o.one_minus_beta1, o.one_minus_beta2 = 1 - opt.beta1, 1 - opt.beta2
    if opt.row_steps is None:  # SparseAdam.delta's scalars, rounded to float32 as torch rounds them
        bias1 = 1 - opt.beta1**opt.steps
        root2 = (1 - opt.beta2**opt.steps) ** 0.5
        o.step, o.eps = -opt.lr * root2 / bias1, opt.eps * root2
    else:
        terms = _bias_terms(opt.beta1, opt.beta2, opt.steps)  # a row's count is at most the step count
        o.lr, o.eps_d, o.beta1_d, o.beta2_d = opt.lr, opt.eps, opt.beta1, opt.beta2
        o.bias_terms, o.bias_len = terms.ctypes.data, terms.shape[0]
    return o


_BIAS_TERMS: dict[tuple[float, float], np.ndarray] = {}


def _bias_terms(beta1: float, beta2: float, steps: int) -> np.ndarray:
    """[n] = (√(1 − β2ⁿ), √(1 − β2ⁿ) / (1 − β1ⁿ)) in float64 for n ≤ ``steps`` at least: lazy
    Adam's per-row bias correction for a row's count n, computed once each, with the
    platform's pow (which torch's own scalar path calls)."""
    terms = _BIAS_TERMS.get((beta1, beta2))
    if terms is None or terms.shape[0] <= steps:
        n = max(1024, 2 * steps)
        terms = np.zeros((n, 2))
        for i in range(1, n):
            root2 = math.sqrt(-math.pow(beta2, i) + 1.0)
            terms[i] = root2, root2 / (-math.pow(beta1, i) + 1.0)
        _BIAS_TERMS[(beta1, beta2)] = terms
    return terms


def _param(table: torch.Tensor, rows: torch.Tensor, opt, name: str) -> tuple[_Param, torch.Tensor, torch.Tensor] | None:
    """The kernel's view of one parameter and its optimiser state, and the base and delta
    tensors it fills (None: a layout the kernel does not read)."""
    if isinstance(opt, SparseSGD):
        s0, s1, steps = opt.buffers.get(name), None, None
        if opt.momentum and s0 is None:
            return None
    else:
        s0, s1, steps = opt.m[name], opt.v[name], None if opt.row_steps is None else opt.row_steps[name]
    if not (
        _usable(torch.float32, table, *(s for s in (s0, s1) if s is not None))
        and _usable(torch.int64, rows)
        and (steps is None or _usable(torch.float64, steps))
    ):
        return None
    base = torch.empty(rows.numel(), table.shape[1])
    delta = torch.empty(rows.numel(), table.shape[1])
    p = _Param(
        table=table.data_ptr(),
        n_rows=table.shape[0],
        dim=table.shape[1],
        rows=rows.data_ptr(),
        k=rows.numel(),
        state0=None if s0 is None else s0.data_ptr(),
        state1=None if s1 is None else s1.data_ptr(),
        row_steps=None if steps is None else steps.data_ptr(),
        base=base.data_ptr(),
        delta=delta.data_ptr(),
    )
    return p, base, delta


def pmf_update(
    params: dict[str, torch.Tensor], opt, batch, rank: int, mu: float, l2: float, row_sum: bool = False
) -> tuple[float, int, RowUpdate] | None:
    """``PMF.local_update(batch)`` in one pass (None: the kernels do not run here);
    ``row_sum``: a recurring row's gradient is the sum of its ratings' (``hyper.row_grad``)."""
    b = batch
    if (
        native._lib is None
        or rank > MAX_RANK
        or not _known(opt, steps_per_row=True)
        or params["user"].shape[1] != rank + 1
        or params["item"].shape[1] != rank + 1
        or not _usable(torch.int64, b.user_of, b.item_of)
        or not _usable(torch.float32, b.rating, b.user_count, b.item_count)
    ):
        return None
    user = _param(params["user"], b.users, opt, "user")
    item = _param(params["item"], b.items, opt, "item")
    if user is None or item is None:
        return None
    opt.begin_step()
    o = _optimiser(opt)
    n, loss_sum = b.rating.numel(), ctypes.c_double()
    _check(
        native._lib.ebb_pmf_step(
            ctypes.addressof(user[0]),
            ctypes.addressof(item[0]),
            rank,
            b.user_of.data_ptr(),
            b.item_of.data_ptr(),
            b.rating.data_ptr(),
            n,
            b.user_count.data_ptr(),
            b.item_count.data_ptr(),
            mu,
            l2,
            int(row_sum),
            ctypes.addressof(o),
            ctypes.byref(loss_sum),
        ),
        opt,
        "user or item id",
        params["user"].shape[0],
        params["item"].shape[0],
    )
    update = RowUpdate(
        {"user": (b.users, user[2]), "item": (b.items, item[2])}, base={"user": user[1], "item": item[1]}
    )
    return loss_sum.value, n, update


def sparse_lr_update(
    params: dict[str, torch.Tensor], opt, batch, l2: float, last: torch.Tensor | None = None
) -> tuple[float, int, RowUpdate] | None:
    """``SparseLR.local_update(batch)`` in one pass (None: the kernels do not run here).
    ``last``: the step each feature was last touched ([F, 1] float64, ``hyper.l2_every_step``):
    a feature's l2 is ``l2`` × the steps since, and the step's features are marked touched."""
    b = batch
    if (
        native._lib is None
        or (last is not None and not (_usable(torch.float64, last) and last.shape[0] == params["weight"].shape[0]))
        or not _known(opt, steps_per_row=False)
        or params["weight"].shape[1] != 1
        or not _usable(torch.int64, b.feature_of, b.sample_of)
        or not _usable(torch.float32, b.values, b.label)
    ):
        return None
    weight = _param(params["weight"], b.features, opt, "weight")
    bias = _param(params["bias"], _BIAS_ROW, opt, "bias")
    if weight is None or bias is None:
        return None
    opt.begin_step()
    o = _optimiser(opt)
    n, loss_sum = b.label.numel(), ctypes.c_double()
    scratch = torch.empty(n)  # (held here: its memory must outlive the call)
    _check(
        native._lib.ebb_sparse_lr_step(
            ctypes.addressof(weight[0]),
            ctypes.addressof(bias[0]),
            b.feature_of.data_ptr(),
            b.sample_of.data_ptr(),
            b.values.data_ptr(),
            b.values.numel(),
            b.label.data_ptr(),
            n,
            l2,
            None if last is None else last.data_ptr(),
            l2,
            float(opt.steps),
            scratch.data_ptr(),
            ctypes.addressof(o),
            ctypes.byref(loss_sum),
        ),
        opt,
        "feature index",
        params["weight"].shape[0],
    )
    update = RowUpdate(
        {"weight": (b.features, weight[2]), "bias": (_BIAS_ROW, bias[2])}, base={"weight": weight[1], "bias": bias[1]}
    )
    return loss_sum.value, n, update


def _check(outcome: int, opt, ids: str, *sizes: int) -> None:
    """Raise for a refused batch (the kernel touched no state; the step it began is undone)."""
    if outcome:
        opt.steps -= 1
        if outcome == _BAD_ROW:
            raise IndexError(
                f"a minibatch's {ids} is out of range of the model ({' and '.join(map(str, sizes))} rows):"
                " was the model built from this dataset's manifest?"
            )
        raise IndexError(
            "a minibatch's positions are out of range of its own rows: not a batch its model's to_batch made"
        )
