"""``vmi_quant.autograd``: the RMSNorm and SwiGLU autograd Functions.

* The derivative formulas the backward kernels implement (spec quant-b §5.2, §7.2), written out
  in float64, pass ``torch.autograd.gradcheck`` against numerical differentiation of the float64
  forward formulas.
* The Functions on the ``cpu`` kernels give torch autograd's gradients of the same math in
  float64 (within fp32 accuracy), and exactly the bits of calling the backward kernel directly.
* The FP8 variant's quantized output is not differentiable; its bf16 output is.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import assert_bitwise_equal, randn
from vmi_quant import (
    NormCastOptions,
    RMSNormFunction,
    SwiGLUFunction,
    norm_backward,
    norm_forward_and_per_token_cast,
    reset_runtime_config,
    set_token_alignment,
)
from vmi_quant.inputs import expert_rows

EPS = 1e-6


# --- the derivative formulas in float64 -------------------------------------------------------

class NormFormulas(torch.autograd.Function):
    """§4.2 forward, §5.2 backward, in float64 (rstd saved, as the kernels do)."""

    @staticmethod
    def forward(ctx, x, weight, residual, out_scale):
        r = x + residual
        rstd = torch.rsqrt((r * r).mean(-1, keepdim=True) + EPS)
        ctx.save_for_backward(r, weight, rstd)
        ctx.out_scale = out_scale
        return r * rstd * (weight * out_scale), r

    @staticmethod
    def backward(ctx, out_grad, residual_out_grad):
        r, weight, rstd = ctx.saved_tensors
        xh = r * rstd
        d = out_grad * ctx.out_scale
        g = d * weight
        m = (xh * g).sum(-1, keepdim=True) / r.shape[-1]
        x_grad = (g - xh * m) * rstd + residual_out_grad
        return x_grad, (xh * d).sum(0), x_grad, None


class SwiGLUFormulas(torch.autograd.Function):
    """§6.2 forward, §7.2 backward, in float64 (clamp, per-row weights and their gradient)."""

    @staticmethod
    def forward(ctx, x, topk_weights, rsf, clamp):
        a, b = x.chunk(2, dim=-1)
        a_c, b_c = a.clamp(max=clamp), b.clamp(-clamp, clamp)
        act = a_c * torch.sigmoid(a_c) * b_c
        ctx.save_for_backward(a, b, topk_weights)
        ctx.rsf, ctx.clamp = rsf, clamp
        return act * (topk_weights * rsf)[:, None]

    @staticmethod
    def backward(ctx, g):
        a, b, topk_weights = ctx.saved_tensors
        c = ctx.clamp
        a_c, b_c = a.clamp(max=c), b.clamp(-c, c)
        s = 1 / (1 + torch.exp(-a_c))
        w = (topk_weights * ctx.rsf)[:, None]
        gws = g * w * s
        d_a = torch.where(a > c, 0.0, gws * b_c * (1 + a_c * (1 - s)))
        d_b = torch.where(b.abs() > c, 0.0, gws * a_c)
        weight_grad = (g * a_c * s * b_c).sum(-1) * ctx.rsf
        return torch.cat([d_a, d_b], dim=-1), weight_grad, None, None


def test_norm_formulas_are_the_derivative():
    g = torch.Generator().manual_seed(1)
    x, weight, residual = (torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True)
                           for s in ((5, 24), (24,), (5, 24)))
    assert torch.autograd.gradcheck(lambda *t: NormFormulas.apply(*t, 0.3), (x, weight, residual))


def test_swiglu_formulas_are_the_derivative():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 32, generator=g, dtype=torch.float64)
    # Keep every input away from the clamp's kinks at +-0.8, where the derivative jumps.
    x = torch.where((x.abs() - 0.8).abs() < 0.05, x + 0.2, x).requires_grad_()
    topk_weights = torch.rand(6, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: SwiGLUFormulas.apply(*t, 2.5, 0.8), (x, topk_weights))


# --- RMSNormFunction on the kernels ------------------------------------------------------------

def _norm_leaves(dtype, seed, hidden=96, with_residual=True):
    x = randn((2, 7, hidden), seed, dtype).requires_grad_()
    weight = randn((hidden,), seed + 1, dtype).requires_grad_()
    residual = randn((2, 7, hidden), seed + 2, dtype).requires_grad_() if with_residual else None
    return x, weight, residual


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_function_gives_torch_autograd_gradients(dtype):
    x, weight, residual = _norm_leaves(dtype, 10)
    out, residual_out, data, sf = RMSNormFunction.apply(x, weight, residual, EPS, 0.3, None)
    assert data is None and sf is None
    out_grad, residual_grad = randn(out.shape, 20, dtype), randn(out.shape, 21, dtype)
    torch.autograd.backward((out, residual_out), (out_grad, residual_grad))

    leaves = [t.detach().double().requires_grad_() for t in (x, weight, residual)]
    r = leaves[0] + leaves[2]
    r_rounded = r + (r.to(dtype).double() - r).detach()  # the forward rounds the sum to x's dtype
    out64 = r_rounded * torch.rsqrt((r_rounded**2).mean(-1, keepdim=True) + EPS) * leaves[1] * 0.3
    torch.autograd.backward((out64, r), (out_grad.double(), residual_grad.double()))
    # The kernels round every step to fp32 (and the outputs to bf16): fp32 error of H-term sums, or
    # bf16's half-ulp 2^-9 on the gradients, against the float64 derivative.
    tol = {"rtol": 2e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for got, want in zip((x.grad, weight.grad, residual.grad), (t.grad for t in leaves), strict=True):
        torch.testing.assert_close(got.double(), want, **tol)
    assert_bitwise_equal(x.grad, residual.grad, "residual gradient = x gradient")


def test_rmsnorm_function_runs_the_backward_kernel():
    x, weight, _ = _norm_leaves(torch.bfloat16, 30, with_residual=False)
    out, residual_out, _, _ = RMSNormFunction.apply(x, weight, None, EPS, 1.0, None)
    assert residual_out is None
    out_grad = randn(out.shape, 31, torch.bfloat16)
    out.backward(out_grad)
    from vmi_quant import norm_forward
    _, rstd, _ = norm_forward(x.detach(), weight.detach(), EPS)
    want_x, want_w = norm_backward(out_grad.view(14, -1), x.detach().view(14, -1), weight.detach(), rstd.view(-1))
    assert_bitwise_equal(x.grad, want_x.view(x.shape), "x.grad")
    assert_bitwise_equal(weight.grad, want_w, "weight.grad")


def test_rmsnorm_function_passes_target_and_flavor_to_both_kernels(monkeypatch):
    import vmi_quant.autograd as autograd

    x, weight, _ = _norm_leaves(torch.bfloat16, 50, with_residual=False)
    with pytest.raises(ValueError, match="target"):
        RMSNormFunction.apply(x, weight, None, EPS, 1.0, None, "npu", None)
    seen = []

    def spy(*args, **kwargs):
        seen.append((kwargs["target"], kwargs["flavor"]))
        return norm_backward(*args, **kwargs)

    monkeypatch.setattr(autograd, "norm_backward", spy)
    out, _, data, sf = RMSNormFunction.apply(x, weight, None, EPS, 1.0, NormCastOptions(), "torch", "cuda")
    (want_data, want_sf), want_out, _, _ = norm_forward_and_per_token_cast(
        x.detach(), weight.detach(), EPS, "e4m3", 32, with_out_bf16=True, target="torch", flavor="cuda")
    assert_bitwise_equal(data, want_data, "data")
    assert_bitwise_equal(out.detach(), want_out, "out")
    out.sum().backward()
    assert seen == [("torch", "cuda")]


def test_rmsnorm_function_fp8_output_is_not_differentiable():
    x, weight, residual = _norm_leaves(torch.bfloat16, 40)
    cast = NormCastOptions(round_sf=True, use_packed_ue8m0=True)
    out, residual_out, data, sf = RMSNormFunction.apply(x, weight, residual, EPS, 1.0, cast)
    assert not data.requires_grad and not sf.requires_grad
    assert out.dtype == torch.bfloat16 and out.requires_grad
    (want_data, want_sf), want_out, _, _ = norm_forward_and_per_token_cast(
        x.detach(), weight.detach(), EPS, "e4m3", 32, residual.detach(), round_sf=True, use_packed_ue8m0=True,
        with_out_bf16=True)
    assert_bitwise_equal(data, want_data, "data")
    assert_bitwise_equal(sf, want_sf, "sf")
    assert_bitwise_equal(out.detach(), want_out, "out")
    out.sum().backward()
    assert x.grad is not None and weight.grad is not None and torch.equal(x.grad, residual.grad)


# --- SwiGLUFunction on the kernels -------------------------------------------------------------

def test_swiglu_function_gives_torch_autograd_gradients():
    set_token_alignment(4)
    try:
        psum = torch.tensor([3, 4, 9], dtype=torch.int32)
        x = randn((12, 128), 50, torch.float32).requires_grad_()
        topk_weights = torch.rand(12, generator=torch.Generator().manual_seed(51)).requires_grad_()
        out = SwiGLUFunction.apply(x, topk_weights, psum, 2.5, 0.8)
        valid = expert_rows(psum, 12, 4)
        assert not out.detach()[~valid].any()  # padding rows are zeros
        out_grad = randn(out.shape, 52, torch.float32)
        out.backward(out_grad)

        x64 = x.detach().double().requires_grad_()
        w64 = topk_weights.detach().double().requires_grad_()
        a, b = x64.chunk(2, dim=-1)
        a_c, b_c = a.clamp(max=0.8), b.clamp(-0.8, 0.8)
        out64 = a_c * torch.sigmoid(a_c) * b_c * (w64 * 2.5)[:, None]
        (out64 * out_grad.double() * valid[:, None]).sum().backward()
        # fp32 rounding of each step (and of the weight gradient's H-term sum) against float64.
        torch.testing.assert_close(x.grad.double(), x64.grad, rtol=2e-5, atol=1e-5)
        torch.testing.assert_close(topk_weights.grad.double(), w64.grad, rtol=2e-5, atol=1e-5)
        assert not x.grad[~valid].any() and not topk_weights.grad[~valid].any()
    finally:
        reset_runtime_config()


def test_swiglu_function_refuses_an_alignment_changed_before_backward():
    """The backward must place the psum rows as the forward did: rows 3 and 9-11 are padding at
    alignment 4, and row 3 would be expert 1's at alignment 1."""
    set_token_alignment(4)
    try:
        psum = torch.tensor([3, 4, 9], dtype=torch.int32)
        x = randn((12, 128), 50, torch.float32).requires_grad_()
        out = SwiGLUFunction.apply(x, None, psum, None, None)
        set_token_alignment(1)
        with pytest.raises(ValueError, match=r"token alignment changed between forward \(4\) and backward \(1\)"):
            out.sum().backward()
    finally:
        reset_runtime_config()


