"""PyTorch reference of ``reduce_fused`` (``docs/moe/reduce_fused.md``), written from the page's
semantics, not from the kernel.

Per token, in fp32: ``acc = +0.0``; for each used slot in slot order ``acc = fma(x[pos], s, acc)``
with ``s = fl(w · x_sf[pos])``, one rounding (``vmi_core.fp32.fma``: float64 with the TwoSum
error deciding the fp32 midpoints, so exactly the correctly rounded fused multiply-add; a float64
``a · b + c`` rounded to fp32 would round twice); then ``fl(acc · sf)`` and torch's own cast to
the output dtype. Both flavors compute this chain.
"""

from __future__ import annotations

import torch

from vmi_core.fp32 import fma

# Tokens per block of the evaluation: the float64 temporaries of the fused multiply-add stay small.
TOKEN_BLOCK = 256


def _reduce_block(data, x_sf, weights, positions, sf) -> torch.Tensor:
    num_tokens, num_topk = positions.shape
    acc = torch.zeros(num_tokens, data.shape[1], dtype=torch.float32)
    for k in range(num_topk):
        pos = positions[:, k].long()
        used = pos >= 0
        rows = pos.clamp(min=0)
        s = torch.ones(num_tokens) if weights is None else weights[:, k].clone()
        if x_sf is not None:
            s = s * x_sf[rows] if data.shape[0] else s
        values = data[rows].float() if data.shape[0] else torch.zeros_like(acc)
        acc = torch.where(used.unsqueeze(1), fma(values, s.unsqueeze(1).expand_as(values), acc), acc)
    if sf is not None:
        acc = acc * sf[0]
    return acc


def reduce_fused(x, topk_weights: torch.Tensor | None, token_topk_to_pos: torch.Tensor, fp8_format: str = "",
                 sf: torch.Tensor | None = None) -> torch.Tensor:
    """``[T, H]`` of ``x`` (rows ``[N, H]``, or ``(rows, x_sf)``), fp32 ``topk_weights [T, K]`` or
    None and int32 ``token_topk_to_pos [T, K]`` (-1: unused), in ``x``'s dtype or float8_e4m3fn
    (``fp8_format="e4m3"``), scaled by ``sf[0]`` when given. Positions must lie in ``[-1, N)``."""
    data, x_sf = x if isinstance(x, tuple) else (x, None)
    data, positions = data.cpu(), token_topk_to_pos.cpu()
    x_sf = None if x_sf is None else x_sf.cpu().float()
    weights = None if topk_weights is None else topk_weights.cpu().float()
    sf = None if sf is None else sf.cpu().float()
    out_dtype = torch.float8_e4m3fn if fp8_format == "e4m3" else data.dtype
    num_tokens = positions.shape[0]
    blocks = [_reduce_block(data, x_sf, None if weights is None else weights[a:a + TOKEN_BLOCK],
                            positions[a:a + TOKEN_BLOCK], sf) for a in range(0, num_tokens, TOKEN_BLOCK)]
    acc = torch.cat(blocks) if blocks else torch.zeros(0, data.shape[1])
    return acc.to(out_dtype).to(token_topk_to_pos.device)
