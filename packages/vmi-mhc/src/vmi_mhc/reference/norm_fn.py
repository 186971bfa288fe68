"""PyTorch reference of ``norm_fn``'s stages A, A', C and D (spec §3.4.2).

Written from the spec: every step one fp32 operation with its own rounding, in the order the
kernels document (``vmi_mhc.norm_fn``). ``flavor`` (``ascend``/``cuda``, vmi_core.targets)
selects the RMS scale's mean (``sq · f32(1/K)`` or ``sq / K``) and the division of the square-sum
gradient (the ascend flavor flushes subnormal operands and quotients, as the Ascend vector unit
divides). ``*_float64`` are the exact formulas evaluated in float64, for error measurements and
gradient checks.
"""

from __future__ import annotations

import numpy as np
import torch

from vmi_core.formats import f32_bits, f32_from_bits
from vmi_core.fp32 import fma
from vmi_core.targets import Flavor, get_flavor

_SIGN = -0x80000000  # bit 31 as an int32 mask
_MIN_NORMAL_BITS = 0x00800000


def _f32(value: float) -> float:
    return float(np.float32(value))


def _flush(t: torch.Tensor) -> torch.Tensor:
    bits = f32_bits(t)
    return f32_from_bits(torch.where((bits & 0x7FFFFFFF) < _MIN_NORMAL_BITS, bits & _SIGN, bits))


def _sqrt(t: torch.Tensor) -> torch.Tensor:
    # torch's float32 sqrt on the CPU is not correctly rounded; the float64 root rounded to fp32 is
    # (53 >= 2 * 24 + 2 bits).
    return torch.sqrt(t.double()).to(torch.float32)


def _divide(num: torch.Tensor, den: torch.Tensor, flavor: str) -> torch.Tensor:
    if flavor == "ascend":
        return _flush(_flush(num) / _flush(den))
    return num / den


# --- stage A and A': fn_eff = fn ⊙ normw ---

def fn_normw_merge_fwd(fn: torch.Tensor, normw: torch.Tensor) -> torch.Tensor:
    """``fn[j, k] · normw[k]`` (fp32, one rounding)."""
    return fn * normw


