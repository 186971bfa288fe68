"""mhc_post_fwd / mhc_post_bwd on the cpu and ascend-sim targets, bit for bit against the torch
reference ``vmi_mhc.reference.post`` (spec mhc §3.5), and the reference against float64.

Bitwise: both flavors specify one fp32 chain per output (a product, then fused multiply-adds in a
fixed order; the H-sums in vmi's fixed 64-lane order), which kernel and reference both evaluate
with single roundings. A kernel is specialised on ``(n, H)`` only (the flavor changes nothing, the
token count is a runtime value), so the default set builds one forward and one backward kernel
per target: ``H = 2600`` gives two hidden tiles in the backward, a clamped last tile and a
40-column register tail. The token counts cover 0, 1, a second wave of the 64 Ascend workers and
several threads on cpu; the hidden-size and token sweeps run under ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import REUSE_SCHEDULES, assert_bitwise_equal, randn, sim_schedule
from vmi_devkit.errors import forbid_kernels
from vmi_mhc.ops.post import mhc_post_bwd, mhc_post_bwd_parallel, mhc_post_fwd, mhc_post_fwd_parallel
from vmi_mhc.reference import post as reference

N = 4
HIDDEN = 2600
# (B, S) of the token dimensions.
TOKENS = ((1, 0), (1, 1), (2, 35))
FLAVORS = ("ascend", "cuda")


def make_inputs(batch: int, seq: int, hidden: int, seed: int, n: int = N) -> dict:
    """Unnormalised randn mixes, as TileKernels' tests draw them."""
    return {
        "x": randn((batch, seq, hidden), seed, torch.bfloat16),
        "residual": randn((batch, seq, n, hidden), seed + 1, torch.bfloat16),
        "post_layer_mix": randn((batch, seq, n, 1), seed + 2),
        "comb_res_mix": randn((batch, seq, n, n), seed + 3),
    }


def d_o_like(inputs: dict, seed: int) -> torch.Tensor:
    return randn(tuple(inputs["residual"].shape), seed + 4, torch.bfloat16)


def check_forward(hidden, tokens, *, flavor=None, target=None, n=N, schedules=None):
    """``schedules``: ascend-sim pipe schedules to launch each shape under (one reference for all)."""
    for seed, (batch, seq) in enumerate(tokens):
        inputs = make_inputs(batch, seq, hidden, seed, n)
        want = reference.mhc_post_fwd(**inputs)
        for schedule in schedules or [None]:
            with sim_schedule(schedule):
                out = mhc_post_fwd(**inputs, target=target, flavor=flavor)
            assert_bitwise_equal(out, want, f"out [H={hidden} n={n} B={batch} S={seq} {target} {flavor} {schedule}]")


BACKWARD_NAMES = ("d_x", "d_residual", "d_post_layer_mix", "d_comb_res_mix")


def check_backward(hidden, tokens, *, flavor=None, target=None, schedules=None):
    """``schedules``: as ``check_forward``'s."""
    for seed, (batch, seq) in enumerate(tokens):
        inputs = make_inputs(batch, seq, hidden, seed + 10)
        d_o = d_o_like(inputs, seed + 10)
        want = reference.mhc_post_bwd(**inputs, d_o=d_o)
        for schedule in schedules or [None]:
            with sim_schedule(schedule):
                got = mhc_post_bwd(**inputs, d_o=d_o, target=target, flavor=flavor)
            for name, a, b in zip(BACKWARD_NAMES, got, want, strict=True):
                assert_bitwise_equal(a, b, f"{name} [H={hidden} B={batch} S={seq} {target} {flavor} {schedule}]")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_forward_matches_reference(flavor):
    check_forward(HIDDEN, TOKENS, flavor=flavor)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_backward_matches_reference(flavor):
    check_backward(HIDDEN, TOKENS, flavor=flavor)


def test_matches_reference_on_ascend_sim():
    # One kernel pair (their build is the cost): one token; the forward on 193 tokens (4 tiles on
    # core 0, more than its 3 buffer versions) and the backward on 66 (a second wave: 4 inner tiles
    # on cores 0 and 1) under consumers_first and producers_first, where a missing wait between
    # pipes shows up.
    check_forward(HIDDEN, ((1, 1),), target="ascend-sim")
    check_forward(HIDDEN, ((1, 193),), target="ascend-sim", schedules=REUSE_SCHEDULES)
    check_backward(HIDDEN, ((1, 1),), target="ascend-sim")
    check_backward(HIDDEN, ((1, 66),), target="ascend-sim", schedules=REUSE_SCHEDULES)


