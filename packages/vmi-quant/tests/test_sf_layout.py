"""SF layouts (vmi_core.sf_layout) against the storage table of quant-a §1.7.

Shapes and strides are checked against the spec's table and worked examples; the
addressing is checked by writing every block through ``kernel_view`` + ``sf_address``
(what a kernel does) and reading it back by torch indexing of the user-visible tensor.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from vmi_core.formats import e4m3_decode, ue8m0_unpack
from vmi_core.targets import ASCEND, CUDA
from vmi_quant.sf_layout import SFLayout, align, ceil_div, sf_address

FLAVORS = {"ascend": ASCEND, "cuda": CUDA}
GRIDS = [(1, 1), (5, 8), (5, 2), (4, 64), (7, 3), (17, 9), (16, 16), (33, 5), (3, 1), (1, 7)]


def layouts():
    """(flavor name, layout) for every layout an op can produce."""
    for name, flavor in FLAVORS.items():
        for col_major in (False, True):
            yield name, SFLayout.of(flavor, packed=False, col_major=col_major)
            yield name, SFLayout.of(flavor, packed=False, e4m3=True, col_major=col_major)
            yield name, SFLayout.of(flavor, packed=True, col_major=col_major, block_k=32)
        yield name, SFLayout.of(flavor, packed=True, block_k=1)


LAYOUTS = list(layouts())


def layout_id(case) -> str:
    name, layout = case
    kind = layout.kind + (f"x{layout.pack}" if layout.pack > 1 else "")
    order = "along_m" if layout.pack_along_m else ("col" if layout.col_major else "row")
    return f"{name}-{kind}-{order}"


def expected_shape_and_strides(name: str, layout: SFLayout, nbm: int, nbk: int):
    """The §1.7 table, written out per row."""
    cuda = name == "cuda"
    p = layout.pack
    if layout.pack_along_m:
        return (ceil_div(nbm, p), nbk), (nbk, 1)
    rows, cols = nbm, ceil_div(nbk, p)
    if not layout.col_major:
        return (rows, cols), (cols, 1)
    if layout.kind == "fp32":
        a = align(nbm, 4) if cuda else nbm
    elif layout.kind == "e4m3":
        a = align(nbm, 16) if cuda else nbm
    else:  # packed words: 16-byte rows on CUDA = 4 int32 words
        a = align(nbm, 4) if cuda else nbm
    return (rows, cols), (1, a)


# --- SFLayout.of and validation ---------------------------------------------------------------

class TestOf:
    def test_unpacked(self):
        for flavor in FLAVORS.values():
            assert SFLayout.of(flavor, packed=False) == SFLayout("fp32")
            e4m3_col = SFLayout.of(flavor, packed=False, e4m3=True, col_major=True)
            assert e4m3_col == SFLayout("e4m3", col_major=True)
            assert SFLayout.of(flavor, packed=False, block_k=1) == SFLayout("fp32")

    def test_packed(self):
        assert SFLayout.of(ASCEND, packed=True, block_k=32) == SFLayout("ue8m0", 2)
        packed_col = SFLayout.of(CUDA, packed=True, block_k=128, col_major=True)
        assert packed_col == SFLayout("ue8m0", 4, col_major=True)
        assert SFLayout.of(CUDA, packed=True, block_k=1) == SFLayout("ue8m0", 4, pack_along_m=True)
        assert SFLayout.of(ASCEND, packed=True, block_k=1) == SFLayout("ue8m0", 2, pack_along_m=True)

    def test_dtypes(self):
        assert SFLayout("fp32").word_dtype() == torch.float32
        assert SFLayout("fp32").storage_dtype == torch.float32
        assert SFLayout("e4m3").word_dtype() == torch.float8_e4m3fn
        assert SFLayout("e4m3").storage_dtype == torch.uint8
        assert SFLayout("ue8m0", 2).word_dtype() == torch.int16
        assert SFLayout("ue8m0", 4).word_dtype() == torch.int32
        assert SFLayout("ue8m0", 4).storage_dtype == torch.uint8

    @pytest.mark.parametrize("kwargs", [
        {"kind": "bf16"}, {"kind": "fp32", "pack": 2}, {"kind": "ue8m0"}, {"kind": "e4m3", "pack": 4},
        {"kind": "ue8m0", "pack": 2, "pack_along_m": True, "col_major": True},
    ])
    def test_invalid(self, kwargs):
        with pytest.raises(ValueError):
            SFLayout(**kwargs)


# --- shapes and strides -----------------------------------------------------------------------

@pytest.mark.parametrize("case", LAYOUTS, ids=layout_id)
def test_allocate_matches_spec_table(case):
    name, layout = case
    for nbm, nbk in GRIDS:
        sf = layout.allocate(nbm, nbk, FLAVORS[name])
        shape, strides = expected_shape_and_strides(name, layout, nbm, nbk)
        assert sf.dtype == layout.word_dtype()
        assert tuple(sf.shape) == shape == layout.logical_shape(nbm, nbk), (nbm, nbk)
        assert sf.stride() == strides, (nbm, nbk)
        assert bool((sf.view(torch.uint8) if sf.element_size() == 1 else sf).eq(0).all())
        layout.check(sf, nbm, nbk, "sf")


class TestSpecExamples:
    """The worked examples of §1.7."""

    def test_cuda_packed_row_major(self):
        # per-token, M = 5, K = 256, bk = 32: nbk = 8 -> int32 (5, 2)
        sf = SFLayout.of(CUDA, packed=True, block_k=32).allocate(5, 8, CUDA)
        assert sf.dtype == torch.int32 and tuple(sf.shape) == (5, 2) and sf.is_contiguous()

    def test_cuda_packed_col_major(self):
        layout = SFLayout.of(CUDA, packed=True, col_major=True, block_k=32)
        sf = layout.allocate(5, 8, CUDA)
        assert tuple(sf.shape) == (5, 2) and sf.stride() == (1, 8)
        # word [t, c] at flat offset 8c + t of the (2, 8) int32 storage
        flat, sm, sk = layout.kernel_view(sf)
        for t, c in itertools.product(range(5), range(2)):
            assert sf_address(t, 4 * c, sm, sk, layout) == 4 * (8 * c + t)
        assert sf.untyped_storage().nbytes() == 2 * 8 * 4

    def test_cuda_fp32_col_major(self):
        sf = SFLayout.of(CUDA, packed=False, col_major=True).allocate(5, 2, CUDA)
        assert sf.dtype == torch.float32 and tuple(sf.shape) == (5, 2) and sf.stride() == (1, 8)

    def test_cuda_packed_along_m(self):
        # block (32, 1), M = 100, K = 64: nbm = 4, nbk = 64 -> int32 (1, 64)
        sf = SFLayout.of(CUDA, packed=True, block_k=1).allocate(4, 64, CUDA)
        assert sf.dtype == torch.int32 and tuple(sf.shape) == (1, 64) and sf.is_contiguous()

    def test_ascend_packed_row_major(self):
        # K = 256, bk = 32 -> int16 (M, 4); word [t, c] = e(t, 2c) | e(t, 2c + 1) << 8
        layout = SFLayout.of(ASCEND, packed=True, block_k=32)
        sf = layout.allocate(3, 8, ASCEND)
        assert sf.dtype == torch.int16 and tuple(sf.shape) == (3, 4)
        flat, sm, sk = layout.kernel_view(sf)
        for t, k in itertools.product(range(3), range(8)):
            flat[sf_address(t, k, sm, sk, layout)] = 16 * t + k + 1
        for t, c in itertools.product(range(3), range(4)):
            e0, e1 = 16 * t + 2 * c + 1, 16 * t + 2 * c + 2
            assert int(sf[t, c]) == e0 | e1 << 8

    def test_ascend_col_major_has_no_padding(self):
        for layout in (SFLayout("fp32", col_major=True), SFLayout("e4m3", col_major=True),
                       SFLayout("ue8m0", 2, col_major=True)):
            sf = layout.allocate(5, 8, ASCEND)
            assert sf.stride() == (1, 5)

    def test_cuda_e4m3_col_major_pads_to_16(self):
        sf = SFLayout("e4m3", col_major=True).allocate(5, 3, CUDA)
        assert sf.stride() == (1, 16)
        assert SFLayout("e4m3", col_major=True).allocate(17, 3, CUDA).stride() == (1, 32)


def test_spec_storage_addressing():
    """§1.7 kernel-side addressing on the byte storage: sf_col_pack ``(m // P, k·P + m % P)``,
    packed col-major ``(k // P, m·P + k % P)``, col-major ``(k, m)``, row-major ``(m, k)``."""
    nbm, nbk = 7, 9
    for flavor in FLAVORS.values():
        p = flavor.ue8m0_pack
        along_m = SFLayout.of(flavor, packed=True, block_k=1)
        flat, sm, sk = along_m.kernel_view(along_m.allocate(nbm, nbk, flavor))
        row_bytes = nbk * p
        for m, k in itertools.product(range(nbm), range(nbk)):
            assert sf_address(m, k, sm, sk, along_m) == (m // p) * row_bytes + k * p + m % p
        col = SFLayout.of(flavor, packed=True, col_major=True, block_k=32)
        flat, sm, sk = col.kernel_view(col.allocate(nbm, nbk, flavor))
        a = align(nbm, 4) if flavor is CUDA else nbm
        for m, k in itertools.product(range(nbm), range(nbk)):
            assert sf_address(m, k, sm, sk, col) == (k // p) * a * p + m * p + k % p
        fp32_col = SFLayout("fp32", col_major=True)
        flat, sm, sk = fp32_col.kernel_view(fp32_col.allocate(nbm, nbk, flavor))
        a = align(nbm, 4) if flavor is CUDA else nbm
        assert all(sf_address(m, k, sm, sk, fp32_col) == k * a + m
                   for m, k in itertools.product(range(nbm), range(nbk)))
        fp32_row = SFLayout("fp32")
        flat, sm, sk = fp32_row.kernel_view(fp32_row.allocate(nbm, nbk, flavor))
        assert all(sf_address(m, k, sm, sk, fp32_row) == m * nbk + k
                   for m, k in itertools.product(range(nbm), range(nbk)))


# --- writing through kernel_view + sf_address -------------------------------------------------

def block_values(nbm: int, nbk: int) -> torch.Tensor:
    """A distinct non-zero byte per block (wrapping past 255, skipping 0)."""
    return (torch.arange(nbm * nbk).reshape(nbm, nbk) % 255 + 1).to(torch.uint8)


def write_grid(layout: SFLayout, sf: torch.Tensor, values: torch.Tensor) -> None:
    """What a kernel does: store block (m, k) at ``flat[sf_address(m, k, ...)]``."""
    flat, sm, sk = layout.kernel_view(sf)
    assert flat.dtype == layout.storage_dtype
    nbm, nbk = values.shape
    for m, k in itertools.product(range(nbm), range(nbk)):
        v = int(values[m, k])
        flat[sf_address(m, k, sm, sk, layout)] = float(v) if layout.kind == "fp32" else v


def read_grid(layout: SFLayout, sf: torch.Tensor, nbm: int, nbk: int) -> torch.Tensor:
    """The grid as uint8, read by torch indexing of the user-visible tensor."""
    if layout.kind == "fp32":
        return sf.to(torch.uint8)
    if layout.kind == "e4m3":
        return sf.view(torch.uint8).clone()
    if layout.pack_along_m:
        return ue8m0_unpack(sf, layout.pack, 0, nbm)
    return ue8m0_unpack(sf, layout.pack, 1, nbk)


def nonzero_storage_elements(layout: SFLayout, sf: torch.Tensor) -> int:
    """Non-zero elements (storage dtype) in the whole allocation behind ``sf``."""
    raw = torch.frombuffer(bytearray(sf.untyped_storage()), dtype=layout.storage_dtype)
    return int((raw != 0).sum())


@pytest.mark.parametrize("case", LAYOUTS, ids=layout_id)
def test_write_through_kernel_view_reads_back(case):
    name, layout = case
    for nbm, nbk in GRIDS:
        sf = layout.allocate(nbm, nbk, FLAVORS[name])
        values = block_values(nbm, nbk)
        write_grid(layout, sf, values)
        assert torch.equal(read_grid(layout, sf, nbm, nbk), values), (nbm, nbk)
        # Nothing else was touched: padding rows and unused bytes of packed words stay 0.
        assert nonzero_storage_elements(layout, sf) == nbm * nbk, (nbm, nbk)


def test_e4m3_values_decode():
    """E4M3 SF bytes written through the flat view read back as the same fp8 values."""
    layout = SFLayout("e4m3", col_major=True)
    sf = layout.allocate(6, 5, CUDA)
    codes = torch.arange(30, dtype=torch.uint8).reshape(6, 5) + 0x30
    write_grid(layout, sf, codes)
    assert torch.equal(sf.float(), e4m3_decode(codes))


@pytest.mark.parametrize("kind", ["fp32", "e4m3", "packed"])
def test_user_tensor_with_padded_rows(kind):
    """A row-major SF that is a slice of a wider buffer: kernel_view follows its strides."""
    nbm, nbk = 6, 5
    layout = {"fp32": SFLayout("fp32"), "e4m3": SFLayout("e4m3"), "packed": SFLayout("ue8m0", 4)}[kind]
    rows, cols = layout.logical_shape(nbm, nbk)
    wide = torch.zeros((rows + 1, cols + 3), dtype=layout.word_dtype())
    sf = wide[1:, 2:2 + cols]
    layout.check(sf, nbm, nbk, "sf")
    values = block_values(nbm, nbk)
    write_grid(layout, sf, values)
    assert torch.equal(read_grid(layout, sf, nbm, nbk), values)
    assert nonzero_storage_elements(layout, wide) == nbm * nbk


def test_kernel_view_of_slice_starts_at_first_element():
    """Row ranges (as cpu_parallel hands out) address from their own first row."""
    layout = SFLayout("ue8m0", 2)
    sf = layout.allocate(8, 6, ASCEND)
    part = sf[3:6]
    write_grid(layout, part, block_values(3, 6))
    assert torch.equal(read_grid(layout, sf, 8, 6)[3:6], block_values(3, 6))
    assert not bool(sf[:3].ne(0).any()) and not bool(sf[6:].ne(0).any())


def test_empty_grids():
    for name, layout in LAYOUTS:
        for nbm, nbk in ((0, 4), (4, 0), (0, 0)):
            sf = layout.allocate(nbm, nbk, FLAVORS[name])
            assert tuple(sf.shape) == layout.logical_shape(nbm, nbk)
            layout.check(sf, nbm, nbk, "sf")
            flat, _, _ = layout.kernel_view(sf)
            assert flat.numel() >= 1


# --- check ------------------------------------------------------------------------------------

class TestCheck:
    def test_type(self):
        with pytest.raises(TypeError, match="sf_x must be a torch.Tensor"):
            SFLayout("fp32").check([[1.0]], 1, 1, "sf_x")

    def test_dtype(self):
        with pytest.raises(TypeError, match="sf_x must have dtype torch.int16"):
            SFLayout("ue8m0", 2).check(torch.zeros(2, 1, dtype=torch.int32), 2, 2, "sf_x")
        with pytest.raises(TypeError, match="float8_e4m3fn"):
            SFLayout("e4m3").check(torch.zeros(2, 2), 2, 2, "sf_x")

    def test_shape(self):
        with pytest.raises(ValueError, match=r"sf_x must have shape \(3, 1\)"):
            SFLayout("ue8m0", 4).check(torch.zeros(3, 2, dtype=torch.int32), 3, 4, "sf_x")
        with pytest.raises(ValueError, match=r"shape \(2, 5\)"):
            SFLayout("ue8m0", 2, pack_along_m=True).check(torch.zeros(3, 5, dtype=torch.int16), 4, 5, "sf_x")

    def test_strides(self):
        sf = torch.zeros(4, 6)[:, ::2]
        with pytest.raises(ValueError, match="row-major or column-major"):
            SFLayout("fp32").check(sf, 4, 3, "sf_x")

    def test_accepts_both_orders(self):
        layout = SFLayout("fp32")
        layout.check(torch.zeros(4, 3), 4, 3, "sf")
        layout.check(torch.zeros(3, 4).t(), 4, 3, "sf")
