"""head_compute_mix forward and backward on the cpu and ascend-sim targets, bit for bit against the
torch reference ``reference.head_compute_mix`` (spec §3.2), the kernels within bounds derived from
their fp32 arithmetic of the float64 formula, and the float64 backward against torch autograd.

The token count and the partial row count ``P`` are runtime values: one forward and one backward
kernel per stream count and flavor. The default set runs each flavor on the cpu with ``n = 4``
(0 tokens, 1 token, 1001 tokens: 15 full tiles and a 41-token tail, with ``P`` giving one tile per
row, several tiles per row, and rows without tokens) and the ascend flavor once on ascend-sim;
the other tests run on the reference by default and on the cpu kernels under ``slow``, as do large
token counts, other ``P`` and the stream counts 1 and 16.

Inputs: normal mixes plus, in every 97th token, streams whose logits lie near -88 (a subnormal
``σ = 1 / (e^88 + 1)``, flushed on the ascend flavor only) and near ±30 (a saturated ``σ``). Given
outputs start as NaN, so a row or element the kernel leaves unwritten fails the comparison.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import REUSE_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.errors import forbid_kernels
from vmi_mhc import (
    mhc_head_compute_mix_bwd,
    mhc_head_compute_mix_bwd_parallel,
    mhc_head_compute_mix_fwd,
    mhc_head_compute_mix_fwd_parallel,
)
from vmi_mhc.reference import head_compute_mix as reference
from vmi_mhc.reference import pre_split_mixes as split_reference

N = 4
PRE_EPS = 1e-2
# (tokens, partial rows): T = 0; one token; 16 tiles over 64 rows (one tile per row, 48 rows
# without tokens); 16 tiles over 5 rows (4 tiles per row, the last row without tokens).
CASES = ((0, 5), (1, 3), (1001, 64), (1001, 5))
FLAVORS = ("ascend", "cuda")
U = 2.0 ** -24  # unit roundoff of fp32
MIN_NORMAL = 2.0 ** -126
NAN = float("nan")
# The default set compiles one cpu kernel pair per flavor (test_matches_reference) and one for
# ascend-sim: the other tests run on the reference by default (the kernels equal it bit for bit)
# and on the cpu kernels under slow.
TARGETS = ["torch", pytest.param(None, marks=pytest.mark.slow)]


def make_inputs(num_tokens: int, seed: int, n: int = N) -> dict:
    g = generator(seed)
    scale = torch.randn(1, generator=g) + 1.5
    base = torch.randn(n, generator=g)
    x = 2 * torch.randn(num_tokens, n, generator=g)
    # Every 97th token: logits near -88, +30 and -30 in the first streams.
    for stream, logit in zip(range(n), (-88.0, 30.0, -30.0), strict=False):
        x[::97, stream] = (logit - base[stream]) / scale[0]
    return {"input_mix": x, "mhc_scale": scale, "mhc_base": base,
            "output_mix_grad": torch.randn(num_tokens, n, generator=g)}


def forward(inputs, target, flavor, out=None, **kwargs):
    return mhc_head_compute_mix_fwd(inputs["input_mix"], inputs["mhc_scale"], inputs["mhc_base"], out, PRE_EPS,
                                    target=target, flavor=flavor, **kwargs)


def backward(inputs, num_rows, target, flavor, outs=(None, None, None), **kwargs):
    return mhc_head_compute_mix_bwd(inputs["output_mix_grad"], inputs["input_mix"], inputs["mhc_scale"],
                                    inputs["mhc_base"], *outs, num_rows, target=target, flavor=flavor, **kwargs)


def reference_backward(inputs, num_rows, flavor):
    return reference.head_compute_mix_bwd(inputs["output_mix_grad"], inputs["input_mix"], inputs["mhc_scale"],
                                          inputs["mhc_base"], num_rows, flavor)


def nan_outputs(num_tokens: int, num_rows: int, n: int = N):
    return (torch.full((num_tokens, n), NAN), torch.full((num_rows, 1), NAN), torch.full((num_rows, n), NAN))


BWD_NAMES = ("input_mix_grad", "mhc_scale_grad_partial", "mhc_base_grad_partial")


def check_cases(flavor, cases, target=None, n=N, schedules=(None,)) -> None:
    """``schedules``: the ascend-sim pipe schedules each case runs under (one reference for all;
    None: the current one)."""
    for seed, (num_tokens, num_rows) in enumerate(cases):
        inputs = make_inputs(num_tokens, seed, n)
        kernel_flavor = None if target == "ascend-sim" else flavor
        want = reference.head_compute_mix_fwd(inputs["input_mix"], inputs["mhc_scale"], inputs["mhc_base"], PRE_EPS,
                                              flavor)
        want_bwd = reference_backward(inputs, num_rows, flavor)
        for schedule in schedules:
            label = f"T={num_tokens} P={num_rows} n={n} flavor={flavor} target={target} schedule={schedule}"
            with sim_schedule(schedule):
                got = forward(inputs, target, kernel_flavor, torch.full((num_tokens, n), NAN))
                got_bwd = backward(inputs, num_rows, target, kernel_flavor, nan_outputs(num_tokens, num_rows, n))
            assert_bitwise_equal(got, want, f"output_mix [{label}]")
            for name, a, b in zip(BWD_NAMES, got_bwd, want_bwd, strict=True):
                assert_bitwise_equal(a, b, f"{name} [{label}]")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_matches_reference(flavor):
    check_cases(flavor, CASES)


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
def test_matches_reference_many_tokens(flavor):
    check_cases(flavor, ((63, 1), (64, 2), (65, 64), (4096, 264), (8191, 64), (8191, 7), (70000, 264),
                         (70000, 1)))


@pytest.mark.slow
@pytest.mark.parametrize("n", (1, 16))
def test_matches_reference_other_stream_counts(n):
    # TileKernels' Ascend kernel takes 4 streams only; vmi's kernels take any n up to 16.
    for flavor in FLAVORS:
        check_cases(flavor, ((1, 2), (1001, 5)), n=n)
    check_cases("ascend", ((1001, 70),), target="ascend-sim", n=n)


def test_matches_reference_on_ascend_sim():
    # 1 token; a 41-token tail with rows of 4 tiles (on-chip buffers and accumulators reused across
    # a row's tiles); then 8193 tokens under consumers_first and under producers_first, where a
    # missing wait between pipes shows up as wrong data: 129 forward tiles (3 on core 0, more than
    # its 2 buffer versions) and 128 rows of up to 2 tiles (two rows per core: the accumulators
    # zeroed again for the second; core 0 walks 3 tiles).
    check_cases("ascend", ((1, 3), (1001, 5)), target="ascend-sim")
    check_cases("ascend", ((8193, 128),), target="ascend-sim", schedules=REUSE_SCHEDULES)


@pytest.mark.slow
def test_matches_reference_on_ascend_sim_under_both_schedules():
    # Under each pipe schedule a missing wait between DMA and vector code shows up as wrong data
    # under one of them (the schedule is read at launch: the kernels are built once).
    for schedule in REUSE_SCHEDULES:
        with sim_schedule(schedule):
            check_cases("ascend", ((1, 3), (1001, 64), (1001, 5), (8191, 128)), target="ascend-sim")


@pytest.mark.slow
def test_matches_reference_on_ascend_sim_many_tokens():
    check_cases("ascend", ((0, 4), (64, 1), (4097, 64), (20000, 48), (20000, 200)), target="ascend-sim")


@pytest.mark.parametrize("target", TARGETS)
def test_spec_example(target):
    # Spec §3.2.2: input 0, base 0, pre_eps 1e-6 -> 0.5 + 1e-6; d_out = 1 -> gz = 0.25, so the input
    # gradient is 0.25 · scale and the base gradient 0.25 per token (exact in fp32).
    inputs = {"input_mix": torch.zeros(3, N), "mhc_scale": torch.tensor([-1.75]), "mhc_base": torch.zeros(N),
              "output_mix_grad": torch.ones(3, N)}
    out = mhc_head_compute_mix_fwd(inputs["input_mix"], inputs["mhc_scale"], inputs["mhc_base"], None, 1e-6,
                                   target=target)
    assert_bitwise_equal(out, torch.full((3, N), 0.5) + torch.tensor(1e-6), "output_mix")
    dx, scale_rows, base_rows = backward(inputs, 2, target, None)
    assert_bitwise_equal(dx, torch.full((3, N), -0.4375), "input_mix_grad")
    assert_bitwise_equal(scale_rows, torch.zeros(2, 1), "mhc_scale_grad_partial")
    assert_bitwise_equal(base_rows, torch.tensor([[0.75] * N, [0.0] * N]), "mhc_base_grad_partial")


@pytest.mark.parametrize("target", TARGETS)
def test_head_mix_is_the_split_pre_mix(target):
    # The head's mix is pre_split_mixes' pre formula with one gain: with that gain as the pre gain
    # and the head's input and biases as the pre entries, the split's pre mix, its input gradient
    # (post and comb gradients zero) and, with one tile per partial row added in row order from
    # +0.0, its pre bias and gain gradients have the same bits.
    num_tokens = 1001
    inputs = make_inputs(num_tokens, 7)
    g = generator(8)
    mixes = torch.randn(num_tokens, 24, generator=g)
    mixes[:, :N] = inputs["input_mix"]
    scale = torch.cat([inputs["mhc_scale"], torch.randn(2, generator=g)])
    base = torch.cat([inputs["mhc_base"], torch.randn(20, generator=g)])
    for flavor in FLAVORS:
        pre, post, _ = split_reference.pre_split_mixes_fwd(mixes, scale, base, 2.0, PRE_EPS, flavor)
        assert_bitwise_equal(forward(inputs, target, flavor), pre, f"output_mix [{flavor}]")
        zeros = torch.zeros(num_tokens, N)
        dx, scale_grad, base_grad = split_reference.pre_split_mixes_bwd(
            inputs["output_mix_grad"], zeros, torch.zeros(num_tokens, N * N), mixes, post, scale, base, 2.0, flavor)
        got = backward(inputs, 16, target, flavor)
        assert_bitwise_equal(got[0], dx[:, :N].contiguous(), f"input_mix_grad [{flavor}]")
        scale_sum, base_sum = torch.zeros(1), torch.zeros(N)
        for scale_row, base_row in zip(got[1], got[2], strict=True):
            scale_sum, base_sum = scale_sum + scale_row, base_sum + base_row
        assert_bitwise_equal(scale_sum, scale_grad[:1], f"scale gradient [{flavor}]")
        assert_bitwise_equal(base_sum, base_grad[:N], f"base gradient [{flavor}]")


def test_flavors_differ_in_subnormal_quotients():
    # The test inputs reach the flavor difference: the ascend flavor flushes the subnormal σ(-88)
    # (output pre_eps, gradient 0), the cuda flavor keeps it; elsewhere they agree.
    inputs = make_inputs(200, 3)
    ascend, cuda = (reference.head_compute_mix_fwd(inputs["input_mix"], inputs["mhc_scale"], inputs["mhc_base"],
                                                   0.0, flavor) for flavor in FLAVORS)
    differs = ascend != cuda
    assert differs[::97, 0].all() and differs.sum() == differs[::97, 0].sum()
    assert (ascend[::97, 0] == 0).all() and (cuda[::97, 0] > 0).all()
    grads = [reference_backward(inputs, 1, flavor)[0] for flavor in FLAVORS]
    assert (grads[0][::97, 0] == 0).all() and (grads[1][::97, 0] != 0).all()


@pytest.mark.slow
def test_every_thread_count_gives_the_same_bits(vmi_env):
    # The partial rows depend on T and P only: one thread and four threads (rows split across
    # them) agree, and equal the reference.
    inputs = make_inputs(3000, 11)
    want = reference_backward(inputs, 9, "ascend")
    for threads in ("1", "4"):
        vmi_env.setenv("VMI_CPU_THREADS", threads)
        for name, a, b in zip(BWD_NAMES, backward(inputs, 9, None, "ascend"), want, strict=True):
            assert_bitwise_equal(a, b, f"{name} [{threads} threads]")


@pytest.mark.slow
def test_token_block_size_does_not_change_the_result():
    # TileKernels' block-size hint is accepted and validated; vmi's fixed tiles give the same bits.
    inputs = make_inputs(300, 14)
    want = forward(inputs, None, "ascend")
    want_grads = backward(inputs, 3, None, "ascend")
    for block in (1, 32, 48):
        assert_bitwise_equal(forward(inputs, None, "ascend", token_block_size=block), want, f"output_mix [{block}]")
        for name, a, b in zip(BWD_NAMES, backward(inputs, 3, None, "ascend", token_block_size=block), want_grads,
                              strict=True):
            assert_bitwise_equal(a, b, f"{name} [{block}]")


def test_no_tokens_launch_nothing(monkeypatch):
    forbid_kernels(monkeypatch, why="T == 0")
    inputs = make_inputs(0, 0)
    for target in (None, "torch"):
        assert forward(inputs, target, None).shape == (0, N)
        outs = nan_outputs(0, 6)
        got = backward(inputs, 6, target, None, outs)
        assert all(a is b for a, b in zip(got, outs, strict=True))
        assert_bitwise_equal(outs[1], torch.zeros(6, 1), f"mhc_scale_grad_partial [{target}]")
        assert_bitwise_equal(outs[2], torch.zeros(6, N), f"mhc_base_grad_partial [{target}]")


@pytest.mark.parametrize("target", TARGETS)
def test_given_outputs_are_written_and_returned(target):
    # TileKernels' kernel-level API: the outputs are arguments; every partial row is overwritten.
    inputs = make_inputs(130, 5)
    out = torch.full((130, N), NAN)
    assert forward(inputs, target, None, out) is out
    want = reference.head_compute_mix_fwd(inputs["input_mix"], inputs["mhc_scale"], inputs["mhc_base"], PRE_EPS)
    assert_bitwise_equal(out, want, "output_mix")
    outs = (torch.full((130, N), NAN), torch.full((4, 1), 7.0), torch.full((4, N), 7.0))
    got = backward(inputs, 4, target, None, outs)
    assert all(a is b for a, b in zip(got, outs, strict=True))
    for name, a, b in zip(BWD_NAMES, outs, reference_backward(inputs, 4, "ascend"), strict=True):
        assert_bitwise_equal(a, b, name)


@pytest.mark.parametrize("target", TARGETS)
def test_non_finite_values_propagate(target):
    # A NaN input (token 3, stream 2), a +inf logit (token 5, stream 0), a -inf output gradient
    # (token 140, stream 1): per element as in IEEE arithmetic, as the reference computes it (NaN
    # payloads aside). Tokens 3 and 5 lie in partial row 0, token 140 in row 1 (300 tokens: 5
    # tiles of 64 over 3 rows, 2 tiles per row).
    inputs = make_inputs(300, 12)
    inputs["input_mix"][3, 2] = NAN
    inputs["input_mix"][5, 0] = float("inf") if inputs["mhc_scale"][0] > 0 else -float("inf")
    inputs["output_mix_grad"][140, 1] = -float("inf")
    want = reference.head_compute_mix_fwd(inputs["input_mix"], inputs["mhc_scale"], inputs["mhc_base"], PRE_EPS)
    got = forward(inputs, target, "ascend")
    assert_bitwise_equal(got, want, "output_mix", any_nan=True)
    assert got[3, 2].isnan() and got[5, 0] == torch.tensor(1.0) + torch.tensor(PRE_EPS)
    got = backward(inputs, 3, target, "ascend")
    for name, a, b in zip(BWD_NAMES, got, reference_backward(inputs, 3, "ascend"), strict=True):
        assert_bitwise_equal(a, b, name, any_nan=True)
    dx, scale_rows, base_rows = got
    # σ(+inf) = 1: s·(1 - s) = 0, a zero logit gradient, whose product with the infinite input
    # makes the gain's partial NaN.
    assert dx[3, 2].isnan() and dx[5, 0] == 0
    assert base_rows[0, 2].isnan() and scale_rows[0, 0].isnan() and base_rows[0, 0].isfinite()
    assert not base_rows[1, 1].isfinite() and base_rows[2].isfinite().all() and scale_rows[2].isfinite().all()


@pytest.mark.slow
def test_torch_target_and_parallel_entry_points():
    inputs = make_inputs(100, 13)
    want = reference.head_compute_mix_fwd(inputs["input_mix"], inputs["mhc_scale"], inputs["mhc_base"], PRE_EPS)
    fwd_args = (inputs["input_mix"], inputs["mhc_scale"], inputs["mhc_base"], None, PRE_EPS)
    for entry, target in ((mhc_head_compute_mix_fwd, "torch"), (mhc_head_compute_mix_fwd_parallel, None)):
        assert_bitwise_equal(entry(*fwd_args, target=target), want, f"output_mix [{entry.__name__} {target}]")
    bwd_args = (inputs["output_mix_grad"], inputs["input_mix"], inputs["mhc_scale"], inputs["mhc_base"], None, None,
                None, 2)
    want_grads = reference_backward(inputs, 2, "ascend")
    for entry, target in ((mhc_head_compute_mix_bwd, "torch"), (mhc_head_compute_mix_bwd_parallel, None)):
        for name, a, b in zip(BWD_NAMES, entry(*bwd_args, target=target), want_grads, strict=True):
            assert_bitwise_equal(a, b, f"{name} [{entry.__name__} {target}]")


def test_parallel_entry_points_refuse_the_reference():
    inputs = make_inputs(4, 15)
    with pytest.raises(ValueError, match="target 'torch'"):
        mhc_head_compute_mix_fwd_parallel(inputs["input_mix"], inputs["mhc_scale"], inputs["mhc_base"], None,
                                          PRE_EPS, target="torch")
    with pytest.raises(ValueError, match="target 'torch'"):
        mhc_head_compute_mix_bwd_parallel(inputs["output_mix_grad"], inputs["input_mix"], inputs["mhc_scale"],
                                          inputs["mhc_base"], None, None, None, 2, target="torch")


# --- error against the float64 formula -----------------------------------------------------------

def forward_bounds(inputs):
    """Per-element bounds on |kernel − float64 formula|: ``(output bound, σ bound)``.

    ``z = fl(fl(x·g) + b)``: two roundings, |Δz| ≤ u(|x·g| + |z|) (+ u² terms, covered by the 1.01
    factor). ``σ``: the exp (correctly rounded), the ``+ 1`` and the division each add a relative
    u, and Δz moves it by σ(1−σ)|Δz|; the ascend flavor's flush of a subnormal quotient adds under
    2^-126. ``out = fl(σ + eps)`` rounds once more."""
    x, scale = inputs["input_mix"].double(), inputs["mhc_scale"].double()
    exact_z = x * scale[0] + inputs["mhc_base"].double()
    dz = U * ((x * scale[0]).abs() + exact_z.abs()) * 1.01
    s = torch.sigmoid(exact_z)
    ds = s * (1 - s) * dz + 3.01 * U * s + MIN_NORMAL
    return ds + U * (s + PRE_EPS), ds


@pytest.mark.parametrize("target", TARGETS)
def test_error_of_the_forward_against_float64(target):
    inputs = make_inputs(1001, 21)
    exact = reference.head_compute_mix_fwd_exact(inputs["input_mix"], inputs["mhc_scale"], inputs["mhc_base"],
                                                 PRE_EPS)
    bound = forward_bounds(inputs)[0]
    for flavor in FLAVORS:
        error = (forward(inputs, target, flavor).double() - exact).abs()
        assert (error <= bound).all(), f"output_mix [{flavor}]: max excess {float((error - bound).max())}"


@pytest.mark.parametrize("target", TARGETS)
def test_error_of_the_backward_against_float64(target):
    # The kernel's backward against the exact float64 gradient. Per element: |Δgz| ≤
    # |d|·(|Δs| + u·s) + 3u|gz| (|Δ(s(1−s))| ≤ |Δs|, the rounding of 1 − s within u·s·(1−s) relative
    # to the product, exact for s ≥ 1/2 by Sterbenz; two rounded products); input_mix_grad rounds
    # once more. The partial rows, summed here in float64, add the elements' errors (times |x| for
    # the gain) and the summation's: every term passes at most n (the token's streams) + K (a
    # lane's tokens in a row, K tiles per row) + 6 (the folds) rounded additions, each within u of
    # its partial, so within depth·u·Σ|terms|.
    num_tokens, num_rows = 1001, 5
    inputs = make_inputs(num_tokens, 22)
    x, scale = inputs["input_mix"].double(), inputs["mhc_scale"].double()
    exact_dx, exact_scale, exact_base = reference.head_compute_mix_bwd_exact(
        inputs["output_mix_grad"], inputs["input_mix"], inputs["mhc_scale"], inputs["mhc_base"])
    s = torch.sigmoid(x * scale[0] + inputs["mhc_base"].double())
    ds = forward_bounds(inputs)[1]
    exact_gz = exact_dx / scale[0]
    dgz = inputs["output_mix_grad"].double().abs() * (ds + U * s) + 3.01 * U * exact_gz.abs()
    depth = N + reference.tiles_per_row(num_tokens, num_rows) + 6
    for flavor in FLAVORS:
        dx, scale_rows, base_rows = backward(inputs, num_rows, target, flavor)
        dx_bound = dgz * scale.abs()[0] * (1 + U) + U * exact_dx.abs()
        assert ((dx.double() - exact_dx).abs() <= dx_bound).all(), f"input_mix_grad [{flavor}]"
        base_bound = dgz.sum(0) + depth * U * exact_gz.abs().sum(0) * 1.01
        base_error = (base_rows.double().sum(0) - exact_base).abs()
        assert (base_error <= base_bound).all(), f"mhc_base_grad [{flavor}]"
        terms = (exact_gz * x).abs()
        scale_bound = (dgz * x.abs() + U * terms + depth * U * terms * 1.01).sum()
        assert (scale_rows.double().sum() - exact_scale).abs() <= scale_bound, f"mhc_scale_grad [{flavor}]"


def test_float64_backward_against_autograd():
    # The closed-form float64 backward equals torch.autograd through the float64 forward, and
    # gradcheck holds for the forward's autograd.
    inputs = make_inputs(64, 23)
    x = inputs["input_mix"].double().requires_grad_(True)
    scale = inputs["mhc_scale"].double().requires_grad_(True)
    base = inputs["mhc_base"].double().requires_grad_(True)

    def head_mix(x, scale, base):
        return torch.sigmoid(x * scale[0] + base) + PRE_EPS

    autograd = torch.autograd.grad(head_mix(x, scale, base), (x, scale, base), inputs["output_mix_grad"].double())
    closed = reference.head_compute_mix_bwd_exact(inputs["output_mix_grad"], inputs["input_mix"],
                                                  inputs["mhc_scale"], inputs["mhc_base"])
    # Both sides are float64 evaluations of the same derivative: they differ by float64 rounding only.
    for name, a, b in zip(("input_mix_grad", "mhc_scale_grad", "mhc_base_grad"), closed, autograd, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)
    small = (x[:2].detach().clone().requires_grad_(True), scale.detach().clone().requires_grad_(True),
             base.detach().clone().requires_grad_(True))
    assert torch.autograd.gradcheck(head_mix, small)
