"""PyTorch reference of ``pre_split_mixes`` (spec §3.8.2), forward and backward.

Every step is one fp32 operation with its own rounding, in the order the kernels document:

* ``z = fl(fl(x · g_c) + b)`` (two roundings, no fused multiply-add) with the gain
  ``g_c = scale[min(2, i div n)]`` of entry ``i``;
* ``σ(z) = fl(1 / fl(exp(-z) + 1))`` with the correctly rounded exp (``vmi_core.fp32.exp``) and
  the flavor's division (``vmi_core.fp32.divide``: the Ascend vector division on the ``ascend`` flavor);
* ``pre = fl(σ + f32(pre_eps))``, ``post = fl(σ · f32(post_mult))``, ``comb = z``;
* backward: ``gz_pre = fl(fl(d · s) · fl(1 - s))`` with ``s`` recomputed,
  ``gz_post = fl(fl(d · p) · fl(1 - fl(p / f32(post_mult))))`` with the saved ``p`` (the quotient
  taken as 0 when ``post_mult = 0``), ``gz_comb = d``, ``input_mixes_grad = fl(gz · g_c)``.

The parameter gradients are sums over tokens in an order that depends on ``T`` only: per block of
``token_block`` consecutive tokens one partial row, ``base`` entry ``i`` the lane sum
(``vmi_core.sums.lane_sum``) of ``gz[:, i]`` over the block's tokens, ``scale`` entry ``c`` the
lane sum over the block's tokens of each token's ``Σ_{i in c} fl(gz · x)`` (from +0.0, ``i``
increasing); then the partial rows added in block order from +0.0. The ``*_exact`` functions
evaluate the same formulas in float64 without intermediate rounding, for error measurement.
"""

from __future__ import annotations

import torch

from vmi_core.fp32 import divide, exp
from vmi_core.sums import lane_sum
from vmi_core.targets import Flavor

TOKEN_BLOCK = 64
"""Tokens per partial row of the parameter gradients (the kernels' token tile)."""


