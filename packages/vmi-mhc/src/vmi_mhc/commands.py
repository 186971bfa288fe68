"""vmi-mhc's ops for the ``vmi`` command (entry point group ``vmi.ops``).

Each entry is built from the op's declaration (``kernel_op_entry``). Token-major shapes:
``(tokens, hidden)`` for the residual ops (``expand``, ``pre_apply_mix``, ``multilayer_recompute``:
the stream count is an option, 4 by default; ``post`` as ``(B, S) = (tokens, 1)``, 4 streams), the
``norm_fn`` stages (``K = 4 · hidden``, ``n3 = 24`` mix entries; the merge stages use the hidden
size only: ``fn`` is ``(24, K)``) and ``pre_big_fuse`` (4 streams, its partials and residual of that
shape); ``(tokens,)`` for the mix ops (``head_compute_mix``, whose stream count is an option, 4 by
default; ``pre_split_mixes``, ``sinkhorn``). Every entry is checked bit for bit (the prenorm GEMM's
within its stated bounds): kernel and reference share the flavor's fp32 chain.
"""

from __future__ import annotations

import torch

from vmi_core.registry import Option, kernel_op_entry
from vmi_core.targets import flavor_argument, resolve_flavor
from vmi_core.testing import compare_named, generator, randn

from .inputs import MAX_STREAMS, MHC_MULT, mix_width
from .kernels.expand import ExpandSpec, build_expand_bwd, build_expand_fwd
from .kernels.head_compute_mix import HeadComputeMixSpec, build_head_compute_mix_bwd, build_head_compute_mix_fwd
from .kernels.multilayer_recompute import MAX_LAYERS, MAX_MHC_MULT, MultilayerRecomputeSpec, build_multilayer_recompute
from .kernels.norm_fn import MergeSpec, ReduceSpec, build_merge_bwd, build_merge_fwd, build_reduce_bwd, build_reduce_fwd
from .kernels.post import PostBackwardSpec, PostForwardSpec, build_post_bwd, build_post_fwd
from .kernels.pre_apply_mix import (
    PreApplyMixBwdSpec,
    PreApplyMixFwdSpec,
    build_pre_apply_mix_bwd,
    build_pre_apply_mix_fwd,
)
from .kernels.pre_big_fuse import PreBigFuseSpec, build_pre_big_fuse
from .kernels.pre_norm_fn_gemm import GemmSpec, build_gemm_bwd, build_gemm_fwd
from .kernels.pre_split_mixes import (
    PreSplitMixesSpec,
    build_pre_split_mixes_bwd,
    build_pre_split_mixes_bwd_reduce,
    build_pre_split_mixes_fwd,
)
from .kernels.sinkhorn import SinkhornSpec, build_sinkhorn_backward, build_sinkhorn_forward
from .ops.expand import EXPAND_TO_MHC_BWD, EXPAND_TO_MHC_FWD
from .ops.head_compute_mix import MHC_HEAD_COMPUTE_MIX_BWD, MHC_HEAD_COMPUTE_MIX_FWD
from .ops.multilayer_recompute import MHC_MULTILAYER_RECOMPUTE
from .ops.norm_fn import (
    MHC_FN_NORMW_MERGE_BWD,
    MHC_FN_NORMW_MERGE_FWD,
    MHC_REDUCE_PARTIALS_AND_RMSNORM_BWD,
    MHC_REDUCE_PARTIALS_AND_RMSNORM_FWD,
)
from .ops.post import MHC_POST_BWD, MHC_POST_FWD
from .ops.pre_apply_mix import MHC_PRE_APPLY_MIX_BWD, MHC_PRE_APPLY_MIX_FWD
from .ops.pre_big_fuse import MHC_PRE_BIG_FUSE_FWD
from .ops.pre_norm_fn_gemm import MHC_PRE_NORM_FN_GEMM_BWD, MHC_PRE_NORM_FN_GEMM_FWD
from .ops.pre_split_mixes import MHC_PRE_SPLIT_MIXES_BWD, MHC_PRE_SPLIT_MIXES_FWD
from .ops.sinkhorn import MHC_SINKHORN_BWD, MHC_SINKHORN_FWD
from .reference import pre_split_mixes as split_reference

