"""vmi-mhc's ops for the ``vmi`` command (entry point group ``vmi.ops``).

Each entry is built from the op's declaration (``kernel_op_entry``). Token-major shapes:
``(tokens, hidden)`` for the residual ops, ``(tokens,)`` for the mix ops; the stream count is an
option (4 by default). ``expand`` and ``pre_apply_mix`` are checked bit for bit.
"""

from __future__ import annotations

import torch

from vmi_core.registry import Option, kernel_op_entry
from vmi_core.targets import flavor_argument, resolve_flavor
from vmi_core.testing import generator, randn

from .expand import EXPAND_TO_MHC_BWD, EXPAND_TO_MHC_FWD
from .expand_parallel import ExpandSpec, expand_bwd_source, expand_fwd_source
from .inputs import MAX_STREAMS
from .pre_apply_mix import MHC_PRE_APPLY_MIX_BWD, MHC_PRE_APPLY_MIX_FWD
from .pre_apply_mix_parallel import (
    PreApplyMixBwdSpec,
    PreApplyMixFwdSpec,
    pre_apply_mix_bwd_source,
    pre_apply_mix_fwd_source,
)

_PARALLEL_TARGETS = {
    "cpu": "runs; checked bit for bit against the reference in both flavors",
    "ascend": "lowers to AscendC (SIMD vector regions); runs on ascend-sim, not yet on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model; checked bit for bit against the reference",
    "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
}
STREAM_OPTIONS = (Option("mhc_mult", 4, tuple(range(1, MAX_STREAMS + 1)), "number of residual streams n"),)
# Prefill sizes (throughput), a decode-size batch and one token.
_SHAPES = ((8192, 4096), (8192, 7168), (512, 4096), (16, 4096), (1, 4096))
# The source the command shows for the backward, whose kernel is specialised on the hidden size.
_SOURCE_HIDDEN = 4096


def _flavor_of(target, flavor):
    return resolve_flavor(target, flavor_argument(target, flavor)).name


def _streams(shape, n, seed):
    # The v1 tests' stream values: sigmoid of normal samples (as a residual after a norm would be).
    return torch.sigmoid(torch.randn(shape[0], n, shape[1], generator=generator(seed))).to(torch.bfloat16)


def _mix(num_tokens, n, seed):
    return torch.softmax(torch.randn(num_tokens, n, generator=generator(seed)), dim=-1)


def _expand_fwd_inputs(shape, options, seed):
    return {"x": randn(shape, seed, torch.bfloat16)}


def _expand_bwd_inputs(shape, options, seed):
    return {"o_grad": randn((shape[0], options["mhc_mult"], shape[1]), seed, torch.bfloat16)}


def _mix_fwd_inputs(shape, options, seed):
    n = options["mhc_mult"]
    return {"x": _streams(shape, n, seed), "mix": _mix(shape[0], n, seed + 1)}


def _mix_bwd_inputs(shape, options, seed):
    n = options["mhc_mult"]
    return {"o_grad": randn(shape, seed + 2, torch.bfloat16), "x": _streams(shape, n, seed),
            "mix": _mix(shape[0], n, seed + 1), "x_grad": randn((shape[0], n, shape[1]), seed + 3, torch.bfloat16)}


OPS = [
    kernel_op_entry(
        EXPAND_TO_MHC_FWD,
        family="mhc",
        summary="widen a hidden state into n residual streams (a bit copy per stream)",
        default_shape=(4096, 4096),
        bench_shapes=_SHAPES,
        options=STREAM_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_expand_fwd_inputs,
        source=lambda options, target, flavor: expand_fwd_source(ExpandSpec(options["mhc_mult"]), target),
    ),
    kernel_op_entry(
        EXPAND_TO_MHC_BWD,
        family="mhc",
        summary="gradient of expand: the fp32 sum of the n stream gradients, rounded to bf16 once",
        default_shape=(4096, 4096),
        bench_shapes=_SHAPES,
        options=STREAM_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_expand_bwd_inputs,
        source=lambda options, target, flavor: expand_bwd_source(ExpandSpec(options["mhc_mult"]), target),
    ),
    kernel_op_entry(
        MHC_PRE_APPLY_MIX_FWD,
        family="mhc",
        summary="sublayer input: the mix-weighted sum of a token's n streams (the flavor's fp32 fma chain)",
        default_shape=(4096, 4096),
        bench_shapes=_SHAPES,
        options=STREAM_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_mix_fwd_inputs,
        source=lambda options, target, flavor: pre_apply_mix_fwd_source(
            PreApplyMixFwdSpec(options["mhc_mult"], _flavor_of(target, flavor)), target),
    ),
    kernel_op_entry(
        MHC_PRE_APPLY_MIX_BWD,
        family="mhc",
        summary="gradients of pre_apply_mix: stream gradients accumulated in place, per-token mix "
                "gradients (fixed-order sums)",
        default_shape=(4096, 4096),
        bench_shapes=_SHAPES,
        options=STREAM_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_mix_bwd_inputs,
        source=lambda options, target, flavor: pre_apply_mix_bwd_source(
            PreApplyMixBwdSpec(options["mhc_mult"], _SOURCE_HIDDEN), target),
    ),
]
