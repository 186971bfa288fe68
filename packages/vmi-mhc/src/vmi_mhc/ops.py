"""vmi-mhc's ops for the ``vmi`` command (entry point group ``vmi.ops``).

Each entry is built from the op's declaration (``kernel_op_entry``). Token-major shapes:
``(tokens, hidden)`` for the residual ops, ``(tokens,)`` for the mix ops; the stream count is 4.
"""

from __future__ import annotations

import torch

from vmi_core.registry import kernel_op_entry
from vmi_core.targets import flavor_argument, resolve_flavor
from vmi_core.testing import generator

from .inputs import MHC_MULT, mix_width
from .pre_split_mixes import MHC_PRE_SPLIT_MIXES_BWD, MHC_PRE_SPLIT_MIXES_FWD
from .pre_split_mixes_parallel import (
    PreSplitMixesSpec,
    pre_split_mixes_bwd_reduce_source,
    pre_split_mixes_bwd_source,
    pre_split_mixes_fwd_source,
)
from .reference import pre_split_mixes as split_reference

_PARALLEL_TARGETS = {
    "cpu": "runs; checked against the reference in both flavors",
    "ascend": "lowers to AscendC (SIMD vector regions; SIMT for the backward's final stores); runs on "
              "ascend-sim, not yet on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model; checked against the reference (ascend flavor)",
    "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
}
# Prefill sizes (throughput) and decode sizes (1, 4, 16 tokens: microseconds per call).
_MIX_SHAPES = ((65536,), (8192,), (1001,), (1,), (4,), (16,))


def _flavor_of(target, flavor):
    return resolve_flavor(target, flavor_argument(target, flavor)).name


# --- pre_split_mixes ---

# TileKernels' test values.
_POST_MULT = 2.0
_PRE_EPS = 1e-2


def _split_parameters(g):
    return {"mhc_scale": torch.randn(3, generator=g), "mhc_base": torch.randn(mix_width(MHC_MULT), generator=g)}


def _split_fwd_inputs(shape, options, seed):
    g = generator(seed)
    return {"input_mixes": torch.randn(shape[0], mix_width(MHC_MULT), generator=g), **_split_parameters(g)}


def _split_bwd_inputs(shape, options, seed):
    g = generator(seed)
    num_tokens, n = shape[0], MHC_MULT
    inputs = {"input_mixes": torch.randn(num_tokens, mix_width(n), generator=g), **_split_parameters(g),
              "pre_layer_mix_grad": torch.randn(num_tokens, n, generator=g),
              "post_layer_mix_grad": torch.randn(num_tokens, n, generator=g),
              "comb_res_mix_grad": torch.randn(num_tokens, n * n, generator=g)}
    _, inputs["post_layer_mix"], _ = split_reference.pre_split_mixes_fwd(
        inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"], _POST_MULT, _PRE_EPS)
    return inputs


def _split_fwd_source(options, target, flavor):
    return pre_split_mixes_fwd_source(PreSplitMixesSpec(_flavor_of(target, flavor)), target)


def _split_bwd_source(options, target, flavor):
    # Both kernels of the backward (so that vmi precompile builds both): the tile kernel, then the reduction.
    return "\n".join((pre_split_mixes_bwd_source(PreSplitMixesSpec(_flavor_of(target, flavor)), target),
                      pre_split_mixes_bwd_reduce_source(target)))


OPS = [
    kernel_op_entry(
        MHC_PRE_SPLIT_MIXES_FWD,
        arguments=lambda inputs, options, flavor: {"mhc_post_mult_value": _POST_MULT, "mhc_pre_eps": _PRE_EPS},
        family="mhc",
        summary="split the mix vector into the pre and post mixes (sigmoid) and the comb logits",
        default_shape=(8192,),
        bench_shapes=_MIX_SHAPES,
        options=(),
        targets=_PARALLEL_TARGETS,
        make_inputs=_split_fwd_inputs,
        source=_split_fwd_source,
    ),
    kernel_op_entry(
        MHC_PRE_SPLIT_MIXES_BWD,
        arguments=lambda inputs, options, flavor: {"mhc_post_mult_value": _POST_MULT},
        family="mhc",
        summary="gradient of pre_split_mixes w.r.t. the mix vector, the gains and the biases (fixed-order sums)",
        default_shape=(8192,),
        bench_shapes=_MIX_SHAPES,
        options=(),
        targets=_PARALLEL_TARGETS,
        make_inputs=_split_bwd_inputs,
        source=_split_bwd_source,
    ),
]