def fn_normw_merge_bwd(fn: torch.Tensor, normw: torch.Tensor, out_fn_grad: torch.Tensor, fn_grad: torch.Tensor,
                       normw_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """New ``(fn_grad, normw_grad)``: ``fn_grad + g · normw`` and
    ``normw_grad + Σ_j g[j] · fn[j]``, each product added with one rounding (fused multiply-add),
    the rows ``j`` in ascending order starting from the incoming ``normw_grad``."""
    new_fn_grad = fma(out_fn_grad, normw.expand_as(out_fn_grad).contiguous(), fn_grad)
    running = normw_grad.clone()
    for j in range(fn.shape[0]):
        running = fma(out_fn_grad[j].contiguous(), fn[j].contiguous(), running)
    return new_fn_grad, running


def fn_normw_merge_bwd_float64(fn, normw, out_fn_grad, fn_grad, normw_grad):
    """``fn_grad + g · normw`` and ``normw_grad + Σ_j g · fn`` in float64."""
    g = out_fn_grad.double()
    return fn_grad.double() + g * normw.double(), normw_grad.double() + (g * fn.double()).sum(0)


# --- stage C: reduce the split-K partials, RMS scale ---

def rms_scale(sqrsum: torch.Tensor, group_size: int, eps: float, flavor: str | Flavor) -> torch.Tensor:
    """``1 / sqrt(f32(f32(sq · f32(1/K)) + f32(eps)))`` (ascend) or
    ``1 / sqrt(f32(f32(sq / K) + f32(eps)))`` (cuda), every operation correctly rounded fp32.

    The ascend division's flush of subnormals never applies here (``sqrt`` is 0 or >= 2^-75)."""
    if get_flavor(flavor).name == "ascend":
        mean = sqrsum * _f32(1.0 / group_size)
    else:
        # A tensor divisor: torch may divide by a Python number as a product with its reciprocal.
        mean = sqrsum / torch.full_like(sqrsum, float(group_size))
    root = _sqrt(mean + _f32(eps))
    return torch.ones_like(root) / root


def reduce_partials_and_rmsnorm_fwd(out_mul_splitted: torch.Tensor, sqrsum_splitted: torch.Tensor,
                                    group_size: int, eps: float, flavor: str | Flavor
                                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out_mul (T, 1, n3), sqrsum (T, 1), out (T, n3))``: the partials summed over the splits in
    ascending order from +0.0, ``out = out_mul · r``."""
    out_mul = torch.zeros_like(out_mul_splitted[0])
    sqrsum = torch.zeros_like(sqrsum_splitted[0])
    for s in range(out_mul_splitted.shape[0]):
        out_mul = out_mul + out_mul_splitted[s]
        sqrsum = sqrsum + sqrsum_splitted[s]
    r = rms_scale(sqrsum, group_size, eps, flavor)
    return out_mul, sqrsum, (out_mul * r.unsqueeze(-1))[:, 0]


def reduce_partials_and_rmsnorm_fwd_float64(out_mul_splitted, sqrsum_splitted, group_size: int, eps: float):
    """``(out_mul, sqrsum, out)`` of the exact formula in float64 (``eps`` the Python double)."""
    out_mul = out_mul_splitted.double().sum(0)
    sqrsum = sqrsum_splitted.double().sum(0)
    r = 1.0 / torch.sqrt(sqrsum / group_size + eps)
    return out_mul, sqrsum, (out_mul * r.unsqueeze(-1))[:, 0]


# --- stage D: its backward ---

def sqrsum_grad(dot: torch.Tensor, r: torch.Tensor, sqrsum: torch.Tensor, group_size: int, eps: float,
                flavor: str | Flavor) -> torch.Tensor:
    """``((dot · r) / (sq + f32(eps·K))) / (−2)``, the flavor's divisions."""
    kind = get_flavor(flavor).name
    quotient = _divide(dot * r, sqrsum + _f32(eps * group_size), kind)
    return _divide(quotient, torch.full_like(quotient, -2.0), kind)


def reduce_partials_and_rmsnorm_bwd(out_grad: torch.Tensor, out_mul: torch.Tensor, sqrsum: torch.Tensor,
                                    group_size: int, eps: float, flavor: str | Flavor
                                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out_mul_grad (T, 1, n3), sqrsum_grad (T, 1))``: ``g · r`` and ``sqrsum_grad`` of
    ``dot = Σ_j g[j] · out_mul[j]``, the products added in ascending ``j`` by fused multiply-adds
    from +0.0; ``r`` recomputed as the forward computes it."""
    r = rms_scale(sqrsum, group_size, eps, flavor)
    g = out_grad.unsqueeze(1)
    dot = torch.zeros_like(sqrsum)
    for j in range(g.shape[-1]):
        dot = fma(g[..., j].contiguous(), out_mul[..., j].contiguous(), dot)
    return g * r.unsqueeze(-1), sqrsum_grad(dot, r, sqrsum, group_size, eps, flavor)


def reduce_partials_and_rmsnorm_bwd_float64(out_grad, out_mul, sqrsum, group_size: int, eps: float):
    """``(out_mul_grad, sqrsum_grad)`` of the exact formulas in float64:
    ``g · r`` and ``−½ · r³ / K · Σ_j g · out_mul`` with ``r = (sq / K + eps)^−½``."""
    g, om, sq = out_grad.double().unsqueeze(1), out_mul.double(), sqrsum.double()
    r = 1.0 / torch.sqrt(sq / group_size + eps)
    dot = (g * om).sum(-1)
    return g * r.unsqueeze(-1), -0.5 * r ** 3 / group_size * dot


def rmsnorm_float64(out_mul: torch.Tensor, sqrsum: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    """The forward of stage C from the reduced sums, ``out_mul · (sq / K + eps)^−½``, differentiable
    (float64 inputs): the function ``reduce_partials_and_rmsnorm_bwd_float64`` is the derivative of."""
    return (out_mul * torch.rsqrt(sqrsum / group_size + eps).unsqueeze(-1))[:, 0]
