"""The swiglu_forward configuration matrices shared by the run and lowering tests."""

from __future__ import annotations

import itertools

SF_MODES = {
    # name: (use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    "fp32": (False, False, False),
    "pow2": (False, True, False),
    "packed": (False, True, True),
    "fp32-col": (True, False, False),
    "packed-col": (True, True, True),
}
# Row weights: none, topk_weights, topk_weights and routed_scaling_factor.
WEIGHTS = ("none", "w", "w+rsf")

# (in_dtype, fmt, num_per_channels, sf_mode, psum, weights, clamp, count, flavor); npc and sf_mode
# None for fp32/bf16 output. Every output format meets both input dtypes, both flavors, the
# expert layout and plain rows; every SF layout of §0.4 and both npc come in; clamping with and
# without the counters; every weight mode.
COVERING = [
    ("bf16", "fp32", None, None, True, "w+rsf", 0.5, True, "ascend"),
    ("fp32", "bf16", None, None, False, "none", None, False, "cuda"),
    ("bf16", "e4m3", 32, "fp32", True, "w+rsf", 0.5, True, "ascend"),
    ("bf16", "e4m3", 128, "packed-col", True, "w", 0.5, True, "cuda"),
    ("fp32", "e4m3", 32, "pow2", False, "none", None, False, "ascend"),
    ("bf16", "e4m3", 128, "fp32-col", True, "none", 10.0, False, "ascend"),
    ("fp32", "e4m3", 32, "packed", False, "w", 0.5, True, "cuda"),
]
_OUTPUTS = [("fp32", None, None), ("bf16", None, None)] + [
    ("e4m3", npc, mode) for npc, mode in itertools.product((32, 128), SF_MODES)]
# The slow sweep: every output configuration with both inputs and flavors, the expert options
# rotating.
_OPTIONS = [(True, "w+rsf", 0.5, True), (False, "none", None, False), (True, "w", 0.5, False),
            (False, "w+rsf", 10.0, True)]
FULL = [case for case in (
    (in_dtype, *out, *_OPTIONS[index % len(_OPTIONS)], flavor)
    for index, (in_dtype, out, flavor) in enumerate(itertools.product(("bf16", "fp32"), _OUTPUTS,
                                                                      ("ascend", "cuda"))))
    if case not in COVERING]
# ascend-sim lowers each case for Ascend (10-20 s of CPU a kernel): by default one E4M3 case with
# every option (SIMT SF scatter of packed bytes, expert search, weights, counters) and one bf16
# output; the other ascend-flavor cases under slow.
SIM_COVERING = [
    ("bf16", "e4m3", 32, "packed-col", True, "w+rsf", 0.5, True, "ascend"),
    ("fp32", "bf16", None, None, False, "none", None, False, "ascend"),
]
SIM_FULL = [case for case in COVERING + FULL if case[-1] == "ascend" and case not in SIM_COVERING]
# The lowering tests' default subset (the ascend-sim cases' lowerings are cached already).
LOWERING = SIM_COVERING
CUDA_LOWERING = [COVERING[3]]


def case_id(case) -> str:
    names = ("", "", "npc", "", "psum", "", "clamp", "count", "")
    parts = []
    for name, value in zip(names, case, strict=True):
        if value is None or value is False:
            continue
        parts.append(name if value is True else f"{name}{value}")
    return "-".join(parts)
