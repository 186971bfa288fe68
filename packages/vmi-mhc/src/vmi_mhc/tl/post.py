"""The arithmetic of ``post`` (spec mhc §3.5) on lane values (scalars or Ascend vector registers,
``vmi_core.tl.simd``): the forward's residual update, which ``multilayer_recompute`` reuses to
reproduce ``mhc_post_fwd`` bit for bit, and the backward's stream sums. One chain on every target
and flavor (the Ascend ``x · post`` then ``vmula``; CUDA's contracted ``acc += comb · res``)."""

from __future__ import annotations

from vmi_core.tl.simd import fma


def weighted_sum(weights, values):
    """``Σ_k weights[k] · values[k]`` in fp32: the product of the first pair, then one fused
    multiply-add per further pair, in order."""
    acc = weights[0] * values[0]
    for weight, value in zip(weights[1:], values[1:], strict=True):
        acc = fma(weight, value, acc)
    return acc


def residual_update(post, x, comb_column, residual):
    """Output stream ``o`` of one column before its bf16 rounding: ``post[o] · x``, then
    ``+ comb[i, o] · res[i]`` fused for ``i = 0, 1, ..., n - 1``.

    Args:
        post: ``post[o]``.
        x: The sublayer output, fp32.
        comb_column: ``comb[0, o], ..., comb[n - 1, o]`` (column ``o`` of the mixing matrix).
        residual: ``res[0], ..., res[n - 1]``, fp32.
    """
    return weighted_sum((post, *comb_column), (x, *residual))
