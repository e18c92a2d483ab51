"""The compiled kernels (ebb.native) decode exactly what numpy decodes, bit for bit.

A fleet may mix workers with and without the kernels, so every decoded value, row and
index must be the same bits on both paths. The kernels are built here into a temporary
folder with the machine's C compiler, whatever the checkout holds.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
import torch

from ebb import native
from ebb.native.build import build
from ebb.sparse import RowUpdate, quantize_rows

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler"),
]


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    path = build(tmp_path_factory.mktemp("native") / "_kernels.so")
    lib = native._load(path)
    assert lib is not None
    return lib


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
            assert torch.equal(got.view(torch.int32) if got.is_floating_point() else got,
                               want.view(torch.int32) if want.is_floating_point() else want)


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
    rows, flat, vals = native.mask_elements(masks, 5, np.array([2, 9]), 4, np.array([1, 2, 3, -4], dtype=np.int8),
                                            scales)
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


def test_ebb_native_0_turns_the_kernels_off(library, tmp_path, monkeypatch):
    path = build(tmp_path / "_kernels.so")
    monkeypatch.setenv("EBB_NATIVE", "0")
    assert native._load(path) is None
