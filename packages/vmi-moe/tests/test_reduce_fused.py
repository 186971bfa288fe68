"""reduce_fused on the cpu target (both flavors) and on ascend-sim against the reference, bit for bit,
plus its bad input and its lowering.

The reference (``vmi_moe.reference.reduce``) computes the fused multiply-adds in float64 with the
TwoSum correction (``vmi_core.fp32.fma``); independently of it: cases whose fused and unfused
results differ (with the fused value written down by hand), the slot order, torch's own E4M3 cast
at saturation and NaN, tokens without a used slot, and the empty sizes. The options ``x_sf``,
``topk_weights`` and ``sf`` are runtime values of one kernel per ``(K, input format, output
format)``: every match runs them all. By default three cpu kernels cover every input and output
format (fp32 -> fp32, bf16 -> bf16, E4M3 -> E4M3) and one ascend-sim kernel (bf16 -> E4M3); the
other combinations in the slow run. Column counts cover 1, one register, one chunk and a chunk
tail (700 = 512 + 188); token counts both sides of the 16-token work tile, and on ascend-sim more
than two work tiles per simulated core (``moe_cases.wrapping_counts``) under both reuse schedules.
"""

import pytest
import torch

from vmi_core.cpu_parallel import THREADS_ENV, row_ranges
from vmi_core.tools.source_checks import assert_vector_regions, barriers_in_thread_guards, dma_counts
from vmi_core.tools.testing import SIM_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.cases.moe_cases import FLAVORS, SIM, counts_on
from vmi_devkit.cuda import check_cuda_source
from vmi_devkit.errors import no_kernel_fixture
from vmi_moe.kernels.reduce_fused import BLOCK_H, BLOCK_M, ReduceFusedSpec, build_reduce_fused
from vmi_moe.ops.reduce_fused import REDUCE_FUSED, placement, reduce_fused, reduce_fused_parallel
from vmi_moe.reference.reduce import reduce_fused as reference_reduce

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}
# (input format, fp8_format): the default run's kernels first.
CPU_DEFAULT = [("fp32", ""), ("bf16", ""), ("e4m3", "")]
SIM_DEFAULT = [("bf16", "e4m3")]
ALL_FORMATS = [("fp32", ""), ("bf16", ""), ("e4m3", ""), ("fp32", "e4m3"), ("bf16", "e4m3")]
TOKENS = [0, 1, 15, 17, 40]
HIDDEN = [1, 64, 700]


def rows_for(fmt: str, num_rows: int, hidden: int, seed: int) -> torch.Tensor:
    """Expanded rows: normal samples over several binades, a few zeros and negative zeros."""
    g = generator(seed)
    x = torch.randn(num_rows, hidden, generator=g) * torch.exp2(torch.randint(-4, 5, (num_rows, 1), generator=g))
    x[torch.rand(num_rows, hidden, generator=g) < 0.02] = 0.0
    x[torch.rand(num_rows, hidden, generator=g) < 0.02] = -0.0
    if fmt == "e4m3":
        x = x * 16
    return x.to(DTYPES[fmt])


def inputs_for(fmt: str, fp8_format: str, T: int, K: int, H: int, seed: int, variant: int):
    """The call's arguments; ``variant`` picks which options are given (weights, x_sf, sf)."""
    g = generator(seed + 100)
    num_rows = T * K + 3
    data = rows_for(fmt, num_rows, H, seed)
    weights = torch.rand(T, K, generator=g) * 2 - 0.5 if variant % 2 == 0 else None
    scaled = fmt == "e4m3" or variant % 3 != 1
    x = (data, torch.rand(num_rows, generator=g) + 0.25) if scaled else data
    sf = torch.rand(1, generator=g) * 4 - 1 if fp8_format == "e4m3" and variant % 4 != 3 else None
    return x, weights, placement(T, K, num_rows, seed + 1, unused=0.25), fp8_format, sf


def check(x, weights, pos, fp8_format, sf, target, flavor, what) -> torch.Tensor:
    out = reduce_fused(x, weights, pos, fp8_format, sf, target=target, flavor=flavor)
    assert_bitwise_equal(out, reference_reduce(x, weights, pos, fp8_format, sf), what)
    return out


