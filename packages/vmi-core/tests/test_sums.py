"""Fixed-order fp32 row sums (``Shell.row_sum`` / ``vmi_core.sums``), and the torch twins of fma and
the correctly rounded exponential (``vmi_core.fp32``; the kernels' exp: test_exp).

One kernel sums each row of a tile (plain terms and fused products); it runs on ``cpu``
(``T.Parallel`` lanes) and ``ascend-sim`` (a SIMD region: a row's partials in one register, folded
by deinterleaving) and is compared bit for bit with the torch twins. The twins are checked against
independent emulations: a Python loop of numpy float32 additions in the lane order, exact rational
arithmetic for the fused products, and the 80-bit ``exp`` of numpy's long double.
"""

# No ``from __future__ import annotations`` here: TileLang evaluates a prim_func's signature
# from the builder's closure, which only holds the sizes that the body itself uses.

from fractions import Fraction

import numpy as np
import pytest
import tilelang.language as T
import torch

from vmi_core.compile import cached_kernel, cuda_arch, kernel_source
from vmi_core.fp32 import exp, fma
from vmi_core.sums import LANES, lane_sum, lane_sum_fused
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tools.source_checks import assert_vector_regions
from vmi_core.tools.testing import assert_bitwise_equal
from vmi_devkit.cuda import check_cuda_source

ROWS, COLS = 8, 448  # 7 chunks of 64 lanes


def _emit(stmt):
    # ``Shell.copy`` gives a call to evaluate (``T.copy``) or expands in place (the cpu copy).
    if stmt is not None:
        T.evaluate(stmt)


def build_sums(spec, target: str):
    """``SUM[i]``, ``DOT[i]`` (``i < rows``): row sums of ``X`` and of ``X * Y``."""
    rows, cols = spec
    sh = Shell(target)

    @T.prim_func
    def sums_kernel(X: T.Tensor((rows, cols), "float32"), Y: T.Tensor((rows, cols), "float32"),
                    SUM: T.Tensor((rows + LANES,), "float32"), DOT: T.Tensor((rows + LANES,), "float32")):
        with sh.kernel(1) as _:
            x = sh.tile((rows, cols), "float32")
            y = sh.tile((rows, cols), "float32")
            total = sh.tile((rows + LANES,), "float32")
            dot = sh.tile((rows + LANES,), "float32")
            _emit(sh.copy(X[0, 0], x))
            _emit(sh.copy(Y[0, 0], y))
            with sh.vector(SIMD):
                sh.row_sum(total, (rows, cols), lambda at: at.load(x))
                sh.row_sum(dot, (rows, cols), lambda at: (at.load(x), at.load(y)), fused=True)
            _emit(sh.copy(total, SUM[0]))
            _emit(sh.copy(dot, DOT[0]))

    return sums_kernel


def run_kernel(x: torch.Tensor, y: torch.Tensor, target: str):
    kernel = cached_kernel(build_sums, x.shape, target, simd_parallel=False)
    # The sums come out with the vector form's padding of the per-row tiles.
    total, dot = torch.empty(x.shape[0] + LANES), torch.empty(x.shape[0] + LANES)
    kernel(x.contiguous(), y.contiguous(), total, dot)
    return total[:x.shape[0]], dot[:x.shape[0]]


def spread(shape, seed: int) -> torch.Tensor:
    """Values of both signs over ~40 binades, so that the order of the additions shows."""
    g = torch.Generator().manual_seed(seed)
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    return (sign * torch.exp2(torch.rand(shape, generator=g) * 40 - 20)).to(torch.float32)


# --- the twins against independent emulations -----------------------------------------------