def gain_index(mhc_mult: int) -> torch.Tensor:
    """int64 ``(n·(n+2),)``: the gain ``min(2, i div n)`` of each mix entry (0 pre, 1 post, 2 comb)."""
    width = mhc_mult * (mhc_mult + 2)
    return torch.clamp(torch.arange(width) // mhc_mult, max=2)


def sigmoid(z: torch.Tensor, flavor: str | Flavor) -> torch.Tensor:
    """``fl(1 / fl(exp(-z) + 1))`` of fp32 ``z`` with the flavor's division (``vmi_core.fp32.divide``)."""
    return divide(torch.ones_like(z), exp(-z) + 1.0, flavor)


def _logits(input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_mult: int):
    gains = mhc_scale[gain_index(mhc_mult).to(mhc_scale.device)]
    return input_mixes * gains + mhc_base, gains


def pre_split_mixes_fwd(input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                        mhc_post_mult_value: float, mhc_pre_eps: float, flavor: str | Flavor = "ascend",
                        mhc_mult: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pre (T, n), post (T, n), comb (T, n²))`` of fp32 ``input_mixes (T, n·(n+2))``."""
    z, _ = _logits(input_mixes, mhc_scale, mhc_base, mhc_mult)
    n = mhc_mult
    pre = sigmoid(z[:, :n], flavor) + torch.tensor(mhc_pre_eps, dtype=torch.float32)
    post = sigmoid(z[:, n:2 * n], flavor) * torch.tensor(mhc_post_mult_value, dtype=torch.float32)
    return pre, post, z[:, 2 * n:].clone(memory_format=torch.contiguous_format)


def logit_grads(pre_layer_mix_grad: torch.Tensor, post_layer_mix_grad: torch.Tensor,
                comb_res_mix_grad: torch.Tensor, input_mixes: torch.Tensor, post_layer_mix: torch.Tensor,
                mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_post_mult_value: float,
                flavor: str | Flavor = "ascend", mhc_mult: int = 4) -> torch.Tensor:
    """fp32 ``gz (T, n·(n+2))``: the gradient with respect to the logits ``z``."""
    n = mhc_mult
    z, _ = _logits(input_mixes, mhc_scale, mhc_base, mhc_mult)
    s = sigmoid(z[:, :n], flavor)
    gz_pre = (pre_layer_mix_grad * s) * (1.0 - s)
    p = post_layer_mix
    mult = torch.tensor(mhc_post_mult_value, dtype=torch.float32)
    ratio = torch.zeros_like(p) if mhc_post_mult_value == 0 else divide(p, mult.expand_as(p), flavor)
    gz_post = (post_layer_mix_grad * p) * (1.0 - ratio)
    return torch.cat([gz_pre, gz_post, comb_res_mix_grad], dim=1)


def block_partials(gz: torch.Tensor, input_mixes: torch.Tensor, mhc_mult: int = 4,
                   token_block: int = TOKEN_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block of ``token_block`` tokens: ``(scale partials (B, 3), base partials (B, n3))``."""
    groups = gain_index(mhc_mult).to(gz.device)
    products = gz * input_mixes
    # Per token: the products of each gain's entries, summed from +0.0 in increasing entry order.
    token_sums = torch.zeros((gz.shape[0], 3), dtype=torch.float32, device=gz.device)
    for i in range(gz.shape[1]):
        c = int(groups[i])
        token_sums[:, c] = token_sums[:, c] + products[:, i]
    scale_parts, base_parts = [], []
    for start in range(0, gz.shape[0], token_block):
        rows = slice(start, start + token_block)
        scale_parts.append(lane_sum(token_sums[rows].T.contiguous()))
        base_parts.append(lane_sum(gz[rows].T.contiguous()))
    width = gz.shape[1]
    if not base_parts:
        return gz.new_zeros((0, 3)), gz.new_zeros((0, width))
    return torch.stack(scale_parts), torch.stack(base_parts)


def pre_split_mixes_bwd(pre_layer_mix_grad: torch.Tensor, post_layer_mix_grad: torch.Tensor,
                        comb_res_mix_grad: torch.Tensor, input_mixes: torch.Tensor, post_layer_mix: torch.Tensor,
                        mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_post_mult_value: float,
                        flavor: str | Flavor = "ascend", mhc_mult: int = 4, token_block: int = TOKEN_BLOCK
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_mixes_grad (T, n3), mhc_scale_grad (3,), mhc_base_grad (n3,))`` in fp32."""
    gz = logit_grads(pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes, post_layer_mix,
                     mhc_scale, mhc_base, mhc_post_mult_value, flavor, mhc_mult)
    _, gains = _logits(input_mixes, mhc_scale, mhc_base, mhc_mult)
    scale_parts, base_parts = block_partials(gz, input_mixes, mhc_mult, token_block)
    scale_grad = torch.zeros(3, dtype=torch.float32, device=gz.device)
    base_grad = torch.zeros(gz.shape[1], dtype=torch.float32, device=gz.device)
    for scale_part, base_part in zip(scale_parts, base_parts, strict=True):
        scale_grad = scale_grad + scale_part
        base_grad = base_grad + base_part
    return gz * gains, scale_grad, base_grad


def pre_split_mixes_fwd_exact(input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                              mhc_post_mult_value: float, mhc_pre_eps: float, mhc_mult: int = 4
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward in float64 (inputs and constants taken as their fp32 values), unrounded."""
    n = mhc_mult
    x, scale, base = input_mixes.double(), mhc_scale.double(), mhc_base.double()
    z = x * scale[gain_index(n).to(x.device)] + base
    pre_eps = float(torch.tensor(mhc_pre_eps, dtype=torch.float32))
    post_mult = float(torch.tensor(mhc_post_mult_value, dtype=torch.float32))
    return torch.sigmoid(z[:, :n]) + pre_eps, torch.sigmoid(z[:, n:2 * n]) * post_mult, z[:, 2 * n:]


def pre_split_mixes_bwd_exact(pre_layer_mix_grad: torch.Tensor, post_layer_mix_grad: torch.Tensor,
                              comb_res_mix_grad: torch.Tensor, input_mixes: torch.Tensor, mhc_scale: torch.Tensor,
                              mhc_base: torch.Tensor, mhc_post_mult_value: float, mhc_mult: int = 4
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward in float64 from its closed form, with the post term from the recomputed
    ``σ`` (``post_mult · σ(1 - σ)``, the exact derivative, also for ``post_mult = 0``) instead of
    the saved fp32 post mix: ``(input_mixes_grad, mhc_scale_grad, mhc_base_grad)``."""
    n = mhc_mult
    x, scale, base = input_mixes.double(), mhc_scale.double(), mhc_base.double()
    groups = gain_index(n).to(x.device)
    s = torch.sigmoid(x * scale[groups] + base)
    post_mult = float(torch.tensor(mhc_post_mult_value, dtype=torch.float32))
    gz = torch.cat([pre_layer_mix_grad.double() * s[:, :n] * (1 - s[:, :n]),
                    post_layer_mix_grad.double() * post_mult * s[:, n:2 * n] * (1 - s[:, n:2 * n]),
                    comb_res_mix_grad.double()], dim=1)
    scale_grad = torch.zeros(3, dtype=torch.float64, device=x.device).index_add_(0, groups, (gz * x).sum(0))
    return gz * scale[groups], scale_grad, gz.sum(0)
