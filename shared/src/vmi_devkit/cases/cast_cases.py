"""The cast / cast_back configuration matrices shared by the run and lowering tests."""

from __future__ import annotations

import itertools

import torch

from vmi_core.targets import get_flavor
from vmi_quant.kernels.cast import CastSpec
from vmi_quant.kernels.cast_back import CastBackSpec
from vmi_quant.sf_layout import SFLayout

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}

# cast: every format pair, and stochastic rounding on its three pairs (12 kernels).
CAST_PAIRS = list(itertools.product(DTYPES, DTYPES))
SR_PAIRS = [("fp32", "bf16"), ("fp32", "e4m3"), ("bf16", "e4m3")]
CAST_SPECS = [CastSpec(a, b) for a, b in CAST_PAIRS] + [CastSpec(a, b, True) for a, b in SR_PAIRS]

SF_MODES = {
    # name: (round_sf, use_packed_ue8m0, use_e4m3_sf); "fp32" also runs with round_sf (same kernel).
    "fp32": (False, False, False),
    "e4m3": (False, False, True),
    "packed": (True, True, False),
}

# cast_back: (data fmt, x_block_size, sf mode, column-major sf, out fmt, flavor). Every data/out
# pair, SF kind, layout (row, column, packed along tokens when bk == 1) and flavor meets the
# spec's blocks (32,1), (32,32), (128,1), (128,128), per-token (1,16..128) and blocks that
# do not divide the 32 x 128 work tile ((3,80), (5,1), (48,192)).
CAST_BACK_COVERING = [
    ("e4m3", (32, 32), "fp32", False, "bf16", "ascend"),
    ("e2m1", (32, 32), "packed", True, "fp32", "cuda"),
    ("e4m3", (128, 1), "packed", False, "bf16", "cuda"),
    ("e2m1", (32, 1), "fp32", False, "bf16", "ascend"),
    ("e4m3", (128, 128), "e4m3", True, "fp32", "ascend"),
    ("e2m1", (128, 128), "packed", False, "bf16", "cuda"),
    ("e4m3", (1, 16), "e4m3", True, "bf16", "ascend"),
    ("e2m1", (1, 32), "packed", False, "bf16", "ascend"),
    ("e4m3", (1, 64), "packed", True, "bf16", "ascend"),
    ("e4m3", (1, 128), "fp32", True, "fp32", "cuda"),
    ("e4m3", (3, 80), "fp32", True, "bf16", "ascend"),
    ("e2m1", (5, 1), "packed", False, "fp32", "ascend"),
    ("e2m1", (64, 32), "e4m3", True, "fp32", "cuda"),
    ("e2m1", (48, 192), "fp32", False, "bf16", "ascend"),
]
CAST_BACK_FULL = [
    (fmt, block, mode, col, out, flavor)
    for fmt, block, mode, col, out, flavor in itertools.product(
        ("e4m3", "e2m1"), ((32, 1), (32, 32), (128, 1), (128, 128), (1, 16), (1, 32), (1, 64), (1, 128)),
        SF_MODES, (False, True), ("fp32", "bf16"), ("ascend", "cuda"))
    if not (col and block[1] == 1) and (fmt, block, mode, col, out, flavor) not in CAST_BACK_COVERING
]


# ascend-sim lowers each case for Ascend (5-15 s of CPU a kernel), so by default it runs a
# covering subset of the ascend-flavor cases: both data formats, fp32 and packed SF, both
# layouts and outputs, blocks that do not divide the work tile ((3, 80)), SF packed along
# tokens ((5, 1)) and per token ((1, 32), E4M3 data: the dequantization's SIMD region, which
# only E4M3 data in power-of-two blocks has); every other ascend-flavor case runs under slow.
# test_cast_lowering's default Ascend lowerings are these cases (the lowering is cached, so
# they cost the default run nothing more).
SIM_CAST_BACK_COVERING = [("e4m3", (1, 32), "packed", False, "bf16", "ascend"), CAST_BACK_COVERING[10],
                          CAST_BACK_COVERING[11]]
SIM_CAST_BACK_FULL = [case for case in CAST_BACK_COVERING + CAST_BACK_FULL
                      if case[-1] == "ascend" and case not in SIM_CAST_BACK_COVERING]


def sf_options(sf_mode: str, col_major: bool) -> dict:
    round_sf, packed, e4m3_sf = SF_MODES[sf_mode]
    return dict(round_sf=round_sf, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf,
                use_tma_aligned_col_major_sf=col_major)


def cast_back_spec(fmt, block, sf_mode, col_major, out, flavor) -> CastBackSpec:
    _, packed, e4m3_sf = SF_MODES[sf_mode]
    layout = SFLayout.of(get_flavor(flavor), packed=packed, e4m3=e4m3_sf, col_major=col_major, block_k=block[1])
    return CastBackSpec(fmt, out, layout, *block)


def case_id(case) -> str:
    return "-".join(str(part).replace(" ", "") for part in case)
