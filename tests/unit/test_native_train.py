"""The fused training kernels (ebb.models.compiled) against the models' torch path.

The torch path is the reference. On x86-64 PMF under SGD must give its bits: the loss
aside (the kernel sums it in float64), every update, base row, momentum buffer and,
after many steps, the replica. What torch computes with its own vectorised routines
cannot be matched bit for bit, only to float32 rounding: the square root and per-row
bias correction of lazy Adam (MKL's vsSqrt, SLEEF's pow) and sparse LR's sigmoid
(SLEEF's exp). Those tests feed both paths the same replica every step (the torch
path's update is applied to both), so each step's difference is the rounding alone.
The kernels are built once per session (conftest.native_library), whatever the checkout holds.
"""

from __future__ import annotations

import copy
import platform
import shutil

import numpy as np
import pytest
import torch

from ebb import native
from ebb.models import compiled as training
from ebb.models.logistic import SparseLR
from ebb.models.pmf import PMF
from ebb.sparse import RowUpdate

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler"),
]

# Torch's bits on x86-64 (the dot product's summation order is aten's there); elsewhere
# the kernel is held to float32 rounding.
EXACT = platform.machine() in ("x86_64", "AMD64")
# Float32 rounding, for what torch computes with its own vectorised routines: relative to
# the value, or to the learning rate for an Adam step (about lr whatever the gradient).
RTOL, ADAM_ATOL = 2e-5, 1e-6


@pytest.fixture
def library(native_library):
    return native_library


def _step(monkeypatch, lib, model, batch):
    """One local_update with the kernels ``lib`` (or the torch path: None)."""
    monkeypatch.setattr(native, "_lib", lib)
    return model.local_update(batch)


def _ratings(rng, n: int, users: int, items: int) -> dict[str, np.ndarray]:
    return {
        "user": rng.integers(0, users, n).astype(np.int32),
        "item": rng.integers(0, items, n).astype(np.int32),
        "rating": rng.uniform(0.5, 5.0, n).astype(np.float32),
    }


def _csr(rng, n: int, features: int, nnz_per_row: int) -> dict[str, np.ndarray]:
    """Rows of 0 to 2·nnz_per_row hashed features (empty rows and repeats included)."""
    counts = rng.integers(0, 2 * nnz_per_row + 1, n)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return {
        "label": (rng.random(n) < 0.3).astype(np.float32),
        "indptr": indptr,
        "indices": rng.integers(0, features, indptr[-1]).astype(np.int32),
        "values": rng.standard_normal(indptr[-1]).astype(np.float32),
    }


def _pmf(
    rank: int,
    optimizer: str,
    users: int = 60,
    items: int = 40,
    momentum: float = 0.9,
    l2: float = 0.05,
    lr: float | None = None,
    row_grad: str = "mean",
) -> PMF:
    return PMF(
        users,
        items,
        rank=rank,
        lr=lr or (0.01 if optimizer == "adam" else 0.05),
        momentum=momentum,
        l2=l2,
        init_std=0.3,
        global_mean=3.0,
        seed=rank,
        optimizer=optimizer,
        row_grad=row_grad,
    )


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int64)


def _same(got: torch.Tensor, want: torch.Tensor, exact: bool = EXACT, atol: float = 0.0) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if exact:
        assert torch.equal(_bits(got), _bits(want))
    else:
        torch.testing.assert_close(got, want, rtol=RTOL, atol=atol)


def _same_update(got: RowUpdate, want: RowUpdate, exact: bool = EXACT, atol: float = 0.0) -> None:
    assert got.rows.keys() == want.rows.keys()
    for name, (rows, vals) in want.rows.items():
        assert torch.equal(got.rows[name][0], rows)
        _same(got.rows[name][1], vals, exact, atol)
    for name, base in (want.base or {}).items():
        _same(got.base[name], base, exact=True)  # rows copied from the same replica


def _same_state(got, want, exact: bool = EXACT, atol: float = 0.0) -> None:
    got_state, want_state = got.optimizer.state(), want.optimizer.state()
    assert got_state.keys() == want_state.keys()
    for key, value in want_state.items():
        _same(got_state[key], value, exact or value.dtype != torch.float32, atol)


