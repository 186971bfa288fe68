"""The per_block_cast_lossless configuration matrices shared by the run and lowering tests."""

from __future__ import annotations

import itertools

SF_MODES = {
    # name: (use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    "fp32-row": (False, True, False),
    "fp32-col": (True, True, False),
    "packed-row": (False, True, True),
    "packed-col": (True, True, True),
}

# (x_block_size, x SF mode, out_block_size, out SF mode, flavor): every SF mode on both sides,
# per-token, 2-D and per-channel (packed along tokens) input blocks, output blocks larger than and
# equal to the input's, both flavors.
COVERING = [
    ((1, 32), "fp32-row", (32, 32), "fp32-row", "ascend"),
    ((1, 32), "packed-col", (128, 128), "packed-col", "cuda"),
    ((1, 32), "packed-col", (1, 128), "fp32-row", "ascend"),
    ((1, 32), "fp32-row", (32, 32), "packed-col", "cuda"),
    ((32, 32), "packed-row", (128, 128), "fp32-col", "ascend"),
    ((32, 1), "packed-row", (32, 32), "packed-row", "cuda"),
    # One input block per output block: the kernel's per-block exponent loops have one iteration.
    ((32, 32), "fp32-row", (32, 32), "fp32-row", "ascend"),
]
BLOCK_PAIRS = [((1, 32), (1, 128)), ((1, 32), (32, 32)), ((1, 32), (128, 128)), ((32, 32), (128, 128)),
               ((1, 16), (64, 64)), ((1, 32), (1, 32)), ((128, 128), (128, 128))]
POWERS = (1, 2, 4, 8, 16, 32, 64, 128)


def _mode(block: tuple[int, int], index: int) -> str:
    return "packed-row" if block[1] == 1 else ("fp32-row", "packed-col", "fp32-col", "packed-row")[index % 4]


FULL = [case for case in (
    (x_block, x_mode, out_block, out_mode, ("ascend", "cuda")[index % 2])
    for index, ((x_block, out_block), x_mode, out_mode) in enumerate(itertools.product(
        BLOCK_PAIRS, ("fp32-row", "packed-col"), ("fp32-row", "packed-col")))
    ) if case not in COVERING] + [
    # Every power-of-two block size in each of the four places: (p, 128/p) input blocks into (p, 128)
    # output blocks, and (1, p) into (128/p, p); an SF packed along tokens (k == 1) is row-major.
    (x_block, _mode(x_block, index), out_block, _mode(out_block, index + 1), ("ascend", "cuda")[index % 2])
    for index, (x_block, out_block) in enumerate(
        pair for p in POWERS for pair in (((p, 128 // p), (p, 128)), ((1, p), (128 // p, p))))
    if (x_block, out_block) not in BLOCK_PAIRS]
# ascend-sim lowers each case for Ascend (5-10 s of CPU a kernel), so by default it runs one
# ascend-flavor case (2-D packed input SF, 128-token tiles, column-major output SF); the other
# ascend-flavor cases run under slow.
SIM_COVERING = [COVERING[4]]
SIM_FULL = [case for case in COVERING + FULL if case[-1] == "ascend" and case not in SIM_COVERING]
# The lowering tests' default case is the ascend-sim one (its lowering is cached, so it costs the
# default run nothing more); the rest of COVERING lowers under slow.
LOWERING = SIM_COVERING
CUDA_LOWERING = [COVERING[3]]


def case_id(case) -> str:
    return "-".join("x".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in case)


def sf_options(sf_mode: str) -> dict:
    col_major, round_sf, packed = SF_MODES[sf_mode]
    return dict(use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