# Hidden sizes of the models (1280 ... 7168), the largest tested (8192: two forward tiles of 4096,
# four backward tiles), a single column, one register, a register tail alone, and a tile tail.
SWEEP = (1, 64, 96, 1280, 2560, 4096, 5000, 5120, 7168, 8192)


@pytest.mark.slow
@pytest.mark.parametrize("hidden", SWEEP)
def test_hidden_sizes(hidden):
    check_forward(hidden, ((1, 1), (2, 37)), flavor="cuda")
    check_backward(hidden, ((1, 1), (2, 37)), flavor="ascend")


@pytest.mark.slow
def test_many_tokens():
    # Several waves of workers and threads; the reference's exact fp32 emulation is the cost.
    check_forward(1280, ((1, 4099),))
    check_backward(1280, ((2, 2048),))


@pytest.mark.slow
@pytest.mark.parametrize("n", (1, 2, 3, 8))
def test_forward_other_stream_counts(n):
    # The forward kernel is built for any n in [1, 8]; the backward for n = 4 only.
    check_forward(320, ((1, 1), (2, 37)), n=n)


@pytest.mark.slow
@pytest.mark.parametrize("hidden", (96, 5000, 8192))
def test_ascend_sim_hidden_sizes(hidden):
    check_forward(hidden, ((1, 3), (1, 67)), target="ascend-sim")
    check_backward(hidden, ((1, 3), (1, 67)), target="ascend-sim")


def test_every_thread_count_gives_the_same_bits(vmi_env):
    # A token's H-sums are made by one worker in a fixed lane order: one thread and two threads
    # (tokens split across them) give the reference's bits.
    inputs = make_inputs(1, 70, HIDDEN, 40)
    d_o = d_o_like(inputs, 40)
    want = reference.mhc_post_bwd(**inputs, d_o=d_o)
    for threads in ("1", "2"):
        vmi_env.setenv("VMI_CPU_THREADS", threads)
        for name, a, b in zip(BACKWARD_NAMES, mhc_post_bwd(**inputs, d_o=d_o), want, strict=True):
            assert_bitwise_equal(a, b, f"{name} [{threads} threads]")


def test_no_tokens_launch_nothing(monkeypatch):
    forbid_kernels(monkeypatch, why="T == 0")
    inputs = make_inputs(0, 5, 256, 0)
    out = mhc_post_fwd(**inputs)
    assert out.shape == (0, 5, 4, 256) and out.dtype == torch.bfloat16
    grads = mhc_post_bwd(**inputs, d_o=d_o_like(inputs, 0))
    shapes = [(0, 5, 256), (0, 5, 4, 256), (0, 5, 4, 1), (0, 5, 4, 4)]
    assert [tuple(g.shape) for g in grads] == shapes
    assert [g.dtype for g in grads] == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32]


def test_out_is_written_and_returned():
    inputs = make_inputs(1, 20, HIDDEN, 50)
    out = torch.full(inputs["residual"].shape, float("nan"), dtype=torch.bfloat16)
    assert mhc_post_fwd(**inputs, out=out) is out
    assert_bitwise_equal(out, reference.mhc_post_fwd(**inputs), "out")
    # The custom op's out overload writes it too.
    out2 = torch.empty_like(out)
    torch.ops.vmi.mhc_post_fwd.out(*inputs.values(), out=out2)
    assert_bitwise_equal(out2, out, "out (torch.ops.vmi.mhc_post_fwd.out)")


def test_strided_residual_and_d_o():
    # residual and d_o may be any view (copied to contiguous, as TileKernels does).
    inputs = make_inputs(2, 10, HIDDEN, 60)
    residual = torch.cat([inputs["residual"], inputs["residual"]], dim=-1)[..., :HIDDEN]
    d_o = d_o_like(inputs, 60).transpose(0, 1).contiguous().transpose(0, 1)
    assert not residual.is_contiguous() and not d_o.is_contiguous()
    inputs["residual"] = residual
    assert_bitwise_equal(mhc_post_fwd(**inputs), reference.mhc_post_fwd(**inputs), "out")
    got = mhc_post_bwd(**inputs, d_o=d_o)
    for name, a, b in zip(BACKWARD_NAMES, got, reference.mhc_post_bwd(**inputs, d_o=d_o), strict=True):
        assert_bitwise_equal(a, b, name)


