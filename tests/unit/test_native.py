"""The compiled kernels (ebb.native) decode exactly what numpy decodes, bit for bit.

A fleet may mix workers with and without the kernels, so every decoded value, row and
index must be the same bits on both paths. The kernels are built here into a temporary
folder with the machine's C compiler, whatever the checkout holds.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from ebb import native
from ebb.sparse import RowUpdate, quantize_rows

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler"),
]


@pytest.fixture
def library(native_library):
    return native_library


def _payload(rng, k: int, dim: int, density: float, nan_row: bool = False) -> bytes:
    """An ISP-like update of k rows: masked entries, quantised (int8 for dim ≥ 4, else float16)."""
    vals = rng.standard_normal((k, dim)).astype(np.float32) * (rng.random((k, dim)) < density)
    vals[rng.random(k) < 0.05] = 0.0  # some rows carry nothing
    if nan_row:
        vals[3, 0] = np.nan
    pack, out = quantize_rows(vals)
    rows = torch.from_numpy(np.sort(rng.choice(50_000, k, replace=False)))
    return RowUpdate({"w": (rows, torch.from_numpy(out))}, packed={"w": pack}).encode()


def _decode_both(monkeypatch, library, data: bytes) -> tuple[RowUpdate, RowUpdate]:
    monkeypatch.setattr(native, "_lib", library)
    fast = RowUpdate.decode(data)
    monkeypatch.setattr(native, "_lib", None)
    slow = RowUpdate.decode(data)
    return fast, slow


def _assert_same_bits(fast: RowUpdate, slow: RowUpdate) -> None:
    assert fast.rows.keys() == slow.rows.keys()
    assert (fast.elements or {}).keys() == (slow.elements or {}).keys()
    for name, (idx, vals) in slow.rows.items():
        assert torch.equal(fast.rows[name][0], idx)
        assert fast.rows[name][1].dtype == vals.dtype and fast.rows[name][1].shape == vals.shape
        assert torch.equal(fast.rows[name][1].view(torch.int32), vals.view(torch.int32))
    for name, parts in (slow.elements or {}).items():
        for got, want in zip(fast.elements[name], parts):
            assert got.dtype == want.dtype
            assert torch.equal(
                got.view(torch.int32) if got.is_floating_point() else got,
                want.view(torch.int32) if want.is_floating_point() else want,
            )


@pytest.mark.parametrize("dim", [1, 3, 4, 7, 8, 9, 16, 21, 40])
@pytest.mark.parametrize("density", [0.03, 0.15, 0.3, 0.7])
def test_decoding_is_bit_identical_to_numpy(monkeypatch, library, dim, density):
    # 0.03 and 0.15 decode as single entries, 0.3 and 0.7 as whole masked rows.
    rng = np.random.default_rng(dim * 100 + int(density * 100))
    fast, slow = _decode_both(monkeypatch, library, _payload(rng, 700, dim, density))
    assert fast.rows or fast.elements
    _assert_same_bits(fast, slow)


def test_a_nan_row_decodes_to_the_same_bits(monkeypatch, library):
    for density in (0.1, 0.5):
        fast, slow = _decode_both(monkeypatch, library, _payload(np.random.default_rng(7), 300, 21, density, True))
        _assert_same_bits(fast, slow)


def test_the_portable_path_gives_the_vector_paths_bits(monkeypatch, library):
    """On x86 the dense decode has an SSE4.1 path; the C fallback (arm64) must agree."""
    data = _payload(np.random.default_rng(3), 900, 21, 0.5)
    vector, _ = _decode_both(monkeypatch, library, data)
    library.ebb_set_simd.restype = ctypes.c_int
    library.ebb_set_simd(0)
    try:
        portable, _ = _decode_both(monkeypatch, library, data)
    finally:
        library.ebb_set_simd(1)
    _assert_same_bits(portable, vector)


def test_masks_that_disagree_with_the_code_count_are_refused(library, monkeypatch):
    monkeypatch.setattr(native, "_lib", library)
    masks = np.array([[0b111], [0b1]], dtype=np.uint8)  # 4 entries set
    scales = np.full(2, 0x3F80, dtype=np.uint16)  # 1.0 in bfloat16
    with pytest.raises(ValueError, match="corrupt update: its row masks carry 4 values, its header says 3"):
        native.expand_q8(masks, 5, np.ones(3, dtype=np.int8), scales)
    with pytest.raises(ValueError, match="corrupt update"):
        native.mask_elements(masks, 5, np.array([2, 9]), 5, np.ones(5, dtype=np.int8), scales)
    out = native.expand_q8(masks, 5, np.array([1, 2, 3, -4], dtype=np.int8), scales)
    assert out.tolist() == [[1, 2, 3, 0, 0], [-4, 0, 0, 0, 0]]
    rows, flat, vals = native.mask_elements(
        masks, 5, np.array([2, 9]), 4, np.array([1, 2, 3, -4], dtype=np.int8), scales
    )
    assert rows.tolist() == [2, 2, 2, 9] and flat.tolist() == [10, 11, 12, 45] and vals.tolist() == [1, 2, 3, -4]


def test_a_stale_or_foreign_library_is_not_loaded(tmp_path, monkeypatch):
    cc = shutil.which("cc") or shutil.which("gcc")
    stale = tmp_path / "stale.c"
    stale.write_text("int ebb_kernels_version(void) { return 999; }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", tmp_path / "stale.so", stale], check=True)
    assert native._load(tmp_path / "stale.so") is None
    bare = tmp_path / "bare.c"
    bare.write_text("int unrelated(void) { return 0; }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", tmp_path / "bare.so", bare], check=True)
    assert native._load(tmp_path / "bare.so") is None
    (tmp_path / "junk.so").write_bytes(b"not a shared library")
    assert native._load(tmp_path / "junk.so") is None
    assert native._load(tmp_path / "missing.so") is None


def test_ebb_native_0_turns_the_kernels_off(library, monkeypatch):
    path = Path(library._name)  # a library that loads (the fixture loaded it)
    monkeypatch.setenv("EBB_NATIVE", "0")
    assert native._load(path) is None


def _filter_run(
    monkeypatch, lib, v: float, quantize: bool, dims: dict[str, int], steps: int = 6, nan_at: int | None = None
):
    """The payloads, sent values and pending accumulators of a SignificanceFilter over a
    fixed sequence of random sparse updates, with the kernels ``lib`` (or numpy: None)."""
    from ebb.engine.isp import SignificanceFilter

    monkeypatch.setattr(native, "_lib", lib)
    rng = np.random.default_rng(11)
    params = {name: torch.from_numpy(rng.standard_normal((400, dim)).astype(np.float32)) for name, dim in dims.items()}
    params["w"][5] = 0.0  # x = 0: any change is significant
    flt = SignificanceFilter(params, v, quantize)
    out = []
    for step in range(steps):
        rows_of = {name: torch.from_numpy(np.sort(rng.choice(400, 150, replace=False))) for name in dims}
        update = {}
        for name, rows in rows_of.items():
            vals = rng.standard_normal((150, dims[name])).astype(np.float32) * np.float32(0.05)
            vals[rng.random(150) < 0.2] = 0.0  # rows whose δ may stay below the threshold
            if nan_at == step and name == "w":
                vals[7, 1] = np.nan
            update[name] = (rows, torch.from_numpy(vals))
        sent = flt(RowUpdate(update), params, step)
        out.append(
            (
                sent.encode(),
                {n: (r.clone(), vals.clone()) for n, (r, vals) in sent.rows.items()},
                {n: a.copy() for n, a in (sent.subset or {}).items()},
            )
        )
    return out, {n: p.clone() for n, p in flt.pending.items()}


@pytest.fixture(params=[True, False], ids=["simd", "portable"])
def simd(request, library):
    """The kernels' vector instances (AVX2 on x86-64, where the CPU has it) or their portable C."""
    was = library.ebb_set_simd(int(request.param))
    yield request.param
    library.ebb_set_simd(was)


