"""The per_block_cast configuration matrices shared by the run and lowering tests."""

from __future__ import annotations

import itertools

import torch

SF_MODES = {
    # name: (round_sf, use_packed_ue8m0)
    "fp32": (False, False),
    "pow2": (True, False),
    "packed": (True, True),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
BLOCKS = [(32, 32), (32, 128), (128, 32), (128, 128)]

# (in_dtype, fmt, block_size, sf_mode, col_major, flavor): every block meets both formats, both
# dtypes and packed SF; every SF mode meets both layouts; packed SF meets both flavors.
COVERING = [
    ("bf16", "e4m3", (32, 32), "fp32", False, "ascend"),
    ("fp32", "e2m1", (128, 128), "fp32", True, "cuda"),
    ("bf16", "e2m1", (32, 128), "pow2", False, "cuda"),
    ("fp32", "e4m3", (128, 32), "pow2", True, "ascend"),
    ("bf16", "e4m3", (128, 128), "packed", False, "cuda"),
    ("fp32", "e2m1", (32, 32), "packed", True, "ascend"),
    ("bf16", "e2m1", (128, 32), "packed", True, "cuda"),
    ("fp32", "e4m3", (32, 128), "packed", False, "ascend"),
]
# The slow sweep: every (dtype, fmt, block, SF mode), the layout and flavor rotating through all
# four combinations (flavors differ only in packed words and column-major padding).
FULL = [case for case in (
    (dtype, fmt, block, mode, index % 2 == 1, ("ascend", "cuda")[index // 2 % 2])
    for index, (dtype, fmt, block, mode) in enumerate(itertools.product(DTYPES, ("e4m3", "e2m1"), BLOCKS, SF_MODES)))
    if case not in COVERING]
# ascend-sim lowers each case for Ascend (5-10 s of CPU a kernel), so by default it runs one
# ascend-flavor case, the one the lowering tests lower too (FP4, 32x32 blocks, column-major packed
# SF); every other ascend-flavor case runs under slow.
SIM_COVERING = [COVERING[5]]
SIM_FULL = [case for case in COVERING + FULL if case[-1] == "ascend" and case not in SIM_COVERING]
# The lowering tests' default subset of cast kernels (Ascend lowering costs ~3 s a kernel): the
# ascend-sim case (its lowering is cached, so it costs the default run nothing more); the lowering
# tests' sf-only kernel adds E4M3 and another block by default, their precomputed-SF kernel under slow.
LOWERING = SIM_COVERING
CUDA_LOWERING = [COVERING[4]]


def case_id(case) -> str:
    return "-".join("x".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in case)


def sf_options(sf_mode: str, col_major: bool) -> dict:
    round_sf, packed = SF_MODES[sf_mode]
    return dict(round_sf=round_sf, use_packed_ue8m0=packed, use_tma_aligned_col_major_sf=col_major)
