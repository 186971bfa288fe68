"""The per_token_cast_and_cast_back configuration matrices shared by the run and lowering tests."""

from __future__ import annotations

import itertools

import torch

SF_MODES = {
    # name: (round_sf, use_e4m3_sf)
    "fp32": (False, False),
    "e4m3": (False, True),
    "pow2": (True, False),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

# (in_dtype, fmt, num_per_channels, sf_mode): every npc twice, every (dtype, fmt), (mode, fmt)
# and (mode, dtype) pair at least once.
COVERING = [
    ("bf16", "e4m3", 32, "fp32"),
    ("fp32", "e2m1", 16, "fp32"),
    ("bf16", "e2m1", 128, "fp32"),
    ("fp32", "e4m3", 64, "e4m3"),
    ("bf16", "e2m1", 16, "e4m3"),
    ("bf16", "e4m3", 128, "e4m3"),
    ("fp32", "e2m1", 32, "pow2"),
    ("bf16", "e4m3", 64, "pow2"),
]
FULL = [case for case in itertools.product(DTYPES, ("e4m3", "e2m1"), (16, 32, 64, 128), SF_MODES)
        if case not in COVERING]
# ascend-sim lowers each case for Ascend (5-10 s of CPU a kernel), so by default it runs two
# cases (both dtypes and formats, fp32 and E4M3 SF, 64 and 128 channels a group); the rest,
# power-of-two SF included, under slow.
SIM_COVERING = [COVERING[i] for i in (2, 3)]
SIM_FULL = [case for case in COVERING + FULL if case not in SIM_COVERING]
# The lowering tests' default subset (Ascend lowering costs ~3 s a kernel): the two kernels the
# default ascend-sim tests compile (COVERING[2] in test_matches_reference_on_ascend_sim, COVERING[3]
# in test_noncontiguous_rows_leave_padding_untouched: their lowering is cached, so it costs nothing
# more; together both dtypes and formats, fp32 and E4M3 SF). The Ascend checks are the same for every
# case, so the rest of COVERING, the power-of-two SF included, lowers under slow.
LOWERING = SIM_COVERING
CUDA_LOWERING = [COVERING[3]]


def hidden_unit(num_per_channels: int) -> int:
    """The smallest valid hidden size: a multiple of 64 and of num_per_channels."""
    return max(64, num_per_channels)
