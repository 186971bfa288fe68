"""The norm_backward configuration matrices shared by the run and property tests.

A case is one row-kernel specialisation (x dtype, hidden size, weight, residual gradient,
out_scale, flavor) and the weight gradient's buffer: ``None`` (no weight), ``"new"`` (allocated
by the op) or the dtype of an accumulation buffer.
"""

from __future__ import annotations

import itertools

import torch

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
EPS = 1e-6

# (x dtype, H, weight_grad, residual_out_grad, out_scale, flavor). H 96: a register tail of 32
# masked columns. Few specialisations by default (each is a compile); the rest under slow.
COVERING = [
    ("bf16", 96, "bf16", True, 0.3, "ascend"),
    ("fp32", 256, "fp32", False, 1.0, "cuda"),
    ("bf16", 96, None, False, 1.0, "cuda"),
]
# Every combination of dtype, hidden size, weight gradient and residual gradient; out_scale and the
# flavor cycle through theirs (each with every other option across the list).
FULL = [
    (dtype, hidden, weight_grad, residual, (1.0, 0.3)[(k + k // 4) % 2], ("ascend", "cuda")[(k // 2 + k // 8) % 2])
    for k, (dtype, hidden, weight_grad, residual) in enumerate(itertools.product(
        DTYPES, (96, 2048), (None, "new", "bf16", "fp32"), (False, True)))
]
# Hidden sizes and out_scales the product leaves out: the smallest H, partial 64-column registers,
# the largest H; a negative out_scale.
MORE = [
    ("fp32", 32, "new", True, -2.0, "cuda"),
    ("bf16", 160, "fp32", False, -2.0, "ascend"),
    ("fp32", 8192, "bf16", True, 0.3, "ascend"),
]


def case_id(case) -> str:
    dtype, hidden, weight_grad, residual, out_scale, flavor = case
    return f"{dtype}-H{hidden}-wg_{weight_grad}-{'rog' if residual else 'norog'}-s{out_scale}-{flavor}"
