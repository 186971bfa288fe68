"""Reference of ``multilayer_recompute`` (spec mhc §3.3; §5.2): the layer inputs and carried
residuals of a run of layers, rebuilt from ``R_0``.

Per token, with ``R = R_0`` and every step one fp32 operation rounded to nearest even::

    for l in 0 .. L-1:
        layer_input[l] = bf16(stream mix of R with pre[l])      flavor's chain (below)
        if l < L_post:
            Rn[o] = post[l][o] · x[l];  Rn[o] = fma(comb[l][i, o], R[i], Rn[o])  for i = 0 .. n-1
            residual[l] = R = bf16(Rn)                          the carried residual, rounded

    stream mix, ascend:  acc = pre[0] · R[0];  acc = fma(pre[m], R[m], acc)  for m = 1 .. n-1
                cuda:    acc = +0;             acc = fma(pre[m], R[m], acc)  for m = 0 .. n-1

``multilayer_recompute_exact`` evaluates each layer in float64 from the bf16 residual it is given
(nothing rounded), the yardstick of the measured errors.
"""

from __future__ import annotations

import torch

from vmi_core.formats import bf16_encode
from vmi_core.fp32 import fma


def _to_bf16(values: torch.Tensor) -> torch.Tensor:
    return bf16_encode(values).view(torch.bfloat16)


def _layer_input(flavor: str, pre: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """fp32 ``(T, H)`` stream mix of fp32 ``pre (T, n)`` and ``streams (T, n, H)``."""
    n = streams.shape[1]
    if flavor == "ascend":
        acc, first = pre[:, 0:1] * streams[:, 0], 1
    elif flavor == "cuda":
        acc, first = torch.zeros_like(streams[:, 0]), 0
    else:
        raise ValueError(f"flavor must be 'ascend' or 'cuda', got {flavor!r}")
    for m in range(first, n):
        acc = fma(pre[:, m:m + 1], streams[:, m], acc)
    return acc


def _next_residual(x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """fp32 ``(T, n, H)``: ``post[o] · x`` then ``+ comb[i, o] · R[i]`` fused, ``i`` ascending."""
    acc = post.unsqueeze(-1) * x.unsqueeze(1)
    for i in range(streams.shape[1]):
        acc = fma(comb[:, i, :].unsqueeze(-1), streams[:, i:i + 1, :], acc)
    return acc


def mhc_multilayer_recompute(initial_residual: torch.Tensor, pre_mix_list: list[torch.Tensor],
                             layer_output_list: list[torch.Tensor], post_mix_list: list[torch.Tensor],
                             comb_mix_list: list[torch.Tensor], flavor: str
                             ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(layer_inputs, residuals)``: ``L`` new bf16 ``(..., H)`` tensors and ``L_post`` new bf16
    ``(..., n, H)`` tensors, of bf16 ``initial_residual (..., n, H)`` and the per-layer fp32 mixes
    (pre and post ``(..., n)`` or ``(..., n, 1)``, comb ``(..., n, n)``) and bf16 layer outputs
    ``(..., H)``."""
    *lead, n, hidden = initial_residual.shape
    residual = initial_residual.reshape(-1, n, hidden)
    num_tokens = residual.shape[0]
    layer_inputs, residuals = [], []
    for layer, pre in enumerate(pre_mix_list):
        streams = residual.float()
        layer_inputs.append(_to_bf16(_layer_input(flavor, pre.reshape(num_tokens, n).float(), streams))
                            .reshape(*lead, hidden))
        if layer < len(layer_output_list):
            x = layer_output_list[layer].reshape(num_tokens, hidden).float()
            post = post_mix_list[layer].reshape(num_tokens, n).float()
            comb = comb_mix_list[layer].reshape(num_tokens, n, n).float()
            residual = _to_bf16(_next_residual(x, post, comb, streams))
            residuals.append(residual.reshape(*lead, n, hidden))
    return layer_inputs, residuals


def multilayer_recompute_exact(carried: list[torch.Tensor], pre_mix_list: list[torch.Tensor],
                               layer_output_list: list[torch.Tensor], post_mix_list: list[torch.Tensor],
                               comb_mix_list: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """float64 ``(layer_inputs, residuals)``: each layer's sums exact, from the bf16 residual
    ``carried[l]`` it is given (``R_0``, then the residuals a recompute carried), so that the
    error of each layer is measured on its own."""
    *lead, n, hidden = carried[0].shape
    layer_inputs, residuals = [], []
    for layer, pre in enumerate(pre_mix_list):
        residual = carried[layer].reshape(-1, n, hidden).double()
        num_tokens = residual.shape[0]
        weights = pre.reshape(num_tokens, n, 1).double()
        layer_inputs.append((weights * residual).sum(dim=1).reshape(*lead, hidden))
        if layer < len(layer_output_list):
            x = layer_output_list[layer].reshape(num_tokens, 1, hidden).double()
            post = post_mix_list[layer].reshape(num_tokens, n, 1).double()
            comb = comb_mix_list[layer].reshape(num_tokens, n, n).double()
            exact = post * x + torch.einsum("tio,tih->toh", comb, residual)
            residuals.append(exact.reshape(*lead, n, hidden))
    return layer_inputs, residuals