def _second_order_cases():
    """The Functions on the ``torch`` target (their plumbing is the kernels'): name, call, leaves."""
    x, weight, residual = _norm_leaves(torch.float32, 70)
    swiglu_x = randn((12, 128), 71, torch.bfloat16).requires_grad_()
    return [
        ("RMSNormFunction", lambda: RMSNormFunction.apply(x, weight, residual, EPS, 0.3, None)[:2],
         (x, weight, residual)),
        ("SwiGLUFunction", lambda: (SwiGLUFunction.apply(swiglu_x, None, None, None, None),),
         (swiglu_x,)),
    ]


@pytest.mark.parametrize("case", range(2))
def test_second_derivative_raises_naming_the_function(case, vmi_env):
    """``grad(out.sum(), create_graph=True)`` gets a constant incoming gradient: the gradients are the
    first-order ones, and differentiating them raises instead of giving zeros."""
    vmi_env.setenv("VMI_TARGET", "torch")
    name, call, inputs = _second_order_cases()[case]
    loss = sum(o.float().sum() for o in call())
    grads = torch.autograd.grad(loss, inputs, create_graph=True)
    plain = torch.autograd.grad(sum(o.float().sum() for o in call()), inputs)
    for g, want in zip(grads, plain, strict=True):
        assert g.requires_grad
        assert_bitwise_equal(g.detach(), want, "first-order gradient")
    with pytest.raises(RuntimeError, match=f"{name} has no second derivative"):
        torch.autograd.grad(grads[0].sum(), inputs, allow_unused=True)