_SPLIT_TARGETS = {
    "cpu": "runs; checked against the reference in both flavors",
    "ascend": "lowers to AscendC (SIMD vector regions; SIMT for the backward's final stores); runs on "
              "ascend-sim, not yet on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model; checked against the reference (ascend flavor)",
    "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
}
# Prefill sizes (throughput) and decode sizes (1, 4, 16 tokens: microseconds per call).
_MIX_SHAPES = ((65536,), (8192,), (1001,), (1,), (4,), (16,))

# Hidden size of the sources the command shows (kernels specialised on it).
_SOURCE_HIDDEN = 4096


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
    return build_pre_split_mixes_fwd.source(PreSplitMixesSpec(_flavor_of(target, flavor)), target)


def _split_bwd_source(options, target, flavor):
    # Both kernels of the backward (so that vmi precompile builds both): the tile kernel, then the reduction.
    return "\n".join((build_pre_split_mixes_bwd.source(PreSplitMixesSpec(_flavor_of(target, flavor)), target),
                      build_pre_split_mixes_bwd_reduce.source(REDUCE_SPEC, target)))


NORM_EPS = 1e-6
"""The RMS epsilon of the ``norm_fn`` entries (TileKernels' tests use 1e-6)."""
_MIX = mix_width(MHC_MULT)
_DEFAULT_SHAPE = (4096, 4096)
_BENCH_SHAPES = ((8192, 4096), (8192, 7168), (4096, 1280), (16, 7168))
_NORM_FN_TARGETS = {
    "cpu": "runs; bit-exact against the reference in both flavors",
    "ascend": "lowers to AscendC (SIMD vector regions); runs on ascend-sim, not yet on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model; bit-exact against the reference (ascend flavor)",
    "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
}


def _group_size(shape) -> int:
    return MHC_MULT * shape[1]


# --- norm_fn merge (stages A, A') ---

def _merge_inputs(shape, options, seed):
    g = generator(seed)
    k = _group_size(shape)
    return {"fn": torch.randn(_MIX, k, generator=g) * 1e-4, "normw": torch.randn(k, generator=g) * 0.1 + 1,
            "out_fn_grad": torch.randn(_MIX, k, generator=g), "fn_grad": torch.randn(_MIX, k, generator=g),
            "normw_grad": torch.randn(k, generator=g)}


def _merge_fwd_inputs(shape, options, seed):
    inputs = _merge_inputs(shape, options, seed)
    return {"fn": inputs["fn"], "normw": inputs["normw"]}


# --- norm_fn reduce (stages C, D) ---

REDUCE_FWD_OPTIONS = (Option("n_splits", 16, tuple(range(1, 65)),
                             "split-K partials (TileKernels: 16 on CUDA, 1 on Ascend)"),)


def _partials(shape, n_splits, seed):
    """Partials as the prenorm GEMM gives them on unit-variance data with ``fn ~ 1e-2``."""
    tokens, k = shape[0], _group_size(shape)
    g = generator(seed)
    partials = torch.randn(n_splits, tokens, 1, _MIX, generator=g) * (k / n_splits) ** 0.5 * 1e-2
    sqrsums = (0.5 + torch.rand(n_splits, tokens, 1, generator=g)) * (k / n_splits)
    return partials, sqrsums


def _reduce_fwd_inputs(shape, options, seed):
    partials, sqrsums = _partials(shape, options["n_splits"], seed)
    # The hidden size is not in the partials' shapes: the group size comes with them.
    return {"out_mul_splitted": partials, "sqrsum_splitted": sqrsums, "rms_group_size": _group_size(shape)}


def _reduce_bwd_inputs(shape, options, seed):
    partials, sqrsums = _partials(shape, 1, seed)
    return {"out_grad": torch.randn(shape[0], _MIX, generator=generator(seed + 1)), "out_mul": partials[0],
            "sqrsum": sqrsums[0], "rms_group_size": _group_size(shape)}


