"""The per_token_cast configuration matrices shared by the run and lowering tests."""

from __future__ import annotations

import itertools

import torch

SF_MODES = {
    # name: (round_sf, use_packed_ue8m0, use_e4m3_sf)
    "fp32": (False, False, False),
    "e4m3": (False, False, True),
    "pow2": (True, False, False),
    "packed": (True, True, False),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

# (in_dtype, fmt, num_per_channels, sf_mode, col_major, flavor)
COVERING = [
    ("bf16", "e4m3", 32, "fp32", False, "ascend"),
    ("fp32", "e4m3", 128, "fp32", True, "cuda"),
    ("bf16", "e2m1", 16, "fp32", False, "cuda"),
    ("fp32", "e2m1", 64, "e4m3", False, "ascend"),
    ("bf16", "e4m3", 16, "e4m3", True, "ascend"),
    ("bf16", "e4m3", 64, "pow2", False, "cuda"),
    ("fp32", "e2m1", 128, "pow2", True, "ascend"),
    ("bf16", "e2m1", 32, "packed", False, "ascend"),
    ("bf16", "e4m3", 64, "packed", True, "ascend"),
    ("fp32", "e4m3", 16, "packed", False, "cuda"),
    ("bf16", "e2m1", 128, "packed", True, "cuda"),
    ("fp32", "e2m1", 32, "packed", True, "cuda"),
]
FULL = [
    (dt, fmt, npc, mode, col, flavor)
    for dt, fmt, npc, mode, col, flavor in itertools.product(
        DTYPES, ("e4m3", "e2m1"), (16, 32, 64, 128), SF_MODES, (False, True), ("ascend", "cuda"))
    if (dt, fmt, npc, mode, col, flavor) not in COVERING
]
# (num_tokens, hidden): empty, single token, tails of the 32-token tile, a partial last
# group (192 with 128 channels per group), a partial 128-column tile, and > 4096 tokens.
SHAPES = [(0, 128), (1, 64), (37, 192), (70, 320), (4100, 128)]
# ascend-sim (64 cores, 32 x 128 work tiles, 2 buffer versions): one tile (63 idle cores), 4
# tiles with token, column and group tails, 9 tiles, and 129 x 2 = 258 tiles (every core runs
# 4 or 5, so both buffer versions are reused). Runs cycle through the pipe schedules; the 258-tile
# one runs under both REUSE_SCHEDULES (vmi_core.tools.testing).
SIM_SHAPES = [(1, 64), (37, 192), (4100, 192), (70, 320)]
# ascend-sim lowers each case for Ascend (5-10 s of CPU a kernel), so by default it runs a
# covering subset of the ascend-flavor cases: fp32, power-of-two and packed UE8M0 SF, both
# layouts, formats and input dtypes, a partial last group (128 channels a group, hidden 192);
# the sf-only / precomputed-SF test adds 16 channels a group, packed row-major and E4M3 SF.
# Every other ascend-flavor case runs under slow.
SIM_COVERING = [COVERING[i] for i in (0, 6, 8)]
SIM_FULL = [case for case in COVERING + FULL if case[-1] == "ascend" and case not in SIM_COVERING]


def sf_options(sf_mode: str, col_major: bool) -> dict:
    round_sf, packed, e4m3_sf = SF_MODES[sf_mode]
    return dict(round_sf=round_sf, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf,
                use_tma_aligned_col_major_sf=col_major)