def lane_order_sum(row: np.ndarray, fused_with: np.ndarray | None = None) -> np.float32:
    """The lane order of vmi_core.sums, one numpy float32 operation at a time."""
    n = -(-len(row) // LANES) * LANES
    partials = [np.float32(0.0)] * LANES
    for j in range(n):
        a = row[j] if j < len(row) else np.float32(0.0)
        if fused_with is None:
            partials[j % LANES] = np.float32(partials[j % LANES] + a)
        else:
            b = fused_with[j] if j < len(row) else np.float32(0.0)
            exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(partials[j % LANES]))
            partials[j % LANES] = np.float32(float(exact)) if exact else np.float32(0.0)
    while len(partials) > 1:
        partials = [np.float32(partials[2 * k] + partials[2 * k + 1]) for k in range(len(partials) // 2)]
    return partials[0]


@pytest.mark.parametrize("cols", [1, 64, 100, 448])
def test_lane_sum_is_the_lane_order(cols):
    x, y = spread((3, cols), 1), spread((3, cols), 2)
    got = lane_sum(x)
    want = torch.tensor([lane_order_sum(r) for r in x.numpy()])
    assert_bitwise_equal(got, want, "lane_sum")
    # Fractions round to fp32 through float64 here: with these magnitudes a * b + p is exact in
    # float64 or far from an fp32 tie, which test_rstd's fma tests cover in general.
    got = lane_sum_fused(x, y)
    want = torch.tensor([lane_order_sum(a, b) for a, b in zip(x.numpy(), y.numpy(), strict=True)])
    assert_bitwise_equal(got, want, "lane_sum_fused")


def test_lane_sum_of_no_rows_and_empty_rows():
    assert lane_sum(torch.zeros(0, 100)).shape == (0,)
    assert lane_sum_fused(torch.zeros(2, 0, 100), torch.zeros(2, 0, 100)).shape == (2, 0)
    assert_bitwise_equal(lane_sum(torch.zeros(3, 0)), torch.zeros(3), "sum of no terms")


def test_lane_sum_order_matters():
    # The same terms in torch's own summation order give other bits for some rows.
    x = spread((64, 448), 3)
    assert int((lane_sum(x) != x.sum(-1)).sum()) > 0


def test_fma_and_exp_twins():
    a, b, c = spread(1000, 4), spread(1000, 5), spread(1000, 6)
    exact = [Fraction(float(u)) * Fraction(float(v)) + Fraction(float(w))
             for u, v, w in zip(a.tolist(), b.tolist(), c.tolist(), strict=True)]
    # Through float64 a tie could round wrongly; none of these is one (checked by the midpoint
    # tests of test_rstd), so float(exact) rounded to fp32 is the correct rounding here.
    assert_bitwise_equal(fma(a, b, c), torch.tensor([float(e) for e in exact]).to(torch.float32), "fma")
    x = torch.cat([torch.linspace(-103.0, 88.7, 20001), torch.tensor([0.0, -0.0, 1e-30, -1e-30])])
    want = np.exp(x.numpy().astype(np.longdouble)).astype(np.float32)
    assert_bitwise_equal(exp(x), torch.from_numpy(want), "exp")
    with pytest.raises(TypeError, match="x must be a float32"):
        exp(x.double())
    with pytest.raises(TypeError, match="c must be a float32"):
        fma(a, b, c.double())


# --- the kernel ------------------------------------------------------------------------------

def kernel_inputs():
    x, y = spread((ROWS, COLS), 7), spread((ROWS, COLS), 8)
    x[1, :5] = torch.tensor([0.0, -0.0, 88.8, -200.0, float("nan")])
    return x, y


@pytest.mark.parametrize("target", ["cpu", "ascend-sim"])
def test_kernel_equals_twins(target):
    x, y = kernel_inputs()
    total, dot = run_kernel(x, y, target)
    assert_bitwise_equal(total, lane_sum(x), f"row sum on {target}", any_nan=True)
    assert_bitwise_equal(dot, lane_sum_fused(x, y), f"fused row sum on {target}", any_nan=True)


def test_ascend_lowers_to_vector_code():
    src = kernel_source(build_sums, (ROWS, COLS), "ascend", simd_parallel=False)
    assert_vector_regions(src, simd=1, simt=0)
    for op in ("simd_inst::vmula(", "vdintlv"):
        assert op in src


@pytest.mark.cuda_compile
def test_lowers_and_compiles_for_cuda():
    check_cuda_source(kernel_source(build_sums, (ROWS, COLS), "cuda"), cuda_arch())