def format_params(default: list, target: str, flavors) -> list:
    return [pytest.param(flavor, target, fmt, fp8, id=f"{flavor}-{target}-{fmt}-{fp8 or 'same'}",
                         marks=[] if (fmt, fp8) in default else [pytest.mark.slow])
            for fmt, fp8 in ALL_FORMATS for flavor in flavors]


MATCH_CASES = format_params(CPU_DEFAULT, "cpu", FLAVORS) + format_params(SIM_DEFAULT, SIM, ["ascend"])


@pytest.mark.parametrize(("flavor", "target", "fmt", "fp8_format"), MATCH_CASES)
def test_matches_reference(flavor: str, target: str, fmt: str, fp8_format: str) -> None:
    K = 4
    counts = counts_on(target, TOKENS, BLOCK_M)
    for seed, T in enumerate(counts):
        # The wrapping counts (many work tiles) with a narrow row; the others over every width.
        widths = [8] if T > 100 else HIDDEN
        for H in widths:
            variant = seed + H
            args = inputs_for(fmt, fp8_format, T, K, H, seed, variant)
            with sim_schedule(SIM_SCHEDULES[seed % len(SIM_SCHEDULES)] if target == SIM else None):
                out = check(*args, target, flavor, f"T={T} H={H} variant={variant}")
            assert out.shape == (T, H) and out.is_contiguous()
            assert out.dtype == (torch.float8_e4m3fn if fp8_format == "e4m3" else DTYPES[fmt])


# --- reference-free cases ---------------------------------------------------------------------------

K4 = 4  # every default test uses the kernels of test_matches_reference (K = 4)


def kernel_targets() -> list:
    return [*((flavor, "cpu") for flavor in FLAVORS), ("ascend", SIM)]


def slots(rows: list[list[int]], weights: list[list[float]] | None = None):
    """Positions (and weights) of a few tokens, padded with unused slots to K = 4."""
    pos = torch.full((len(rows), K4), -1, dtype=torch.int32)
    w = torch.zeros(len(rows), K4)
    for t, row in enumerate(rows):
        pos[t, :len(row)] = torch.tensor(row, dtype=torch.int32)
        if weights is not None:
            w[t, :len(row)] = torch.tensor(weights[t], dtype=torch.float64).float()
    return pos, (w if weights is not None else None)


def run(target: str, flavor: str, rows: torch.Tensor, weights, pos, sf: float = 1.0) -> torch.Tensor:
    """fp32 rows on cpu (fp32 -> fp32); on ascend-sim its default kernel (bf16 rows, E4M3 out, ``sf``)."""
    if target != SIM:
        return reduce_fused(rows.float(), weights, pos, target=target, flavor=flavor)
    return reduce_fused((rows.bfloat16(), torch.ones(rows.shape[0])), weights, pos, "e4m3", torch.tensor([sf]),
                        target=target, flavor=flavor)


@pytest.mark.parametrize(("flavor", "target"), kernel_targets())
def test_fused_multiply_add(flavor: str, target: str) -> None:
    """acc = -(1 + 2^-7 + 2^-23) (row -1, an fp32 weight), then row 1 + 2^-7 times 1 + 2^-23: the
    product 1 + 2^-7 + 2^-23 + 2^-30 is not an fp32, so a separate multiply and add gives 0 and the
    fused multiply-add 2^-30 (bf16 0x3080; on ascend-sim times sf = 2^30: E4M3 1.0). Likewise with
    fp32 rows (cpu): -(1 + 2^-11), then (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 gives 2^-24."""
    rows = torch.tensor([[-1.0] * 3, [1 + 2.0**-7] * 3])
    pos, w = slots([[0, 1]], [[1 + 2.0**-7 + 2.0**-23, 1 + 2.0**-23]])
    if target == SIM:
        out = run(target, flavor, rows, w, pos, 2.0**30)
        assert_bitwise_equal(out, torch.ones(1, 3).to(torch.float8_e4m3fn), "fused")
        return
    out = reduce_fused(rows.bfloat16(), w, pos, target=target, flavor=flavor)
    assert_bitwise_equal(out.view(torch.int16), torch.full((1, 3), 0x3080, dtype=torch.int16), "fused, bf16 rows")
    a = 1 + 2.0**-12
    pos, w = slots([[0, 1]], [[1.0, a]])
    out = run(target, flavor, torch.tensor([[-(1 + 2.0**-11)] * 3, [a] * 3]), w, pos)
    assert_bitwise_equal(out, torch.full((1, 3), 2.0**-24), "fused, fp32 rows")


