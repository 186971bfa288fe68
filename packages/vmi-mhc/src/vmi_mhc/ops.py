"""vmi-mhc's ops for the ``vmi`` command (entry point group ``vmi.ops``).

Each entry is built from the op's declaration (``kernel_op_entry``). Token-major shapes:
``(tokens, hidden)`` for the residual ops, ``(tokens,)`` for the mix ops; the stream count is 4.
``mhc_sinkhorn_fwd`` and ``mhc_sinkhorn_bwd`` are checked bit for bit (kernel and reference share
the flavor's fp32 chain).
"""

from __future__ import annotations

import torch

from vmi_core.registry import Option, kernel_op_entry
from vmi_core.targets import flavor_argument, resolve_flavor
from vmi_core.testing import generator

from .inputs import MHC_MULT
from .sinkhorn import MHC_SINKHORN_BWD, MHC_SINKHORN_FWD
from .sinkhorn_parallel import SinkhornSpec, sinkhorn_backward_source, sinkhorn_forward_source


def _flavor_of(target, flavor):
    return resolve_flavor(target, flavor_argument(target, flavor)).name


_PARALLEL_TARGETS = {
    "cpu": "runs; checked against the reference in both flavors",
    "ascend": "lowers to AscendC (SIMD vector regions); runs on ascend-sim, not yet on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model; checked against the reference (ascend flavor)",
    "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
}

# --- sinkhorn ---

SINKHORN_OPTIONS = (
    Option("repeat", 10, help="Sinkhorn iterations (the backward takes 1 to 16)"),
    Option("eps", "1e-6", help="added after the softmax and to every denominator"),
)
# Prefill sizes (throughput) and decode sizes (1, 4, 16 tokens: microseconds per call).
_SINKHORN_SHAPES = ((65536,), (8192,), (512,), (1,), (4,), (16,))


def _sinkhorn_arguments(inputs, options, flavor):
    return {"eps": float(options["eps"])}


def _sinkhorn_forward_inputs(shape, options, seed):
    return {"comb_res_mix": torch.randn(shape[0], MHC_MULT, MHC_MULT, generator=generator(seed))}


def _sinkhorn_backward_inputs(shape, options, seed):
    g = generator(seed)
    return {"grad_output": torch.randn(shape[0], MHC_MULT, MHC_MULT, generator=g),
            "x": torch.randn(shape[0], MHC_MULT, MHC_MULT, generator=g)}


def _sinkhorn_forward_source(options, target, flavor):
    return sinkhorn_forward_source(SinkhornSpec(_flavor_of(target, flavor)), target)


def _sinkhorn_backward_source(options, target, flavor):
    return sinkhorn_backward_source(SinkhornSpec(_flavor_of(target, flavor)), target)


OPS = [
    kernel_op_entry(
        MHC_SINKHORN_FWD,
        arguments=_sinkhorn_arguments,
        family="mhc",
        summary="Sinkhorn projection of the 4x4 comb logits onto (near) doubly-stochastic matrices",
        default_shape=(8192,),
        bench_shapes=_SINKHORN_SHAPES,
        options=SINKHORN_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_sinkhorn_forward_inputs,
        source=_sinkhorn_forward_source,
    ),
    kernel_op_entry(
        MHC_SINKHORN_BWD,
        arguments=_sinkhorn_arguments,
        family="mhc",
        summary="gradient of the Sinkhorn projection w.r.t. the comb logits, by recomputing the forward",
        default_shape=(8192,),
        bench_shapes=_SINKHORN_SHAPES,
        options=SINKHORN_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_sinkhorn_backward_inputs,
        source=_sinkhorn_backward_source,
    ),
]
