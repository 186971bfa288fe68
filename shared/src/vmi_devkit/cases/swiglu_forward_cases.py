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
# None for fp32/bf16 output. By default (each case one compiled kernel, the clamp counters and
# E4M3 encoders the costly parts): every option of the expert path in one plain and one E4M3
# case (ascend flavor), and fp32 input, npc 128, an fp32 SF and the cuda flavor in a third.
COVERING = [
    ("bf16", "bf16", None, None, True, "w+rsf", 0.5, True, "ascend"),
    ("bf16", "e4m3", 32, "packed-col", True, "w+rsf", 0.5, True, "ascend"),
    ("fp32", "e4m3", 128, "fp32", False, "none", None, False, "cuda"),
]
_OUTPUTS = [("fp32", None, None), ("bf16", None, None)] + [
    ("e4m3", npc, mode) for npc, mode in itertools.product((32, 128), SF_MODES)]
# The slow sweep: every output configuration (fp32, bf16, E4M3 with both npc and every SF layout
# of §0.4) with both inputs and flavors, the expert options rotating.
_OPTIONS = [(True, "w+rsf", 0.5, True), (False, "none", None, False), (True, "w", 0.5, False),
            (False, "w+rsf", 10.0, True)]
FULL = [case for case in (
    (in_dtype, *out, *_OPTIONS[index % len(_OPTIONS)], flavor)
    for index, (in_dtype, out, flavor) in enumerate(itertools.product(("bf16", "fp32"), _OUTPUTS,
                                                                      ("ascend", "cuda"))))
    if case not in COVERING]
# ascend-sim lowers and compiles each case for Ascend (half a minute of CPU for a plain case,
# more with the expert options, about a minute with the E4M3 encoders): by default the plainest
# case (fp32 in, bf16 out, every row valid); the expert options, the E4M3 ones (SIMT SF scatter)
# and every other ascend-flavor case under slow.
SIM_COVERING = [("fp32", "bf16", None, None, False, "none", None, False, "ascend")]
SIM_FULL = [case for case in dict.fromkeys(COVERING + FULL) if case[-1] == "ascend" and case not in SIM_COVERING]
# The lowering tests' default subset (the ascend-sim case's lowering is cached already) and the
# E4M3 case of every SF layout under slow.
LOWERING = SIM_COVERING
CUDA_LOWERING = [COVERING[2]]

# swiglu_forward_and_per_channel_cast_and_transpose: (num_per_tokens, round_sf, without_transpose,
# clamp, flavor). By default one kernel (transposed, npt 32, clamped, ascend flavor); the other
# option combinations under ``slow``.
PER_CHANNEL_DEFAULT = (32, False, False, 0.5, "ascend")
PER_CHANNEL_FULL = [case for case in itertools.product((32, 128), (False, True), (False, True), (None, 10.0, 0.5),
                                                       ("ascend", "cuda")) if case != PER_CHANNEL_DEFAULT]


def case_id(case) -> str:
    names = ("", "", "npc", "", "psum", "", "clamp", "count", "")
    parts = []
    for name, value in zip(names, case, strict=True):
        if value is None or value is False:
            continue
        parts.append(name if value is True else f"{name}{value}")
    return "-".join(parts)
