"""The Ascend vector division as scalar code: the subnormal flush (``vmi_core.tl.formats.flush_subnormal``)
and the whole division (``ascend_quotient``), kernel functions on the cpu target against their torch
twins (``vmi_core.fp32``), bit for bit, on every class of fp32 value and on quotients small enough for
the residual check to move them; the division's element loop vectorizes on cpu."""

from __future__ import annotations

import tilelang.language as T
import torch

from vmi_core.compile import compile_kernel, lower
from vmi_core.formats import f32_from_bits
from vmi_core.fp32 import ascend_quotient, divide, division_flushes_subnormals, flush_subnormal
from vmi_core.tl import formats as F
from vmi_core.tools.source_checks import cpu_vectorized_loops
from vmi_core.tools.testing import assert_bitwise_equal

SIGN = -0x80000000
# Zeros, the smallest and largest subnormals, the smallest normal, ordinary values, infinity, NaN;
# each with both signs.
PATTERNS = [0x00000000, 0x00000001, 0x00000400, 0x007FFFFF, 0x00800000, 0x00800001, 0x3F800000, 0x7F7FFFFF,
            0x7F800000, 0x7FC00000]
N = 2 * len(PATTERNS)


def values() -> torch.Tensor:
    magnitudes = torch.tensor(PATTERNS, dtype=torch.int32)
    return f32_from_bits(torch.cat([magnitudes, magnitudes | SIGN]))


def expected() -> torch.Tensor:
    x = values()
    subnormal = (x != 0) & (x.abs() < 2.0 ** -126)
    return torch.where(subnormal, torch.copysign(torch.zeros(()), x), x)


def test_torch_twin():
    assert_bitwise_equal(flush_subnormal(values()), expected(), "flush_subnormal")
    assert division_flushes_subnormals("ascend") and not division_flushes_subnormals("cuda")


def test_kernel_function_matches_its_twin():
    @T.prim_func
    def flush_kernel(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(1):
            for i in T.Parallel(N):
                Y[i] = F.flush_subnormal(X[i])

    kernel = compile_kernel(flush_kernel, "cpu")
    out = torch.empty(N)
    kernel(values(), out)
    assert_bitwise_equal(out, flush_subnormal(values()), "kernel flush_subnormal")


def quotient_operands() -> tuple[torch.Tensor, torch.Tensor]:
    """Every pair of the special values, plus quotients spread over 2^-149 .. 2^-90, where the
    residuals of the division's neighbour check underflow."""
    g = torch.Generator().manual_seed(5)
    num = torch.cat([values().repeat_interleave(N), torch.rand(4096, generator=g) + 0.5])
    den = torch.cat([values().repeat(N), 2.0 ** torch.randint(90, 149, (4096,), generator=g).float()
                     * (torch.rand(4096, generator=g) + 1.0)])
    return num, den


def test_ascend_quotient_twin():
    num, den = quotient_operands()
    q = ascend_quotient(num, den)
    exact = num.double() / den.double()
    normal_operands = (num.abs() >= 2.0 ** -126) & (den.abs() >= 2.0 ** -126)
    finite = normal_operands & (exact.abs() <= torch.finfo(torch.float32).max) & (exact.abs() >= 2.0 ** -126)
    # Normal quotients of normal operands: within an ulp of the exact one (the check moves them by
    # one at most); subnormal ones flushed.
    assert ((q.double()[finite] - exact[finite]).abs() <= exact[finite].abs() * 2.0 ** -23).all()
    assert (q[normal_operands & (exact.abs() < 2.0 ** -126)] == 0).all()
    # The residual check does move some of these (a flush-only model would not match).
    assert (q != flush_subnormal(num / den)).sum() > 100
    assert_bitwise_equal(divide(num, den, "ascend"), q, "divide ascend")
    assert_bitwise_equal(divide(num, den, "cuda"), num / den, "divide cuda")


def test_ascend_quotient_kernel_matches_its_twin():
    num, den = quotient_operands()
    M = num.numel()

    @T.prim_func
    def quotient_kernel(A: T.Tensor((M,), "float32"), B: T.Tensor((M,), "float32"), Q: T.Tensor((M,), "float32")):
        with T.Kernel(1):
            for i in T.Parallel(M):
                Q[i] = F.ascend_quotient(A[i], B[i])

    kernel = compile_kernel(quotient_kernel, "cpu")
    out = torch.empty(M)
    kernel(num, den, out)
    assert_bitwise_equal(out, ascend_quotient(num, den), "kernel ascend_quotient", any_nan=True)
    # The division sits in the element loops of SwiGLU and the mHC sigmoid: it must not stop GCC
    # vectorizing them (None: the host compiler is not GCC).
    loops = cpu_vectorized_loops(lower(quotient_kernel, "cpu"))
    assert loops is None or len(loops) == 1, loops
