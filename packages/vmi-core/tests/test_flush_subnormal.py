"""The subnormal flush of the Ascend vector division: the kernel function
(``vmi_core.tl.formats.flush_subnormal``, cpu target) and its torch twin (``vmi_core.fp32``), bit
for bit, on every class of fp32 value."""

from __future__ import annotations

import tilelang.language as T
import torch

from vmi_core.compile import compile_kernel
from vmi_core.formats import f32_from_bits
from vmi_core.fp32 import division_flushes_subnormals, flush_subnormal
from vmi_core.testing import assert_bitwise_equal
from vmi_core.tl import formats as F

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
