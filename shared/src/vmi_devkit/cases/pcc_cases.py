"""The per_channel_cast configuration matrices shared by the run and lowering tests."""

from __future__ import annotations

import itertools

OUT_SF = {
    # name: (round_sf, use_packed_ue8m0)
    "fp32": (False, False),
    "pow2": (True, False),
    "packed": (True, True),
}
# The SF of a pre-quantized input (per-token blocks (1, npc)): reference.cast options. The spec's
# input configurations (col_major, round_sf, packed) are "pow2", "fp32" and "packed-col"; E4M3 and
# column-major fp32 SF come on top.
IN_SF = {
    "fp32": dict(),
    "pow2": dict(round_sf=True),
    "packed-col": dict(round_sf=True, use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True),
    "packed": dict(round_sf=True, use_packed_ue8m0=True),
    "e4m3": dict(use_e4m3_sf=True),
    "fp32-col": dict(use_tma_aligned_col_major_sf=True),
}

# (in_dtype, num_per_channels, in_sf, num_per_tokens, out_sf, flavor); in_dtype "e4m3" is a
# pre-quantized (data, sf) input, the others plain tensors (npc and in_sf None).
# Every input kind meets both npt, every output SF mode and both flavors; every input SF kind of
# the spec meets both npc; packed output meets both npt in both flavors.
COVERING = [
    ("bf16", None, None, 32, "fp32", "ascend"),
    ("bf16", None, None, 128, "pow2", "ascend"),
    ("fp32", None, None, 128, "packed", "ascend"),
    ("fp32", None, None, 32, "packed", "cuda"),
    ("e4m3", 32, "packed-col", 32, "packed", "ascend"),
    ("e4m3", 128, "pow2", 128, "fp32", "cuda"),
    ("e4m3", 32, "fp32", 128, "packed", "cuda"),
    ("e4m3", 128, "e4m3", 32, "pow2", "ascend"),
    ("e4m3", 128, "packed-col", 128, "packed", "cuda"),
]
_PLAIN = [(dtype, None, None, npt, out, flavor)
          for dtype, npt, out, flavor in itertools.product(("bf16", "fp32"), (32, 128), OUT_SF, ("ascend", "cuda"))]
_QUANTIZED = [("e4m3", npc, in_sf, npt, out, ("ascend", "cuda")[index % 2])
              for index, (npc, in_sf, npt, out) in enumerate(itertools.product((32, 128), IN_SF, (32, 128), OUT_SF))]
# The slow sweep: every plain case; every quantized (npc, input SF, npt, output SF), the flavor
# alternating.
FULL = [case for case in _PLAIN + _QUANTIZED if case not in COVERING]
# ascend-sim lowers each case for Ascend (5-10 s of CPU a kernel): by default a plain bf16 input
# whose fp32 SF goes out by DMA; every other ascend-flavor case runs under slow.
SIM_COVERING = [COVERING[1]]
SIM_FULL = [case for case in COVERING + FULL if case[-1] == "ascend" and case not in SIM_COVERING]
# The lowering tests' default subset: that case and a quantized input with SIMT regions on both
# sides (input-SF gather, packed-SF store).
LOWERING = [COVERING[i] for i in (4, 1)]
CUDA_LOWERING = [COVERING[8]]


def case_id(case) -> str:
    return "-".join(str(v) for v in case if v is not None)


def out_options(out_sf: str) -> dict:
    round_sf, packed = OUT_SF[out_sf]
    return dict(round_sf=round_sf, use_packed_ue8m0=packed)
