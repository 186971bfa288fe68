"""The mHC layer in float64, differentiable with torch's autograd: the oracle of the autograd layer.

Each function is the exact formula of its op (spec §1.2, §3.x.2) on the inputs' values in float64:
no TF32 operands, no fp32 steps. The ops whose outputs are bf16 (``mhc_pre_apply_mix``,
``mhc_post``) round their result to bf16 as the op specifies, straight-through: the forward value is
the rounded one and the derivative is that of the exact formula, as the backward kernels compute
it. ``torch.autograd`` through these gives the gradients that ``vmi_mhc.autograd`` approximates (its
remaining differences: fp32 arithmetic, TF32 operands, bf16 gradient stores). Arbitrary leading
dims, as the autograd layer takes them.
"""

from __future__ import annotations

import torch

from .post import post_fwd_exact
from .sinkhorn import sinkhorn_forward_float64


def _f32(value: float) -> float:
    """A scalar option as the kernels take it (rounded to fp32 once)."""
    return float(torch.tensor(value, dtype=torch.float32))


def bf16_store(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to bf16 (nearest even) in value, with the derivative of the identity."""
    return t + (t.to(torch.bfloat16).double() - t).detach()


def expand_to_mhc(hidden: torch.Tensor, mhc_mult: int) -> torch.Tensor:
    return hidden.double().unsqueeze(-2).expand(*hidden.shape[:-1], mhc_mult, hidden.shape[-1])


def mhc_pre_norm_fn(residual: torch.Tensor, fn: torch.Tensor, norm_weight: torch.Tensor | None,
                    eps: float) -> torch.Tensor:
    """``(flat(R) · (fn ⊙ w)ᵀ) · (mean(flat(R)²) + eps)^-½``, ``(..., n3)``."""
    x = residual.double().flatten(-2)
    fn_eff = fn.double() if norm_weight is None else fn.double() * norm_weight.double()
    r = torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    return (x @ fn_eff.T) * r


def mhc_pre_split_mixes(input_mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, mhc_mult: int,
                        post_mult_value: float, pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pre (..., n, 1), post (..., n, 1), comb_logits (..., n, n))`` of ``z = x · g + b``."""
    n = mhc_mult
    scale = scale.double()
    gains = torch.cat([scale[0].expand(n), scale[1].expand(n), scale[2].expand(n * n)])
    z = input_mixes.double() * gains + base.double()
    pre = torch.sigmoid(z[..., :n]) + _f32(pre_eps)
    post = torch.sigmoid(z[..., n:2 * n]) * _f32(post_mult_value)
    return pre.unsqueeze(-1), post.unsqueeze(-1), z[..., 2 * n:].unflatten(-1, (n, n))


def sinkhorn_normalize(x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    return sinkhorn_forward_float64(x, repeat, eps)


def mhc_pre_apply_mix(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """``bf16(Σ_m mix[..., m] · x[..., m, :])``."""
    return bf16_store((mix.double() * x.double()).sum(-2))


def mhc_post(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
             comb_res_mix: torch.Tensor) -> torch.Tensor:
    return bf16_store(post_fwd_exact(x, residual, post_layer_mix, comb_res_mix))


def mhc_head_compute_mix(input_mix: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                         pre_eps: float) -> torch.Tensor:
    """``σ(input_mix · scale + base) + pre_eps``, ``scale`` of shape ``(1,)``."""
    return torch.sigmoid(input_mix.double() * scale.double() + base.double()) + _f32(pre_eps)


def mhc_pre(residual, fn, scale, base, *, norm_weight=None, norm_eps=1e-6, mhc_mult=4, post_mult_value=1.0,
            pre_eps=1e-6, sinkhorn_eps=1e-6, sinkhorn_repeat=10):
    """``(layer_input, (post_mix, comb_mix))`` of one sublayer's pre stage."""
    mixes = mhc_pre_norm_fn(residual, fn, norm_weight, _f32(norm_eps))
    pre, post, comb_logits = mhc_pre_split_mixes(mixes, scale, base, mhc_mult, post_mult_value, pre_eps)
    comb = sinkhorn_normalize(comb_logits, sinkhorn_repeat, sinkhorn_eps)
    return mhc_pre_apply_mix(residual, pre), (post, comb)


def mhc_head(residual, fn, scale, base, *, norm_weight=None, norm_eps=1e-6, mhc_mult=4, pre_eps=1e-6):
    """The LM head's input; ``fn`` has ``n`` rows (the kernels' zero padding changes nothing)."""
    mixes = mhc_pre_norm_fn(residual, fn, norm_weight, _f32(norm_eps))
    mix = mhc_head_compute_mix(mixes, scale, base, pre_eps)
    return mhc_pre_apply_mix(residual, mix.unsqueeze(-1))