@pytest.mark.parametrize("rank", [1, 3, 4, 7, 8, 13, 20, 31, 33, 40, 70])
@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_pmf_sgd_gives_the_torch_paths_bits(monkeypatch, library, rank, momentum):
    """Every rank's summation path (under 8, whole vectors, four interleaved from 32, a
    tail), with and without Nesterov momentum, over random batches full of repeats."""
    rng = np.random.default_rng(rank)
    fast = _pmf(rank, "sgd_momentum", momentum=momentum)
    slow = copy.deepcopy(fast)
    for _ in range(6):
        batch = fast.to_batch(_ratings(rng, int(rng.integers(1, 400)), 60, 40))
        loss, n, update = _step(monkeypatch, library, fast, batch)
        want_loss, want_n, want = _step(monkeypatch, None, slow, batch)
        assert n == want_n and loss == pytest.approx(want_loss, rel=1e-6)
        assert loss == float(np.float32(loss))  # as torch reports it: the fleet's sum is order-free
        assert update.base is not None  # the ISP filter reads |x| there
        _same_update(update, want)
        _same_state(fast, slow)
        fast.apply(update)
        slow.apply(want)
    for name, param in slow.params.items():
        _same(fast.params[name], param)


@pytest.mark.parametrize("users, items", [(1, 1), (3, 200), (500, 2)])
@pytest.mark.parametrize("l2", [0.05, 0.0])
@pytest.mark.parametrize("row_grad", ["mean", "sum"])
def test_pmf_repeated_ids_accumulate_as_torch_does(monkeypatch, library, users, items, l2, row_grad):
    """One user (or item) in every rating of a batch: its gradient is the mean (or the sum,
    hyper.row_grad) of all of them."""
    rng = np.random.default_rng(users + items)
    for optimizer in ("sgd_momentum", "adam"):
        fast = _pmf(
            20, optimizer, users=users, items=items, l2=l2, row_grad=row_grad, lr=0.001 if row_grad == "sum" else None
        )
        slow = copy.deepcopy(fast)
        for _ in range(3):
            batch = fast.to_batch(_ratings(rng, 300, users, items))
            _, _, update = _step(monkeypatch, library, fast, batch)
            _, _, want = _step(monkeypatch, None, slow, batch)
            adam = optimizer == "adam"
            _same_update(update, want, exact=EXACT and not adam, atol=ADAM_ATOL if adam else 0.0)
            fast.apply(want)  # the same replica for both from here
            slow.apply(want)
            _same_state(fast, slow)  # Adam's moments too: the same gradients give the same bits


@pytest.mark.parametrize("rank", [4, 20, 33])
def test_pmf_lazy_adam_matches_the_torch_path_within_float32_rounding(monkeypatch, library, rank):
    rng = np.random.default_rng(100 + rank)
    fast = _pmf(rank, "adam")
    slow = copy.deepcopy(fast)
    exact_share = []
    for _ in range(8):
        batch = fast.to_batch(_ratings(rng, int(rng.integers(50, 400)), 60, 40))
        loss, _, update = _step(monkeypatch, library, fast, batch)
        want_loss, _, want = _step(monkeypatch, None, slow, batch)
        assert loss == pytest.approx(want_loss, rel=1e-6)
        _same_update(update, want, exact=False, atol=ADAM_ATOL)
        exact_share += [
            torch.eq(_bits(update.rows[n][1]), _bits(v)).float().mean().item() for n, (_, v) in want.rows.items()
        ]
        fast.apply(want)
        slow.apply(want)
        _same_state(fast, slow)  # moments and per-row counts: bit for bit
    # Only the entries that torch's square root or pow rounds differently may differ.
    assert np.mean(exact_share) > 0.5


@pytest.mark.parametrize("l2, every_step", [(1e-3, False), (0.0, False), (1e-3, True)])
@pytest.mark.parametrize("features, nnz_per_row", [(50, 6), (5_000, 20), (200, 1)])
def test_sparse_lr_matches_the_torch_path_within_float32_rounding(
    monkeypatch, library, l2, every_step, features, nnz_per_row
):
    """(hyper.l2_every_step: the same per-feature l2, and the same last-touched steps, bit for bit.)"""
    rng = np.random.default_rng(features + nnz_per_row)
    fast = SparseLR(features, lr=0.05, l2=l2, seed=0, l2_every_step=every_step)
    fast.params["weight"].normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    slow = copy.deepcopy(fast)
    for _ in range(8):
        batch = fast.to_batch(_csr(rng, int(rng.integers(1, 300)), features, nnz_per_row))
        loss, n, update = _step(monkeypatch, library, fast, batch)
        want_loss, want_n, want = _step(monkeypatch, None, slow, batch)
        assert n == want_n and loss == pytest.approx(want_loss, rel=1e-5)
        _same_update(update, want, exact=False, atol=ADAM_ATOL)
        fast.apply(want)
        slow.apply(want)
        _same_state(fast, slow, exact=False, atol=1e-7)


