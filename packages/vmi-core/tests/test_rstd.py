"""rstd = 1 / sqrt(S / hidden + eps) (quant-b spec §3, §4.2): the kernel function, its torch twin,
and both against a high-precision reference.

One element-wise kernel maps square sums through ``vmi_core.tl.rstd.rstd`` for several
specialisations (hidden x eps) at once; it runs on ``cpu`` (both flavors, twelve
specialisations) and ``ascend-sim`` (the ascend flavor, in a SIMD region: vector code; four
specialisations, all twelve in the slow run) and is compared bit for bit with the twins of
``vmi_core.rstd``. The twins are checked against exact arithmetic (``fractions``) and the
float64 reference ``rstd_reference``. The CUDA source is generated and compiled with nvcc where
it is installed.
"""

# No ``from __future__ import annotations`` here: TileLang evaluates a prim_func's signature
# from the builder's closure, which only holds the sizes that the body itself uses.

import math
from fractions import Fraction

import numpy as np
import pytest
import tilelang.language as T
import torch

from vmi_core.compile import cached_kernel, cuda_arch, kernel_source
from vmi_core.fp32 import fma
from vmi_core.rstd import rstd, rstd_constants, rstd_reference
from vmi_core.tl.rstd import rstd as rstd_kernel_fn
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tools.source_checks import assert_vector_regions, dma_counts
from vmi_core.tools.testing import assert_bitwise_equal
from vmi_devkit.cuda import check_cuda_source

HIDDEN = (128, 192, 4096, 7168)
EPS = (1e-6, 1e-5, 2.0**-126)
CASES = tuple((h, e) for h in HIDDEN for e in EPS)
# ascend-sim compiles a kernel's source with g++ -O2, about a second per case: the quick tests run
# these four (every hidden and every eps once), the slow ones all twelve.
SIM_CASES = ((128, 1e-6), (192, 2.0**-126), (4096, 1e-5), (7168, 1e-6))
N = 1 << 14  # square sums per case
BLOCK = 1024

# The ascend flavor's error, in ulps of the result, against the exact rstd. While
# 2^-100 <= S / hidden + eps <= 2^100, v + ve holds the mean square to ~2^-48 and the Newton step
# adds ~2^-47 (relative) before the final rounding: measured below half an ulp everywhere (every
# result correctly rounded); the bound allows 2^-20 ulp more.
ASCEND_ULPS = 0.5 + 2.0**-20
# Outside that range the low part ve (below 2^-100) or r0^2's error term r2e (above 2^100) falls
# under the fp32 subnormal grid and the compensation loses bits: measured 0.98 ulp here, 0.9989
# over 2^22 samples per case (``test_ascend_error_sweep``), for eps = 2^-126. For hidden >= 4,
# S / hidden < 2^126 keeps r0^2 normal.
ASCEND_ULPS_EDGES = 1.0
# The cuda flavor off the GPU, f32(1 / f32(sqrt(a))) with a = f32(f32(S / hidden) + f32(eps)): a
# is off by at most 2^-23 relative (three roundings, two of them weighted), which moves rstd by
# 2^-24 relative, at most one ulp; the sqrt's rounding moves it by another ulp at most, and the
# division rounds once more: 2.5 ulp (measured 1.99).
CUDA_ULPS = 2.5


# --- the kernel -------------------------------------------------------------------------------

def _emit(stmt):
    # ``Shell.copy`` gives a call to evaluate (``T.copy``) or expands in place (the cpu copy).
    if stmt is not None:
        T.evaluate(stmt)


def _cases(sh, spec, X, Y, bx):
    """One input and one output tile per case, a phase each (Python loops: unrolled at trace time)."""
    flavor, cases, _, block = spec
    xs = [sh.tile((block,), "float32") for _ in cases]
    ys = [sh.tile((block,), "float32") for _ in cases]
    for c, x in enumerate(xs):
        _emit(sh.copy(X[c, bx * block], x))
    with sh.vector(SIMD):
        for c, (hidden, eps) in enumerate(cases):
            sh.elementwise((block,), lambda at, x=xs[c], h=hidden, e=eps: rstd_kernel_fn(at.load(x), h, e, flavor),
                           ys[c])
    for c, y in enumerate(ys):
        _emit(sh.copy(y, Y[c, bx * block]))


