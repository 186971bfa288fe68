"""The swiglu_backward and swiglu_backward_and_per_token_cast configuration matrices shared by the
run and property tests. Each case is one compiled kernel (the hidden size and the options are its
specialisation; token count, row strides, psum, weights, factors and the clamp value are runtime
values)."""

from __future__ import annotations

import torch

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
SF_OPTIONS = {
    "fp32": dict(),
    "fp32-col": dict(use_tma_aligned_col_major_sf=True),
    "pow2": dict(round_sf=True),
    "pow2-col": dict(round_sf=True, use_tma_aligned_col_major_sf=True),
    "packed": dict(round_sf=True, use_packed_ue8m0=True),
    "packed-col": dict(round_sf=True, use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True),
}
# (x format, grad format, npc, SF layout, flavor, weights, rsf, clamp, do_recompute, psum, H).
# Plain: x and the gradient share their dtype; fmt = that dtype.
COVERING = [
    ("bf16", "bf16", None, None, "ascend", True, 2.5, 0.5, True, True, 128),
    ("fp32", "fp32", None, None, "ascend", False, None, None, False, False, 64),
    ("fp32", "fp32", None, None, "cuda", False, None, None, False, False, 64),
    ("e4m3", "bf16", 32, "packed-col", "ascend", True, 2.5, 0.5, True, True, 256),
    ("e4m3", "fp32", 128, "fp32-col", "cuda", True, None, None, True, False, 384),
]
FULL = [
    ("bf16", "bf16", None, None, "cuda", True, 2.5, 0.5, True, True, 128),
    ("fp32", "fp32", None, None, "ascend", True, None, 10.0, True, True, 192),
    ("bf16", "bf16", None, None, "ascend", False, None, 0.5, False, True, 2048),
] + [
    ("e4m3", grad, npc, layout, flavor, True, 2.5, 0.5, True, True, 384 if npc == 128 else 128)
    for npc in (32, 128) for layout in SF_OPTIONS for flavor in ("ascend", "cuda")
    for grad in (("bf16",) if layout != "fp32" else ("bf16", "fp32"))
]

# E4M3 cases without weights, recompute or psum (the products above always have them): the
# ascend-sim sweep's, and the smallest hidden size.
MORE = [
    ("e4m3", "bf16", 128, "fp32", "ascend", True, None, None, False, True, 256),
    ("e4m3", "fp32", 32, "pow2-col", "ascend", False, None, 0.5, True, False, 128),
    ("e4m3", "bf16", 32, "packed", "cuda", False, None, None, False, False, 64),
]


def case_id(case) -> str:
    in_fmt, grad, npc, layout, flavor, weights, rsf, clamp, recompute, psum, hidden = case
    parts = [in_fmt if npc is None else f"e4m3-{npc}-{layout}-grad_{grad}", flavor, f"H{hidden}"]
    parts += [name for name, on in (("w", weights), ("rsf", rsf), ("clamp", clamp), ("recompute", recompute),
                                    ("psum", psum)) if on]
    return "-".join(parts)
