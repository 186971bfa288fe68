"""PyTorch reference of ``post`` (spec mhc §3.5): the sublayer output written back into the
widened residual, and its backward.

Both flavors share one arithmetic (``flavor`` is accepted for the common reference signature and
changes nothing). Per token, with ``x`` the sublayer output, ``res`` the ``n`` residual streams,
``post`` the ``n`` output weights and ``comb`` the ``n x n`` mixing matrix (row = input stream ``i``,
column = output stream ``o``), every step one fp32 operation rounded to nearest even:

* forward ``out[o] = bf16(chain)`` with ``chain = post[o] · x``, then ``chain = fma(comb[i, o],
  res[i], chain)`` for ``i = 0, 1, ..., n - 1``;
* backward ``d_x = Σ_o post[o] · d_o[o]`` and ``d_res[i] = Σ_o comb[i, o] · d_o[o]`` as a product
  then fused multiply-adds over ascending ``o``, rounded to bf16;
  ``d_post[o] = Σ_h d_o[o, h] · x[h]`` and ``d_comb[i, o] = Σ_h res[i, h] · d_o[o, h]`` in vmi's
  fixed 64-lane order with fused products (``vmi_core.sums.lane_sum_fused``), kept in fp32.

``post_fwd_exact`` and ``post_bwd_exact`` evaluate the same formulas in float64 (no rounding
before the result), the yardstick of the measured errors.
"""

from __future__ import annotations

import torch

from vmi_core.fp32 import fma
from vmi_core.sums import lane_sum_fused


def _weighted_sum(weights: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """``weights[0] · values[0]``, then ``fma(weights[k], values[k], ·)`` for k = 1, 2, ... (fp32)."""
    acc = weights[0] * values[0]
    for w, v in zip(weights[1:], values[1:], strict=True):
        acc = fma(w, v, acc)
    return acc


# Tokens per block of the evaluation: every token is independent, and blocks keep the float64
# temporaries of the exact fp32 operations small.
TOKEN_BLOCK = 128


def _token_blocks(fn, *tensors):
    """``fn`` over blocks of ``TOKEN_BLOCK`` tokens of ``tensors`` (leading dims flattened, each
    tensor with its own trailing dims ``tensors[k].shape[2:]``), results concatenated back."""
    lead = tensors[0].shape[:2]
    flat = [t.reshape(-1, *t.shape[2:]) for t in tensors]
    num_tokens = flat[0].shape[0]
    blocks = [fn(*(t[start:start + TOKEN_BLOCK] for t in flat))
              for start in range(0, num_tokens, TOKEN_BLOCK)] or [fn(*flat)]
    results = blocks[0] if isinstance(blocks[0], tuple) else (blocks[0],)
    joined = [torch.cat([b[k] if isinstance(b, tuple) else b for b in blocks]) for k in range(len(results))]
    shaped = tuple(t.reshape(*lead, *t.shape[1:]) for t in joined)
    return shaped if isinstance(blocks[0], tuple) else shaped[0]


def _forward(x, residual, post_layer_mix, comb_res_mix):
    n = residual.shape[-2]
    xf = x.float().unsqueeze(-2)  # (T, 1, H)
    res = residual.float()
    post = post_layer_mix.float()  # (T, n, 1): post[o] against every column
    comb = comb_res_mix.float()
    weights = [post] + [comb[:, i, :].unsqueeze(-1) for i in range(n)]
    values = [xf] + [res[:, i:i + 1, :] for i in range(n)]
    return _weighted_sum(weights, values).to(torch.bfloat16)


def mhc_post_fwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
                 comb_res_mix: torch.Tensor, flavor: str = "ascend") -> torch.Tensor:
    """``out (B, S, n, H)`` bf16 from ``x (B, S, H)`` bf16, ``residual (B, S, n, H)`` bf16,
    ``post_layer_mix (B, S, n, 1)`` fp32 and ``comb_res_mix (B, S, n, n)`` fp32."""
    return _token_blocks(_forward, x, residual, post_layer_mix, comb_res_mix)


def _backward(x, residual, post_layer_mix, comb_res_mix, d_o):
    n = residual.shape[-2]
    xf, res, grad = x.float(), residual.float(), d_o.float()
    post = post_layer_mix.float()[..., 0]  # (T, n)
    comb = comb_res_mix.float()
    g = [grad[:, o, :] for o in range(n)]
    d_x = _weighted_sum([post[:, o:o + 1] for o in range(n)], g)
    d_res = torch.stack([_weighted_sum([comb[:, i, o:o + 1] for o in range(n)], g) for i in range(n)], dim=1)
    # The n + n² H-sums at once: (d_o[o], x) for d_post[o], then (res[i], d_o[o]) for d_comb[i, o].
    firsts = torch.cat([grad, res.repeat_interleave(n, dim=1)], dim=1)
    seconds = torch.cat([xf.unsqueeze(1).expand_as(grad), grad.repeat(1, n, 1)], dim=1)
    sums = lane_sum_fused(firsts, seconds)
    d_post, d_comb = sums[:, :n], sums[:, n:].reshape(-1, n, n)
    return d_x.to(torch.bfloat16), d_res.to(torch.bfloat16), d_post.unsqueeze(-1), d_comb


def mhc_post_bwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
                 d_o: torch.Tensor, flavor: str = "ascend"
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(d_x, d_residual, d_post_layer_mix, d_comb_res_mix)`` shaped like the inputs: bf16, bf16,
    fp32, fp32."""
    return _token_blocks(_backward, x, residual, post_layer_mix, comb_res_mix, d_o)


def post_fwd_exact(x, residual, post_layer_mix, comb_res_mix) -> torch.Tensor:
    """The forward in float64 on the inputs' values: ``post[o] · x + Σ_i comb[i, o] · res[i]``."""
    return (post_layer_mix.double() * x.double().unsqueeze(-2)
            + torch.einsum("...io,...ih->...oh", comb_res_mix.double(), residual.double()))


def post_bwd_exact(x, residual, post_layer_mix, comb_res_mix, d_o):
    """The backward in float64 on the inputs' values (spec §3.5.2)."""
    xd, res, grad = x.double(), residual.double(), d_o.double()
    post, comb = post_layer_mix.double()[..., 0], comb_res_mix.double()
    d_x = torch.einsum("...o,...oh->...h", post, grad)
    d_res = torch.einsum("...io,...oh->...ih", comb, grad)
    d_post = torch.einsum("...oh,...h->...o", grad, xd).unsqueeze(-1)
    d_comb = torch.einsum("...ih,...oh->...io", res, grad)
    return d_x, d_res, d_post, d_comb
