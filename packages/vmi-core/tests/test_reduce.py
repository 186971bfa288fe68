"""Reductions (``Shell.segment_reduce``, ``vmi_core.tl.reduce``) on the CPU target against torch,
and their Ascend lowering."""

# No ``from __future__ import annotations`` here: TileLang evaluates a prim_func's signature
# from the builder's closure, which only holds the sizes that the body itself uses.

import math

import pytest
import tilelang.language as T
import torch

from vmi_core.compile import compile_kernel, lower
from vmi_core.tl import formats as F
from vmi_core.tl.reduce import combine, reduce_rows
from vmi_core.tl.shell import Shell
from vmi_core.tl.simd import LANES
from vmi_core.tl.vector import group_tile_shape
from vmi_core.tools.source_checks import assert_vector_regions
from vmi_core.tools.testing import assert_bitwise_equal

BM = 8
INIT = {"max": -math.inf, "min": math.inf, "sum": 0.0}


# --- segment_reduce ---------------------------------------------------------------------------

OPS = ("max", "min", "sum")
INT_INIT = {"max": -(2**31), "min": 2**31 - 1, "sum": 0}


def build_segment_kernel(k: int, seg_len: int, dtype: str = "float32"):
    """``Y_op[m, s] = op over the columns of segment s of X[m, :]`` for max, min and sum; the last
    segment may be partial (its missing columns are guarded by the value function)."""
    sh = Shell("cpu")
    segments = -(-k // seg_len)
    M = T.dynamic("M")

    def init(op):
        return F.f32_const(INIT[op]) if dtype == "float32" else T.int32(INT_INIT[op])

    @T.macro
    def reduce_into(x, acc, op: str):
        sh.segment_reduce(acc, (BM, segments * seg_len), seg_len,
                          lambda at: T.Select(at.column() < k, at.load(x), init(op)), op, init(op))

    @T.prim_func
    def segment_kernel(X: T.Tensor((M, k), dtype), YMAX: T.Tensor((M, segments), dtype),
                       YMIN: T.Tensor((M, segments), dtype), YSUM: T.Tensor((M, segments), dtype)):
        with sh.kernel(T.ceildiv(M, BM)) as bx:
            x = sh.tile((BM, segments * seg_len), dtype)
            acc_max = sh.tile((BM, segments), dtype)
            acc_min = sh.tile((BM, segments), dtype)
            acc_sum = sh.tile((BM, segments), dtype)
            sh.copy(X[bx * BM, 0], x)
            with sh.vector("simt"):
                reduce_into(x, acc_max, "max")
                reduce_into(x, acc_min, "min")
                reduce_into(x, acc_sum, "sum")
            sh.copy(acc_max, YMAX[bx * BM, 0])
            sh.copy(acc_min, YMIN[bx * BM, 0])
            sh.copy(acc_sum, YSUM[bx * BM, 0])

    return segment_kernel


def run_segments(kernel, x: torch.Tensor, seg_len: int) -> dict[str, torch.Tensor]:
    out = {op: torch.empty(x.shape[0], -(-x.shape[1] // seg_len), dtype=x.dtype) for op in OPS}
    kernel(x, *out.values())
    return out


def reference_segments(x: torch.Tensor, op: str, seg_len: int, init) -> torch.Tensor:
    """Left-to-right accumulation per segment, in the tensor's dtype (as the kernel's lanes)."""
    m, k = x.shape
    segments = -(-k // seg_len)
    padded = torch.full((m, segments * seg_len), init, dtype=x.dtype)
    padded[:, :k] = x
    parts = padded.reshape(m, segments, seg_len)
    acc = torch.full((m, segments), init, dtype=x.dtype)
    for j in range(seg_len):
        v = parts[:, :, j]
        acc = torch.maximum(acc, v) if op == "max" else torch.minimum(acc, v) if op == "min" else acc + v
    return acc


SEGMENT_CASES = [(64, 16), (100, 32), (40, 7), (5, 8)]  # (k, seg_len); partial last segments too


@pytest.mark.parametrize("k,seg_len", SEGMENT_CASES)
def test_segment_reduce_fp32(k, seg_len):
    kernel = compile_kernel(build_segment_kernel(k, seg_len), "cpu")
    g = torch.Generator().manual_seed(k * 100 + seg_len)
    for m in (1, 13, 40):
        x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-10, 10, (m, k), generator=g).float())
        out = run_segments(kernel, x, seg_len)
        for op in OPS:
            ref = reference_segments(x, op, seg_len, INIT[op])
            assert_bitwise_equal(out[op], ref, f"{op} k={k} seg={seg_len} M={m}")
        # max/min are exact in any order: torch's own reductions agree.
        segs = -(-k // seg_len)
        padded = torch.full((m, segs * seg_len), -math.inf)
        padded[:, :k] = x
        assert_bitwise_equal(out["max"], padded.reshape(m, segs, seg_len).amax(2))
        padded[:, k:] = math.inf
        assert_bitwise_equal(out["min"], padded.reshape(m, segs, seg_len).amin(2))


def test_segment_reduce_int32():
    kernel = compile_kernel(build_segment_kernel(48, 16, "int32"), "cpu")
    g = torch.Generator().manual_seed(9)
    x = torch.randint(-(2**20), 2**20, (21, 48), generator=g, dtype=torch.int32)
    out = run_segments(kernel, x, 16)
    parts = x.reshape(21, 3, 16)
    assert_bitwise_equal(out["max"], parts.amax(2))
    assert_bitwise_equal(out["min"], parts.amin(2))
    assert_bitwise_equal(out["sum"], parts.sum(2, dtype=torch.int32))


def test_combine_rejects_unknown_op():
    with pytest.raises(ValueError, match="got 'mean'"):
        combine("mean", 0, 1)


@pytest.mark.parametrize("groups", [1, 3, 8, 9, 16, 24, 64, 128])
@pytest.mark.parametrize("rows", [1, 4, 8])
def test_group_tile_holds_every_group_read(rows, groups):
    """``at.group`` reads ``LANES`` values from the chunk's first group rounded down to 8 (32
    bytes): from the last such start of the last row, the read stays inside the tile."""
    tile_rows, cols = group_tile_shape(True, rows, groups)
    assert cols % 8 == 0 and cols >= groups
    last_start = (rows - 1) * cols + (groups - 1) // 8 * 8
    assert last_start + LANES <= tile_rows * cols


# --- reduce_rows ------------------------------------------------------------------------------

N = 64


def build_rows_kernel(target: str, ops=OPS, clear: bool = True):
    """``Y_op[m] = op(Y0[m] if not clear, X[m, :])`` with the target's ``T.reduce_*`` (CPU: local
    buffers; Ascend: UB tiles in a SIMD region), one output per op in ``ops``."""
    sh = Shell(target)
    M = T.dynamic("M")

    def buffer(shape):
        return sh.tile(shape, "float32") if sh.is_ascend else T.alloc_local(shape, "float32")

    @T.macro
    def reduce_one(X, Y0, Y, bx, op: str):
        x = buffer((BM, N))
        y = buffer((BM,))
        sh.copy(X[bx * BM, 0], x)
        sh.copy(Y0[bx * BM], y)
        with sh.vector("simd"):
            reduce_rows(sh, op, x, y, clear=clear)
        sh.copy(y, Y[bx * BM])

    if len(ops) == 1:
        @T.prim_func
        def rows_kernel(X: T.Tensor((M, N), "float32"), Y0: T.Tensor((M,), "float32"),
                        Y: T.Tensor((M,), "float32")):
            with sh.kernel(T.ceildiv(M, BM)) as bx:
                reduce_one(X, Y0, Y, bx, ops[0])
    else:
        @T.prim_func
        def rows_kernel(X: T.Tensor((M, N), "float32"), Y0: T.Tensor((M,), "float32"),
                        YMAX: T.Tensor((M,), "float32"), YMIN: T.Tensor((M,), "float32"),
                        YSUM: T.Tensor((M,), "float32")):
            with sh.kernel(T.ceildiv(M, BM)) as bx:
                reduce_one(X, Y0, YMAX, bx, "max")
                reduce_one(X, Y0, YMIN, bx, "min")
                reduce_one(X, Y0, YSUM, bx, "sum")

    return rows_kernel


@pytest.mark.parametrize("clear", [True, False])
def test_reduce_rows_cpu(clear):
    kernel = compile_kernel(build_rows_kernel("cpu", clear=clear), "cpu")
    g = torch.Generator().manual_seed(10)
    for m, integers in ((24, True), (24, False), (5, False)):
        if integers:  # small integers: every summation order gives the exact sum
            x = torch.randint(-8, 9, (m, N), generator=g).float()
            y0 = torch.randint(-8, 9, (m,), generator=g).float()
        else:
            x = torch.randn(m, N, generator=g)
            y0 = torch.randn(m, generator=g)
        out = {op: torch.empty(m) for op in OPS}
        kernel(x, y0, *out.values())
        refs = {"max": x.amax(1), "min": x.amin(1), "sum": x.sum(1)}
        for op in OPS:
            ref = refs[op]
            if not clear:
                ref = {"max": torch.maximum, "min": torch.minimum, "sum": torch.add}[op](ref, y0)
            if op == "sum" and not integers:  # the order of the adds is TileLang's: compare with a bound
                torch.testing.assert_close(out[op], ref, rtol=0, atol=N * 4 * 2.0**-24 * x.abs().sum(1).max())
            else:
                assert_bitwise_equal(out[op], ref, f"reduce_rows {op} clear={clear} M={m}")


@pytest.mark.parametrize("op", OPS)
def test_reduce_rows_lowers_to_ascend_simd(op):
    src = lower(build_rows_kernel("ascend", (op,)), "ascend")
    assert_vector_regions(src, simd=1, simt=0)


def test_reduce_rows_rejects_unknown_op():
    with pytest.raises(ValueError, match="got 'mean'"):
        reduce_rows(Shell("cpu"), "mean", None, None)
