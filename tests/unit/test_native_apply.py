"""The compiled apply (``RowMean.apply_wire`` → kernels.c ``ebb_apply_payloads``) against
decoding each payload and ``RowMean.apply``: the replica's bits must be the same."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from ebb import native
from ebb.engine.aggregate import RowMean
from ebb.engine.isp import SignificanceFilter
from ebb.sparse import RowUpdate

pytestmark = pytest.mark.skipif(not native.available(), reason="the compiled kernels are not built")

ROWS = {"user": 300, "item": 200, "user_bias": 300, "item_bias": 200}
DIMS = {"user": 8, "item": 21, "user_bias": 1, "item_bias": 1}  # 21: PMF's rows, a group of 8 and a tail of 5


@pytest.fixture(params=[True, False], ids=["simd", "portable"], autouse=True)
def simd(request):
    """Every test on the kernel's vector instance (AVX2 on x86-64, where the CPU has it) and its portable C."""
    lib = native._lib
    lib.ebb_set_simd.restype = ctypes.c_int
    was = lib.ebb_set_simd(int(request.param))
    yield request.param
    lib.ebb_set_simd(was)


def _params(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {n: torch.randn(ROWS[n], DIMS[n], generator=g) for n in ROWS}
    out["user"][3, 2] = -0.0  # a whole-row zero added to -0.0 makes it +0.0: the kernel must too
    return out


def _update(g: torch.Generator, touched: int = 40, zeros: float = 0.0) -> RowUpdate:
    rows: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for table in ("user", "item"):
        idx = torch.unique(torch.randint(0, ROWS[table], (touched,), generator=g))
        vals = 0.05 * torch.randn(idx.numel(), DIMS[table], generator=g)
        vals[torch.rand(vals.shape, generator=g) < zeros] = 0.0
        rows[table] = (idx, vals)
        rows[f"{table}_bias"] = (idx, 0.05 * torch.randn(idx.numel(), 1, generator=g))
    return RowUpdate(rows)


def _both(sources: list, combine: str = "mean", sum_cap: int | None = None, seed: int = 0):
    """The replica after the compiled apply and after the Python one, from the same start."""
    fast, slow = _params(seed), _params(seed)
    RowMean(fast, combine, sum_cap).apply_wire(fast, list(sources))
    decoded = [s if isinstance(s, RowUpdate) else RowUpdate.decode(s) for s in sources]
    RowMean(slow, combine, sum_cap).apply(slow, decoded)
    return fast, slow


def _same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    for name in a:
        assert torch.equal(a[name].view(torch.int32), b[name].view(torch.int32)), name


@pytest.mark.parametrize("own_at", [None, 0, 3, 7])
@pytest.mark.parametrize(("combine", "cap"), [("mean", None), ("sum", None), ("sum", 3)])
def test_isp_payloads_apply_bit_for_bit_as_decoded(own_at, combine, cap):
    """ISP's payloads (touched rows, row subsets, masked int8 and float16 values, some
    decoding to single entries) and BSP's (dense float32), the own update in any slot."""
    g = torch.Generator().manual_seed(5)
    base = _params(1)
    sources: list = []
    for w in range(8):
        upd = _update(g, zeros=0.3 if w % 2 else 0.0)
        if w == own_at:
            sources.append(upd)
        elif w < 5:  # ISP, quantised, thresholds from sending little to sending most
            filt = SignificanceFilter(base, threshold=[0.02, 0.3, 2.0, 0.1, 0.6][w], quantize=True)
            sources.append(filt(upd, base, 0).encode())
        elif w == 5:  # ISP unquantised
            sources.append(SignificanceFilter(base, threshold=0.3)(upd, base, 0).encode())
        else:  # BSP: whole float32 rows (masked where zeros pay)
            sources.append(upd.encode())
    fast, slow = _both(sources, combine, cap)
    _same_bits(fast, slow)
    assert not torch.equal(fast["user"], _params(0)["user"])  # something was applied


def test_a_single_own_update_and_no_sources_are_applied_as_in_python():
    g = torch.Generator().manual_seed(2)
    _same_bits(*_both([_update(g)]))
    _same_bits(*_both([]))


def test_payloads_in_any_buffer_type_apply_as_bytes():
    g = torch.Generator().manual_seed(7)
    payloads = [_update(g).encode() for _ in range(3)]
    want, _ = _both(payloads)
    got = _params(0)
    RowMean(got).apply_wire(got, [payloads[0], bytearray(payloads[1]), memoryview(payloads[2])])
    _same_bits(got, want)


def test_a_payload_of_a_name_the_replica_lacks_is_skipped():
    g = torch.Generator().manual_seed(3)
    upd = _update(g)
    upd.rows["other"] = (torch.tensor([1, 2]), torch.ones(2, 3))
    _same_bits(*_both([upd.encode(), _update(g).encode()]))


def test_a_corrupt_or_out_of_range_payload_raises_and_writes_nothing():
    g = torch.Generator().manual_seed(4)
    good = _update(g).encode()
    params = _params(0)
    before = {n: p.clone() for n, p in params.items()}
    mean = RowMean(params)
    with pytest.raises(ValueError):
        native.apply_payloads(params, mean.counts, [good, good[: len(good) // 2]], True, 1.0, 4)
    wide = RowUpdate({"user": (torch.tensor([400]), torch.ones(1, 8))}).encode()  # user has 300 rows
    with pytest.raises(IndexError):
        native.apply_payloads(params, mean.counts, [good, wide], True, 1.0, 4)
    narrow = RowUpdate({"user": (torch.tensor([4]), torch.ones(1, 3))}).encode()
    with pytest.raises(ValueError):
        native.apply_payloads(params, mean.counts, [narrow], True, 1.0, 4)
    _same_bits(params, before)
    assert all(not c.any() for c in mean.counts.values())  # the scratch counts stay clean


def test_without_the_kernels_apply_wire_falls_back_to_decoding(monkeypatch):
    g = torch.Generator().manual_seed(6)
    sources = [_update(g).encode(), _update(g), _update(g).encode()]
    with_kernels = _params(0)
    RowMean(with_kernels).apply_wire(with_kernels, sources)
    monkeypatch.setattr(native, "_lib", None)
    without = _params(0)
    RowMean(without).apply_wire(without, sources)
    _same_bits(with_kernels, without)
    assert np.isfinite(without["user"].numpy()).all()


def _tables(shapes: dict[str, tuple[int, int]], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(*shape, generator=g) for n, shape in shapes.items()}


@pytest.mark.parametrize("case", ["every-row-shared", "rows-not-ascending", "rows-wider-than-64"])
@pytest.mark.parametrize("combine", ["mean", "sum"])
def test_rows_merged_across_payloads_or_added_a_block_at_a_time_match_decoding(case, combine):
    """Rows every payload shares (each takes its payloads in their order), rows not
    ascending (the kernel adds them in one block) and rows wider than 64 (the per-entry
    loop, not the expanded row): the decoded path's bits in each."""
    dim = 70 if case == "rows-wider-than-64" else 21
    shapes = {"item": (60, dim), "bias": (60, 1)}
    base = _tables(shapes, 1)
    g = torch.Generator().manual_seed(9)
    sources: list = []
    for w in range(6):
        if case == "every-row-shared":
            idx = torch.arange(60)
        else:
            idx = torch.randperm(60, generator=g)[:45]
            if case != "rows-not-ascending":
                idx = idx.sort().values
        vals = 0.05 * torch.randn(idx.numel(), dim, generator=g)
        vals[torch.rand(vals.shape, generator=g) < (0.9 if w % 3 == 2 else 0.2)] = 0.0
        upd = RowUpdate({"item": (idx, vals), "bias": (idx, 0.05 * torch.randn(idx.numel(), 1, generator=g))})
        if w == 1:
            sources.append(upd)
        elif w % 2:
            sources.append(upd.encode())
        else:
            filt = SignificanceFilter(base, threshold=[0.05, 0.5, 1.5][w // 2], quantize=w != 4)
            sources.append(filt(upd, base, 0).encode())
    fast, slow = _tables(shapes, 0), _tables(shapes, 0)
    RowMean(fast, combine).apply_wire(fast, list(sources))
    RowMean(slow, combine).apply(slow, [s if isinstance(s, RowUpdate) else RowUpdate.decode(s) for s in sources])
    _same_bits(fast, slow)
    assert not torch.equal(fast["item"], _tables(shapes, 0)["item"])