@pytest.mark.parametrize(("flavor", "target"), kernel_targets())
def test_slot_order(flavor: str, target: str) -> None:
    """Rows 2^25, 1 and -2^25: in slot order 2^25 + 1 rounds to 2^25 and the sum is 0; with the
    slots permuted so that the large rows cancel first, it is 1."""
    pos, _ = slots([[0, 1, 2], [0, 2, 1], [-1, 1, -1]])
    out = run(target, flavor, torch.tensor([[2.0**25], [1.0], [-(2.0**25)]]), None, pos)
    assert_bitwise_equal(out.float(), torch.tensor([[0.0], [1.0], [1.0]]), "slot order")


@pytest.mark.parametrize(("flavor", "target"), kernel_targets())
def test_e4m3_output_is_torchs_cast(flavor: str, target: str) -> None:
    """One slot: acc = fma(x, s, +0.0) (a -0.0 product gives +0.0), the output torch's
    ``(acc · sf).to(float8_e4m3fn)``: values past 448 and +-inf saturate, NaN stays NaN, ties round
    to even, subnormals, signed zeros. cpu: E4M3 rows, the scale as their x_sf; ascend-sim: bf16 rows, sf."""
    values = [0.0, -0.0, 1.0, -3.5, 448.0, 449.0, 464.0, 479.0, 480.0, 1e6, -1e30, float("inf"), float("-inf"),
              float("nan"), 2.0**-9, 1.5 * 2.0**-9, 2.0**-10, 0.5 * 2.0**-9 * 1.0001, 17.0, 19.0, 304.0, 1.0625]
    pos, _ = slots([[0]])
    for scale in (1.0, 0.5, -2.0, 3.0):
        if target == SIM:
            x = torch.tensor([values]).bfloat16()
            out = run(target, flavor, x.float(), None, pos, scale)
        else:
            x = torch.tensor([values]).to(torch.float8_e4m3fn)  # saturates 1e6 etc. on the way in
            out = reduce_fused((x, torch.tensor([scale])), None, pos, target=target, flavor=flavor)
        # fma(x, s, +0.0): the product, then +0.0 (a -0.0 product becomes +0.0); sf multiplies after.
        acc = x.float() + 0.0 if target == SIM else x.float() * scale + 0.0
        wanted = (acc * scale if target == SIM else acc).to(torch.float8_e4m3fn)
        nan = wanted.float().isnan()
        assert torch.equal(out.float().isnan(), nan), "NaN positions"
        assert_bitwise_equal(out.view(torch.uint8)[~nan], wanted.view(torch.uint8)[~nan], f"sf={scale}")


@pytest.mark.parametrize(("flavor", "target"), kernel_targets())
def test_tokens_without_used_slots(flavor: str, target: str) -> None:
    """+0.0 (then sf: 0 · (-2) = -0.0, 0 · inf = NaN); a used slot of weight 0 on a -0.0 row keeps +0.0."""
    rows = torch.tensor([[-0.0, 5.0]])
    pos, w = slots([[], [0]], [[], [0.0]])
    out = run(target, flavor, rows, w, pos)
    assert not bool(out.float().signbit().any()) and not bool(out.float().any()), "+0.0"
    if target == SIM:
        assert bool(run(target, flavor, rows, w, pos, -2.0).float().signbit().all()), "0 · -2 = -0.0"
        assert bool(run(target, flavor, rows, w, pos, float("inf")).float().isnan().all()), "0 · inf = NaN"


