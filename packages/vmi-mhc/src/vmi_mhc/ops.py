"""vmi-mhc's ops for the ``vmi`` command (entry point group ``vmi.ops``).

Each entry is built from the op's declaration (``kernel_op_entry``). Token-major shapes:
``(tokens, hidden)`` for the residual ops (as ``(B, S) = (tokens, 1)``), ``(tokens,)`` for the mix
ops; the stream count is 4.
"""

from __future__ import annotations

import torch

from vmi_core.registry import Option, kernel_op_entry
from vmi_core.testing import randn

from .inputs import MHC_MULT
from .post import MHC_POST_BWD, MHC_POST_FWD
from .post_parallel import PostBackwardSpec, PostForwardSpec, post_bwd_source, post_fwd_source

_PARALLEL_TARGETS = {
    "cpu": "runs; bit-exact against the reference in both flavors",
    "ascend": "lowers to AscendC (SIMD vector regions); runs on ascend-sim, not yet on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model; bit-exact against the reference",
    "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
}
# Prefill sizes at the models' hidden sizes (throughput) and decode sizes (microseconds per call).
_RESIDUAL_SHAPES = ((8192, 4096), (4096, 7168), (512, 5120), (1, 4096), (4, 4096), (16, 4096))
# Hidden size of the sources the command shows.
_SOURCE_HIDDEN = 4096


# --- post ---

POST_FWD_OPTIONS = (Option("mhc_mult", MHC_MULT, tuple(range(1, 9)), "residual streams n"),)


def _post_inputs(shape, n: int, seed: int) -> dict:
    # Unnormalised randn mixes, as TileKernels' tests draw them.
    tokens, hidden = shape
    return {
        "x": randn((tokens, 1, hidden), seed, torch.bfloat16),
        "residual": randn((tokens, 1, n, hidden), seed + 1, torch.bfloat16),
        "post_layer_mix": randn((tokens, 1, n, 1), seed + 2),
        "comb_res_mix": randn((tokens, 1, n, n), seed + 3),
    }


def _post_fwd_inputs(shape, options, seed):
    return _post_inputs(shape, options["mhc_mult"], seed)


def _post_bwd_inputs(shape, options, seed):
    inputs = _post_inputs(shape, MHC_MULT, seed)
    inputs["d_o"] = randn(tuple(inputs["residual"].shape), seed + 4, torch.bfloat16)
    return inputs


def _post_fwd_source(options, target, flavor):
    return post_fwd_source(PostForwardSpec(options["mhc_mult"], _SOURCE_HIDDEN), target)


def _post_bwd_source(options, target, flavor):
    return post_bwd_source(PostBackwardSpec(MHC_MULT, _SOURCE_HIDDEN), target)


OPS = [
    kernel_op_entry(
        MHC_POST_FWD,
        family="mhc",
        summary="the next widened residual: post[o] * x + sum_i comb[i, o] * residual[i], bf16",
        default_shape=(1024, 4096),
        bench_shapes=_RESIDUAL_SHAPES,
        options=POST_FWD_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_post_fwd_inputs,
        source=_post_fwd_source,
    ),
    kernel_op_entry(
        MHC_POST_BWD,
        family="mhc",
        summary="gradients of mhc_post_fwd: d_x, d_residual (bf16), d_post_layer_mix, d_comb_res_mix (fp32)",
        default_shape=(1024, 4096),
        bench_shapes=_RESIDUAL_SHAPES,
        options=(),
        targets=_PARALLEL_TARGETS,
        make_inputs=_post_bwd_inputs,
        source=_post_bwd_source,
    ),
]
