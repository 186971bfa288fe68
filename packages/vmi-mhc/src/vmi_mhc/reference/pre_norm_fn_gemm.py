"""Reference of the prenorm GEMM of ``norm_fn`` (spec §3.4, stages B and E), from the spec.

Forward, per split ``s`` of ``S`` equal contiguous slices of ``K`` (``k`` in split ``s``):

    out_mul_splitted[s, t, j] = Σ_k f32(x[t, k]) · tf32(fn[j, k])
    sqrsum_splitted[s, t]     = Σ_k f32(x[t, k])²

Backward (``v = tf32(fn)``, ``d = tf32(out_mul_grad)``):

    x_grad[t, k] = bf16( (f32(x_grad[t, k]) + Σ_j d[t, j] · v[j, k]) + (2 · f32(x[t, k])) · sqrsum_grad[t] )
    fn_grad[j, k] = Σ_t d[t, j] · f32(x[t, k])

``tf32`` rounds half away from zero to 10 mantissa bits; every product above is exact in fp32.
The sums are evaluated in the cpu kernel's fixed order, so that kernel matches bit for bit (both
flavors are identical: the op has no flavor-dependent arithmetic):

* the products over ``k`` (forward) and ``j`` (backward ``x_grad``) are added in increasing
  index order to an fp32 accumulator starting at +0.0, one rounding per addition;
* ``Σ x²`` per split is the lane order of ``vmi_core.sums.lane_sum_fused`` (64 partials over the
  split's columns, then six folds);
* ``fn_grad`` adds the tokens' products in increasing token order from +0.0.

``*_float64`` evaluate the same formulas in float64 (the products of the same TF32/bf16
operands, summed in float64) for error measurement.
"""

from __future__ import annotations

import torch

from vmi_core.formats import bf16_decode, f32_bits, f32_from_bits
from vmi_core.sums import lane_sum_fused

_ABS = 0x7FFFFFFF
_INF = 0x7F800000


def round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """fp32 ``t`` rounded to TF32, half away from zero: ``(bits + 0x1000) & ~0x1FFF``."""
    return f32_from_bits((f32_bits(t) + 0x1000) & 0xFFFFE000)


def tf32_split(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 bit patterns (int64) ``(hi, lo)`` of TF32 values ``v``: ``hi`` the top 8
    significant bits (a NaN as the quiet NaN), ``lo`` the bits of ``v - hi`` truncated to bf16
    (+0 for non-finite ``v``)."""
    bits = f32_bits(v)
    finite = (bits & _ABS) < _INF
    hi = torch.where((bits & _ABS) > _INF, 0x7FC0, bits >> 16)
    rest = f32_bits(torch.where(finite, v - bf16_decode(hi), 0.0))
    lo = torch.where(finite, rest >> 16, 0)
    return hi, lo


def tf32_operand(t: torch.Tensor) -> torch.Tensor:
    """The fp32 values every target multiplies for the fp32 GEMM operand ``t``: rounded to TF32,
    split into bf16 ``hi + lo`` and joined again (the identity for ``|v| >= 2^-116``)."""
    hi, lo = tf32_split(round_to_tf32(t.float()))
    return bf16_decode(hi) + bf16_decode(lo)


def _check_splits(k: int, n_splits: int) -> int:
    if n_splits < 1 or k % n_splits:
        raise ValueError(f"n_splits must be a positive divisor of K = {k}, got {n_splits}")
    return k // n_splits


def pre_norm_fn_gemm_fwd(x: torch.Tensor, fn: torch.Tensor, n_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out_mul_splitted (S, T, n3), sqrsum_splitted (S, T))`` fp32 of bf16 ``x (T, K)`` and fp32
    ``fn (n3, K)``, summed in the cpu kernel's order (module docstring)."""
    num_tokens, k = x.shape
    n3 = fn.shape[0]
    width = _check_splits(k, n_splits)
    xs = x.float().reshape(num_tokens, n_splits, width).transpose(0, 1)  # (S, T, Ks)
    v = tf32_operand(fn).reshape(n3, n_splits, width).permute(1, 2, 0)  # (S, Ks, n3)
    acc = torch.zeros((n_splits, num_tokens, n3), dtype=torch.float32)
    for col in range(width):
        acc = acc + xs[:, :, col, None] * v[:, None, col, :]
    sq = lane_sum_fused(xs.contiguous(), xs.contiguous()) if width else torch.zeros((n_splits, num_tokens))
    # Row-major outputs (the broadcast sums leave other strides).
    return torch.zeros_like(acc, memory_format=torch.contiguous_format).copy_(acc), sq.contiguous()


def pre_norm_fn_gemm_bwd(out_mul_grad: torch.Tensor, sqrsum_grad: torch.Tensor, x: torch.Tensor, fn: torch.Tensor,
                         x_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_grad (T, K) bf16, fn_grad (n3, K) fp32)``: the accumulated residual gradient (``x_grad``
    is the incoming buffer, not modified) and the gradient of ``fn_eff``, in the cpu kernel's order
    (module docstring)."""
    d = tf32_operand(out_mul_grad)
    v = tf32_operand(fn)
    xf = x.float()
    n3, k = fn.shape
    gemm = torch.zeros(x.shape, dtype=torch.float32)
    for j in range(n3):
        gemm = gemm + d[:, j, None] * v[None, j, :]
    total = (x_grad.float() + gemm) + (2 * xf) * sqrsum_grad.float()[:, None]
    fn_grad = torch.zeros((n3, k), dtype=torch.float32)
    for t in range(x.shape[0]):
        fn_grad = fn_grad + d[t, :, None] * xf[t, None, :]
    return total.to(torch.bfloat16), fn_grad


def pre_norm_fn_gemm_fwd_float64(x: torch.Tensor, fn: torch.Tensor, n_splits: int
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's sums in float64 (same TF32/bf16 operands)."""
    num_tokens, k = x.shape
    width = _check_splits(k, n_splits)
    xs = x.double().reshape(num_tokens, n_splits, width).transpose(0, 1)
    v = tf32_operand(fn).double().reshape(fn.shape[0], n_splits, width).permute(1, 2, 0)
    return xs @ v, (xs * xs).sum(-1)


def gemm_bwd_formula(d: torch.Tensor, sqrsum_grad: torch.Tensor, x: torch.Tensor, v: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward's formulas on the operands as given (no rounding): ``(d·v + 2·x·sqrsum_grad,
    dᵀ·x)``, the gradients of ``(x·vᵀ, Σ x²)`` with respect to ``x`` and ``v``."""
    return d @ v + 2 * x * sqrsum_grad[:, None], d.T @ x


def pre_norm_fn_gemm_bwd_float64(out_mul_grad: torch.Tensor, sqrsum_grad: torch.Tensor, x: torch.Tensor,
                                 fn: torch.Tensor, x_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward in float64 (same TF32/bf16 operands), ``x_grad`` before its bf16 rounding."""
    x_part, fn_grad = gemm_bwd_formula(tf32_operand(out_mul_grad).double(), sqrsum_grad.double(), x.double(),
                                       tf32_operand(fn).double())
    return x_grad.double() + x_part, fn_grad