@pytest.mark.parametrize(("flavor", "target"), kernel_targets())
def test_empty_sizes(flavor: str, target: str) -> None:
    x = torch.randn(6, 5)
    pos, _ = slots([[0], []])
    dtype = torch.float8_e4m3fn if target == SIM else torch.float32
    # T = 0, H = 0: empty outputs.
    assert run(target, flavor, x, None, pos[:0]).shape == (0, 5)
    out = run(target, flavor, x[:, :0], None, pos)
    assert out.shape == (2, 0) and out.dtype == dtype
    # N = 0: every slot unused gives zeros; any position is out of range.
    assert_bitwise_equal(run(target, flavor, x[:0], None, pos[1:]), torch.zeros(1, 5).to(dtype), "N = 0")
    with pytest.raises(ValueError, match=r"token_topk_to_pos holds positions outside \[-1, 0\)"):
        run(target, flavor, x[:0], None, pos)
    # No element to compute (H = 0): the positions are still checked.
    with pytest.raises(ValueError, match=r"token_topk_to_pos holds positions outside \[-1, 6\)"):
        run(target, flavor, x[:, :0], None, pos + 6)


@pytest.mark.parametrize(("flavor", "target"), kernel_targets())
def test_bad_positions_raise_after_the_kernel(flavor: str, target: str) -> None:
    """Positions below -1 or at/after N: ValueError naming token_topk_to_pos; nothing read or written
    outside the tensors (the simulator's and the C backend's bounds checks), a given out untouched."""
    fmt, fp8 = ("bf16", "e4m3") if target == SIM else ("bf16", "")
    x = torch.randn(100, 70).to(DTYPES[fmt])
    for bad in (-2, 100, 2**31 - 1, -(2**31)):
        pos = placement(20, K4, 100, 7)
        pos[13, 1] = bad
        out = torch.full((20, 70), 7.0).to(torch.float8_e4m3fn if fp8 else DTYPES[fmt])
        before = out.clone()
        with pytest.raises(ValueError, match=r"token_topk_to_pos holds positions outside \[-1, 100\)"):
            reduce_fused((x, torch.ones(100)), None, pos, fp8, out=out, target=target, flavor=flavor)
        assert_bitwise_equal(out, before, "out untouched")
        with pytest.raises(ValueError, match="token_topk_to_pos holds positions"):
            reduce_fused((x, torch.ones(100)), None, pos, fp8, target=target, flavor=flavor)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_preallocated_out_and_plans(flavor: str) -> None:
    x, w, pos, fp8, sf = inputs_for("bf16", "", 33, 4, 64, 3, 0)
    wanted = reference_reduce(x, w, pos, fp8, sf)
    out = torch.empty(33, 64, dtype=torch.bfloat16)
    assert reduce_fused(x, w, pos, out=out, target="cpu", flavor=flavor) is out
    assert_bitwise_equal(out, wanted, "out")
    # A repeat call runs from its launch plan, and the plan checks the positions again.
    for _ in range(2):
        assert_bitwise_equal(reduce_fused(x, w, pos, target="cpu", flavor=flavor), wanted, "planned")
    plan = REDUCE_FUSED.plan_of(x[0], x[1], w, pos, target="cpu", flavor=flavor)
    assert not isinstance(plan, str), plan
    bad = pos.clone()
    bad[5, 2] = 10**6
    for _ in range(2):
        with pytest.raises(ValueError, match="token_topk_to_pos holds positions"):
            reduce_fused(x, w, bad, target="cpu", flavor=flavor)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_split_over_threads(flavor: str, vmi_env) -> None:
    vmi_env.setenv(THREADS_ENV, "3")
    T = 200
    assert len(row_ranges(T, 3, BLOCK_M, 32)) >= 2
    args = inputs_for("fp32", "", T, 4, 40, 11, 0)
    out = check(*args, "cpu", flavor, "split")
    vmi_env.setenv(THREADS_ENV, "1")
    assert_bitwise_equal(reduce_fused(*args, target="cpu", flavor=flavor), out, "one thread")


