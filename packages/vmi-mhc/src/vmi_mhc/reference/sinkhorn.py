"""PyTorch reference of ``sinkhorn`` (spec §3.9): forward, backward by recompute, and float64
evaluations of the exact formula for measuring errors.

The fp32 functions evaluate the spec's formulas step by step, each step one fp32 operation with
its own rounding, in the flavor's conventions: sums of the 4 entries of a row or column pairwise
``(a0 + a1) + (a2 + a3)`` (``ascend``) or left to right (``cuda``); ``exp`` correctly rounded
(``vmi_core.fp32.exp``); division IEEE (``cuda``) or the Ascend vector division (``ascend``:
subnormal operands and quotients flushed to signed zero, and the quotient moved by an ulp where
the residual check of TileLang's ``vdiv_0ulp_ftz_true`` sees underflowing residuals). Matrices
are ``(T, n, n)``: rows along the last axis, columns along the second-to-last.
"""

from __future__ import annotations

import torch

from vmi_core.fp32 import divide, exp
from vmi_core.targets import Flavor, get_flavor


def line_sum(t: torch.Tensor, dim: int, flavor: str | Flavor) -> torch.Tensor:
    """The fp32 sum of the 4 entries along ``dim`` in the flavor's order, keeping ``dim`` (size 1)."""
    a0, a1, a2, a3 = t.split(1, dim)
    if get_flavor(flavor).name == "ascend":
        return (a0 + a1) + (a2 + a3)
    return ((a0 + a1) + a2) + a3


def _eps32(eps: float) -> torch.Tensor:
    return torch.tensor(eps, dtype=torch.float32)


def replay(logits: torch.Tensor, repeat: int, eps: float, flavor: str | Flavor):
    """The forward of fp32 ``(T, 4, 4)`` logits with its steps: ``(out, inputs, denominators)``,
    ``inputs[s]`` the input of normalisation step ``s`` (``inputs[0]`` the softmax output) and
    ``denominators[s]`` its ``sum + eps`` (``(T, 1, 4)`` for column steps, odd ``s``; ``(T, 4, 1)``
    for row steps; ``None`` for ``s = 0``)."""
    e32 = _eps32(eps)
    peak = logits.amax(dim=-1, keepdim=True)
    e = exp(logits - peak)
    p = divide(e, line_sum(e, -1, flavor), flavor)
    inputs, denominators = [p], [None]
    x = p + e32
    for step in range(1, 2 * repeat):
        # Odd steps normalise the columns (sum over j, dim -2), even steps the rows.
        den = line_sum(x, -2 if step % 2 else -1, flavor) + e32
        inputs.append(x)
        denominators.append(den)
        x = divide(x, den, flavor)
    return x, inputs, denominators


def sinkhorn_forward(logits: torch.Tensor, repeat: int, eps: float, flavor: str | Flavor) -> torch.Tensor:
    """The Sinkhorn projection of fp32 ``(T, 4, 4)`` logits, in the flavor's fp32 arithmetic."""
    return replay(logits, repeat, eps, flavor)[0]


def sinkhorn_backward(grad_output: torch.Tensor, logits: torch.Tensor, repeat: int, eps: float,
                      flavor: str | Flavor) -> torch.Tensor:
    """The gradient of the logits, by recompute (spec §3.9.3), in the flavor's fp32 arithmetic.

    Per step ``y = a / d``, ``d = sum(a) + eps``: ``u = sum(g * a) / d``, ``g <- (g - u) / d``
    (products rounded, then summed in the flavor's order); last the softmax's
    ``(g - sum_row(g * p)) * p``.
    """
    _, inputs, denominators = replay(logits, repeat, eps, flavor)
    g = grad_output
    for step in range(2 * repeat - 1, 0, -1):
        a, den = inputs[step], denominators[step]
        u = divide(line_sum(g * a, -2 if step % 2 else -1, flavor), den, flavor)
        g = divide(g - u, den, flavor)
    p = inputs[0]
    return (g - line_sum(g * p, -1, flavor)) * p


def _replay_float64(logits: torch.Tensor, repeat: int, eps: float):
    e = float(_eps32(eps))
    p = torch.softmax(logits.double(), dim=-1)
    inputs, denominators = [p], [None]
    x = p + e
    for step in range(1, 2 * repeat):
        den = x.sum(dim=-2 if step % 2 else -1, keepdim=True) + e
        inputs.append(x)
        denominators.append(den)
        x = x / den
    return x, inputs, denominators


def sinkhorn_forward_float64(logits: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    """The exact formula in float64 (for error measurement), with the kernels' ``eps``: ``fp32(eps)``."""
    return _replay_float64(logits, repeat, eps)[0]


def sinkhorn_backward_float64(grad_output: torch.Tensor, logits: torch.Tensor, repeat: int,
                              eps: float) -> torch.Tensor:
    """The recompute backward of spec §3.9.3 in float64 (exact sums and quotients)."""
    _, inputs, denominators = _replay_float64(logits, repeat, eps)
    g = grad_output.double()
    for step in range(2 * repeat - 1, 0, -1):
        a, den = inputs[step], denominators[step]
        u = (g * a).sum(dim=-2 if step % 2 else -1, keepdim=True) / den
        g = (g - u) / den
    p = inputs[0]
    return (g - (g * p).sum(dim=-1, keepdim=True)) * p
