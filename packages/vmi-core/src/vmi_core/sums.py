"""Row sums of fp32 terms in vmi's fixed lane order, in torch: the twins of the kernel reduction
``vmi_core.tl.vector.row_sum`` (``Shell.row_sum``), bit for bit.

The lane order: 64 partial sums, partial ``l`` accumulating the terms of columns
``l, l + 64, l + 128, ...`` in increasing order from +0.0 (``p = p + t``, or ``p = fma(a, b, p)``
with one rounding for a sum of products), then six folds of adjacent partials,
``p[l] = p[2l] + p[2l + 1]``, down to one value. Every step is one fp32 operation, so the result
depends on the terms only, on every target: a 64-lane vector register holds the partials on
Ascend, 64 parallel lanes elsewhere. A row's length is padded with zero terms to a multiple of 64
(adding +0.0 leaves a partial unchanged, apart from the sign of a zero sum).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .fp32 import fma_held

LANES = 64
"""Partial sums per row: the lanes of one fp32 vector register."""


def _check(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if t.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension, got a 0-d tensor")


def _chunks(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``(..., n / 64, 64)`` after padding its last dimension with zeros."""
    pad = -t.shape[-1] % LANES
    t = F.pad(t, (0, pad)) if pad else t
    return t.reshape(*t.shape[:-1], t.shape[-1] // LANES, LANES)


def _fold(partials: torch.Tensor) -> torch.Tensor:
    while partials.shape[-1] > 1:
        partials = partials[..., 0::2] + partials[..., 1::2]
    return partials[..., 0]


def lane_sum(terms: torch.Tensor) -> torch.Tensor:
    """The sum of each row (last dimension) of float32 ``terms`` in the lane order.

    Raises:
        TypeError: ``terms`` is not a float32 tensor.
        ValueError: ``terms`` is 0-d.
    """
    _check("terms", terms)
    chunks = _chunks(terms)
    partials = torch.zeros(chunks.shape[:-2] + (LANES,), dtype=torch.float32, device=terms.device)
    for k in range(chunks.shape[-2]):
        partials = partials + chunks[..., k, :]
    return _fold(partials)


def lane_sum_fused(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The sum of ``a * b`` over each row in the lane order, each product fused into its partial
    (``p = fma(a, b, p)``); ``a`` and ``b`` float32 of one shape.

    Raises:
        TypeError: ``a`` or ``b`` is not a float32 tensor.
        ValueError: a 0-d operand, or the shapes differ.
    """
    _check("a", a)
    _check("b", b)
    if a.shape != b.shape:
        raise ValueError(f"a and b must have one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    # Chunk-major, so that each step reads contiguous operands.
    ca, cb = (_chunks(t).movedim(-2, 0).double().contiguous() for t in (a, b))
    partials = torch.zeros(ca.shape[1:], dtype=torch.float64, device=a.device)
    for k in range(ca.shape[0]):
        partials = fma_held(ca[k], cb[k], partials)
    return _fold(partials.to(torch.float32))