def test_entry_points_agree() -> None:
    x, w, pos, fp8, sf = inputs_for("bf16", "", 40, 4, 64, 5, 2)
    out = reduce_fused(x, w, pos, target="cpu")
    for what, other in {"cuda flavor": reduce_fused(x, w, pos, target="cpu", flavor="cuda"),
                        "parallel": reduce_fused_parallel(x, w, pos, target="cpu"),
                        "torch": reduce_fused(x, w, pos, target="torch")}.items():
        assert_bitwise_equal(other, out, what)
    # A row used by two slots is added twice.
    twice, _ = slots([[0, 0]])
    data = x[0] if isinstance(x, tuple) else x
    wanted = (data[:1].float() * 2 + 0.0).bfloat16()
    assert_bitwise_equal(reduce_fused(data, None, twice, target="cpu"), wanted, "twice")
    with pytest.raises(ValueError, match="always runs the kernel"):
        reduce_fused_parallel(x, w, pos, target="torch")


# --- bad arguments: refused before any kernel runs --------------------------------------------------

no_kernel = no_kernel_fixture("vmi_moe.kernels.reduce_fused", autouse=False)
X = torch.randn(12, 8, dtype=torch.bfloat16)
XS = torch.rand(12)
POS = torch.tensor([[0, 1], [2, -1], [-1, -1]], dtype=torch.int32)
W = torch.rand(3, 2)
META = torch.device("meta")