def test_non_finite_values_propagate():
    # NaN in x (token 3, column 10), +inf in residual stream 2 (token 5, column 2599: the register
    # tail of the last tile), NaN in comb[1, 2] (token 7), +inf in d_o stream 0 (token 9,
    # column 700): IEEE propagation as the reference has it (NaN payloads aside).
    inputs = make_inputs(1, 12, HIDDEN, 70)
    d_o = d_o_like(inputs, 70)
    inputs["x"][0, 3, 10] = float("nan")
    inputs["residual"][0, 5, 2, 2599] = float("inf")
    inputs["comb_res_mix"][0, 7, 1, 2] = float("nan")
    d_o[0, 9, 0, 700] = float("inf")
    out = mhc_post_fwd(**inputs)
    assert_bitwise_equal(out, reference.mhc_post_fwd(**inputs), "out", any_nan=True)
    bad = ~out.float().isfinite()
    assert bad[0, 3, :, 10].all() and bad[0, 3].sum() == 4
    assert bad[0, 7, 2].all() and bad[0, 5, :, 2599].any()
    got = mhc_post_bwd(**inputs, d_o=d_o)
    for name, a, b in zip(BACKWARD_NAMES, got, reference.mhc_post_bwd(**inputs, d_o=d_o), strict=True):
        assert_bitwise_equal(a, b, name, any_nan=True)
    d_x, d_res, d_post, d_comb = got
    assert not d_post[0, 3].isfinite().any() and not d_comb[0, 5, 2].isfinite().any()
    assert not d_res[0, 7, 1].float().isfinite().any()
    assert d_x[0, 9, 700].float().isinf() and d_res[0, 9, :, 700].float().isinf().all()
    assert d_post[0, 9, 0].isinf() and d_comb[0, 9, :, 0].isinf().all()
    finite = [t for t in range(12) if t not in (3, 5, 7, 9)]
    assert d_post[0, finite].isfinite().all() and d_comb[0, finite].isfinite().all()
    assert d_x[0, finite].float().isfinite().all() and d_res[0, finite].float().isfinite().all()


def test_torch_target_and_parallel_entry_points():
    inputs = make_inputs(1, 20, HIDDEN, 80)
    d_o = d_o_like(inputs, 80)
    want_out = reference.mhc_post_fwd(**inputs)
    want_grads = reference.mhc_post_bwd(**inputs, d_o=d_o)
    for target in ("torch", None):
        assert_bitwise_equal(mhc_post_fwd(**inputs, target=target), want_out, f"out [{target}]")
    assert_bitwise_equal(mhc_post_fwd_parallel(**inputs), want_out, "out [parallel]")
    for name, a, b in zip(BACKWARD_NAMES, mhc_post_bwd_parallel(**inputs, d_o=d_o), want_grads, strict=True):
        assert_bitwise_equal(a, b, f"{name} [parallel]")
    for name, a, b in zip(BACKWARD_NAMES, mhc_post_bwd(**inputs, d_o=d_o, target="torch"), want_grads, strict=True):
        assert_bitwise_equal(a, b, f"{name} [torch]")
    with pytest.raises(ValueError, match="target 'torch'"):
        mhc_post_fwd_parallel(**inputs, target="torch")
    with pytest.raises(ValueError, match="target 'torch'"):
        mhc_post_bwd_parallel(**inputs, d_o=d_o, target="torch")


def test_worked_example():
    # The reference on spec §3.5.2's example (n = 2, one column; the kernel's n = 2 forward is in
    # test_forward_other_stream_counts), exact in every format: out[0] = p0·x + a·r0 + c·r1,
    # out[1] = p1·x + b·r0 + d·r1 with comb = [[a, b], [c, d]]; and its backward.
    a, b, c, d, p0, p1, r0, r1, x, g0, g1 = 1.0, 2.0, 3.0, 4.0, 0.5, -1.0, 2.0, -3.0, 4.0, 1.0, 0.25
    inputs = {"x": torch.tensor([[[x]]], dtype=torch.bfloat16),
              "residual": torch.tensor([[[[r0], [r1]]]], dtype=torch.bfloat16),
              "post_layer_mix": torch.tensor([[[[p0], [p1]]]]),
              "comb_res_mix": torch.tensor([[[[a, b], [c, d]]]])}
    want = torch.tensor([[[[p0 * x + a * r0 + c * r1], [p1 * x + b * r0 + d * r1]]]], dtype=torch.bfloat16)
    assert_bitwise_equal(reference.mhc_post_fwd(**inputs), want, "out")
    d_o = torch.tensor([[[[g0], [g1]]]], dtype=torch.bfloat16)
    d_x, d_res, d_post, d_comb = reference.mhc_post_bwd(**inputs, d_o=d_o)
    assert d_x.item() == p0 * g0 + p1 * g1
    assert d_res.flatten().tolist() == [a * g0 + b * g1, c * g0 + d * g1]
    assert d_post.flatten().tolist() == [x * g0, x * g1]
    assert d_comb.flatten().tolist() == [r0 * g0, r0 * g1, r1 * g0, r1 * g1]