def test_sparse_lr_takes_non_zeros_in_any_order(monkeypatch, library):
    """A batch whose non-zeros are not grouped by sample (not CSR) takes the kernel's
    general path: the same sums, added in the batch's order as torch adds them."""
    rng = np.random.default_rng(4)
    fast = SparseLR(300, lr=0.05, l2=1e-3, seed=0)
    slow = copy.deepcopy(fast)
    batch = fast.to_batch(_csr(rng, 200, 300, 8))
    order = torch.from_numpy(rng.permutation(batch.sample_of.numel()))
    batch.sample_of, batch.feature_of, batch.values = (
        batch.sample_of[order],
        batch.feature_of[order],
        batch.values[order],
    )
    loss, _, update = _step(monkeypatch, library, fast, batch)
    want_loss, _, want = _step(monkeypatch, None, slow, batch)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    _same_update(update, want, exact=False, atol=ADAM_ATOL)


def test_empty_batches(monkeypatch, library):
    """No ratings (no samples): no rows, a zero loss, and the optimisers count the step."""
    for fast in (_pmf(20, "sgd_momentum"), _pmf(20, "adam"), SparseLR(30, lr=0.05, l2=1e-3, seed=0)):
        slow = copy.deepcopy(fast)
        if isinstance(fast, PMF):
            arrays = {"user": np.zeros(0, np.int32), "item": np.zeros(0, np.int32), "rating": np.zeros(0, np.float32)}
        else:
            arrays = {
                "label": np.zeros(0, np.float32),
                "indptr": np.zeros(1, np.int64),
                "indices": np.zeros(0, np.int32),
                "values": np.zeros(0, np.float32),
            }
        batch = fast.to_batch(arrays)
        got = _step(monkeypatch, library, fast, batch)
        want = _step(monkeypatch, None, slow, batch)
        assert got[:2] == want[:2] == (0.0, 0)
        _same_update(got[2], want[2], exact=False, atol=ADAM_ATOL)  # sparse LR's bias still takes its Adam step
        assert fast.optimizer.steps == slow.optimizer.steps == 1
        _same_state(fast, slow, exact=False)


@pytest.mark.parametrize("optimizer, row_grad", [("sgd_momentum", "mean"), ("adam", "mean"), ("adam", "sum")])
def test_pmf_trained_for_many_steps_ends_where_the_torch_path_does(monkeypatch, library, optimizer, row_grad):
    """300 steps, each path on its own replica: SGD ends on torch's bits; lazy Adam within
    1e-4 of each parameter and 1e-5 of the training loss (either hyper.row_grad)."""
    rng = np.random.default_rng(9)
    truth_u, truth_i = rng.standard_normal((120, 3)), rng.standard_normal((80, 3))
    arrays = [_ratings(rng, 256, 120, 80) for _ in range(30)]
    for a in arrays:  # planted: rank 3 and a little noise
        a["rating"] = (3.0 + (truth_u[a["user"]] * truth_i[a["item"]]).sum(1) + 0.1 * rng.standard_normal(256)).astype(
            np.float32
        )
    fast = _pmf(
        20, optimizer, users=120, items=80, momentum=0.8, lr=0.01 if optimizer == "adam" else 0.02, row_grad=row_grad
    )
    slow = copy.deepcopy(fast)
    losses = {"fast": [], "slow": []}
    for step in range(300):
        batch = fast.to_batch(arrays[step % len(arrays)])
        for key, model, lib in (("fast", fast, library), ("slow", slow, None)):
            loss, n, update = _step(monkeypatch, lib, model, batch)
            model.apply(update)
            losses[key].append(loss / n)
    assert losses["slow"][-1] < 0.5 * losses["slow"][0]  # it trained
    assert np.mean(losses["fast"][-30:]) == pytest.approx(np.mean(losses["slow"][-30:]), rel=1e-5)
    for name, param in slow.params.items():
        if optimizer == "sgd_momentum":
            _same(fast.params[name], param)
        else:
            torch.testing.assert_close(fast.params[name], param, rtol=0, atol=1e-4)


@pytest.mark.parametrize("every_step", [False, True])
def test_sparse_lr_trained_for_many_steps_ends_where_the_torch_path_does(monkeypatch, library, every_step):
    """300 steps, each path on its own replica: weights within 1e-4, loss within 1e-5."""
    rng = np.random.default_rng(10)
    truth = rng.standard_normal(400).astype(np.float32)
    arrays = []
    for _ in range(30):
        b = _csr(rng, 256, 400, 10)
        sample = np.repeat(np.arange(256), np.diff(b["indptr"]))
        logits = np.bincount(sample, weights=truth[b["indices"]] * b["values"], minlength=256)
        b["label"] = (rng.random(256) < 1 / (1 + np.exp(-logits))).astype(np.float32)
        arrays.append(b)
    fast = SparseLR(400, lr=0.02, l2=1e-4, seed=0, l2_every_step=every_step)
    slow = copy.deepcopy(fast)
    losses = {"fast": [], "slow": []}
    for step in range(300):
        batch = fast.to_batch(arrays[step % len(arrays)])
        for key, model, lib in (("fast", fast, library), ("slow", slow, None)):
            loss, n, update = _step(monkeypatch, lib, model, batch)
            model.apply(update)
            losses[key].append(loss / n)
    assert losses["slow"][-1] < 0.8 * losses["slow"][0]
    assert np.mean(losses["fast"][-30:]) == pytest.approx(np.mean(losses["slow"][-30:]), rel=1e-5)
    for name, param in slow.params.items():
        torch.testing.assert_close(fast.params[name], param, rtol=0, atol=1e-4)


