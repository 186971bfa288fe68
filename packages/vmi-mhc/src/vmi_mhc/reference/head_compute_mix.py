"""PyTorch reference of ``head_compute_mix`` (spec §3.2.2), forward and backward.

The LM head's pre mix is ``pre_split_mixes``' pre formula with one gain for all ``n`` entries, and
every step is one fp32 operation with its own rounding:

* ``z = fl(fl(x · scale[0]) + base[j])`` (two roundings, no fused multiply-add);
* ``σ(z) = fl(1 / fl(exp(-z) + 1))`` with the correctly rounded exp and the flavor's division
  (``vmi_mhc.reference.pre_split_mixes.sigmoid``);
* ``out = fl(σ + f32(pre_eps))``;
* backward, ``s`` recomputed from the saved input: ``gz = fl(fl(d_out · s) · fl(1 - s))``,
  ``input_mix_grad = fl(gz · scale[0])``.

The parameter gradients come as ``P = num_sms`` partial rows. The token axis is cut into tiles of
``TOKEN_BLOCK`` tokens, and partial row ``p`` owns the ``K = ceil(tiles / P)`` consecutive tiles
``[p·K, (p+1)·K)``, i.e. the tokens ``[p·K·64, (p+1)·K·64)`` (none for the rows past the last
token). Its ``base`` entry ``j`` is the lane sum (``vmi_core.sums.lane_sum``) of ``gz[:, j]`` over
its tokens, its ``scale`` entry the lane sum of each token's ``Σ_j fl(gz · x)`` (from +0.0, ``j``
increasing); a row without tokens is +0.0. The ``*_exact`` functions evaluate the formulas in
float64 without intermediate rounding, for error measurement.
"""

from __future__ import annotations

import torch

from vmi_core.sums import lane_sum
from vmi_core.targets import Flavor

from .pre_split_mixes import TOKEN_BLOCK, sigmoid


def tiles_per_row(num_tokens: int, num_rows: int) -> int:
    """Token tiles ``K`` that each of ``num_rows`` partial rows owns (at least 1)."""
    num_tiles = -(-num_tokens // TOKEN_BLOCK)
    return max(1, -(-num_tiles // num_rows))


def _logits(input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor) -> torch.Tensor:
    return input_mix * mhc_scale[0] + mhc_base


def head_compute_mix_fwd(input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                         mhc_pre_eps: float, flavor: str | Flavor = "ascend") -> torch.Tensor:
    """``output_mix (T, n)`` of fp32 ``input_mix (T, n)``, ``mhc_scale (1,)``, ``mhc_base (n,)``."""
    z = _logits(input_mix, mhc_scale, mhc_base)
    return sigmoid(z, flavor) + torch.tensor(mhc_pre_eps, dtype=torch.float32)


def logit_grad(output_mix_grad: torch.Tensor, input_mix: torch.Tensor, mhc_scale: torch.Tensor,
               mhc_base: torch.Tensor, flavor: str | Flavor = "ascend") -> torch.Tensor:
    """fp32 ``gz (T, n)``: the gradient with respect to the logits ``z``."""
    s = sigmoid(_logits(input_mix, mhc_scale, mhc_base), flavor)
    return (output_mix_grad * s) * (1.0 - s)


def partial_rows(gz: torch.Tensor, input_mix: torch.Tensor, num_sms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale partials (P, 1), base partials (P, n))`` of the logit gradient ``gz``."""
    num_tokens, n = gz.shape
    # Each token's Σ_j fl(gz · x), from +0.0 in increasing j.
    token_sums = torch.zeros(num_tokens, dtype=torch.float32, device=gz.device)
    for j in range(n):
        token_sums = token_sums + gz[:, j] * input_mix[:, j]
    scale_rows = torch.zeros((num_sms, 1), dtype=torch.float32, device=gz.device)
    base_rows = torch.zeros((num_sms, n), dtype=torch.float32, device=gz.device)
    span = tiles_per_row(num_tokens, num_sms) * TOKEN_BLOCK
    for p in range(min(num_sms, -(-num_tokens // span))):
        tokens = slice(p * span, (p + 1) * span)
        scale_rows[p, 0] = lane_sum(token_sums[tokens])
        base_rows[p] = lane_sum(gz[tokens].T.contiguous())
    return scale_rows, base_rows


def head_compute_mix_bwd(output_mix_grad: torch.Tensor, input_mix: torch.Tensor, mhc_scale: torch.Tensor,
                         mhc_base: torch.Tensor, num_sms: int, flavor: str | Flavor = "ascend"
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_mix_grad (T, n), mhc_scale_grad_partial (P, 1), mhc_base_grad_partial (P, n))`` in fp32."""
    gz = logit_grad(output_mix_grad, input_mix, mhc_scale, mhc_base, flavor)
    scale_rows, base_rows = partial_rows(gz, input_mix, num_sms)
    return gz * mhc_scale[0], scale_rows, base_rows


def head_compute_mix_fwd_exact(input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                               mhc_pre_eps: float) -> torch.Tensor:
    """The forward in float64 (inputs and ``pre_eps`` taken as their fp32 values), unrounded."""
    z = input_mix.double() * mhc_scale.double()[0] + mhc_base.double()
    return torch.sigmoid(z) + float(torch.tensor(mhc_pre_eps, dtype=torch.float32))


def head_compute_mix_bwd_exact(output_mix_grad: torch.Tensor, input_mix: torch.Tensor, mhc_scale: torch.Tensor,
                               mhc_base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward in float64, unrounded: ``(input_mix_grad (T, n), mhc_scale_grad (1,),
    mhc_base_grad (n,))`` with the parameter gradients fully reduced over the tokens."""
    x, scale = input_mix.double(), mhc_scale.double()
    s = torch.sigmoid(x * scale[0] + mhc_base.double())
    gz = output_mix_grad.double() * s * (1 - s)
    return gz * scale[0], (gz * x).sum().reshape(1), gz.sum(0)
