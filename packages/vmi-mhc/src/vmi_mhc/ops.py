"""vmi-mhc's ops for the ``vmi`` command (entry point group ``vmi.ops``).

Each entry is built from the op's declaration (``kernel_op_entry``). Token-major shapes:
``(tokens, hidden)`` for the residual ops, ``(tokens,)`` for the mix ops; the stream count is 4.
"""

from __future__ import annotations

import torch

from vmi_core.registry import Option, kernel_op_entry
from vmi_core.testing import randn

from .inputs import MHC_MULT, mix_width
from .pre_norm_fn_gemm import MHC_PRE_NORM_FN_GEMM_BWD, MHC_PRE_NORM_FN_GEMM_FWD
from .pre_norm_fn_gemm_parallel import GemmSpec, gemm_bwd_source, gemm_fwd_source

# --- the prenorm GEMM of norm_fn (shape: tokens, hidden H; K = 4·H) ---

_GEMM_OPTIONS = (
    Option("mix", mix_width(MHC_MULT), (mix_width(2), mix_width(MHC_MULT), 32), "rows n3 of fn (mix entries)"),
)
_GEMM_FWD_OPTIONS = (*_GEMM_OPTIONS, Option("n_splits", 16, (1, 2, 4, 16), "K slices (split-K partials)"))
_GEMM_TARGETS = {
    "cpu": "runs; bit-exact against the reference (its fixed summation order), both flavors alike",
    "ascend": "lowers to AscendC: T.gemm on the Cube unit, SIMD vector regions; not run (ascend-sim has no "
              "Cube model yet)",
    "ascend-sim": "refused: the simulator models the vector cores only (the TF32 operand kernel runs on it)",
    "cuda": "lowers (tensor-core MMA) and compiles with nvcc (sm_90a); not run without a GPU",
}
_GEMM_SHAPES = ((8192, 4096), (4096, 7168), (4096, 1280), (16, 4096))
_SOURCE_HIDDEN = 4096


def _gemm_fwd_inputs(shape, options, seed):
    tokens, hidden = shape
    return {"x": randn((tokens, MHC_MULT * hidden), seed, torch.bfloat16),
            "fn": randn((options["mix"], MHC_MULT * hidden), seed + 1) * 1e-2}


def _gemm_bwd_inputs(shape, options, seed):
    tokens, hidden = shape
    mix = options["mix"]
    return {**_gemm_fwd_inputs(shape, options, seed),
            "out_mul_grad": randn((tokens, mix), seed + 2), "sqrsum_grad": randn((tokens,), seed + 3) * 1e-3,
            "x_grad": randn((tokens, MHC_MULT * hidden), seed + 4, torch.bfloat16)}


def _gemm_fwd_source(options, target, flavor):
    return gemm_fwd_source(GemmSpec(MHC_MULT * _SOURCE_HIDDEN, options["mix"], options["n_splits"]), target)


def _gemm_bwd_source(options, target, flavor):
    return gemm_bwd_source(GemmSpec(MHC_MULT * _SOURCE_HIDDEN, options["mix"]), target)


OPS = [
    kernel_op_entry(
        MHC_PRE_NORM_FN_GEMM_FWD,
        family="mhc",
        summary="norm_fn's prenorm GEMM: split-K partials of x · tf32(fn)ᵀ and of Σx² (DeepGEMM "
                "tf32_hc_prenorm_gemm)",
        default_shape=(4096, 4096),
        bench_shapes=_GEMM_SHAPES,
        options=_GEMM_FWD_OPTIONS,
        targets=_GEMM_TARGETS,
        make_inputs=_gemm_fwd_inputs,
        source=_gemm_fwd_source,
    ),
    kernel_op_entry(
        MHC_PRE_NORM_FN_GEMM_BWD,
        family="mhc",
        summary="backward of norm_fn's prenorm GEMM: x_grad accumulated in place, fn_grad (column-owned, "
                "deterministic)",
        default_shape=(4096, 4096),
        bench_shapes=_GEMM_SHAPES,
        options=_GEMM_OPTIONS,
        targets=_GEMM_TARGETS,
        make_inputs=_gemm_bwd_inputs,
        source=_gemm_bwd_source,
    ),
]