def test_the_portable_path_gives_the_vector_paths_bits(monkeypatch, library):
    """On x86 the kernels have an AVX2 + FMA instance; the portable C (arm64's) must agree."""
    rng = np.random.default_rng(12)
    pmf_arrays = [_ratings(rng, 300, 60, 40) for _ in range(3)]
    lr_arrays = [_csr(rng, 200, 500, 8) for _ in range(3)]

    def run():
        out = []
        for model, arrays in (
            (_pmf(20, "sgd_momentum"), pmf_arrays),
            (_pmf(13, "adam"), pmf_arrays),
            (SparseLR(500, lr=0.05, l2=1e-3, seed=0), lr_arrays),
        ):
            for a in arrays:
                loss, _, update = _step(monkeypatch, library, model, model.to_batch(a))
                model.apply(update)
                out.append((loss, update))
        return out

    vector = run()
    was = library.ebb_set_simd(0)
    try:
        portable = run()
    finally:
        library.ebb_set_simd(was)
    for (loss, update), (want_loss, want) in zip(portable, vector):
        assert loss == want_loss
        _same_update(update, want, exact=True)


def test_ids_out_of_range_raise_and_touch_nothing(monkeypatch, library):
    monkeypatch.setattr(native, "_lib", library)
    for model, arrays in (
        (
            _pmf(20, "adam"),
            {"user": np.array([0, 60], np.int32), "item": np.array([1, 2], np.int32), "rating": np.ones(2, np.float32)},
        ),
        (
            SparseLR(30, lr=0.05, l2=0.0, seed=0),
            {
                "label": np.ones(2, np.float32),
                "indptr": np.array([0, 1, 2]),
                "indices": np.array([3, 30], np.int32),
                "values": np.ones(2, np.float32),
            },
        ),
    ):
        before = copy.deepcopy(model)
        with pytest.raises(IndexError, match="out of range of the model"):
            model.local_update(model.to_batch(arrays))
        assert model.optimizer.steps == before.optimizer.steps == 0
        for key, value in before.state_arrays().items():
            assert np.array_equal(model.state_arrays()[key], value)


def test_the_torch_path_runs_where_the_kernels_do_not(monkeypatch, library):
    rng = np.random.default_rng(13)
    model = _pmf(20, "sgd_momentum")
    batch = model.to_batch(_ratings(rng, 100, 60, 40))
    monkeypatch.setattr(native, "_lib", None)  # not built, stale or EBB_NATIVE=0
    assert training.pmf_update(model.params, model.optimizer, batch, 20, 3.0, 0.05) is None
    monkeypatch.setattr(native, "_lib", library)
    assert training.pmf_update(model.params, model.optimizer, batch, training.MAX_RANK + 1, 3.0, 0.05) is None
    strided = {name: torch.zeros(p.shape[1], p.shape[0]).T for name, p in model.params.items()}  # not contiguous
    assert training.pmf_update(strided, model.optimizer, batch, 20, 3.0, 0.05) is None
    assert model.optimizer.steps == 0  # declining begins no step
    assert model.local_update(batch)[1] == 100


@pytest.mark.parametrize("scale", [1.0, -1.0, 0.37])
@pytest.mark.parametrize("dim", [1, 21])
def test_add_rows_gives_index_adds_bits(monkeypatch, library, scale, dim):
    monkeypatch.setattr(native, "_lib", library)
    rng = np.random.default_rng(dim)
    table = torch.from_numpy(rng.standard_normal((500, dim)).astype(np.float32))
    rows = torch.from_numpy(rng.choice(500, 200, replace=False))
    vals = torch.from_numpy(rng.standard_normal((200, dim)).astype(np.float32))
    want = table.clone().index_add_(0, rows, vals, alpha=scale)
    assert native.add_rows(table, rows, vals, scale)
    assert torch.equal(_bits(table), _bits(want))
    before = table.clone()
    with pytest.raises(IndexError, match="out of range of a table of 500 rows"):
        native.add_rows(table, torch.tensor([3, 500]), vals[:2], scale)
    assert torch.equal(table, before)
    strided = torch.zeros(200, 2 * dim)[:, ::2].copy_(vals)
    assert not native.add_rows(table, rows, strided, scale)  # not contiguous: torch's turn
