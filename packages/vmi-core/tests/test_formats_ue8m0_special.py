"""``ue8m0_ceil`` and ``ue8m0_reciprocal`` (vmi_core.tl.formats) on the CPU target over their
whole domain, NaN, infinities, zeros and subnormals included, bit for bit against the torch twins.

The quantization ops build power-of-two scales from these two: a NaN block amax must give
exponent 0 (sf 0.0, sf_inv inf) and an infinite one 255 (sf inf, sf_inv 0), as in the reference.
"""

from __future__ import annotations

import tilelang.language as T
import torch

from vmi_core import formats as tw
from vmi_core.compile import compile_kernel
from vmi_core.tl import formats as F
from vmi_core.tools.testing import assert_bitwise_equal

U32 = 0xFFFFFFFF
N = 4096


def build_kernel(n: int):
    # uint32 results travel as int32: TileLang's CPU wrapper has no uint32 argument type.
    @T.prim_func
    def ue8m0_kernel(X: T.Tensor((n,), "float32"), C: T.Tensor((n,), "int32"),
                     E: T.Tensor((256,), "int32"), R: T.Tensor((256,), "float32")):
        with T.Kernel(1):
            for i in T.Parallel(n):
                C[i] = T.Cast("int32", F.ue8m0_ceil(X[i]))
            for e in T.Parallel(256):
                R[e] = F.ue8m0_reciprocal(T.Cast("uint32", E[e]))

    return ue8m0_kernel


def _special_patterns() -> torch.Tensor:
    specials = [0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x3F800000, 0x3F800001,
                0x7EFFFFFF, 0x7F000000, 0x7F000001, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7F800001,
                0x7FC00000, 0x7FFFFFFF, 0xFFC00000, 0xFFFFFFFF, 0xBF800000]
    rand = torch.randint(0, 1 << 32, (N - len(specials),), generator=torch.Generator().manual_seed(3),
                         dtype=torch.int64)
    return tw.f32_from_bits(torch.cat([torch.tensor(specials, dtype=torch.int64), rand]))


def test_ceil_and_reciprocal_every_class():
    kernel = compile_kernel(build_kernel(N), "cpu")
    x = _special_patterns()
    ceil = torch.empty(N, dtype=torch.int32)
    exps = torch.arange(256, dtype=torch.int32)
    recip = torch.empty(256)
    kernel(x, ceil, exps, recip)

    assert torch.equal(ceil.to(torch.int64) & U32, tw.ue8m0_encode_ceil(x).to(torch.int64))
    got = dict(zip(tw.f32_bits(x[:19]).tolist(), ceil[:19].tolist(), strict=True))
    assert got[0x7FC00000] == got[0xFFFFFFFF] == got[0x7F800001] == 0  # NaN -> 0 (sf 0.0)
    assert got[0x7F800000] == got[0x7F000001] == 255  # inf and values above 2^127 -> inf
    assert got[0x7F000000] == 254 and got[0x00000001] == 1 and got[0x00000000] == 0

    assert_bitwise_equal(recip, tw.ue8m0_reciprocal(exps.to(torch.uint8)), "ue8m0_reciprocal vs twin")
    # Independent of both: IEEE division of 1 by the decoded exponent (exact for every byte).
    assert_bitwise_equal(recip, torch.ones(256) / tw.ue8m0_decode(exps.to(torch.uint8)), "ue8m0_reciprocal vs 1/x")
    assert recip[0] == float("inf") and recip[255] == 0.0 and int(tw.f32_bits(recip[254:255])[0]) == 0x400000
