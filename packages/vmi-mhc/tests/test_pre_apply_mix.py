"""pre_apply_mix on the cpu and ascend-sim targets, bit for bit against the torch reference
``reference.pre_apply_mix`` (spec §3.6), the reference backward against float64 autograd, and the
kernels' error against the float64 formulas.

Inputs follow the v1 tests: streams ``sigmoid(randn)``, weights a softmax over the streams,
``o_grad`` and the accumulated ``x_grad`` normal samples. The forward kernel is specialised on
``(n, flavor)`` (hidden size runtime), the backward on ``(n, H)``: the default set runs n = 4, the
forward over several hidden sizes in both flavors, the backward at H = 200 (a masked register
tail), and the backward on ascend-sim; other stream counts, the hidden-size sweep, the largest
hidden size, large token counts and the forward on ascend-sim run under ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.errors import forbid_kernels
from vmi_mhc import (
    mhc_pre_apply_mix_bwd,
    mhc_pre_apply_mix_bwd_parallel,
    mhc_pre_apply_mix_fwd,
    mhc_pre_apply_mix_fwd_parallel,
)
from vmi_mhc.kernels.pre_apply_mix import max_hidden
from vmi_mhc.reference import pre_apply_mix as reference

TOKENS = (0, 1, 37)
FWD_HIDDEN = (1, 200, 1280, 7168)
BWD_HIDDEN = 200


def make_inputs(num_tokens: int, n: int, hidden: int, seed: int) -> dict:
    g = generator(seed)
    return {
        "x": torch.sigmoid(torch.randn(num_tokens, n, hidden, generator=g)).to(torch.bfloat16),
        "mix": torch.softmax(torch.randn(num_tokens, n, generator=g), dim=-1),
        "o_grad": torch.randn(num_tokens, hidden, generator=g).to(torch.bfloat16),
        "x_grad": torch.randn(num_tokens, n, hidden, generator=g).to(torch.bfloat16),
    }


def run_fwd(x, mix, *, target=None, flavor=None):
    o = torch.full((x.shape[0], x.shape[2]), float("nan"), dtype=torch.bfloat16)
    assert mhc_pre_apply_mix_fwd(x, mix, o, target=target, flavor=flavor) is o
    return o


def check_fwd(n, tokens, hidden, *, target=None, flavor=None) -> None:
    for seed, num_tokens in enumerate(tokens):
        for h in hidden:
            inputs = make_inputs(num_tokens, n, h, seed)
            o = run_fwd(inputs["x"], inputs["mix"], target=target, flavor=flavor)
            want = reference.mhc_pre_apply_mix_fwd(inputs["x"], inputs["mix"], flavor or "ascend")
            assert_bitwise_equal(o, want, f"o [n={n} T={num_tokens} H={h} target={target} flavor={flavor}]")


def check_bwd(n, tokens, hidden, *, target=None, flavor=None, mix_shape="(T, n)") -> None:
    for seed, num_tokens in enumerate(tokens):
        inputs = make_inputs(num_tokens, n, hidden, seed)
        mix = inputs["mix"] if mix_shape == "(T, n)" else inputs["mix"].unsqueeze(-1)
        x_grad = inputs["x_grad"].clone()
        mix_grad = mhc_pre_apply_mix_bwd(inputs["o_grad"], inputs["x"], mix, x_grad, target=target, flavor=flavor)
        want_x_grad, want_mix_grad = reference.mhc_pre_apply_mix_bwd(inputs["o_grad"], inputs["x"], inputs["mix"],
                                                                     inputs["x_grad"])
        label = f"n={n} T={num_tokens} H={hidden} target={target} flavor={flavor}"
        assert_bitwise_equal(x_grad, want_x_grad, f"x_grad [{label}]")
        assert_bitwise_equal(mix_grad, want_mix_grad, f"mix_grad [{label}]")


@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
def test_forward_matches_reference(flavor):
    check_fwd(4, TOKENS, FWD_HIDDEN, flavor=flavor)
    check_sign_of_an_all_zero_sum(flavor)


@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
def test_backward_matches_reference(flavor):
    # Both flavors compute the same bits (one kernel); mix given as (T, n) and as (T, n, 1).
    check_bwd(4, TOKENS, BWD_HIDDEN, flavor=flavor, mix_shape="(T, n)" if flavor == "ascend" else "(T, n, 1)")


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 3, 8, 16])
@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
def test_forward_other_stream_counts(n, flavor):
    check_fwd(n, (1, 37), (200, 1280), flavor=flavor)


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 3, 8, 16])
def test_backward_other_stream_counts(n):
    check_bwd(n, (1, 37), 1000)


@pytest.mark.slow
@pytest.mark.parametrize("hidden", [1280, 1920, 2560, 4096, 4224, 5120, 7168, 7680, 8192])
def test_hidden_sizes(hidden):
    # The backward's float64-held reference sums are memory-hungry: many tokens at one size below.
    check_fwd(4, (4099,), (hidden,), flavor="cuda")
    check_bwd(4, (1, 300), hidden)


@pytest.mark.slow
def test_backward_many_tokens():
    check_bwd(4, (4099,), 1280)


@pytest.mark.slow
def test_largest_hidden_size():
    check_bwd(4, (3,), max_hidden(4))
    check_bwd(16, (3,), max_hidden(16))


def test_matches_reference_on_ascend_sim():
    # The backward (row sums, weight gathers, in-place update): one token, and 193 tokens (4 tiles
    # on core 0, more than its 3 buffer versions) under consumers_first and under producers_first,
    # where a missing wait between pipes shows up as wrong data.
    for schedule, tokens in (("consumers_first", (1, 193)), ("producers_first", (193,))):
        with sim_schedule(schedule):
            check_bwd(4, tokens, BWD_HIDDEN, target="ascend-sim")


@pytest.mark.slow
def test_forward_on_ascend_sim():
    with sim_schedule("consumers_first"):
        check_fwd(4, (1, 70), (200, 1280), target="ascend-sim")


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 8])
def test_other_stream_counts_on_ascend_sim(n):
    check_fwd(n, (3, 130), (64, 1000), target="ascend-sim")
    check_bwd(n, (3, 130), 1000, target="ascend-sim")


@pytest.mark.slow
def test_large_hidden_size_on_ascend_sim():
    # One buffer version (the token's rows fill most of the unified buffer).
    check_bwd(4, (2, 65), 7168, target="ascend-sim")


def check_sign_of_an_all_zero_sum(flavor):
    # Every product mix · x is -0 (x = -0, mix > 0): the ascend chain starts from the product
    # (-0, and -0 + -0 stays -0); the cuda chain starts from +0 (+0 + -0 = +0).
    x = torch.full((3, 4, 130), -0.0, dtype=torch.bfloat16)
    o = run_fwd(x, torch.full((3, 4), 0.25), flavor=flavor)
    assert (o == 0).all()
    signs = o.float().signbit()
    assert signs.all() if flavor == "ascend" else not signs.any()


def test_backward_accumulates_into_x_grad():
    # x_grad is updated in place (and only it): twice the same call adds the contribution twice,
    # each time with one rounding per element.
    inputs = make_inputs(5, 4, BWD_HIDDEN, 3)
    x_grad = inputs["x_grad"].clone()
    before = {name: t.clone() for name, t in inputs.items()}
    for _ in range(2):
        mhc_pre_apply_mix_bwd(inputs["o_grad"], inputs["x"], inputs["mix"], x_grad)
    want = inputs["x_grad"]
    for _ in range(2):
        want, _ = reference.mhc_pre_apply_mix_bwd(inputs["o_grad"], inputs["x"], inputs["mix"], want)
    assert_bitwise_equal(x_grad, want, "x_grad")
    for name, t in before.items():
        assert_bitwise_equal(inputs[name], t, f"{name} untouched")


def test_non_finite_values_propagate():
    # A NaN in the streams (token 1), +inf in o_grad (token 2) and an infinite weight (token 3).
    inputs = make_inputs(6, 4, BWD_HIDDEN, 4)
    inputs["x"][1, 2, 10] = float("nan")
    inputs["o_grad"][2, 20] = float("inf")
    inputs["mix"][3, 1] = float("inf")
    for flavor in ("ascend", "cuda"):
        o = run_fwd(inputs["x"], inputs["mix"], flavor=flavor)
        want = reference.mhc_pre_apply_mix_fwd(inputs["x"], inputs["mix"], flavor)
        assert_bitwise_equal(o, want, f"o [{flavor}]", any_nan=True)
        assert o[1, 10].isnan() and o[3].float().isinf().all() and o[[0, 2, 4, 5]].float().isfinite().all()
    x_grad = inputs["x_grad"].clone()
    mix_grad = mhc_pre_apply_mix_bwd(inputs["o_grad"], inputs["x"], inputs["mix"], x_grad)
    want_x_grad, want_mix_grad = reference.mhc_pre_apply_mix_bwd(inputs["o_grad"], inputs["x"], inputs["mix"],
                                                                 inputs["x_grad"])
    assert_bitwise_equal(x_grad, want_x_grad, "x_grad", any_nan=True)
    assert_bitwise_equal(mix_grad, want_mix_grad, "mix_grad", any_nan=True)
    assert mix_grad[1, 2].isnan() and not mix_grad[1, [0, 1, 3]].isnan().any()
    assert not mix_grad[2].isfinite().any() and x_grad[2, :, 20].float().isinf().all()
    assert x_grad[3, 1].float().isinf().sum() > 0 and mix_grad[[0, 4, 5]].isfinite().all()


def test_error_against_float64():
    # Bounds from the arithmetic (u = 2^-24 for fp32 roundings, 2^-8 for the final bf16 one):
    # o: n fused steps, each one fp32 rounding, then bf16: |o - exact| <= 2^-8 |exact| +
    #    (1 + 2^-8) n u Σ|mix · x|.
    # x_grad: one fused rounding then bf16 (a double rounding): <= (2^-8 + 2 u) |exact|.
    # mix_grad: every term passes through H / 64 fused steps and six folds, each a rounding:
    #    <= (H / 64 + 6) u Σ_h |o_grad · x| (first order; the margin covers the rest).
    n, hidden, u = 4, BWD_HIDDEN, 2.0**-24
    inputs = make_inputs(300, n, hidden, 5)
    x, mix, o_grad, x_grad = inputs["x"], inputs["mix"], inputs["o_grad"], inputs["x_grad"]
    exact = reference.mhc_pre_apply_mix_fwd_exact(x, mix)
    magnitude = (mix.double().unsqueeze(-1) * x.double()).abs().sum(1)
    for flavor in ("ascend", "cuda"):
        error = (run_fwd(x, mix, flavor=flavor).double() - exact).abs()
        assert (error <= 2.0**-8 * exact.abs() + (1 + 2.0**-8) * n * u * magnitude).all(), flavor
    new_x_grad = x_grad.clone()
    mix_grad = mhc_pre_apply_mix_bwd(o_grad, x, mix, new_x_grad)
    exact_x_grad, exact_mix_grad = reference.mhc_pre_apply_mix_bwd_exact(o_grad, x, mix, x_grad)
    assert ((new_x_grad.double() - exact_x_grad).abs() <= (2.0**-8 + 2 * u) * exact_x_grad.abs()).all()
    terms = (o_grad.double().unsqueeze(1) * x.double()).abs().sum(-1)
    assert ((mix_grad.double() - exact_mix_grad).abs() <= 1.01 * (hidden / 64 + 6) * u * terms).all()


def test_reference_backward_is_the_gradient():
    # The float64 backward is the adjoint of the float64 forward (gradcheck, x_grad starting at 0),
    # and equals autograd's.
    class ApplyMix(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, mix):
            ctx.save_for_backward(x, mix)
            return reference.mhc_pre_apply_mix_fwd_exact(x, mix)

        @staticmethod
        def backward(ctx, o_grad):
            x, mix = ctx.saved_tensors
            return reference.mhc_pre_apply_mix_bwd_exact(o_grad, x, mix, torch.zeros_like(x))

    x = torch.randn(3, 4, 9, dtype=torch.float64, requires_grad=True)
    mix = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ApplyMix.apply, (x, mix))
    o_grad = torch.randn(3, 9, dtype=torch.float64)
    want = torch.autograd.grad((mix.unsqueeze(-1) * x).sum(1), (x, mix), o_grad)
    got = reference.mhc_pre_apply_mix_bwd_exact(o_grad, x.detach(), mix.detach(), torch.zeros(3, 4, 9,
                                                                                               dtype=torch.float64))
    # Both sides are float64 evaluations of the same derivative: they differ by float64 rounding only.
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, rtol=1e-12, atol=1e-12)


def test_no_tokens_launch_nothing(monkeypatch):
    forbid_kernels(monkeypatch, why="T == 0")
    x = torch.empty(0, 4, 64, dtype=torch.bfloat16)
    for target in (None, "torch"):
        o = mhc_pre_apply_mix_fwd(x, torch.empty(0, 4), torch.empty(0, 64, dtype=torch.bfloat16), target=target)
        assert o.shape == (0, 64)
        mix_grad = mhc_pre_apply_mix_bwd(torch.empty(0, 64, dtype=torch.bfloat16), x, torch.empty(0, 4, 1),
                                         torch.empty(0, 4, 64, dtype=torch.bfloat16), target=target)
        assert mix_grad.shape == (0, 4) and mix_grad.dtype == torch.float32


def test_parallel_entry_points_and_torch_target_agree():
    inputs = make_inputs(9, 4, BWD_HIDDEN, 6)
    o = torch.empty(9, BWD_HIDDEN, dtype=torch.bfloat16)
    assert_bitwise_equal(mhc_pre_apply_mix_fwd_parallel(inputs["x"], inputs["mix"], o),
                         run_fwd(inputs["x"], inputs["mix"], target="torch"), "o")
    kernel_x_grad, torch_x_grad = inputs["x_grad"].clone(), inputs["x_grad"].clone()
    mix_grad = mhc_pre_apply_mix_bwd_parallel(inputs["o_grad"], inputs["x"], inputs["mix"], kernel_x_grad)
    want = mhc_pre_apply_mix_bwd(inputs["o_grad"], inputs["x"], inputs["mix"], torch_x_grad, target="torch")
    assert_bitwise_equal(mix_grad, want, "mix_grad")
    assert_bitwise_equal(kernel_x_grad, torch_x_grad, "x_grad")


def test_custom_ops():
    # torch.ops.vmi.mhc_pre_apply_mix_fwd allocates o (its .out overload writes a given one); the
    # backward's x_grad is a mutable argument.
    inputs = make_inputs(5, 4, BWD_HIDDEN, 7)
    o = torch.ops.vmi.mhc_pre_apply_mix_fwd(inputs["x"], inputs["mix"])
    assert_bitwise_equal(o, reference.mhc_pre_apply_mix_fwd(inputs["x"], inputs["mix"], "ascend"), "o")
    x_grad = inputs["x_grad"].clone()
    mix_grad = torch.ops.vmi.mhc_pre_apply_mix_bwd(inputs["o_grad"], inputs["x"], inputs["mix"], x_grad)
    want = reference.mhc_pre_apply_mix_bwd(inputs["o_grad"], inputs["x"], inputs["mix"], inputs["x_grad"])
    assert_bitwise_equal(x_grad, want[0], "x_grad")
    assert_bitwise_equal(mix_grad, want[1], "mix_grad")