def _reduce_spec(options, target, flavor) -> ReduceSpec:
    """The specialisation of the default shape's group size."""
    return ReduceSpec(_MIX, MHC_MULT * _DEFAULT_SHAPE[1], NORM_EPS, _flavor_of(target, flavor))
_SINKHORN_TARGETS = {
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
    return build_sinkhorn_forward.source(SinkhornSpec(_flavor_of(target, flavor)), target)


def _sinkhorn_backward_source(options, target, flavor):
    return build_sinkhorn_backward.source(SinkhornSpec(_flavor_of(target, flavor)), target)


# --- the prenorm GEMM of norm_fn (shape: tokens, hidden H; K = 4·H) ---

_GEMM_OPTIONS = (
    Option("mix", mix_width(MHC_MULT), (mix_width(2), mix_width(MHC_MULT), 32), "rows n3 of fn (mix entries)"),
)
_GEMM_FWD_OPTIONS = (*_GEMM_OPTIONS, Option("n_splits", 16, (1, 2, 4, 16), "K slices (split-K partials)"))
_GEMM_TARGETS = {
    "cpu": "runs; bit-exact against the reference (its fixed summation order), both flavors alike",
    "ascend": "lowers to AscendC: T.gemm on the Cube unit, SIMD vector regions; runs on ascend-sim, not yet "
              "on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model, Cube unit included: square sums and fn_grad bit-exact, "
                  "the Cube's sums within the stated bound of the reference",
    "cuda": "lowers (tensor-core MMA) and compiles with nvcc (sm_90a); not run without a GPU",
}
_GEMM_SHAPES = ((8192, 4096), (4096, 7168), (4096, 1280), (16, 4096))


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
    return build_gemm_fwd.source(GemmSpec(MHC_MULT * _SOURCE_HIDDEN, options["mix"], options["n_splits"]), target)


def _gemm_bwd_source(options, target, flavor):
    return build_gemm_bwd.source(GemmSpec(MHC_MULT * _SOURCE_HIDDEN, options["mix"]), target)


def _within(name, actual, wanted, tolerance) -> list[str]:
    bad = (actual.float() - wanted.float()).abs() > tolerance
    if not bad.any():
        return []
    first = tuple(int(i) for i in bad.nonzero()[0])
    return [f"  {name}: {int(bad.sum())} values farther than the bound, first at {first}: "
            f"{actual[first].item()!r} vs {wanted[first].item()!r}"]


def _gemm_check(exact_names, summed):
    """Bit for bit on the outputs every target computes in one order (square sums, fn_grad, cpu's
    everything); the matrix units' sums (``summed``: name, position) within the docs page's bound."""
    bitwise = compare_named(exact_names)

    def check(outputs, expected):
        name, at = summed
        exact = [o for i, o in enumerate(outputs) if i != at]
        lines = bitwise(exact, [e for i, e in enumerate(expected) if i != at])
        actual, wanted = outputs[at].cpu(), expected[at].cpu()
        if wanted.dtype == torch.bfloat16:
            # One bf16 rounding step apart at most.
            tolerance = wanted.float().abs() * 2.0**-7 + 2.0**-126
        else:
            # (γ(K_s - 1) + γ(2 K_s - 1)) · Σ|p|: for the command's random inputs Σ|p| is about
            # sqrt(K_s) times a typical sum, so the bound is about 2^-9 of the largest sum.
            tolerance = wanted.abs().amax() * 2.0**-9
        return lines + _within(name, actual, wanted, tolerance)
    return check


# --- pre_big_fuse (shape: tokens, hidden H) ---

_BIG_FUSE_TARGETS = {
    "cpu": "runs; bit-exact against the reference (= the unfused chain) in both flavors",
    "ascend": "lowers to AscendC (SIMD vector regions); runs on ascend-sim, not yet on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model; bit-exact against the reference (ascend flavor)",
    "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
}
_BIG_FUSE_OPTIONS = (Option("n_splits", 16, tuple(range(1, 65)),
                            "split-K partials (TileKernels: 16 on CUDA, 1 on Ascend)"),)
# TileKernels' benchmark sizes, and a decode-size batch.
_BIG_FUSE_SHAPES = ((8192, 4096), (8192, 7168), (512, 4096), (16, 4096))


def _big_fuse_inputs(shape, options, seed):
    partials, sqrsums = _partials(shape, options["n_splits"], seed)
    g = generator(seed + 1)
    return {"gemm_out_mul": partials[:, :, 0], "gemm_out_sqrsum": sqrsums[:, :, 0],
            "mhc_scale": torch.randn(3, generator=g) * 0.1, "mhc_base": torch.randn(_MIX, generator=g) * 0.1,
            "residual": _streams(shape, MHC_MULT, seed + 2)}


def _big_fuse_arguments(inputs, options, flavor):
    # TileKernels' test values (v1 test_pre_big_fuse; the post multiplier of the split tests).
    return {"rms_eps": NORM_EPS, "mhc_pre_eps": 1e-6, "mhc_sinkhorn_eps": 1e-6, "mhc_post_mult_value": _POST_MULT,
            "sinkhorn_repeat": 10}


def _big_fuse_source(options, target, flavor):
    return build_pre_big_fuse.source(PreBigFuseSpec(MHC_MULT * _SOURCE_HIDDEN, NORM_EPS, _flavor_of(target, flavor)),
                               target)


# --- expand, pre_apply_mix (shape: tokens, hidden H) ---

_STREAM_TARGETS = {
    "cpu": "runs; checked bit for bit against the reference in both flavors",
    "ascend": "lowers to AscendC (SIMD vector regions); runs on ascend-sim, not yet on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model; checked bit for bit against the reference",
    "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
}
STREAM_OPTIONS = (Option("mhc_mult", 4, tuple(range(1, MAX_STREAMS + 1)), "number of residual streams n"),)
# Prefill sizes (throughput), a decode-size batch and one token.
_SHAPES = ((8192, 4096), (8192, 7168), (512, 4096), (16, 4096), (1, 4096))


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


_POST_TARGETS = {
    "cpu": "runs; bit-exact against the reference in both flavors",
    "ascend": "lowers to AscendC (SIMD vector regions); runs on ascend-sim, not yet on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model; bit-exact against the reference",
    "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
}
# Prefill sizes at the models' hidden sizes (throughput) and decode sizes (microseconds per call).
_RESIDUAL_SHAPES = ((8192, 4096), (4096, 7168), (512, 5120), (1, 4096), (4, 4096), (16, 4096))


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
    return build_post_fwd.source(PostForwardSpec(options["mhc_mult"], _SOURCE_HIDDEN), target)


def _post_bwd_source(options, target, flavor):
    return build_post_bwd.source(PostBackwardSpec(MHC_MULT, _SOURCE_HIDDEN), target)


# --- head_compute_mix (shape: tokens) ---

HEAD_OPTIONS = (Option("mhc_mult", MHC_MULT, tuple(range(1, MAX_STREAMS + 1)), "residual streams n"),)
HEAD_BWD_OPTIONS = (*HEAD_OPTIONS,
                    Option("num_sms", 64, help="partial rows P of the parameter gradients (Ascend 950: 64 vector "
                                               "cores)"))
_HEAD_TARGETS = {
    "cpu": "runs; bit-exact against the reference in both flavors",
    "ascend": "lowers to AscendC (SIMD vector regions; SIMT for the backward's final stores); runs on "
              "ascend-sim, not yet on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model; bit-exact against the reference (ascend flavor)",
    "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
}


def _head_inputs(shape, options, seed):
    # TileKernels' test data: normal input, gain, biases and output gradient.
    g = generator(seed)
    num_tokens, n = shape[0], options["mhc_mult"]
    return {"input_mix": torch.randn(num_tokens, n, generator=g), "mhc_scale": torch.randn(1, generator=g),
            "mhc_base": torch.randn(n, generator=g), "output_mix_grad": torch.randn(num_tokens, n, generator=g)}


def _head_fwd_inputs(shape, options, seed):
    inputs = _head_inputs(shape, options, seed)
    del inputs["output_mix_grad"]
    return inputs


def _head_spec(options, target, flavor):
    return HeadComputeMixSpec(options["mhc_mult"], _flavor_of(target, flavor))
# --- multilayer_recompute ---

RECOMPUTE_OPTIONS = (
    Option("mhc_mult", MHC_MULT, tuple(range(1, MAX_MHC_MULT + 1)), "residual streams n"),
    Option("num_layers", 4, tuple(range(1, MAX_LAYERS + 1)), "layers L"),
    Option("last_post", True, (True, False), "whether the last layer has a post update (L_post = L, else L - 1)"),
)


def _post_layers(options) -> int:
    return options["num_layers"] - (0 if options["last_post"] else 1)


def _recompute_inputs(shape, options, seed):
    # Unnormalised randn mixes, as TileKernels' test draws them; each input list is one buffer's
    # layers (the layout a caller that saves them for recomputation keeps), the outputs too.
    tokens, hidden = shape
    n, layers, post_layers = options["mhc_mult"], options["num_layers"], _post_layers(options)
    return {
        "initial_residual": randn((tokens, n, hidden), seed, torch.bfloat16),
        "pre_mix_list": list(randn((layers, tokens, n, 1), seed + 1).unbind(0)),
        "layer_output_list": list(randn((post_layers, tokens, hidden), seed + 2, torch.bfloat16).unbind(0)),
        "post_mix_list": list(randn((post_layers, tokens, n, 1), seed + 3).unbind(0)),
        "comb_mix_list": list(randn((post_layers, tokens, n, n), seed + 4).unbind(0)),
        "layer_input_list": list(torch.zeros(layers, tokens, hidden, dtype=torch.bfloat16).unbind(0)),
        "residual_list": list(torch.zeros(post_layers, tokens, n, hidden, dtype=torch.bfloat16).unbind(0)),
    }


def _recompute_check(outputs, expected) -> list[str]:
    # The written lists, layer inputs then residuals, each tensor bit for bit.
    names = [f"output {k}" for k in range(len(expected))]
    if len(outputs) != len(expected):
        return [f"  {len(outputs)} outputs vs {len(expected)} expected"]
    return compare_named(names)(outputs, expected)


def _recompute_source(options, target, flavor):
    n, post_layers, flavor = options["mhc_mult"], _post_layers(options), _flavor_of(target, flavor)
    if not post_layers:
        # One layer without a post update runs pre_apply_mix's kernel.
        return build_pre_apply_mix_fwd.source(PreApplyMixFwdSpec(n, flavor), target)
    spec = MultilayerRecomputeSpec(n, _SOURCE_HIDDEN, options["num_layers"], post_layers, flavor)
    return build_multilayer_recompute.source(spec, target)


OPS = [
    kernel_op_entry(
        MHC_PRE_SPLIT_MIXES_FWD,
        arguments=lambda inputs, options, flavor: {"mhc_post_mult_value": _POST_MULT, "mhc_pre_eps": _PRE_EPS},
        family="mhc",
        summary="split the mix vector into the pre and post mixes (sigmoid) and the comb logits",
        default_shape=(8192,),
        bench_shapes=_MIX_SHAPES,
        options=(),
        targets=_SPLIT_TARGETS,
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
        targets=_SPLIT_TARGETS,
        make_inputs=_split_bwd_inputs,
        source=_split_bwd_source,
    ),
    kernel_op_entry(
        MHC_FN_NORMW_MERGE_FWD,
        family="mhc",
        summary="norm_fn stage A: merge the RMSNorm weight into the mix projection, fn · normw",
        default_shape=(1, 7168),
        bench_shapes=((1, 1280), (1, 4096), (1, 7168)),
        options=(),
        targets=_NORM_FN_TARGETS,
        make_inputs=_merge_fwd_inputs,
        source=lambda options, target, flavor: build_merge_fwd.source(MergeSpec(_MIX), target),
    ),
    kernel_op_entry(
        MHC_FN_NORMW_MERGE_BWD,
        family="mhc",
        summary="norm_fn stage A': merge backward, accumulated into fn_grad and normw_grad (column-owned, "
                "fused multiply-adds in row order)",
        default_shape=(1, 7168),
        bench_shapes=((1, 1280), (1, 4096), (1, 7168)),
        options=(),
        targets=_NORM_FN_TARGETS,
        make_inputs=_merge_inputs,
        source=lambda options, target, flavor: build_merge_bwd.source(MergeSpec(_MIX), target),
    ),
    kernel_op_entry(
        MHC_REDUCE_PARTIALS_AND_RMSNORM_FWD,
        arguments=lambda inputs, options, flavor: {"rms_eps": NORM_EPS},
        family="mhc",
        summary="norm_fn stage C: sum the split-K partials of the prenorm GEMM, RMS scale (per-flavor rsqrt)",
        default_shape=_DEFAULT_SHAPE,
        bench_shapes=_BENCH_SHAPES,
        options=REDUCE_FWD_OPTIONS,
        targets=_NORM_FN_TARGETS,
        make_inputs=_reduce_fwd_inputs,
        source=lambda options, target, flavor: build_reduce_fwd.source(_reduce_spec(options, target, flavor), target),
    ),
    kernel_op_entry(
        MHC_REDUCE_PARTIALS_AND_RMSNORM_BWD,
        arguments=lambda inputs, options, flavor: {"rms_eps": NORM_EPS},
        family="mhc",
        summary="norm_fn stage D: gradients of the reduced products and square sum from the mixes' gradient",
        default_shape=_DEFAULT_SHAPE,
        bench_shapes=_BENCH_SHAPES,
        options=(),
        targets=_NORM_FN_TARGETS,
        make_inputs=_reduce_bwd_inputs,
        source=lambda options, target, flavor: build_reduce_bwd.source(_reduce_spec(options, target, flavor), target),
    ),
    kernel_op_entry(
        MHC_SINKHORN_FWD,
        arguments=_sinkhorn_arguments,
        family="mhc",
        summary="Sinkhorn projection of the 4x4 comb logits onto (near) doubly-stochastic matrices",
        default_shape=(8192,),
        bench_shapes=_SINKHORN_SHAPES,
        options=SINKHORN_OPTIONS,
        targets=_SINKHORN_TARGETS,
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
        targets=_SINKHORN_TARGETS,
        make_inputs=_sinkhorn_backward_inputs,
        source=_sinkhorn_backward_source,
    ),
    kernel_op_entry(
        MHC_PRE_BIG_FUSE_FWD,
        arguments=_big_fuse_arguments,
        family="mhc",
        summary="inference pre in one kernel: reduce + RMS, split, Sinkhorn, pre mix applied (the pre mix "
                "stays on chip; bit-exact to the unfused chain)",
        default_shape=(4096, 4096),
        bench_shapes=_BIG_FUSE_SHAPES,
        options=_BIG_FUSE_OPTIONS,
        targets=_BIG_FUSE_TARGETS,
        make_inputs=_big_fuse_inputs,
        source=_big_fuse_source,
    ),
    kernel_op_entry(
        MHC_PRE_NORM_FN_GEMM_FWD,
        check=_gemm_check(["sqrsum_splitted"], ("out_mul_splitted", 0)),
        check_criterion="(square sums bit for bit; partial products within 2^-9 of the largest: the matrix "
                        "units' order; cpu is bit-exact)",
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
        check=_gemm_check(["fn_grad"], ("x_grad", 1)),
        check_criterion="(fn_grad bit for bit; x_grad within one bf16 step: the matrix units' order; cpu is "
                        "bit-exact)",
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
    kernel_op_entry(
        EXPAND_TO_MHC_FWD,
        family="mhc",
        summary="widen a hidden state into n residual streams (a bit copy per stream)",
        default_shape=(4096, 4096),
        bench_shapes=_SHAPES,
        options=STREAM_OPTIONS,
        targets=_STREAM_TARGETS,
        make_inputs=_expand_fwd_inputs,
        source=lambda options, target, flavor: build_expand_fwd.source(ExpandSpec(options["mhc_mult"]), target),
    ),
    kernel_op_entry(
        EXPAND_TO_MHC_BWD,
        family="mhc",
        summary="gradient of expand: the fp32 sum of the n stream gradients, rounded to bf16 once",
        default_shape=(4096, 4096),
        bench_shapes=_SHAPES,
        options=STREAM_OPTIONS,
        targets=_STREAM_TARGETS,
        make_inputs=_expand_bwd_inputs,
        source=lambda options, target, flavor: build_expand_bwd.source(ExpandSpec(options["mhc_mult"]), target),
    ),
    kernel_op_entry(
        MHC_HEAD_COMPUTE_MIX_FWD,
        arguments=lambda inputs, options, flavor: {"mhc_pre_eps": _PRE_EPS},
        family="mhc",
        summary="LM-head pre mix: sigmoid of the n mixes with one gain, plus pre_eps",
        default_shape=(8192,),
        bench_shapes=_MIX_SHAPES,
        options=HEAD_OPTIONS,
        targets=_HEAD_TARGETS,
        make_inputs=_head_fwd_inputs,
        source=lambda options, target, flavor: build_head_compute_mix_fwd.source(_head_spec(options, target, flavor),
                                                                           target),
    ),
    kernel_op_entry(
        MHC_HEAD_COMPUTE_MIX_BWD,
        family="mhc",
        summary="gradient of head_compute_mix w.r.t. the mixes, and P partial rows of the gain's and biases' "
                "(fixed-order sums)",
        default_shape=(8192,),
        bench_shapes=_MIX_SHAPES,
        options=HEAD_BWD_OPTIONS,
        targets=_HEAD_TARGETS,
        make_inputs=_head_inputs,
        source=lambda options, target, flavor: build_head_compute_mix_bwd.source(_head_spec(options, target, flavor),
                                                                           target),
    ),
    kernel_op_entry(
        MHC_PRE_APPLY_MIX_FWD,
        family="mhc",
        summary="sublayer input: the mix-weighted sum of a token's n streams (the flavor's fp32 fma chain)",
        default_shape=(4096, 4096),
        bench_shapes=_SHAPES,
        options=STREAM_OPTIONS,
        targets=_STREAM_TARGETS,
        make_inputs=_mix_fwd_inputs,
        source=lambda options, target, flavor: build_pre_apply_mix_fwd.source(
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
        targets=_STREAM_TARGETS,
        make_inputs=_mix_bwd_inputs,
        source=lambda options, target, flavor: build_pre_apply_mix_bwd.source(
            PreApplyMixBwdSpec(options["mhc_mult"], _SOURCE_HIDDEN), target),
    ),
    kernel_op_entry(
        MHC_POST_FWD,
        family="mhc",
        summary="the next widened residual: post[o] * x + sum_i comb[i, o] * residual[i], bf16",
        default_shape=(1024, 4096),
        bench_shapes=_RESIDUAL_SHAPES,
        options=POST_FWD_OPTIONS,
        targets=_POST_TARGETS,
        make_inputs=_post_fwd_inputs,
        source=_post_fwd_source,
    ),
    kernel_op_entry(
        MHC_MULTILAYER_RECOMPUTE,
        check=_recompute_check,
        family="mhc",
        summary="rebuild a run of layers' inputs and residuals from R_0: pre_apply_mix then post per layer, "
                "bit for bit, in one kernel",
        default_shape=(1024, 4096),
        bench_shapes=_RESIDUAL_SHAPES,
        options=RECOMPUTE_OPTIONS,
        targets=_POST_TARGETS,
        make_inputs=_recompute_inputs,
        source=_recompute_source,
    ),
    kernel_op_entry(
        MHC_POST_BWD,
        family="mhc",
        summary="gradients of mhc_post_fwd: d_x, d_residual (bf16), d_post_layer_mix, d_comb_res_mix (fp32)",
        default_shape=(1024, 4096),
        bench_shapes=_RESIDUAL_SHAPES,
        options=(),
        targets=_POST_TARGETS,
        make_inputs=_post_bwd_inputs,
        source=_post_bwd_source,
    ),
]