@pytest.mark.usefixtures("no_kernel")
@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: reduce_fused(X.float().numpy(), W, POS), TypeError, "x must be a torch.Tensor"),
    (lambda: reduce_fused(X.half(), W, POS), TypeError, "x must be"),
    (lambda: reduce_fused(X.double(), W, POS), TypeError, "x must be"),
    (lambda: reduce_fused(X.to(torch.float8_e4m3fn), W, POS), TypeError, "x must be"),
    (lambda: reduce_fused((X, XS, XS), W, POS), ValueError, "x must be a tensor or a"),
    (lambda: reduce_fused((X, None), W, POS), TypeError, "x_sf"),
    (lambda: reduce_fused((X, XS.double()), W, POS), TypeError, "x_sf must be torch.float32"),
    (lambda: reduce_fused((X, XS[:5]), W, POS), ValueError, "x_sf must have shape"),
    (lambda: reduce_fused((X, XS.to(META)), W, POS), ValueError, "x_sf must be on cpu"),
    (lambda: reduce_fused(X[0], W, POS), ValueError, "x must be 2-D"),
    (lambda: reduce_fused(X.t(), W, POS), ValueError, "x must be contiguous"),
    (lambda: reduce_fused(X, W, POS.long()), TypeError, "token_topk_to_pos must be torch.int32"),
    (lambda: reduce_fused(X, W, POS[0]), ValueError, "token_topk_to_pos must have shape"),
    (lambda: reduce_fused(X, W, POS.t()), ValueError, "token_topk_to_pos must be contiguous"),
    (lambda: reduce_fused(X, None, torch.zeros(3, 0, dtype=torch.int32)), ValueError, "1 to 32 columns"),
    (lambda: reduce_fused(X, None, torch.zeros(3, 33, dtype=torch.int32)), ValueError, "1 to 32 columns"),
    (lambda: reduce_fused(X, W, POS.to(META)), ValueError, "token_topk_to_pos must be on cpu"),
    (lambda: reduce_fused(X, W.double(), POS), TypeError, "topk_weights must be torch.float32"),
    (lambda: reduce_fused(X, W[:2], POS), ValueError, "topk_weights must have shape"),
    (lambda: reduce_fused(X, W.t().contiguous().t(), POS), ValueError, "topk_weights must be contiguous"),
    (lambda: reduce_fused(X, W, POS, "e5m2"), ValueError, "fp8_format must be one of"),
    (lambda: reduce_fused(X, W, POS, None), TypeError, "fp8_format must be a str"),
    (lambda: reduce_fused(X, W, POS, "", torch.ones(1)), ValueError, "sf is accepted only with fp8_format='e4m3'"),
    (lambda: reduce_fused(X, W, POS, "e4m3", torch.ones(2)), ValueError, "sf must have shape"),
    (lambda: reduce_fused(X, W, POS, "e4m3", torch.ones(1).double()), TypeError, "sf must be torch.float32"),
    (lambda: reduce_fused(X, W, POS, "e4m3", 1.0), TypeError, "sf must be a torch.Tensor"),
    (lambda: reduce_fused(X, W, POS, out=torch.empty(3, 8)), TypeError, "out must be torch.bfloat16"),
    (lambda: reduce_fused(X, W, POS, "e4m3", out=torch.empty(3, 8, dtype=torch.bfloat16)), TypeError,
     "out must be torch.float8_e4m3fn"),
    (lambda: reduce_fused(X, W, POS, out=torch.empty(3, 9, dtype=torch.bfloat16)), ValueError, "out must have shape"),
    (lambda: reduce_fused(X, W, POS, out=X[:3]), ValueError, "out shares memory with x"),
    (lambda: reduce_fused(X, W, POS, target="cuda"), ValueError, "target 'cuda'"),
    (lambda: reduce_fused(X, W, POS, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: reduce_fused_parallel(X, W, POS, target="torch"), ValueError, "always runs the kernel"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_meta_tensors_give_the_output_layout():
    out = reduce_fused((X.to(META).to(torch.float8_e4m3fn), XS.to(META)), None, POS.to(META), "",
                       target="torch")
    assert out.device == META and out.shape == (3, 8) and out.dtype == torch.float8_e4m3fn


# --- lowering -------------------------------------------------------------------------------------

# By default the ascend-sim kernel above (its lowering is cached) and one nvcc compile.
LOWERING = [pytest.param(ReduceFusedSpec(4, fmt, out), id=f"{fmt}-{out}",
                         marks=[] if (fmt, out) == ("bf16", "e4m3") else [pytest.mark.slow])
            for fmt, out in [("bf16", "e4m3"), ("fp32", "fp32"), ("e4m3", "e4m3"), ("bf16", "bf16")]]


@pytest.mark.parametrize("spec", LOWERING)
def test_ascend_lowering(spec: ReduceFusedSpec) -> None:
    src = build_reduce_fused.source(spec, "ascend")
    assert "__global__ __vector__ void reduce_fused_kernel" in src
    # The slot scales (x_sf gathered at the positions) and the row gathers: SIMT regions, no SIMD.
    assert_vector_regions(src, simd=0, simt=2)
    assert barriers_in_thread_guards(src) == 0
    gm_to_ub, ub_to_gm = dma_counts(src)
    assert (gm_to_ub, ub_to_gm) == (2, 1), "positions and weights in, the output tile out"
    assert "block_idx" in src
    assert "fmaf(" in src, "the accumulation is a fused multiply-add"
    # The output tile is BLOCK_H columns of BLOCK_M tokens, two versions.
    assert f"min({BLOCK_H}, max((H - h0), 0))" in src


@pytest.mark.cuda_compile
@pytest.mark.slow
def test_cuda_lowering_compiles() -> None:
    src = build_reduce_fused.source(ReduceFusedSpec(8, "bf16", "bf16"), "cuda")
    assert "__global__ void" in src and "reduce_fused_kernel" in src
    assert barriers_in_thread_guards(src) == 0
    assert "fmaf(" in src
    check_cuda_source(src)


# --- sweeps ---------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("K", [1, 2, 3, 6, 8, 9, 16, 32])
@pytest.mark.parametrize("flavor", FLAVORS)
def test_matches_reference_full(flavor: str, K: int) -> None:
    for seed, (T, H) in enumerate([(1, 7168), (300, 1000), (4001, 96)]):
        for fmt, fp8 in ALL_FORMATS:
            check(*inputs_for(fmt, fp8, T, K, H, 200 + seed, seed), "cpu", flavor, f"K={K} T={T} H={H} {fmt}")