@pytest.mark.parametrize("quantize", [True, False])
@pytest.mark.parametrize("v", [0.0, 0.05, 0.7, 5.0])
def test_the_filter_is_bit_identical_to_numpy(monkeypatch, library, simd, v, quantize):
    """Rows 21 wide (PMF's default rank: an instance of their own) and others, vector and portable."""
    dims = {"w": 21, "narrow": 3, "bias": 1, "wide": 40, "odd": 13}
    kernel, done = native.isp_filter, []
    monkeypatch.setattr(native, "isp_filter", lambda *a: done.append(kernel(*a)) or done[-1])
    fast, fast_pending = _filter_run(monkeypatch, library, v, quantize, dims)
    assert v == 0 or (done and all(d is not None for d in done))  # the kernel did the work
    slow, slow_pending = _filter_run(monkeypatch, None, v, quantize, dims)
    for (fast_bytes, fast_rows, fast_at), (slow_bytes, slow_rows, slow_at) in zip(fast, slow):
        assert fast_bytes == slow_bytes
        for name, (rows, vals) in slow_rows.items():
            assert torch.equal(fast_rows[name][0], rows)
            assert torch.equal(fast_rows[name][1].view(torch.int32), vals.view(torch.int32))
        assert fast_at.keys() == slow_at.keys() and all(np.array_equal(fast_at[n], a) for n, a in slow_at.items())
    for name, acc in slow_pending.items():
        assert torch.equal(fast_pending[name].view(torch.int32), acc.view(torch.int32))


