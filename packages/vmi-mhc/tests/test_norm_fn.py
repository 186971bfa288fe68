"""norm_fn stages A, A', C, D on the cpu and ascend-sim targets.

* Kernels against the torch reference (``vmi_mhc.reference.norm_fn``), bit for bit: the kernels
  and the reference compute the same fixed chain of fp32 operations (spec §3.4.2 with the
  documented summation orders), in both flavors.
* Kernels against float64 evaluations of the exact formulas, within bounds derived from the
  number of roundings (stated at each test): a check that does not go through the reference.
* The reference's float64 backward formulas against torch autograd of the float64 forward.

Kernel specialisations: the merge kernels are specialised on the row count only (``K`` is a
runtime value), the reduce kernels on ``(n3, K, eps, flavor)`` (tokens and splits are runtime
values). The default set compiles one merge pair and one reduce pair per flavor on cpu and the
reduce pair on ascend-sim; other specialisations, large sizes and the merge on ascend-sim run
under ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import REUSE_SCHEDULES, assert_bitwise_equal, generator, randn, sim_schedule
from vmi_devkit.errors import forbid_kernels
from vmi_mhc.ops.norm_fn import (
    mhc_fn_normw_merge_bwd,
    mhc_fn_normw_merge_bwd_parallel,
    mhc_fn_normw_merge_fwd,
    mhc_reduce_partials_and_rmsnorm_bwd,
    mhc_reduce_partials_and_rmsnorm_fwd,
    mhc_reduce_partials_and_rmsnorm_fwd_parallel,
)
from vmi_mhc.reference import norm_fn as reference

N3 = 24
EPS = 1e-6
# K = n·H with n = 4; the default group size is that of H = 1280.
K_DEFAULT = 4 * 1280
HIDDEN_SIZES = (1280, 2560, 4096, 5120, 7168)
FLAVORS = ("ascend", "cuda")
# Tokens: none, one, a partial token block, several blocks with a partial last one.
TOKENS = (0, 1, 37, 130)
SPLITS = (1, 16)
U = 2.0**-24  # the fp32 unit roundoff


# --- inputs ---

def merge_inputs(rows: int, cols: int, seed: int) -> dict:
    """As TileKernels' tests draw them: fn ~ 1e-4 · N(0, 1), normw ~ 1 + 0.1 · N(0, 1)."""
    return {"fn": randn((rows, cols), seed) * 1e-4, "normw": randn((cols,), seed + 1) * 0.1 + 1,
            "out_fn_grad": randn((rows, cols), seed + 2), "fn_grad": randn((rows, cols), seed + 3),
            "normw_grad": randn((cols,), seed + 4)}