def _fp32_chain_bound(terms_abs_sum: torch.Tensor, roundings: int) -> torch.Tensor:
    # Each of ``roundings`` fp32 operations adds at most 2^-24 of the running magnitude, bounded
    # by the sum of the terms' magnitudes.
    return roundings * 2.0**-24 * terms_abs_sum


def test_reference_forward_against_float64():
    # out = bf16(fp32 chain): the chain's n + 1 roundings (product, n fmas) are within
    # (n + 1) 2^-24 Σ|terms| of the exact value, then bf16 rounding adds half an ulp (2^-8
    # relative, at most, of the chain's value).
    inputs = make_inputs(1, 64, 1280, 90)
    exact = reference.post_fwd_exact(**inputs)
    terms = (inputs["post_layer_mix"].double().abs() * inputs["x"].double().abs().unsqueeze(-2)
             + torch.einsum("...io,...ih->...oh", inputs["comb_res_mix"].double().abs(),
                            inputs["residual"].double().abs()))
    chain = _fp32_chain_bound(terms, N + 1)
    err = (reference.mhc_post_fwd(**inputs).double() - exact).abs()
    assert (err <= 2.0**-8 * (exact.abs() + chain) + chain).all()


def test_reference_backward_against_float64_autograd():
    # The float64 formulas of the backward are the gradients of the float64 forward (autograd),
    # and torch.autograd.gradcheck agrees on a small case; the fp32 reference is within its
    # rounding bounds of them: d_x / d_residual as the forward (n roundings, then bf16);
    # d_post / d_comb: a lane partial adds H / 64 terms with one rounding each, the fold 6 more.
    hidden = 1280
    inputs = make_inputs(1, 16, hidden, 91)
    d_o = d_o_like(inputs, 91)
    leaves = {k: v.double().requires_grad_(True) for k, v in inputs.items()}
    reference.post_fwd_exact(**leaves).backward(d_o.double())
    exact = reference.post_bwd_exact(**inputs, d_o=d_o)
    # Both sides are float64 evaluations of the same derivative: they differ by float64 rounding only.
    for name, leaf, want in zip(BACKWARD_NAMES, leaves.values(), exact, strict=True):
        torch.testing.assert_close(leaf.grad, want, rtol=1e-12, atol=1e-12, msg=name)
    small = {k: v[:, :2, ..., :8].double().requires_grad_(True) for k, v in inputs.items()}
    small["x"] = inputs["x"][:, :2, :8].double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda *a: reference.post_fwd_exact(*a), tuple(small.values()))

    got = reference.mhc_post_bwd(**inputs, d_o=d_o)
    g, x, res = d_o.double().abs(), inputs["x"].double().abs(), inputs["residual"].double().abs()
    post, comb = inputs["post_layer_mix"].double().abs()[..., 0], inputs["comb_res_mix"].double().abs()
    bounds = [
        _fp32_chain_bound(torch.einsum("...o,...oh->...h", post, g), N),
        _fp32_chain_bound(torch.einsum("...io,...oh->...ih", comb, g), N),
        _fp32_chain_bound(torch.einsum("...oh,...h->...o", g, x).unsqueeze(-1), hidden // 64 + 6),
        _fp32_chain_bound(torch.einsum("...ih,...oh->...io", res, g), hidden // 64 + 6),
    ]
    for k, (name, value, want, bound) in enumerate(zip(BACKWARD_NAMES, got, exact, bounds, strict=True)):
        err = (value.double() - want).abs()
        limit = 2.0**-8 * (want.abs() + bound) + bound if k < 2 else bound
        assert (err <= limit).all(), f"{name}: max error {err.max().item():.3g}"
