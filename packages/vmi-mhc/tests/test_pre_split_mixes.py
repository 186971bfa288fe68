"""pre_split_mixes forward and backward on the cpu and ascend-sim targets, bit for bit against the
torch reference ``reference.pre_split_mixes`` (spec §3.8), the kernels within bounds derived from
their fp32 arithmetic of the float64 formula, and the float64 backward against torch autograd.

The token count is a runtime value: one forward, one backward tile kernel and one reduction per
flavor. The default set runs each flavor on the cpu (0 tokens, 1 token, 1001 tokens: 15 full tiles
and a 41-token tail) and the ascend flavor once on ascend-sim; the other default tests reuse the
ascend-flavor cpu kernels. Large token counts run under ``slow``.

Inputs: normal mixes plus, in every 97th token, entries whose logits lie near -88 (a subnormal
``σ = 1 / (e^88 + 1)``, flushed on the ascend flavor only) and near ±30 (a saturated ``σ``).
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import REUSE_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.errors import forbid_kernels
from vmi_mhc import (
    mhc_pre_split_mixes_bwd,
    mhc_pre_split_mixes_bwd_parallel,
    mhc_pre_split_mixes_fwd,
    mhc_pre_split_mixes_fwd_parallel,
)
from vmi_mhc.reference import pre_split_mixes as reference

N, N3 = 4, 24
POST_MULT, PRE_EPS = 2.0, 1e-2
TOKENS = (0, 1, 1001)
FLAVORS = ("ascend", "cuda")
U = 2.0 ** -24  # unit roundoff of fp32
MIN_NORMAL = 2.0 ** -126


def make_inputs(num_tokens: int, seed: int) -> dict:
    g = generator(seed)
    scale = torch.randn(3, generator=g) + torch.tensor([1.5, -1.5, 1.0])
    base = torch.randn(N3, generator=g)
    x = 2 * torch.randn(num_tokens, N3, generator=g)
    gains = scale[reference.gain_index(N)]
    # Every 97th token: logits near -88 (pre entry 1, post entry 5), +30 (pre entry 2) and -30
    # (post entry 6).
    for entry, logit in ((1, -88.0), (5, -88.0), (2, 30.0), (6, -30.0)):
        x[::97, entry] = (logit - base[entry]) / gains[entry]
    return {
        "input_mixes": x, "mhc_scale": scale, "mhc_base": base,
        "pre_layer_mix_grad": torch.randn(num_tokens, N, generator=g),
        "post_layer_mix_grad": torch.randn(num_tokens, N, generator=g),
        "comb_res_mix_grad": torch.randn(num_tokens, N * N, generator=g),
    }


def forward(inputs, target, flavor, post_mult=POST_MULT):
    return mhc_pre_split_mixes_fwd(inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"], None, None, None,
                                   post_mult, PRE_EPS, target=target, flavor=flavor)


def backward(inputs, post, target, flavor, post_mult=POST_MULT):
    return mhc_pre_split_mixes_bwd(inputs["pre_layer_mix_grad"], inputs["post_layer_mix_grad"],
                                   inputs["comb_res_mix_grad"], inputs["input_mixes"], post, inputs["mhc_scale"],
                                   inputs["mhc_base"], None, None, None, post_mult, target=target, flavor=flavor)


def reference_backward(inputs, post, flavor, post_mult=POST_MULT):
    return reference.pre_split_mixes_bwd(inputs["pre_layer_mix_grad"], inputs["post_layer_mix_grad"],
                                         inputs["comb_res_mix_grad"], inputs["input_mixes"], post, inputs["mhc_scale"],
                                         inputs["mhc_base"], post_mult, flavor)


FWD_NAMES = ("pre_layer_mix", "post_layer_mix", "comb_res_mix")
BWD_NAMES = ("input_mixes_grad", "mhc_scale_grad", "mhc_base_grad")


def check_tokens(flavor, tokens, target=None, post_mult=POST_MULT, schedules=(None,)) -> None:
    """``schedules``: the ascend-sim pipe schedules each token count runs under (one reference for
    all; None: the current one)."""
    for seed, num_tokens in enumerate(tokens):
        inputs = make_inputs(num_tokens, seed)
        kernel_flavor = None if target == "ascend-sim" else flavor
        want = reference.pre_split_mixes_fwd(inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"],
                                             post_mult, PRE_EPS, flavor)
        # The backward is fed the kernel's own post mix (bit for bit the reference's once the
        # forward matched), as TileKernels' test does.
        want_bwd = reference_backward(inputs, want[1], flavor, post_mult)
        for schedule in schedules:
            label = f"T={num_tokens} flavor={flavor} target={target} schedule={schedule}"
            with sim_schedule(schedule):
                got = forward(inputs, target, kernel_flavor, post_mult)
                for name, a, b in zip(FWD_NAMES, got, want, strict=True):
                    assert_bitwise_equal(a, b, f"{name} [{label}]")
                got = backward(inputs, got[1], target, kernel_flavor, post_mult)
            for name, a, b in zip(BWD_NAMES, got, want_bwd, strict=True):
                assert_bitwise_equal(a, b, f"{name} [{label}]")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_matches_reference(flavor):
    check_tokens(flavor, TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
def test_matches_reference_many_tokens(flavor):
    check_tokens(flavor, (63, 64, 65, 4096, 8191, 70000))


def test_matches_reference_on_ascend_sim():
    # Under each pipe schedule a missing wait between DMA and vector code shows up as wrong data
    # under one of them: 1 token, a 41-token tail, and three tiles on core 0 (8193 tokens: 129
    # tiles over 64 cores, more than the 2 versions of the on-chip buffers a core reuses) under
    # both (one reference for both launches: the reference is the cost).
    for schedule, tokens in (("consumers_first", (1001,)), ("producers_first", (1,))):
        with sim_schedule(schedule):
            check_tokens("ascend", tokens, target="ascend-sim")
    check_tokens("ascend", (8193,), target="ascend-sim", schedules=REUSE_SCHEDULES)


@pytest.mark.slow
def test_matches_reference_on_ascend_sim_many_tokens():
    check_tokens("ascend", (0, 64, 4097, 8192, 20000), target="ascend-sim")


def test_flavors_differ_in_subnormal_quotients():
    # The test inputs reach the flavor difference: the ascend flavor flushes the subnormal σ(-88)
    # (post mix 0, pre gradient 0), the cuda flavor keeps it; elsewhere they agree.
    inputs = make_inputs(200, 3)
    ascend = reference.pre_split_mixes_fwd(inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"], POST_MULT,
                                           PRE_EPS, "ascend")
    cuda = reference.pre_split_mixes_fwd(inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"], POST_MULT,
                                         PRE_EPS, "cuda")
    differs = ascend[1] != cuda[1]
    assert differs[::97, 1].all() and differs.sum() == differs[::97, 1].sum()
    assert (ascend[1][::97, 1] == 0).all() and (cuda[1][::97, 1] > 0).all()
    assert torch.equal(ascend[0], cuda[0]) and torch.equal(ascend[2], cuda[2])
    grads = [reference_backward(inputs, cuda[1], flavor)[0] for flavor in FLAVORS]
    assert (grads[0][::97, 1] == 0).all() and (grads[1][::97, 1] != 0).all()


def test_every_thread_count_gives_the_same_bits(vmi_env):
    # The parameter gradients' order depends on T only (tiles of 64 tokens): one thread and four
    # threads (tiles split across them) agree, and equal the reference.
    inputs = make_inputs(3000, 11)
    want_post = reference.pre_split_mixes_fwd(inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"],
                                              POST_MULT, PRE_EPS)[1]
    want = reference_backward(inputs, want_post, "ascend")
    for threads in ("1", "4"):
        vmi_env.setenv("VMI_CPU_THREADS", threads)
        got = backward(inputs, want_post, None, "ascend")
        for name, a, b in zip(BWD_NAMES, got, want, strict=True):
            assert_bitwise_equal(a, b, f"{name} [{threads} threads]")


def test_no_tokens_launch_nothing(monkeypatch):
    forbid_kernels(monkeypatch, why="T == 0")
    inputs = make_inputs(0, 0)
    for target in (None, "torch"):
        pre, post, comb = forward(inputs, target, None)
        assert pre.shape == (0, N) and post.shape == (0, N) and comb.shape == (0, N * N)
        scale_grad = torch.full((3,), float("nan"))
        base_grad = torch.full((N3,), float("nan"))
        dx, got_scale, got_base = mhc_pre_split_mixes_bwd(
            inputs["pre_layer_mix_grad"], inputs["post_layer_mix_grad"], inputs["comb_res_mix_grad"],
            inputs["input_mixes"], post, inputs["mhc_scale"], inputs["mhc_base"], None, scale_grad, base_grad,
            POST_MULT, target=target)
        assert dx.shape == (0, N3)
        assert got_scale is scale_grad and got_base is base_grad
        assert_bitwise_equal(scale_grad, torch.zeros(3), f"mhc_scale_grad [{target}]")
        assert_bitwise_equal(base_grad, torch.zeros(N3), f"mhc_base_grad [{target}]")


def test_given_outputs_are_written_and_returned():
    # TileKernels' kernel-level API: the outputs are arguments; the parameter gradients are
    # overwritten, not accumulated into.
    inputs = make_inputs(130, 5)
    outs = [torch.full((130, N), float("nan")), torch.full((130, N), float("nan")),
            torch.full((130, N * N), float("nan"))]
    got = mhc_pre_split_mixes_fwd(inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"], *outs, POST_MULT,
                                  PRE_EPS)
    assert all(a is b for a, b in zip(got, outs, strict=True))
    want = reference.pre_split_mixes_fwd(inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"], POST_MULT,
                                         PRE_EPS)
    for name, a, b in zip(FWD_NAMES, outs, want, strict=True):
        assert_bitwise_equal(a, b, name)
    grads = [torch.full((130, N3), float("nan")), torch.full((3,), 7.0), torch.full((N3,), 7.0)]
    got = mhc_pre_split_mixes_bwd(inputs["pre_layer_mix_grad"], inputs["post_layer_mix_grad"],
                                  inputs["comb_res_mix_grad"], inputs["input_mixes"], want[1], inputs["mhc_scale"],
                                  inputs["mhc_base"], *grads, POST_MULT)
    assert all(a is b for a, b in zip(got, grads, strict=True))
    for name, a, b in zip(BWD_NAMES, grads, reference_backward(inputs, want[1], "ascend"), strict=True):
        assert_bitwise_equal(a, b, name)


def test_zero_post_multiplier():
    # post_mult = 0 (spec §6.6): the post mix 0 · σ(z) is +0 and does not depend on z; the backward
    # divides by +inf instead of 0, so the post entries' gradients are d · 0 = ±0 (TileKernels:
    # NaN), the exact derivative; the pre and comb entries are as for any multiplier.
    inputs = make_inputs(150, 6)
    pre, post, comb = forward(inputs, None, "ascend", post_mult=0.0)
    assert_bitwise_equal(post, torch.zeros(150, N), "post_layer_mix")
    dx, scale_grad, base_grad = backward(inputs, post, None, "ascend", post_mult=0.0)
    want = reference_backward(inputs, post, "ascend", post_mult=0.0)
    for name, a, b in zip(BWD_NAMES, (dx, scale_grad, base_grad), want, strict=True):
        assert_bitwise_equal(a, b, name)
    assert (dx[:, N:2 * N] == 0).all() and (base_grad[N:2 * N] == 0).all() and scale_grad[1] == 0
    assert dx.isfinite().all() and scale_grad.isfinite().all() and base_grad.isfinite().all()
    exact = reference.pre_split_mixes_bwd_exact(
        inputs["pre_layer_mix_grad"], inputs["post_layer_mix_grad"], inputs["comb_res_mix_grad"],
        inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"], 0.0)
    assert (exact[0][:, N:2 * N] == 0).all()


def test_non_finite_values_propagate():
    # A NaN mix (token 3, a comb entry), +inf in a pre entry (token 5), -inf in a post gradient
    # (token 8): per element as in IEEE arithmetic, as the reference computes it (NaN payloads aside).
    # The comb gradient does not read the mix; the comb gain's gradient does.
    inputs = make_inputs(70, 12)
    inputs["input_mixes"][3, 12] = float("nan")
    inputs["input_mixes"][5, 0] = float("inf") if inputs["mhc_scale"][0] > 0 else -float("inf")
    inputs["post_layer_mix_grad"][8, 2] = -float("inf")
    got = forward(inputs, None, "ascend")
    want = reference.pre_split_mixes_fwd(inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"], POST_MULT,
                                         PRE_EPS)
    for name, a, b in zip(FWD_NAMES, got, want, strict=True):
        assert_bitwise_equal(a, b, name, any_nan=True)
    assert got[2][3, 4].isnan() and got[0][5, 0] == 1 + PRE_EPS
    got = backward(inputs, want[1], None, "ascend")
    for name, a, b in zip(BWD_NAMES, got, reference_backward(inputs, want[1], "ascend"), strict=True):
        assert_bitwise_equal(a, b, name, any_nan=True)
    assert got[0][3, 12].isfinite() and got[2][12].isfinite() and got[1][2].isnan()
    assert not got[0][8, N + 2].isfinite() and not got[2][N + 2].isfinite()


def test_torch_target_and_parallel_entry_points():
    inputs = make_inputs(100, 13)
    want = reference.pre_split_mixes_fwd(inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"], POST_MULT,
                                         PRE_EPS)
    fwd_args = (inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"], None, None, None, POST_MULT, PRE_EPS)
    for entry, target in ((mhc_pre_split_mixes_fwd, "torch"), (mhc_pre_split_mixes_fwd_parallel, None)):
        for name, a, b in zip(FWD_NAMES, entry(*fwd_args, target=target), want, strict=True):
            assert_bitwise_equal(a, b, f"{name} [{entry.__name__} {target}]")
    bwd_args = (inputs["pre_layer_mix_grad"], inputs["post_layer_mix_grad"], inputs["comb_res_mix_grad"],
                inputs["input_mixes"], want[1], inputs["mhc_scale"], inputs["mhc_base"], None, None, None, POST_MULT)
    want_grads = reference_backward(inputs, want[1], "ascend")
    for entry, target in ((mhc_pre_split_mixes_bwd, "torch"), (mhc_pre_split_mixes_bwd_parallel, None)):
        for name, a, b in zip(BWD_NAMES, entry(*bwd_args, target=target), want_grads, strict=True):
            assert_bitwise_equal(a, b, f"{name} [{entry.__name__} {target}]")
    with pytest.raises(ValueError, match="target 'torch'"):
        mhc_pre_split_mixes_fwd_parallel(*fwd_args, target="torch")
    with pytest.raises(ValueError, match="target 'torch'"):
        mhc_pre_split_mixes_bwd_parallel(*bwd_args, target="torch")


# --- error against the float64 formula -----------------------------------------------------------

def forward_bounds(inputs, exact_z):
    """Per-element bounds on |kernel − float64 formula| of the three forward outputs.

    ``z = fl(fl(x·g) + b)``: two roundings, |Δz| ≤ u(|x·g| + |z|) (+ u² terms, covered by the 1.01
    factor). ``σ``: the exp (correctly rounded), the ``+ 1`` and the division each add a relative
    u, and Δz moves it by σ(1−σ)|Δz|; the ascend flavor's flush of a subnormal quotient adds under
    2^-126. ``pre = fl(σ + eps)`` and ``post = fl(σ · m)`` round once more."""
    x, scale = inputs["input_mixes"].double(), inputs["mhc_scale"].double()
    product = (x * scale[reference.gain_index(N)]).abs()
    dz = U * (product + exact_z.abs()) * 1.01
    s = torch.sigmoid(exact_z)
    ds = s * (1 - s) * dz + 3.01 * U * s + MIN_NORMAL
    pre_bound = ds[:, :N] + U * (s[:, :N] + PRE_EPS)
    post_bound = POST_MULT * ds[:, N:2 * N] * (1 + U) + U * POST_MULT * s[:, N:2 * N]
    return pre_bound, post_bound, dz[:, 2 * N:], ds


# The reference by default (the kernels equal it bit for bit), the cpu kernels under slow.
ERROR_TARGETS = ["torch", pytest.param(None, marks=pytest.mark.slow)]


@pytest.mark.parametrize("target", ERROR_TARGETS)
def test_error_of_the_forward_against_float64(target):
    inputs = make_inputs(1001, 21)
    exact = reference.pre_split_mixes_fwd_exact(inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"],
                                                POST_MULT, PRE_EPS)
    x, scale, base = inputs["input_mixes"].double(), inputs["mhc_scale"].double(), inputs["mhc_base"].double()
    exact_z = x * scale[reference.gain_index(N)] + base
    bounds = forward_bounds(inputs, exact_z)[:3]
    for flavor in FLAVORS:
        got = forward(inputs, target, flavor)
        for name, a, b, bound in zip(FWD_NAMES, got, exact, bounds, strict=True):
            error = (a.double() - b).abs()
            assert (error <= bound).all(), f"{name} [{flavor}]: max excess {float((error - bound).max())}"


@pytest.mark.parametrize("target", ERROR_TARGETS)
def test_error_of_the_backward_against_float64(target):
    # The kernel's backward, fed its forward's post mix, against the exact float64 gradient of the
    # exact forward. Per element: |Δgz| ≤ |d|·(|Δ(s(1−s))|) + 3u|gz| with |Δ(s(1−s))| ≤ |Δs| + u·s
    # (the rounding of 1 − s, exact for s ≥ 1/2 by Sterbenz) and, for post, the forward's |Δp| =
    # m·|Δs| + u·p, the quotient's u·p/m; input_mixes_grad rounds once more. The parameter
    # gradients add the elements' errors (times |x| for the gains) and the summation's: every
    # term passes at most 24 (entries of a gain) + 7 (the tile's lane sum) + T/64 (the tiles)
    # rounded additions, each within u of its partial, so within k·u·Σ|terms|.
    num_tokens = 1001
    inputs = make_inputs(num_tokens, 22)
    x = inputs["input_mixes"].double()
    scale = inputs["mhc_scale"].double()
    gains = scale[reference.gain_index(N)]
    exact = reference.pre_split_mixes_bwd_exact(
        inputs["pre_layer_mix_grad"], inputs["post_layer_mix_grad"], inputs["comb_res_mix_grad"],
        inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"], POST_MULT)
    exact_z = x * gains + inputs["mhc_base"].double()
    ds = forward_bounds(inputs, exact_z)[3]
    s = torch.sigmoid(exact_z)
    d = torch.cat([inputs["pre_layer_mix_grad"], inputs["post_layer_mix_grad"], inputs["comb_res_mix_grad"]],
                  dim=1).double().abs()
    exact_gz = exact[0] / gains
    dgz = torch.zeros_like(exact_gz)
    dgz[:, :N] = d[:, :N] * (ds[:, :N] + U * s[:, :N]) + 3.01 * U * exact_gz[:, :N].abs()
    dp = POST_MULT * ds[:, N:2 * N] + U * POST_MULT * s[:, N:2 * N]
    dgz[:, N:2 * N] = (d[:, N:2 * N] * (2 * dp + 2.01 * U * POST_MULT * s[:, N:2 * N])
                       + 3.01 * U * exact_gz[:, N:2 * N].abs())
    depth = 24 + 7 + -(-num_tokens // 64)
    for flavor in FLAVORS:
        post = forward(inputs, target, flavor)[1]
        dx, scale_grad, base_grad = backward(inputs, post, target, flavor)
        dx_bound = dgz * gains.abs() * (1 + U) + U * exact[0].abs()
        assert ((dx.double() - exact[0]).abs() <= dx_bound).all(), f"input_mixes_grad [{flavor}]"
        base_bound = dgz.sum(0) + depth * U * exact_gz.abs().sum(0) * 1.01
        assert ((base_grad.double() - exact[2]).abs() <= base_bound).all(), f"mhc_base_grad [{flavor}]"
        terms = (exact_gz * x).abs()
        groups = reference.gain_index(N)
        term_errors = dgz * x.abs() + U * terms
        scale_bound = torch.zeros(3, dtype=torch.float64).index_add_(0, groups, (term_errors + depth * U * terms
                                                                                 * 1.01).sum(0))
        assert ((scale_grad.double() - exact[1]).abs() <= scale_bound).all(), f"mhc_scale_grad [{flavor}]"


def test_float64_backward_against_autograd():
    # The closed-form float64 backward equals torch.autograd through the float64 forward (post
    # term from the recomputed σ), and gradcheck holds for the forward's autograd.
    inputs = make_inputs(64, 23)
    x = inputs["input_mixes"].double().requires_grad_(True)
    scale = inputs["mhc_scale"].double().requires_grad_(True)
    base = inputs["mhc_base"].double().requires_grad_(True)

    def split(x, scale, base):
        z = x * scale[reference.gain_index(N)] + base
        s = torch.sigmoid(z)
        return s[:, :N] + PRE_EPS, s[:, N:2 * N] * POST_MULT, z[:, 2 * N:]

    outputs = split(x, scale, base)
    grads = (inputs["pre_layer_mix_grad"].double(), inputs["post_layer_mix_grad"].double(),
             inputs["comb_res_mix_grad"].double())
    autograd = torch.autograd.grad(outputs, (x, scale, base), grads)
    closed = reference.pre_split_mixes_bwd_exact(
        inputs["pre_layer_mix_grad"], inputs["post_layer_mix_grad"], inputs["comb_res_mix_grad"],
        inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"], POST_MULT)
    # Both sides are float64 evaluations of the same derivative: they differ by float64 rounding only.
    for name, a, b in zip(BWD_NAMES, closed, autograd, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)
    small = (x[:2].detach().clone().requires_grad_(True), scale.detach().clone().requires_grad_(True),
             base.detach().clone().requires_grad_(True))
    assert torch.autograd.gradcheck(split, small)