def reduce_inputs(splits: int, tokens: int, mix: int, group_size: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Split-K partials as the prenorm GEMM makes them from unit-variance data: products
    ``~ N(0, K / S)`` scaled as ``fn ~ 1e-2``, square sums ``~ K / S`` each."""
    g = generator(seed)
    partials = torch.randn(splits, tokens, 1, mix, generator=g) * (group_size / splits) ** 0.5 * 1e-2
    sqrsums = (0.5 + torch.rand(splits, tokens, 1, generator=g)) * (group_size / splits)
    return partials, sqrsums


def run_reduce_fwd(partials, sqrsums, group_size, eps=EPS, *, target="cpu", flavor=None):
    splits, tokens, _, mix = partials.shape
    out_mul, sqrsum = torch.full((tokens, 1, mix), 7.0), torch.full((tokens, 1), 7.0)
    out = torch.full((tokens, mix), 7.0)
    results = mhc_reduce_partials_and_rmsnorm_fwd(partials, sqrsums, out_mul, sqrsum, out, group_size, eps, splits,
                                                  target=target, flavor=flavor)
    assert results[0] is out_mul and results[1] is sqrsum and results[2] is out
    return results


def run_reduce_bwd(out_grad, out_mul, sqrsum, group_size, eps=EPS, *, target="cpu", flavor=None):
    tokens, mix = out_grad.shape
    out_mul_grad, sqrsum_grad = torch.full((tokens, 1, mix), 7.0), torch.full((tokens, 1), 7.0)
    results = mhc_reduce_partials_and_rmsnorm_bwd(out_grad, out_mul, sqrsum, out_mul_grad, sqrsum_grad, group_size,
                                                  eps, target=target, flavor=flavor)
    assert results[0] is out_mul_grad and results[1] is sqrsum_grad
    return results


# --- merge (stages A, A') ---

def check_merge(rows: int, cols: int, seed: int, *, target="cpu") -> None:
    inputs = merge_inputs(rows, cols, seed)
    fn, normw = inputs["fn"], inputs["normw"]
    out_fn = torch.full((rows, cols), 7.0)
    with sim_schedule("consumers_first"):
        assert mhc_fn_normw_merge_fwd(fn, normw, out_fn, target=target) is out_fn
    assert_bitwise_equal(out_fn, reference.fn_normw_merge_fwd(fn, normw), f"out_fn [K={cols} {target}]")
    fn_grad, normw_grad = inputs["fn_grad"].clone(), inputs["normw_grad"].clone()
    with sim_schedule("producers_first"):
        results = mhc_fn_normw_merge_bwd(fn, normw, inputs["out_fn_grad"], fn_grad, normw_grad, target=target)
    assert results[0] is fn_grad and results[1] is normw_grad
    want = reference.fn_normw_merge_bwd(**inputs)
    assert_bitwise_equal(fn_grad, want[0], f"fn_grad [K={cols} {target}]")
    assert_bitwise_equal(normw_grad, want[1], f"normw_grad [K={cols} {target}]")


def test_merge_matches_reference():
    # K: one column, a partial block, several blocks with a partial last one (MERGE_*_BLOCK 256/128).
    for seed, cols in enumerate((1, 200, 1000)):
        check_merge(N3, cols, seed)


@pytest.mark.slow
@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
def test_merge_matches_reference_hidden_sizes(hidden):
    check_merge(N3, 4 * hidden, hidden)


@pytest.mark.slow
@pytest.mark.parametrize("rows", (1, 4, 32))
def test_merge_other_row_counts(rows):
    check_merge(rows, 700, rows)


@pytest.mark.slow
def test_merge_matches_reference_on_ascend_sim():
    check_merge(N3, 1000, 3, target="ascend-sim")


def test_merge_accumulates():
    # Two backward calls add two contributions onto the buffers, each as the reference adds one.
    inputs = merge_inputs(N3, 300, 7)
    fn_grad, normw_grad = inputs["fn_grad"].clone(), inputs["normw_grad"].clone()
    for _ in range(2):
        mhc_fn_normw_merge_bwd(inputs["fn"], inputs["normw"], inputs["out_fn_grad"], fn_grad, normw_grad)
    once = reference.fn_normw_merge_bwd(**inputs)
    twice = reference.fn_normw_merge_bwd(inputs["fn"], inputs["normw"], inputs["out_fn_grad"], *once)
    assert_bitwise_equal(fn_grad, twice[0], "fn_grad")
    assert_bitwise_equal(normw_grad, twice[1], "normw_grad")


def test_merge_against_float64():
    # out_fn is one rounding of the exact product: it equals the float64 product rounded to fp32.
    # fn_grad is one rounding of g·normw + fn_grad (a fused multiply-add): within half an ulp of
    # the exact value. normw_grad is m fused multiply-adds: each rounding moves it by at most
    # U·|partial sum| <= U·(|normw_grad| + Σ_j |g·fn|), so the error is below m times that.
    inputs = merge_inputs(N3, 1000, 11)
    fn, normw = inputs["fn"], inputs["normw"]
    out_fn = mhc_fn_normw_merge_fwd(fn, normw, torch.empty_like(fn))
    assert_bitwise_equal(out_fn, (fn.double() * normw.double()).float(), "out_fn vs the rounded exact product")
    fn_grad, normw_grad = inputs["fn_grad"].clone(), inputs["normw_grad"].clone()
    mhc_fn_normw_merge_bwd(fn, normw, inputs["out_fn_grad"], fn_grad, normw_grad)
    exact_fn_grad, exact_normw_grad = reference.fn_normw_merge_bwd_float64(**inputs)
    half_ulp = (torch.nextafter(fn_grad.abs(), torch.tensor(float("inf"))) - fn_grad.abs()).double() / 2
    assert ((fn_grad.double() - exact_fn_grad).abs() <= half_ulp).all()
    scale = inputs["normw_grad"].double().abs() + (inputs["out_fn_grad"].double() * fn.double()).abs().sum(0)
    assert ((normw_grad.double() - exact_normw_grad).abs() <= N3 * U * scale).all()


# --- reduce (stages C, D) ---

def check_reduce(flavor: str, group_size: int, tokens=TOKENS, splits=SPLITS, mix=N3, *, target="cpu") -> None:
    kernel_flavor = None if target == "ascend-sim" else flavor
    for seed, (num_tokens, num_splits) in enumerate((t, s) for t in tokens for s in splits):
        partials, sqrsums = reduce_inputs(num_splits, num_tokens, mix, group_size, seed)
        label = f"T={num_tokens} S={num_splits} K={group_size} {flavor} {target}"
        with sim_schedule(REUSE_SCHEDULES[seed % 2]):
            results = run_reduce_fwd(partials, sqrsums, group_size, target=target, flavor=kernel_flavor)
        want = reference.reduce_partials_and_rmsnorm_fwd(partials, sqrsums, group_size, EPS, flavor)
        for name, got, wanted in zip(("out_mul", "sqrsum", "out"), results, want, strict=True):
            assert_bitwise_equal(got, wanted, f"{name} [{label}]")
        out_grad = randn((num_tokens, mix), seed + 100)
        with sim_schedule(("producers_first", "consumers_first")[seed % 2]):
            grads = run_reduce_bwd(out_grad, want[0], want[1], group_size, target=target, flavor=kernel_flavor)
        want_grads = reference.reduce_partials_and_rmsnorm_bwd(out_grad, want[0], want[1], group_size, EPS, flavor)
        assert_bitwise_equal(grads[0], want_grads[0], f"out_mul_grad [{label}]")
        assert_bitwise_equal(grads[1], want_grads[1], f"sqrsum_grad [{label}]")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_reduce_matches_reference(flavor):
    check_reduce(flavor, K_DEFAULT)


def test_reduce_matches_reference_on_ascend_sim():
    # 8193 tokens: 129 token blocks, 3 on core 0 (more than its 2 buffer versions); each of its two
    # launches per kernel runs under consumers_first and under producers_first.
    check_reduce("ascend", K_DEFAULT, tokens=(1, 8193), splits=(1, 3), target="ascend-sim")


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("hidden", HIDDEN_SIZES[1:])
def test_reduce_matches_reference_hidden_sizes(flavor, hidden):
    check_reduce(flavor, 4 * hidden, tokens=(1, 130, 4096 + 37), splits=(1, 16, 64))


@pytest.mark.slow
@pytest.mark.parametrize("mix", (1, 8, 32))
def test_reduce_other_mix_widths(mix):
    # The kernels do not depend on n = 4: any n3 up to 32 entries (e.g. the LM head's n = 4).
    check_reduce("ascend", K_DEFAULT, tokens=(1, 130), mix=mix)


@pytest.mark.slow
def test_reduce_many_tokens_on_ascend_sim():
    check_reduce("ascend", 4 * 7168, tokens=(4096 + 37,), splits=(1,), target="ascend-sim")


def test_every_thread_count_gives_the_same_bits(vmi_env):
    # Token blocks (reduce) and column blocks (merge) split across threads: same bits.
    partials, sqrsums = reduce_inputs(2, 1000, N3, K_DEFAULT, 5)
    inputs = merge_inputs(N3, 5000, 5)
    results = []
    for threads in ("1", "3"):
        vmi_env.setenv("VMI_CPU_THREADS", threads)
        fwd = run_reduce_fwd(partials, sqrsums, K_DEFAULT)
        bwd = run_reduce_bwd(partials[0, :, 0], fwd[0], fwd[1], K_DEFAULT)
        grads = mhc_fn_normw_merge_bwd(inputs["fn"], inputs["normw"], inputs["out_fn_grad"],
                                       inputs["fn_grad"].clone(), inputs["normw_grad"].clone())
        results.append((*fwd, *bwd, *grads))
    for got, wanted in zip(*results, strict=True):
        assert_bitwise_equal(got, wanted)


def test_no_tokens_launch_nothing(monkeypatch):
    forbid_kernels(monkeypatch, why="T == 0")
    for target in ("cpu", "torch"):
        out_mul, sqrsum, out = mhc_reduce_partials_and_rmsnorm_fwd(
            torch.empty(16, 0, 1, N3), torch.empty(16, 0, 1), torch.empty(0, 1, N3), torch.empty(0, 1),
            torch.empty(0, N3), K_DEFAULT, EPS, 16, target=target)
        assert out_mul.shape == (0, 1, N3) and sqrsum.shape == (0, 1) and out.shape == (0, N3)
        grads = mhc_reduce_partials_and_rmsnorm_bwd(torch.empty(0, N3), out_mul, sqrsum, None, None, K_DEFAULT, EPS,
                                                    target=target)
        assert grads[0].shape == (0, 1, N3) and grads[1].shape == (0, 1)
        # K = 0 columns: the merge has nothing to do either.
        empty = torch.empty(N3, 0)
        assert mhc_fn_normw_merge_fwd(empty, torch.empty(0), None, target=target).shape == (N3, 0)
        mhc_fn_normw_merge_bwd(empty, torch.empty(0), empty, torch.empty(N3, 0), torch.empty(0), target=target)


def test_parallel_entry_points_run_the_kernel():
    partials, sqrsums = reduce_inputs(1, 5, N3, K_DEFAULT, 2)
    results = mhc_reduce_partials_and_rmsnorm_fwd_parallel(partials, sqrsums, None, None, None, K_DEFAULT, EPS, 1,
                                                           target="cpu")
    want = reference.reduce_partials_and_rmsnorm_fwd(partials, sqrsums, K_DEFAULT, EPS, "ascend")
    assert_bitwise_equal(results[2], want[2], "out")
    inputs = merge_inputs(N3, 64, 2)
    with pytest.raises(ValueError, match="torch"):
        mhc_fn_normw_merge_bwd_parallel(**inputs, target="torch")


def test_non_finite_values_propagate():
    # A NaN partial product (token 2) and an infinite partial square sum (token 5): as IEEE
    # arithmetic gives them, in the kernel as in the reference (NaN payloads aside).
    partials, sqrsums = reduce_inputs(2, 40, N3, K_DEFAULT, 9)
    partials[1, 2, 0, 3] = float("nan")
    sqrsums[0, 5, 0] = float("inf")
    for flavor in FLAVORS:
        results = run_reduce_fwd(partials, sqrsums, K_DEFAULT, flavor=flavor)
        want = reference.reduce_partials_and_rmsnorm_fwd(partials, sqrsums, K_DEFAULT, EPS, flavor)
        for got, wanted in zip(results, want, strict=True):
            assert_bitwise_equal(got, wanted, any_nan=True)
        out = results[2]
        assert out[2, 3].isnan() and out[2].isfinite().sum() == N3 - 1
        assert (out[5] == 0).all()  # r = 1 / sqrt(inf) = 0
        assert out[[0, 1, 3, 4, 6]].isfinite().all()
    # The backward of a NaN entry of g makes its token's sqrsum_grad NaN, and only that.
    out_mul, sqrsum, _ = reference.reduce_partials_and_rmsnorm_fwd(*reduce_inputs(1, 40, N3, K_DEFAULT, 10),
                                                                   K_DEFAULT, EPS, "ascend")
    out_grad = randn((40, N3), 10)
    out_grad[4, 6] = float("nan")
    grads = run_reduce_bwd(out_grad, out_mul, sqrsum, K_DEFAULT)
    want = reference.reduce_partials_and_rmsnorm_bwd(out_grad, out_mul, sqrsum, K_DEFAULT, EPS, "ascend")
    assert_bitwise_equal(grads[0], want[0], any_nan=True)
    assert_bitwise_equal(grads[1], want[1], any_nan=True)
    assert grads[1][4].isnan().all() and grads[1].isnan().sum() == 1


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
def test_zero_eps_and_zero_square_sum(flavor):
    # eps = 0 and a zero square sum: r = 1 / sqrt(0) = inf, out = 0 · inf = NaN where out_mul is 0,
    # ±inf elsewhere; the backward's r is inf as well.
    partials, sqrsums = reduce_inputs(2, 10, N3, K_DEFAULT, 14)
    sqrsums[:, 7] = 0.0
    partials[:, 7, 0, :2] = 0.0
    results = run_reduce_fwd(partials, sqrsums, K_DEFAULT, 0.0, flavor=flavor)
    want = reference.reduce_partials_and_rmsnorm_fwd(partials, sqrsums, K_DEFAULT, 0.0, flavor)
    for got, wanted in zip(results, want, strict=True):
        assert_bitwise_equal(got, wanted, any_nan=True)
    assert results[2][7, :2].isnan().all() and results[2][7, 2:].isinf().all()
    out_grad = randn((10, N3), 14)
    grads = run_reduce_bwd(out_grad, results[0], results[1], K_DEFAULT, 0.0, flavor=flavor)
    want = reference.reduce_partials_and_rmsnorm_bwd(out_grad, results[0], results[1], K_DEFAULT, 0.0, flavor)
    assert_bitwise_equal(grads[0], want[0], any_nan=True)
    assert_bitwise_equal(grads[1], want[1], any_nan=True)
    assert grads[0][7].isinf().all()


@pytest.mark.parametrize("flavor", FLAVORS)
def test_ascend_division_flushes_subnormals(flavor):
    # Tiny gradients make (dot · r) / (sq + eps·K) and its half subnormal: the ascend flavor
    # flushes them to signed zero (as the Ascend vector division does), the cuda flavor keeps
    # them; the kernel follows its flavor.
    partials, sqrsums = reduce_inputs(1, 64, N3, K_DEFAULT, 12)
    out_mul, sqrsum, _ = reference.reduce_partials_and_rmsnorm_fwd(partials, sqrsums, K_DEFAULT, EPS, flavor)
    out_grad = randn((64, N3), 12) * 2.0**-120
    grads = run_reduce_bwd(out_grad, out_mul, sqrsum, K_DEFAULT, flavor=flavor)
    want = reference.reduce_partials_and_rmsnorm_bwd(out_grad, out_mul, sqrsum, K_DEFAULT, EPS, flavor)
    assert_bitwise_equal(grads[1], want[1], "sqrsum_grad")
    nonzero = grads[1] != 0
    if flavor == "ascend":
        assert not nonzero.any()
    else:
        assert nonzero.all() and (grads[1].abs() < torch.finfo(torch.float32).tiny).all()


@pytest.mark.parametrize("flavor", FLAVORS)
def test_reduce_against_float64(flavor):
    # Bounds from the roundings (U = 2^-24 each, first order):
    # * out_mul, sqrsum: S - 1 additions, each moving the sum by at most U · Σ_s |P_s|;
    # * r: sqrsum's relative error, plus 1/K's, the product's and eps's roundings (ascend: 3;
    #   cuda: the quotient and the sum, 2), halved by the square root, plus its own and the
    #   division's rounding: rel(r) <= ((S - 1) + 3) / 2 · U + 2 U;
    # * out = out_mul · r: |out_mul|·(rel(r) + U) plus r times out_mul's error.
    # * out_mul_grad = g · r (exact inputs): rel(r) + U with rel(r) <= 3.5 U.
    # * sqrsum_grad = (dot · r / (sq + eps·K)) / (−2): dot's n3 fused multiply-adds
    #   (<= n3 · U · Σ|g · out_mul|), then rel(r) + 4 U (product, sum, eps·K, quotient).
    splits, group_size = 16, K_DEFAULT
    partials, sqrsums = reduce_inputs(splits, 500, N3, group_size, 13)
    out_mul, sqrsum, out = run_reduce_fwd(partials, sqrsums, group_size, flavor=flavor)
    exact = reference.reduce_partials_and_rmsnorm_fwd_float64(partials, sqrsums, group_size, EPS)
    abs_partials = partials.double().abs().sum(0)
    assert ((out_mul.double() - exact[0]).abs() <= (splits - 1) * U * abs_partials).all()
    assert ((sqrsum.double() - exact[1]).abs() <= (splits - 1) * U * sqrsums.double().sum(0)).all()
    r = (1.0 / torch.sqrt(exact[1] / group_size + EPS)).unsqueeze(-1)
    rel_r = ((splits + 2) / 2 + 2) * U * 1.01
    bound = (exact[0].abs() * (rel_r + U) + r * (splits - 1) * U * abs_partials)[:, 0]
    assert ((out.double() - exact[2]).abs() <= bound).all()

    out_grad = randn((500, N3), 13)
    grads = run_reduce_bwd(out_grad, out_mul, sqrsum, group_size, flavor=flavor)
    exact_grads = reference.reduce_partials_and_rmsnorm_bwd_float64(out_grad, out_mul, sqrsum, group_size, EPS)
    g_abs = out_grad.double().abs().unsqueeze(1)
    assert ((grads[0].double() - exact_grads[0]).abs() <= g_abs * r * 4.5 * U * 1.01).all()
    terms = (out_grad.double().unsqueeze(1) * out_mul.double()).abs().sum(-1)
    dot = (out_grad.double().unsqueeze(1) * out_mul.double()).sum(-1)
    r_over_den = r[:, :, 0] / (sqrsum.double() + EPS * group_size)
    bound = 0.5 * r_over_den * (N3 * U * terms + dot.abs() * 7.5 * U) * 1.01
    assert ((grads[1].double() - exact_grads[1]).abs() <= bound).all()


# --- the reference ---

def test_reference_worked_example():
    # Spec §3.4.2: n = 2, H = 2 (K = 4), x = [1, 2, 3, 4], fn_eff row [0.5, 0.25, 0, 0], eps 1e-6:
    # sqrsum 30, out_mul 1, mixes 0.36514837; with g = 1, d_sqrsum = -0.0060858.
    partials, sqrsums = torch.tensor([[[[1.0]]]]), torch.tensor([[[30.0]]])
    for flavor in FLAVORS:
        out_mul, sqrsum, out = reference.reduce_partials_and_rmsnorm_fwd(partials, sqrsums, 4, EPS, flavor)
        assert out.item() == pytest.approx(0.36514837, rel=1e-7)
        d_out_mul, d_sqrsum = reference.reduce_partials_and_rmsnorm_bwd(torch.ones(1, 1), out_mul, sqrsum, 4, EPS,
                                                                        flavor)
        assert d_out_mul.item() == pytest.approx(0.36514837, rel=1e-7)
        assert d_sqrsum.item() == pytest.approx(-0.0060858, rel=1e-4)


@pytest.mark.slow
def test_kernel_worked_example():
    partials, sqrsums = torch.tensor([[[[1.0]]]]), torch.tensor([[[30.0]]])
    out_mul, sqrsum, out = run_reduce_fwd(partials, sqrsums, 4)
    assert out.item() == pytest.approx(0.36514837, rel=1e-7)
    d_out_mul, d_sqrsum = run_reduce_bwd(torch.ones(1, 1), out_mul, sqrsum, 4)
    assert d_sqrsum.item() == pytest.approx(-0.0060858, rel=1e-4)


def test_reference_float64_backward_is_the_derivative():
    # The float64 formulas of stage D are the gradient of stage C's float64 forward (gradcheck of
    # the forward, then autograd's gradient against the formulas), and the merge's likewise.
    g = generator(3)
    out_mul = torch.randn(6, 1, 5, generator=g, dtype=torch.float64, requires_grad=True)
    sqrsum = (torch.rand(6, 1, generator=g, dtype=torch.float64) + 0.5).requires_grad_()
    group_size = 7
    torch.autograd.gradcheck(lambda a, b: reference.rmsnorm_float64(a, b, group_size, 0.01), (out_mul, sqrsum))
    out_grad = torch.randn(6, 5, generator=g, dtype=torch.float64)
    reference.rmsnorm_float64(out_mul, sqrsum, group_size, 0.01).backward(out_grad)
    want = reference.reduce_partials_and_rmsnorm_bwd_float64(out_grad, out_mul.detach(), sqrsum.detach(),
                                                             group_size, 0.01)
    torch.testing.assert_close(want[0], out_mul.grad, rtol=1e-12, atol=0)
    torch.testing.assert_close(want[1], sqrsum.grad, rtol=1e-12, atol=0)

    fn = torch.randn(3, 8, generator=g, dtype=torch.float64, requires_grad=True)
    normw = torch.randn(8, generator=g, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda a, b: a * b, (fn, normw))
    out_fn_grad = torch.randn(3, 8, generator=g, dtype=torch.float64)
    (fn * normw).backward(out_fn_grad)
    zeros = torch.zeros(3, 8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64)
    want = reference.fn_normw_merge_bwd_float64(fn.detach(), normw.detach(), out_fn_grad, *zeros)
    torch.testing.assert_close(want[0], fn.grad, rtol=1e-12, atol=0)
    torch.testing.assert_close(want[1], normw.grad, rtol=1e-12, atol=0)


def test_the_stages_compose_as_they_come():
    """The prenorm GEMM's partials ``(S, T, n3)``, ``(S, T)`` feed the reduction, and the reduction
    backward's ``(T, 1, n3)``, ``(T, 1)`` feed the GEMM backward, with the bits of spelling out the
    group axis (or dropping it) by hand."""
    from vmi_mhc.ops.pre_norm_fn_gemm import mhc_pre_norm_fn_gemm_bwd, mhc_pre_norm_fn_gemm_fwd

    tokens, mix, hidden, splits = 5, 24, 256, 2
    x = randn((tokens, hidden), 90, torch.bfloat16)
    fn = randn((mix, hidden), 91) * hidden ** -0.5
    out_mul_splitted, sqrsum_splitted = mhc_pre_norm_fn_gemm_fwd(x, fn, n_splits=splits, target="torch")
    assert out_mul_splitted.shape == (splits, tokens, mix) and sqrsum_splitted.shape == (splits, tokens)
    direct = mhc_reduce_partials_and_rmsnorm_fwd(out_mul_splitted, sqrsum_splitted, None, None, None, hidden, 1e-6,
                                                 splits, target="torch")
    by_hand = mhc_reduce_partials_and_rmsnorm_fwd(out_mul_splitted.view(splits, tokens, 1, mix),
                                                  sqrsum_splitted.view(splits, tokens, 1), None, None, None, hidden,
                                                  1e-6, splits, target="torch")
    for got, want, name in zip(direct, by_hand, ("out_mul", "sqrsum", "out"), strict=True):
        assert_bitwise_equal(got, want, name)
    out_mul, sqrsum, _ = direct
    out_mul_grad, sqrsum_grad = mhc_reduce_partials_and_rmsnorm_bwd(randn((tokens, mix), 92), out_mul, sqrsum, None,
                                                                    None, hidden, 1e-6, target="torch")
    assert out_mul_grad.shape == (tokens, 1, mix) and sqrsum_grad.shape == (tokens, 1)
    x_grads = [torch.zeros(tokens, hidden, dtype=torch.bfloat16) for _ in range(2)]
    _, fn_grad = mhc_pre_norm_fn_gemm_bwd(out_mul_grad, sqrsum_grad, x, fn, x_grads[0], target="torch")
    _, want_fn_grad = mhc_pre_norm_fn_gemm_bwd(out_mul_grad.view(tokens, mix), sqrsum_grad.view(tokens), x, fn,
                                               x_grads[1], target="torch")
    assert_bitwise_equal(fn_grad, want_fn_grad, "fn_grad")
    assert_bitwise_equal(x_grads[0], x_grads[1], "x_grad")
