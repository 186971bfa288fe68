"""The norm_forward and norm_forward_and_per_token_cast configuration matrices shared by the run
and property tests. The hidden size, eps, out_scale, flavor and options are the kernel's
specialisation (token count and strides are runtime values): each case is one compiled kernel."""

from __future__ import annotations

import itertools

EPS = 1e-6

# (dtype, hidden, weight, residual, out_scale, flavor)
NORM_CASES = [
    ("bf16", 256, True, True, 0.3, "ascend"),
    ("fp32", 200, True, True, 0.3, "cuda"),       # H not a multiple of 64: masked tail columns
    ("bf16", 7168, False, False, 1.0, "cuda"),    # two rows a tile
]
# (dtype, hidden, weight, residual, out_scale, flavor, col_major, round_sf, packed, with_out_bf16, mega_block_m)
CAST_CASES = [
    ("bf16", 256, True, True, 0.3, "ascend", True, True, True, True, 0),
    ("fp32", 96, False, True, 1.0, "cuda", False, True, True, True, 0),       # 3 groups: a packed pad byte
    ("bf16", 512, False, False, 1.0, "cuda", True, True, False, False, 192),  # Mega MoE SF, fp32 pow2 SF
    ("fp32", 640, True, False, 2.0, "ascend", False, False, False, False, 0),
]

# The slow sweeps, with eps as a last entry: every dtype, weight, residual and flavor combination
# (and, for the cast, every SF layout and both flavors and dtypes), the hidden size, out_scale,
# eps and the other options rotating. Hidden sizes: one column, a partial register, partial
# 64-column registers, the largest.
_NORM_HIDDEN = (1, 31, 64, 200, 448, 1000, 8192)
_SCALES = (1.0, 0.3, -2.0)
_EPS = (EPS, 2.0**-126, 0.25)
NORM_FULL = [
    (dtype, _NORM_HIDDEN[k % len(_NORM_HIDDEN)], weight, residual, _SCALES[k % 3], flavor, _EPS[(k // 3) % 3])
    for k, (dtype, weight, residual, flavor) in enumerate(itertools.product(
        ("bf16", "fp32"), (False, True), (False, True), ("ascend", "cuda")))
]
SF_MODES = {
    # name: (round_sf, use_packed_ue8m0)
    "fp32": (False, False),
    "pow2": (True, False),
    "packed": (True, True),
}
_CAST_HIDDEN = (32, 96, 256, 640, 4096)
# Mega MoE blocks (with round_sf and H % 128 == 0): a block inside one 128-row slab, one slab, a
# slab and a half (rows no token maps to).
_MEGA_BLOCKS = (16, 128, 192)


def _cast_full() -> list[tuple]:
    cases, blocks = [], itertools.cycle(_MEGA_BLOCKS)
    for k, (dtype, flavor, (round_sf, packed), col_major) in enumerate(itertools.product(
            ("bf16", "fp32"), ("ascend", "cuda"), SF_MODES.values(), (False, True))):
        block_m = next(blocks) if round_sf and k % 2 else 0
        hidden = 128 * (1 + k % 5) if block_m else _CAST_HIDDEN[k % len(_CAST_HIDDEN)]
        cases.append((dtype, hidden, k // 5 % 2 == 0, k // 2 % 2 == 1, _SCALES[k % 3], flavor, col_major, round_sf,
                      packed, k // 3 % 2 == 1, block_m, _EPS[k // 4 % 3]))
    return cases


CAST_FULL = _cast_full()


def case_id(case) -> str:
    return "-".join(str(v) for v in case)
