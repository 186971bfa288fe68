"""Reference of ``pre_big_fuse`` (spec §3.7, §5.1): the inference chain of ``pre`` in one call.

Spec §5.1 defines the fused op as the composition, on the same flavor, of

    reduce_partials_and_rmsnorm_fwd (rms_group_size = n·H)  →  mixes (T, n3)
    pre_split_mixes_fwd                                      →  pre (T, n), post (T, n), comb logits
    sinkhorn_fwd                                             →  comb (T, n, n)
    pre_apply_mix_fwd(residual, pre)                         →  layer_input (T, H) bf16

so the fp32 reference is exactly that composition of the part-1 references (each written from its
own section of the spec); ``pre`` is not an output. ``pre_big_fuse_fwd_float64`` chains the exact
float64 formulas of the same stages, for error measurement.
"""

from __future__ import annotations

import torch

from vmi_core.targets import Flavor, get_flavor

from . import norm_fn, pre_apply_mix, pre_split_mixes, sinkhorn


def pre_big_fuse_fwd(gemm_out_mul: torch.Tensor, gemm_out_sqrsum: torch.Tensor, mhc_scale: torch.Tensor,
                     mhc_base: torch.Tensor, residual: torch.Tensor, rms_eps: float, mhc_pre_eps: float,
                     mhc_sinkhorn_eps: float, mhc_post_mult_value: float, sinkhorn_repeat: int,
                     flavor: str | Flavor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(post_mix (T, n) fp32, comb_mix (T, n²) fp32, layer_input (T, H) bf16)`` of the fp32
    partials ``gemm_out_mul (S, T, n3)``, ``gemm_out_sqrsum (S, T)`` and the bf16 ``residual (T, n, H)``,
    in ``flavor``'s fp32 arithmetic."""
    flavor = get_flavor(flavor)
    num_tokens, n, hidden = residual.shape
    _, _, mixes = norm_fn.reduce_partials_and_rmsnorm_fwd(gemm_out_mul.unsqueeze(2), gemm_out_sqrsum.unsqueeze(2),
                                                          n * hidden, rms_eps, flavor)
    pre, post, comb_logits = pre_split_mixes.pre_split_mixes_fwd(mixes, mhc_scale, mhc_base, mhc_post_mult_value,
                                                                 mhc_pre_eps, flavor, n)
    comb = sinkhorn.sinkhorn_forward(comb_logits.view(num_tokens, n, n), sinkhorn_repeat, mhc_sinkhorn_eps, flavor)
    layer_input = pre_apply_mix.mhc_pre_apply_mix_fwd(residual, pre, flavor.name)
    return post, comb.reshape(num_tokens, n * n), layer_input


def pre_big_fuse_fwd_float64(gemm_out_mul: torch.Tensor, gemm_out_sqrsum: torch.Tensor, mhc_scale: torch.Tensor,
                             mhc_base: torch.Tensor, residual: torch.Tensor, rms_eps: float, mhc_pre_eps: float,
                             mhc_sinkhorn_eps: float, mhc_post_mult_value: float, sinkhorn_repeat: int
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(post_mix, comb_mix, layer_input)`` of the exact formulas in float64, ``layer_input`` not
    rounded (the scalars as the stages take them: ``rms_eps`` the double, the others their fp32
    values)."""
    num_tokens, n, hidden = residual.shape
    _, _, mixes = norm_fn.reduce_partials_and_rmsnorm_fwd_float64(gemm_out_mul.unsqueeze(2),
                                                                  gemm_out_sqrsum.unsqueeze(2), n * hidden, rms_eps)
    pre, post, comb_logits = pre_split_mixes.pre_split_mixes_fwd_exact(mixes, mhc_scale, mhc_base,
                                                                       mhc_post_mult_value, mhc_pre_eps, n)
    comb = sinkhorn.sinkhorn_forward_float64(comb_logits.reshape(num_tokens, n, n), sinkhorn_repeat, mhc_sinkhorn_eps)
    layer_input = pre_apply_mix.mhc_pre_apply_mix_fwd_exact(residual, pre)
    return post, comb.reshape(num_tokens, n * n), layer_input