@pytest.mark.parametrize("dtype", [np.int8, np.float16, np.float32])
@pytest.mark.parametrize("dim", [1, 5, 8, 13, 21, 40])
def test_packing_masked_rows_is_what_numpy_gives(monkeypatch, library, simd, dtype, dim):
    """The encoder's masks and carried entries; -0.0 counts as zero and NaN does not, as in numpy."""
    monkeypatch.setattr(native, "_lib", library)
    rng = np.random.default_rng(dim)
    v = (rng.standard_normal((301, dim)) * 40).astype(dtype) * (rng.random((301, dim)) < 0.4).astype(dtype)
    if dtype != np.int8:
        v[0, 0], v[1, -1], v[2, :] = -0.0, np.nan, -0.0
    masks, carried = native.pack_masked(v)
    keep = v != 0
    padded = np.zeros((301, 8 * masks.shape[1]), dtype=bool)
    padded[:, :dim] = keep
    assert np.array_equal(masks, np.packbits(padded, axis=1, bitorder="little"))
    assert carried.dtype == v.dtype
    assert np.array_equal(carried.view(f"u{v.itemsize}"), v[keep].view(f"u{v.itemsize}"))


def test_a_nan_in_the_update_leaves_the_filter_to_numpy(monkeypatch, library, simd):
    """The kernel meets the NaN at the 8th row, having written 7: it puts them back."""
    dims = {"w": 21}
    fast, fast_pending = _filter_run(monkeypatch, library, 0.7, True, dims, nan_at=2)
    slow, slow_pending = _filter_run(monkeypatch, None, 0.7, True, dims, nan_at=2)
    assert [f[0] for f in fast] == [s[0] for s in slow]
    assert torch.equal(fast_pending["w"].view(torch.int32), slow_pending["w"].view(torch.int32))
    assert torch.isnan(fast_pending["w"]).any()


def test_float16_rounding_matches_torch_on_hard_values(monkeypatch, library):
    """Half denormals, ties, -0.0 and the clamp at ±65504, through the filter's f16 form."""
    monkeypatch.setattr(native, "_lib", library)
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    values = values[np.isfinite(values)]
    # Halfway between two half denormals: ties, to round to even.
    ties = (np.arange(-3000, 3000, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-24)
    hard = np.array(
        [-0.0, 0.0, 65504, 65519.9, -65520, 1e30, -1e-30, 6.1e-5, 6.104e-5, 2.0**-14, 2.0**-25], dtype=np.float32
    )
    values = np.concatenate([values, ties, hard, values * np.float32(1e-35)])
    k = values.size
    table = np.zeros((k, 1), dtype=np.float32)
    # Threshold 0 with |x| = 1: every nonzero value is significant (a zero row is idle).
    at, sent, codes, scales = native.isp_filter(
        table, np.arange(k), values[:, None], np.ones((k, 1), np.float32), np.float32(0.0), "f16"
    )
    want = torch.from_numpy(values).clamp(-65504.0, 65504.0).to(torch.float16)
    assert scales is None and codes.dtype == np.float16
    assert np.array_equal(codes[:, 0].view(np.uint16), want.numpy()[at].view(np.uint16))
    assert np.array_equal(sent[:, 0].view(np.uint32), want.to(torch.float32).numpy()[at].view(np.uint32))
    assert at.size == np.count_nonzero(values)