def build_rstd(spec, target: str):
    """``Y[c, i] = rstd(X[c, i], *cases[c], flavor)`` for ``spec = (flavor, cases, n, block)``."""
    _, cases, n, block = spec
    sh = Shell(target)
    k = len(cases)

    @T.prim_func
    def rstd_kernel(X: T.Tensor((k, n), "float32"), Y: T.Tensor((k, n), "float32")):
        with sh.kernel(n // block) as bx:
            _cases(sh, spec, X, Y, bx)

    return rstd_kernel


def run_kernel(x: torch.Tensor, flavor: str, target: str, cases=CASES) -> torch.Tensor:
    """The kernel on ``x`` of shape ``(len(cases), N)``."""
    kernel = cached_kernel(build_rstd, (flavor, cases, N, BLOCK), target, simd_parallel=False)
    y = torch.empty_like(x)
    kernel(x.contiguous(), y)
    return y


# --- inputs -----------------------------------------------------------------------------------

F32_MAX = float(np.finfo(np.float32).max)


def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(torch.float32)


def ulp_of(x: torch.Tensor) -> torch.Tensor:
    """The fp32 ulp at float64 values ``x > 0`` (2^(e - 24) for x in [2^(e-1), 2^e))."""
    _, exponent = torch.frexp(x)
    return torch.ldexp(torch.ones_like(x), exponent.to(torch.int32) - 24)


def ulps_off(r: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|r - ref| in ulps of ``ref`` (float64)."""
    return (r.double() - ref).abs() / ulp_of(ref)


def distance_to_midpoint(ref: torch.Tensor) -> torch.Tensor:
    """How far (in ulps) ``ref`` lies from the nearest midpoint of two fp32 values."""
    scaled = ref / ulp_of(ref)
    return ((scaled - scaled.floor()) - 0.5).abs()


def in_usual_range(x: torch.Tensor) -> torch.Tensor:
    """Where 2^-100 <= S / hidden + eps <= 2^100, per case (rows of ``x``)."""
    hidden = torch.tensor([h for h, _ in CASES], dtype=torch.float64)[:, None]
    eps = torch.tensor([e for _, e in CASES], dtype=torch.float64)[:, None]
    mean = x.double() / hidden + eps
    return (mean >= 2.0**-100) & (mean <= 2.0**100)


def edge_values(hidden: int, eps: float) -> list[float]:
    """Zero, the subnormals, the extremes, and S where S / hidden meets eps."""
    meet = hidden * eps
    return [0.0, 2.0**-149, 3 * 2.0**-149, 2.0**-127, 2.0**-126, 1e-30, 1e-20, 1e-12, meet / 64, meet / 2,
            meet, 2 * meet, 64 * meet, 1.0, float(hidden), 1e10, 1e20, 1e30, 2.0**100 * hidden, 1e36, 3e38,
            F32_MAX]


def inputs(hidden: int, eps: float, seed: int) -> torch.Tensor:
    """``N`` square sums: one per binade and random ones over all of them, runs of consecutive fp32
    values, the edges, and the values of a large random pool whose rstd lies nearest to a rounding
    boundary (a midpoint of two fp32 values)."""
    g = torch.Generator().manual_seed(seed)
    binades = torch.exp2(torch.arange(-149, 128, dtype=torch.float64))
    spread = torch.exp2(torch.rand(4096, generator=g, dtype=torch.float64) * 277 - 149)
    # Where rstd depends on S (S / hidden near eps and above), log-uniform.
    lo, hi = math.log2(hidden * eps) - 12, math.log2(hidden) + 40
    pool = torch.exp2(torch.rand(1 << 18, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(torch.float32)
    nearest = pool[distance_to_midpoint(rstd_reference(pool, hidden, eps)).argsort()[:4096]]
    start = f32([hidden * eps, 1.0, float(hidden), 1e4 * hidden]).view(torch.int32)
    runs = (start[:, None] + torch.arange(-256, 256, dtype=torch.int32)).flatten().view(torch.float32)
    edges = f32(edge_values(hidden, eps))
    fixed = torch.cat([binades.to(torch.float32), spread.to(torch.float32), nearest, runs, edges])
    rest = torch.exp2(torch.rand(N - fixed.numel(), generator=g, dtype=torch.float64) * (hi - lo) + lo)
    return torch.cat([fixed, rest.to(torch.float32)])


def all_inputs() -> torch.Tensor:
    return torch.stack([inputs(h, e, seed) for seed, (h, e) in enumerate(CASES)])


@pytest.fixture(scope="module")
def x():
    return all_inputs()


@pytest.fixture(scope="module")
def twins(x):
    return {flavor: torch.stack([rstd(x[c], h, e, flavor) for c, (h, e) in enumerate(CASES)])
            for flavor in ("ascend", "cuda")}


@pytest.fixture(scope="module")
def reference(x):
    return torch.stack([rstd_reference(x[c], h, e) for c, (h, e) in enumerate(CASES)])


# --- exact arithmetic -------------------------------------------------------------------------

def f32_of(value: Fraction) -> float:
    """``value`` rounded once to fp32 (nearest, ties to even; subnormals; finite range)."""
    if value == 0:
        return 0.0
    sign, mag = (-1, -value) if value < 0 else (1, value)
    exponent = max(math.floor(math.log2(mag)), -126)
    while Fraction(2) ** exponent > mag and exponent > -126:  # log2 of a Fraction may round up
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= mag:
        exponent += 1
    step = Fraction(2) ** (exponent - 23)
    return sign * float(round(mag / step) * step)  # round(): half to even


def is_correctly_rounded(r: float, s: float, hidden: int, eps: float) -> bool:
    """Whether the fp32 ``r`` is 1 / sqrt(s / hidden + eps) rounded to nearest, decided exactly: the
    midpoints to both fp32 neighbours must bracket it (rstd is never a midpoint)."""
    x = Fraction(s) / hidden + Fraction(eps)
    lo = (Fraction(r) + Fraction(float(np.nextafter(np.float32(r), np.float32(0))))) / 2
    hi = (Fraction(r) + Fraction(float(np.nextafter(np.float32(r), np.float32(np.inf))))) / 2
    return lo * lo * x < 1 < hi * hi * x


# --- the torch twins --------------------------------------------------------------------------

def fma_triples(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random operands over many binades, and products that put ``a b + c`` within 2^-53 of an fp32
    midpoint (either side): ``a b = +-(p q) 2^-71`` with integers ``p q = 2^47 + d``,
    ``0 < |d| < 2^18``, and ``c`` in [1, 2), so that rounding to float64 first lands on the tie."""
    g = torch.Generator().manual_seed(seed)

    def spread(n, lo, hi):
        sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
        return (sign * torch.exp2(torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo)).to(torch.float32)

    a, b, c = spread(6000, -60, 60), spread(6000, -60, 60), spread(6000, -100, 100)
    p = torch.randint(1 << 23, 1 << 24, (1 << 16,), generator=g)
    q = torch.round((1 << 47) / p.double()).long()
    d = p * q - (1 << 47)
    keep = (d != 0) & (d.abs() < (1 << 18)) & (q < (1 << 24))
    p, q = p[keep][:3000], q[keep][:3000]
    sign = torch.where(torch.rand(p.numel(), generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    a2 = (sign * p.double() * 2.0**-47).to(torch.float32)
    b2 = (q.double() * 2.0**-24).to(torch.float32)
    c2 = (1.0 + torch.randint(0, 1 << 23, (p.numel(),), generator=g).double() * 2.0**-23).to(torch.float32)
    zeros = (f32([1.5, -1.5, 0.0, -0.0, 2.0**-75]), f32([2.0, 2.0, -1.0, 3.0, 2.0**-75]),
             f32([-3.0, 3.0, -0.0, -0.0, 0.0]))
    return tuple(torch.cat([u, v, z]) for u, v, z in zip((a, b, c), (a2, b2, c2), zeros, strict=True))


class TestTwin:
    def test_fma_is_one_rounding(self):
        a, b, c = fma_triples(1)
        got = fma(a, b, c)
        expected = f32([f32_of(Fraction(float(u)) * Fraction(float(v)) + Fraction(float(w)))
                        for u, v, w in zip(a.tolist(), b.tolist(), c.tolist(), strict=True)])
        zero = expected == 0  # exact zeros: +0 unless both a b and c are -0 (round to nearest)
        expected[zero] = torch.where((a[zero] * b[zero]).signbit() & c[zero].signbit(), -0.0, 0.0)
        assert_bitwise_equal(got, expected, "fma")
        # Rounding a * b + c in float64 first would round some of the ties wrongly.
        twice = (a.double() * b.double() + c.double()).to(torch.float32)
        assert int((twice != expected).sum()) > 100

    def test_constants(self):
        c = rstd_constants(192, 1e-6)
        assert c.rc_hi == float(np.float32(1 / 192)) and c.rc_lo == float(np.float32(1 / 192 - c.rc_hi))
        assert c.e_hi == float(np.float32(1e-6)) and c.e_lo == float(np.float32(1e-6 - c.e_hi))
        assert Fraction(c.rc_hi) + Fraction(c.rc_lo) != Fraction(1, 192)
        assert abs(Fraction(c.rc_hi) + Fraction(c.rc_lo) - Fraction(1, 192)) < Fraction(1, 192) * 2**-47
        exact = rstd_constants(4096, 2.0**-126)
        assert (exact.rc_lo, exact.e_lo) == (0.0, 0.0)

    @pytest.mark.parametrize("hidden,eps,error", [
        (128, 2.0**-127, ValueError), (128, 0.0, ValueError), (128, -1e-6, ValueError), (128, math.nan, ValueError),
        (128, math.inf, ValueError), (128, 1e39, ValueError), (0, 1e-6, ValueError), (2**24 + 1, 1e-6, ValueError),
        (128.0, 1e-6, TypeError), (True, 1e-6, TypeError), (128, "1e-6", TypeError), (128, None, TypeError),
    ])
    def test_bad_specialisation(self, hidden, eps, error):
        with pytest.raises(error):
            rstd_constants(hidden, eps)
        with pytest.raises(error):
            rstd(torch.ones(4), hidden, eps)

    def test_bad_arguments(self):
        with pytest.raises(TypeError):
            rstd(torch.ones(4, dtype=torch.float64), 128, 1e-6)
        with pytest.raises(ValueError):
            rstd(torch.ones(4), 128, 1e-6, "rocm")
        assert rstd_constants(7168, 2.0**-126).e_hi == 2.0**-126

    def test_ascend_is_nearly_correctly_rounded(self, x, twins, reference):
        """Correctly rounded while 2^-100 <= S / hidden + eps <= 2^100, within an ulp elsewhere.

        A result within half an ulp less 2^-25 of the float64 reference (whose own error is below
        2^-26 ulp) is correctly rounded; the others in that range are decided exactly.
        """
        r = twins["ascend"]
        err = ulps_off(r, reference)
        usual = in_usual_range(x)
        assert float(err[usual].max()) <= ASCEND_ULPS, f"max {float(err[usual].max())} ulp"
        assert float(err.max()) < ASCEND_ULPS_EDGES, f"max {float(err.max())} ulp"
        # Decided exactly: those, and per case the 16 results nearest to a midpoint (within ~2^-19 ulp),
        # whose fp32 neighbours must fail the same test (it is not vacuous).
        undecided = set(map(tuple, (usual & (err > 0.5 - 2.0**-25)).nonzero().tolist()))
        nearest = distance_to_midpoint(reference).masked_fill(~usual, 1.0).argsort(dim=1)[:, :16]
        checked = undecided | {(c, int(i)) for c in range(len(CASES)) for i in nearest[c]}
        wrong = []
        for c, i in sorted(checked):
            value, s = float(r[c, i]), float(x[c, i])
            if not is_correctly_rounded(value, s, *CASES[c]):
                wrong.append((CASES[c], s))
            other = float(np.nextafter(np.float32(value), np.float32(0 if value > reference[c, i] else np.inf)))
            assert not is_correctly_rounded(other, s, *CASES[c])
        assert not wrong, f"misrounded: {wrong[:8]}"

    @pytest.mark.slow
    @pytest.mark.parametrize("hidden", HIDDEN)
    def test_ascend_error_sweep(self, hidden):
        """2^22 square sums per eps where the compensation runs out of bits (S / hidden below
        2^-100 and above 2^100), and where it does not."""
        g = torch.Generator().manual_seed(hidden)
        log_h = math.log2(hidden)
        for lo, hi, eps, bound in ((-160, -90, 2.0**-126, ASCEND_ULPS_EDGES), (-160, -90, 2.0**-110, ASCEND_ULPS_EDGES),
                                   (90, 128 - log_h, 1e-6, ASCEND_ULPS_EDGES), (-40, 100, 1e-6, ASCEND_ULPS)):
            s = torch.exp2(torch.rand(1 << 22, generator=g, dtype=torch.float64) * (hi - lo) + lo + log_h)
            s = s.to(torch.float32)
            s = s[torch.isfinite(s)]
            err = ulps_off(rstd(s, hidden, eps), rstd_reference(s, hidden, eps))
            assert float(err.max()) <= bound, f"eps {eps}, S in 2^[{lo}, {hi}] hidden: max {float(err.max())} ulp"

    def test_cuda_is_its_definition(self, x, twins, reference):
        """``f32(1 / f32(sqrt(a)))``, ``a = f32(f32(S / hidden) + f32(eps))``, in numpy's fp32 ops."""
        for c, (h, e) in enumerate(CASES):
            s = x[c].numpy()
            with np.errstate(over="ignore"):
                a = (s / np.float32(h)).astype(np.float32) + np.float32(e)
                expected = np.float32(1.0) / np.sqrt(a)
            assert_bitwise_equal(twins["cuda"][c], torch.from_numpy(expected), f"cuda twin, case {c}")
        err = ulps_off(twins["cuda"], reference)
        assert float(err.max()) <= CUDA_ULPS, f"max {float(err.max())} ulp"

    def test_special_values(self):
        s = f32([0.0, math.inf, math.nan])
        for h, e in CASES:
            asc, cud = rstd(s, h, e, "ascend"), rstd(s, h, e, "cuda")
            exact_zero = float(rstd_reference(s[:1], h, e)[0])
            assert abs(float(asc[0]) - exact_zero) <= 0.5 * float(ulp_of(torch.tensor([exact_zero]))[0])
            assert math.isnan(float(asc[1])) and math.isnan(float(asc[2]))
            assert float(cud[1]) == 0.0 and math.isnan(float(cud[2]))


# --- the kernel -------------------------------------------------------------------------------

def rows(cases) -> list[int]:
    return [CASES.index(case) for case in cases]


KERNEL_RUNS = [pytest.param("cpu", CASES, id="cpu"), pytest.param("ascend-sim", SIM_CASES, id="ascend-sim"),
               pytest.param("ascend-sim", CASES, marks=pytest.mark.slow, id="ascend-sim-all")]


@pytest.mark.parametrize("target,cases", KERNEL_RUNS)
def test_ascend_kernel_equals_twin(x, twins, target, cases):
    y = run_kernel(x[rows(cases)], "ascend", target, cases)
    assert_bitwise_equal(y, twins["ascend"][rows(cases)], f"ascend flavor on {target}")


def test_cuda_kernel_equals_twin(x, twins):
    assert_bitwise_equal(run_kernel(x, "cuda", "cpu"), twins["cuda"], "cuda flavor on cpu")


@pytest.mark.parametrize("target,cases", KERNEL_RUNS[:2])
def test_kernel_special_values(target, cases):
    x = torch.zeros(len(cases), N)
    x[:, 1], x[:, 2], x[:, 3] = math.inf, math.nan, F32_MAX
    flavors = ("ascend", "cuda") if target == "cpu" else ("ascend",)
    for flavor in flavors:
        y = run_kernel(x, flavor, target, cases)
        expected = torch.stack([rstd(x[c], h, e, flavor) for c, (h, e) in enumerate(cases)])
        nan = expected.isnan()
        assert torch.equal(y.isnan(), nan)
        assert_bitwise_equal(y[~nan], expected[~nan], f"{flavor} on {target}")


def test_checked_when_the_kernel_is_built():
    with pytest.raises(ValueError, match="2\\^-126"):
        build_rstd(("ascend", ((128, 1e-40),), N, BLOCK), "cpu")
    with pytest.raises(ValueError, match="no vector form"):
        build_rstd(("cuda", ((128, 1e-6),), N, BLOCK), "ascend")


# --- lowering for Ascend and CUDA ---------------------------------------------------------------

ONE_CASE = ((7168, 1e-6),)


def test_ascend_lowers_to_vector_code():
    src = kernel_source(build_rstd, ("ascend", ONE_CASE, N, BLOCK), "ascend", simd_parallel=False)
    assert_vector_regions(src, simd=1, simt=0)
    assert dma_counts(src) == (1, 1)
    for op in ("simd_inst::vsqrt(", "simd_inst::vdiv_0ulp_ftz_true(", "simd_inst::vmula(", "simd_inst::vneg("):
        assert op in src
    assert src.count("simd_inst::vmula(") == 8
    assert "sqrtf(" not in src and "fmaf(" not in src


@pytest.mark.cuda_compile
@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
def test_lowers_and_compiles_for_cuda(flavor):
    src = kernel_source(build_rstd, (flavor, ONE_CASE, N, BLOCK), "cuda")
    calls = ("rsqrtf(",) if flavor == "cuda" else ("fmaf(", "sqrtf(")
    for call in calls:
        assert call in src
    check_cuda_source(src, cuda_arch())
