"""vmi-quant's ops for the ``vmi`` command (entry point group ``vmi.ops``).

Each entry is built from the op's declaration (``kernel_op_entry``): the command binds the
op's parameters by name from the generated inputs and the options below; options that are
not parameters (``in_dtype``, block sides, ``x_fmt``) shape the inputs or the arguments.
"""

from __future__ import annotations

import torch

from vmi_core.registry import Option, kernel_op_entry
from vmi_core.sf_layout import SFLayout
from vmi_core.targets import flavor_argument, resolve_flavor
from vmi_core.testing import compare_named, generator, randn

from . import reference
from .config import get_token_alignment
from .kernels.batched_transpose_weight_sf import TransposeSpec, build_batched_transpose_weight_sf
from .kernels.cast import CastSpec, build_cast
from .kernels.cast_back import CastBackSpec, build_cast_back
from .kernels.norm_backward import NormBackwardSpec, build_norm_backward
from .kernels.norm_forward import build_norm_forward
from .kernels.per_block_cast import build_per_block_cast
from .kernels.per_block_cast_lossless import build_per_block_cast_lossless
from .kernels.per_channel_cast import build_per_channel_cast
from .kernels.per_token_cast import build_per_token_cast
from .kernels.per_token_cast_and_cast_back import build_per_token_cast_and_cast_back
from .kernels.swiglu_backward import build_swiglu_backward
from .kernels.swiglu_forward import build_swiglu_forward
from .kernels.swiglu_forward_and_per_channel_cast_and_transpose import build_swiglu_per_channel
from .ops.batched_transpose_weight_sf import BATCHED_TRANSPOSE_WEIGHT_SF
from .ops.cast import CAST
from .ops.cast_back import CAST_BACK
from .ops.norm_backward import NORM_BACKWARD
from .ops.norm_forward import NORM_FORWARD, NORM_FORWARD_AND_PER_TOKEN_CAST
from .ops.norm_forward import make_spec as make_norm_spec
from .ops.per_block_cast import PER_BLOCK_CAST
from .ops.per_block_cast import make_spec as make_block_spec
from .ops.per_block_cast_lossless import PER_BLOCK_CAST_LOSSLESS
from .ops.per_block_cast_lossless import make_spec as make_lossless_spec
from .ops.per_channel_cast import PER_CHANNEL_CAST
from .ops.per_channel_cast import make_spec as make_channel_spec
from .ops.per_token_cast import PER_TOKEN_CAST, make_spec
from .ops.per_token_cast_and_cast_back import PER_TOKEN_CAST_AND_CAST_BACK
from .ops.per_token_cast_and_cast_back import make_spec as make_round_trip_spec
from .ops.swiglu_backward import SWIGLU_BACKWARD, SWIGLU_BACKWARD_AND_PER_TOKEN_CAST
from .ops.swiglu_backward import make_spec as make_swiglu_backward_spec
from .ops.swiglu_forward import SWIGLU_FORWARD, SWIGLU_FORWARD_AND_PER_TOKEN_CAST
from .ops.swiglu_forward import make_spec as make_swiglu_spec
from .ops.swiglu_forward_and_per_channel_cast_and_transpose import SWIGLU_FORWARD_AND_PER_CHANNEL_CAST_AND_TRANSPOSE
from .ops.swiglu_forward_and_per_channel_cast_and_transpose import make_spec as make_swiglu_channel_spec

_IN_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

PER_TOKEN_CAST_OPTIONS = (
    Option("fmt", "e4m3", ("e4m3", "e2m1"), "output format"),
    Option("num_per_channels", 32, (16, 32, 64, 128), "channels per scaling factor"),
    Option("in_dtype", "bf16", tuple(_IN_DTYPES), "input dtype"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 scaling factors (needs round_sf)"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major scaling factors"),
    Option("use_e4m3_sf", False, help="E4M3 scaling factors"),
    Option("stochastic_cast", False, help="stochastic rounding of the data"),
)


def _ptc_inputs(shape, options, seed):
    return {"x": randn(shape, seed, _IN_DTYPES[options["in_dtype"]])}


def _ptc_source(options, target, flavor):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    layout = SFLayout.of(flavor, packed=options["use_packed_ue8m0"], e4m3=options["use_e4m3_sf"],
                         col_major=options["use_tma_aligned_col_major_sf"])
    spec = make_spec(options["in_dtype"], options["fmt"], options["num_per_channels"], "cast", layout,
                     options["round_sf"], options["use_e4m3_sf"], options["stochastic_cast"])
    return build_per_token_cast.source(spec, target)


# --- per_token_cast_and_cast_back ---

ROUND_TRIP_OPTIONS = (
    Option("fmt", "e4m3", ("e4m3", "e2m1"), "quantized format of the round trip"),
    Option("num_per_channels", 32, (16, 32, 64, 128), "channels per scaling factor"),
    Option("in_dtype", "bf16", tuple(_IN_DTYPES), "input dtype"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_e4m3_sf", False, help="E4M3 scaling factors"),
)


def _round_trip_source(options, target, flavor):
    spec = make_round_trip_spec(options["in_dtype"], options["fmt"], options["num_per_channels"],
                                options["round_sf"], options["use_e4m3_sf"])
    return build_per_token_cast_and_cast_back.source(spec, target)


# --- per_block_cast ---

PER_BLOCK_CAST_OPTIONS = (
    Option("fmt", "e4m3", ("e4m3", "e2m1"), "output format"),
    Option("block_m", 128, (32, 128), "tokens per scaling block"),
    Option("block_k", 128, (32, 128), "channels per scaling block"),
    Option("in_dtype", "bf16", tuple(_IN_DTYPES), "input dtype"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 scaling factors (needs round_sf)"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major scaling factors"),
)


def _pbc_source(options, target, flavor):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    layout = SFLayout.of(flavor, packed=options["use_packed_ue8m0"],
                         col_major=options["use_tma_aligned_col_major_sf"], block_k=options["block_k"])
    spec = make_block_spec(options["in_dtype"], options["fmt"], (options["block_m"], options["block_k"]), "cast",
                           layout, options["round_sf"])
    return build_per_block_cast.source(spec, target)


# --- per_channel_cast ---

PER_CHANNEL_CAST_OPTIONS = (
    Option("num_per_tokens", 32, (32, 128), "tokens per scaling factor"),
    Option("in_dtype", "bf16", ("bf16", "fp32", "e4m3"),
           "input dtype (e4m3: a per-token quantized input with packed UE8M0 column-major SF)"),
    Option("num_per_channels", 128, (32, 128), "channels per input scaling factor (in_dtype=e4m3)"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="UE8M0 scaling factors packed along the tokens (needs round_sf)"),
)
# What a quantized input's SF is: TileKernels' default input configuration.
_PCC_INPUT_SF = dict(round_sf=True, use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True)


def _pcc_inputs(shape, options, seed):
    if options["in_dtype"] != "e4m3":
        return _ptc_inputs(shape, options, seed)
    # Quantized once per flavor (packed UE8M0 words differ); run and reference pick theirs.
    x = randn(shape, seed)
    return {flavor: reference.cast(x, "e4m3", (1, options["num_per_channels"]), flavor=flavor, **_PCC_INPUT_SF)
            for flavor in ("ascend", "cuda")}


def _pcc_arguments(inputs, options, flavor):
    if options["in_dtype"] != "e4m3":
        return {"fmt": "e4m3", "num_per_channels": None}
    data, sf = inputs[flavor]
    return {"fmt": "e4m3", "x": data, "x_sf": sf}


def _pcc_nbytes(inputs, outputs) -> int:
    tensors = inputs["ascend"] if "ascend" in inputs else (inputs["x"],)
    return sum(t.numel() * t.element_size() for t in (*tensors, *outputs))


def _pcc_source(options, target, flavor):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    layout = SFLayout.of(flavor, packed=options["use_packed_ue8m0"], block_k=1)
    in_layout, npc = None, None
    if options["in_dtype"] == "e4m3":
        npc = options["num_per_channels"]
        in_layout = SFLayout.of(flavor, packed=True, col_major=True, block_k=npc)
    spec = make_channel_spec(options["in_dtype"], options["num_per_tokens"], options["round_sf"], layout, in_layout,
                             npc)
    return build_per_channel_cast.source(spec, target)


# --- per_block_cast_lossless ---

_POW2_BLOCK = (1, 2, 4, 8, 16, 32, 64, 128)
LOSSLESS_OPTIONS = (
    Option("x_block_m", 1, _POW2_BLOCK, "tokens per input scaling block"),
    Option("x_block_k", 32, _POW2_BLOCK, "channels per input scaling block"),
    Option("out_block_m", 32, _POW2_BLOCK, "tokens per output scaling block"),
    Option("out_block_k", 32, _POW2_BLOCK, "channels per output scaling block"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 output scaling factors"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major output scaling factors"),
)


def _lossless_blocks(options):
    return (options["x_block_m"], options["x_block_k"]), (options["out_block_m"], options["out_block_k"])


def _lossless_inputs(shape, options, seed):
    # FP4 with fp32 power-of-two scales; every |x| >= max|x| / 2^9 keeps the block scales within
    # the 11 binades one output block can hold.
    x = randn(shape, seed)
    floor = x.abs().max() / 2**9 if x.numel() else 0.0
    x = torch.where(x.abs() < floor, torch.copysign(torch.full_like(x, float(floor)), x), x)
    data, sf = reference.cast(x, "e2m1", _lossless_blocks(options)[0], round_sf=True)
    return {"x_data": data, "x_sf": sf}


def _lossless_arguments(inputs, options, flavor):
    x_block, out_block = _lossless_blocks(options)
    return {"fmt": "e4m3", "x_block_size": x_block, "out_block_size": out_block, "round_sf": True}


def _lossless_source(options, target, flavor):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    x_block, out_block = _lossless_blocks(options)
    in_layout = SFLayout.of(flavor, packed=False, block_k=x_block[1])
    layout = SFLayout.of(flavor, packed=options["use_packed_ue8m0"],
                         col_major=options["use_tma_aligned_col_major_sf"], block_k=out_block[1])
    return build_per_block_cast_lossless.source(make_lossless_spec(in_layout, x_block, layout, out_block), target)


# --- batched_transpose_weight_sf ---

TRANSPOSE_OPTIONS = (
    Option("block_size", 32, (32, 128), "weight rows and columns per scaling block"),
    Option("num_weights", 4, help="weights of the shape, each with its own scales"),
    Option("num_groups", 0, help="groups per weight: (G, n/bs, k/bs) scales (0: 2-D scales)"),
    Option("transpose_sf1", False, help="return each transposed weight's SF as (P1, k)"),
)


def _transpose_inputs(shape, options, seed):
    # The power-of-two block scales a per-block cast gives each weight (n, k) = shape, G at a time;
    # rows and columns of the weights spread over 2^-8 .. 2^8, so the exponents vary by block.
    n, k = shape
    bs, groups = options["block_size"], options["num_groups"]
    sf = []
    for i in range(options["num_weights"]):
        rows = max(groups, 1) * n
        g = generator(seed + i)
        spread = torch.randint(-4, 5, (rows, 1), generator=g) + torch.randint(-4, 5, (1, k), generator=g)
        _, scales = reference.cast(randn((rows, k), seed + i) * torch.exp2(spread.float()), "e4m3", (bs, bs),
                                   round_sf=True)
        sf.append(scales.view(groups, n // bs, k // bs) if groups else scales)
    return {"sf": sf}


def _transpose_source(options, target, flavor):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    return build_batched_transpose_weight_sf.source(TransposeSpec(options["block_size"], flavor.ue8m0_pack), target)


# --- swiglu_backward(_and_per_token_cast) ---
# Shapes are (tokens, hidden): x is (tokens, 2 * hidden).

SWIGLU_BACKWARD_OPTIONS = (
    Option("fmt", "bf16", ("bf16", "fp32"), "dtype of x, act_x_grad and the outputs"),
    Option("weights", True, help="topk_weights and routed_scaling_factor 2.5 (the weight gradient)"),
    Option("psum", True, help="rows in 8 experts of the psum layout (token alignment padding)"),
    Option("clamp", False, help="clamp_value 10"),
    Option("do_recompute", False, help="also return the recomputed activation"),
)
SWIGLU_BACKWARD_CAST_OPTIONS = (
    Option("num_per_channels", 32, (32, 128), "channels per scaling factor (input and output)"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 scaling factors (needs round_sf)"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major scaling factors"),
    *SWIGLU_BACKWARD_OPTIONS[1:],
)
_SWIGLU_EXPERTS = 8
# Shapes of x, (N, 2H): MoE expert rows at DeepSeek-V3/V4 intermediate sizes (H 2048, 3584), and a
# decode-size call.
_SWIGLU_DEFAULT_SHAPE = (4096, 4096)
_SWIGLU_BACKWARD_BENCH_SHAPES = ((4096, 4096), (2048, 7168), (128, 4096))


def _swiglu_backward_inputs(shape, options, seed, x_dtype=None):
    tokens, width = shape
    dtype = x_dtype or _IN_DTYPES[options["fmt"]]
    inputs = {"x": randn(shape, seed, dtype), "act_x_grad": randn((tokens, width // 2), seed + 1, dtype)}
    if options["weights"]:
        inputs["topk_weights"] = torch.rand(tokens, generator=generator(seed + 2))
    if options["psum"]:
        inputs["psum_num_tokens_per_expert"] = _swiglu_psum(tokens, _SWIGLU_EXPERTS, seed + 3)
    return inputs


def _swiglu_backward_cast_inputs(shape, options, seed):
    inputs = _swiglu_backward_inputs(shape, options, seed, torch.bfloat16)
    inputs["x"], inputs["x_sf"] = reference.cast(inputs["x"], "e4m3", (1, options["num_per_channels"]))
    return inputs


def _swiglu_backward_arguments(inputs, options, flavor):
    return {"routed_scaling_factor": 2.5 if options["weights"] else None,
            "clamp_value": 10.0 if options["clamp"] else None}


def _swiglu_backward_cast_arguments(inputs, options, flavor):
    return {"fmt": "e4m3", **_swiglu_backward_arguments(inputs, options, flavor)}


def _swiglu_backward_spec(options, target, flavor, quantized: bool):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    hidden = _SWIGLU_DEFAULT_SHAPE[1] // 2
    flags = dict(weights=options["weights"], clamp=options["clamp"], recompute=options["do_recompute"],
                 psum=options["psum"])
    if not quantized:
        fmt = options["fmt"]
        return make_swiglu_backward_spec(fmt, fmt, fmt, hidden, flavor, **flags)
    layout = SFLayout.of(flavor, packed=options["use_packed_ue8m0"],
                         col_major=options["use_tma_aligned_col_major_sf"])
    return make_swiglu_backward_spec("e4m3", "bf16", "bf16", hidden, flavor, **flags,
                                     num_per_channels=options["num_per_channels"], round_sf=options["round_sf"],
                                     sf_layout=layout)


# Prefill sizes (throughput) and decode sizes (1, 4, 16 tokens: microseconds per call).
_BENCH_SHAPES = ((4096, 7168), (1024, 4096), (128, 7168), (1, 7168), (4, 7168), (16, 7168))


# --- norm_forward / norm_forward_and_per_token_cast ---

NORM_EPS = 1e-6
NORM_OPTIONS = (
    Option("in_dtype", "bf16", tuple(_IN_DTYPES), "input dtype"),
    Option("use_weight", True, help="a weight (else unit weight)"),
    Option("use_residual", False, help="a residual added first (returned as residual_out)"),
)
NORM_CAST_OPTIONS = NORM_OPTIONS + (
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 scaling factors (needs round_sf)"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major scaling factors"),
    Option("with_out_bf16", False, help="also the bf16 normalised output"),
)
# The kernel is specialised on the hidden size: ``vmi source`` shows it for this one.
_NORM_SOURCE_HIDDEN = 4096


def _norm_inputs(shape, options, seed):
    dtype = _IN_DTYPES[options["in_dtype"]]
    inputs = {"x": randn(shape, seed, dtype)}
    if options["use_weight"]:
        inputs["weight"] = randn(shape[-1:], seed + 1, dtype)
    if options["use_residual"]:
        inputs["residual"] = randn(shape, seed + 2, dtype)
    return inputs


def _norm_arguments(inputs, options, flavor):
    return {"eps": NORM_EPS}


def _norm_cast_arguments(inputs, options, flavor):
    return {"eps": NORM_EPS, "fmt": "e4m3", "num_per_channels": 32}


def _norm_source(options, target, flavor, quantize=False):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    cast = {}
    if quantize:
        cast = dict(round_sf=options["round_sf"], col_major=options["use_tma_aligned_col_major_sf"],
                    packed=options["use_packed_ue8m0"], with_out_bf16=options["with_out_bf16"])
    spec = make_norm_spec(options["in_dtype"], _NORM_SOURCE_HIDDEN, NORM_EPS, flavor, 1.0, options["use_weight"],
                          options["use_residual"], quantize, **cast)
    return build_norm_forward.source(spec, target)


# per_block_cast(_lossless) and per_channel_cast need M and K multiples of 128: no decode sizes.
_BLOCK_BENCH_SHAPES = ((4096, 7168), (1024, 4096), (128, 7168))

_PARALLEL_TARGETS = {
    "cpu": "runs; bit-exact against the reference in both flavors, every option",
    "ascend": "lowers to AscendC (SIMD and SIMT vector regions); runs on ascend-sim, not yet on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model; bit-exact against the reference (ascend flavor)",
    "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
}


_CAST_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}

CAST_OPTIONS = (
    Option("in_dtype", "fp32", tuple(_CAST_DTYPES), "input dtype"),
    Option("dtype", "bf16", tuple(_CAST_DTYPES), "output dtype"),
    Option("stochastic_rounding", False, help="stochastic rounding (fp32->bf16, fp32->e4m3, bf16->e4m3)"),
)

CAST_BACK_OPTIONS = (
    Option("fmt", "bf16", ("bf16", "fp32"), "output format"),
    Option("x_fmt", "e4m3", ("e4m3", "e2m1"), "format of the quantized input"),
    Option("block_m", 1, help="tokens per scaling block"),
    Option("block_k", 32, help="channels per scaling block"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 scaling factors (needs round_sf)"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major scaling factors (block_k > 1)"),
    Option("use_e4m3_sf", False, help="E4M3 scaling factors"),
)


def _cast_inputs(shape, options, seed):
    return {"x": randn(shape, seed, torch.float32).to(_CAST_DTYPES[options["in_dtype"]])}


def _cast_source(options, target, flavor):
    return build_cast.source(CastSpec(options["in_dtype"], options["dtype"], options["stochastic_rounding"]), target)


def _cast_back_block(options) -> tuple[int, int]:
    return options["block_m"], options["block_k"]


def _cast_back_inputs(shape, options, seed):
    # Quantized once per flavor (packed UE8M0 words differ); run and reference pick theirs.
    flags = ("round_sf", "use_packed_ue8m0", "use_tma_aligned_col_major_sf", "use_e4m3_sf")
    x = randn(shape, seed)
    return {flavor: reference.cast(x, options["x_fmt"], _cast_back_block(options), flavor=flavor,
                                   **{k: options[k] for k in flags})
            for flavor in ("ascend", "cuda")}


def _cast_back_arguments(inputs, options, flavor):
    data, sf = inputs[flavor]
    return {"x_data": data, "x_sf": sf, "x_block_size": _cast_back_block(options)}


def _cast_back_nbytes(inputs, outputs) -> int:
    return sum(t.numel() * t.element_size() for t in (*inputs["ascend"], *outputs))


def _cast_back_source(options, target, flavor):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    layout = SFLayout.of(flavor, packed=options["use_packed_ue8m0"], e4m3=options["use_e4m3_sf"],
                         col_major=options["use_tma_aligned_col_major_sf"], block_k=options["block_k"])
    spec = CastBackSpec(options["x_fmt"], options["fmt"], layout, *_cast_back_block(options))
    return build_cast_back.source(spec, target)


# --- norm_backward ---

NORM_BACKWARD_OPTIONS = (
    Option("in_dtype", "bf16", tuple(_IN_DTYPES), "dtype of x, out_grad and the weight"),
    Option("weight_grad_dtype", "fp32", tuple(_IN_DTYPES), "dtype of the accumulated weight gradient"),
    Option("with_residual_grad", False, help="add a residual_out_grad"),
    Option("scaled", False, help="out_scale 0.3 (else 1.0)"),
)
_NORM_EPS = 1e-6


def _norm_backward_inputs(shape, options, seed):
    dtype = _IN_DTYPES[options["in_dtype"]]
    rows, hidden = shape
    x = randn(shape, seed, dtype)
    inputs = {
        "out_grad": randn(shape, seed + 1, dtype),
        "x": x,
        "weight": randn((hidden,), seed + 2, dtype),
        # The forward's saved rstd.
        "rstd": torch.rsqrt(x.float().square().mean(-1) + _NORM_EPS),
        "weight_grad": randn((hidden,), seed + 3, _IN_DTYPES[options["weight_grad_dtype"]]),
    }
    if options["with_residual_grad"]:
        inputs["residual_out_grad"] = randn(shape, seed + 4, dtype)
    return inputs


def _norm_backward_arguments(inputs, options, flavor):
    return {"out_scale": 0.3 if options["scaled"] else 1.0}


def _norm_backward_source(options, target, flavor):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    spec = NormBackwardSpec(options["in_dtype"], 4096, True, options["with_residual_grad"],
                            0.3 if options["scaled"] else 1.0, flavor.name)
    return build_norm_backward.source(spec, target)


# --- swiglu_forward / swiglu_forward_and_per_token_cast ---

SWIGLU_OPTIONS = (
    Option("in_dtype", "bf16", tuple(_IN_DTYPES), "input dtype of x (N, 2H)"),
    Option("experts", 8, help="experts of the psum layout (0: no layout, every row valid)"),
    Option("weights", True, help="per-row topk_weights with routed_scaling_factor 2.5"),
    Option("clamp", True, help="clamp_value 10.0 (the SwiGLU limit)"),
)
SWIGLU_FORWARD_OPTIONS = (Option("fmt", "bf16", ("bf16", "fp32"), "output format"), *SWIGLU_OPTIONS)
SWIGLU_CAST_OPTIONS = (
    Option("num_per_channels", 32, (32, 128), "channels per scaling factor"),
    *SWIGLU_OPTIONS,
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 scaling factors (needs round_sf)"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major scaling factors"),
)
SWIGLU_CLAMP = 10.0
SWIGLU_SCALING_FACTOR = 2.5


def _swiglu_psum(num_rows: int, experts: int, seed: int) -> torch.Tensor:
    """A psum layout of ``experts`` experts over every row: each expert's token count a multiple of
    the token alignment (so no row is padding and every output element is defined), the rows not
    a multiple of it in the last expert."""
    alignment = get_token_alignment()
    blocks = num_rows // alignment
    cuts = torch.sort(torch.randint(0, blocks + 1, (experts - 1,), generator=generator(seed))).values
    ends = torch.cat([cuts * alignment, torch.tensor([num_rows])])
    return ends.to(torch.int32)


def _swiglu_inputs(shape, options, seed):
    num_rows = shape[0]
    inputs = {"x": randn(shape, seed, _IN_DTYPES[options["in_dtype"]])}
    if options["experts"]:
        inputs["psum_num_tokens_per_expert"] = _swiglu_psum(num_rows, options["experts"], seed)
    if options["weights"]:
        inputs["topk_weights"] = torch.rand(num_rows, generator=generator(seed + 1))
    return inputs


def _swiglu_arguments(inputs, options, flavor):
    return {"routed_scaling_factor": SWIGLU_SCALING_FACTOR if options["weights"] else None,
            "clamp_value": SWIGLU_CLAMP if options["clamp"] else None}


def _swiglu_cast_arguments(inputs, options, flavor):
    return {"fmt": "e4m3", **_swiglu_arguments(inputs, options, flavor)}


def _swiglu_source(options, target, flavor):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    fmt, npc, layout, round_sf = options.get("fmt", "e4m3"), None, None, False
    if fmt == "e4m3":
        npc, round_sf = options["num_per_channels"], options["round_sf"]
        layout = SFLayout.of(flavor, packed=options["use_packed_ue8m0"],
                             col_major=options["use_tma_aligned_col_major_sf"])
    spec = make_swiglu_spec(options["in_dtype"], fmt, npc, layout, round_sf, with_psum=options["experts"] > 0,
                            with_weights=options["weights"], with_scaling_factor=options["weights"],
                            with_clamp=options["clamp"], flavor=flavor)
    return build_swiglu_forward.source(spec, target)


_SWIGLU_BENCH_SHAPES = ((4096, 7168), (1024, 4096), (128, 7168), (1, 7168), (16, 7168))

SWIGLU_CHANNEL_OPTIONS = (
    Option("num_per_tokens", 32, (32, 128), "tokens per scaling factor"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("without_transpose", False, help="data (T, H) instead of (H, T)"),
    Option("clamp", True, help="swiglu_clamp_value 10.0"),
)


def _swiglu_channel_inputs(shape, options, seed):
    return {"x": randn(shape, seed, torch.bfloat16)}


def _swiglu_channel_arguments(inputs, options, flavor):
    return {"fmt": "e4m3", "swiglu_clamp_value": SWIGLU_CLAMP if options["clamp"] else None}


def _swiglu_channel_source(options, target, flavor):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    spec = make_swiglu_channel_spec(options["num_per_tokens"], options["round_sf"], not options["without_transpose"],
                                    options["clamp"], flavor)
    return build_swiglu_per_channel.source(spec, target)


OPS = [
    kernel_op_entry(
        PER_TOKEN_CAST,
        family="quant",
        summary="per-token FP8 (E4M3) / FP4 (E2M1) quantization with per-group scaling factors",
        default_shape=(1024, 4096),
        bench_shapes=_BENCH_SHAPES,
        options=PER_TOKEN_CAST_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_ptc_inputs,
        source=_ptc_source,
    ),
    kernel_op_entry(
        PER_TOKEN_CAST_AND_CAST_BACK,
        family="quant",
        summary="in-place per-token FP8/FP4 quantize-dequantize round trip (quantization noise)",
        default_shape=(1024, 4096),
        bench_shapes=_BENCH_SHAPES,
        options=ROUND_TRIP_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_ptc_inputs,
        source=_round_trip_source,
    ),
    kernel_op_entry(
        NORM_FORWARD,
        arguments=_norm_arguments,
        family="quant",
        summary="RMSNorm over the last dim (optional residual add, weight, out_scale) with its rstd",
        default_shape=(1024, 4096),
        bench_shapes=_BENCH_SHAPES,
        options=NORM_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_norm_inputs,
        source=_norm_source,
    ),
    kernel_op_entry(
        NORM_FORWARD_AND_PER_TOKEN_CAST,
        arguments=_norm_cast_arguments,
        family="quant",
        summary="RMSNorm fused with a per-token E4M3 cast of its output (groups of 32, every SF layout)",
        default_shape=(1024, 4096),
        bench_shapes=_BENCH_SHAPES,
        options=NORM_CAST_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_norm_inputs,
        source=lambda options, target, flavor: _norm_source(options, target, flavor, quantize=True),
    ),
    kernel_op_entry(
        PER_BLOCK_CAST,
        arguments=lambda inputs, options, flavor: {"block_size": (options["block_m"], options["block_k"])},
        family="quant",
        summary="per-block (bm x bk) FP8 (E4M3) / FP4 (E2M1) quantization with block scaling factors",
        default_shape=(1024, 4096),
        bench_shapes=_BLOCK_BENCH_SHAPES,
        options=PER_BLOCK_CAST_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_ptc_inputs,
        source=_pbc_source,
    ),
    kernel_op_entry(
        PER_CHANNEL_CAST,
        arguments=_pcc_arguments,
        nbytes=_pcc_nbytes,
        family="quant",
        summary="per-channel FP8 (E4M3) quantization with one scaling factor per channel and 32 or 128 tokens",
        default_shape=(1024, 4096),
        bench_shapes=_BLOCK_BENCH_SHAPES,
        options=PER_CHANNEL_CAST_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_pcc_inputs,
        source=_pcc_source,
    ),
    kernel_op_entry(
        NORM_BACKWARD,
        arguments=_norm_backward_arguments,
        check=compare_named(("x_grad", "weight_grad")),
        family="quant",
        summary="RMSNorm backward: x_grad, and the weight gradient accumulated into a bf16/fp32 buffer "
                "(deterministic partial sums)",
        default_shape=(1024, 4096),
        bench_shapes=((8001, 7168), (4096, 4096), (1024, 4096), (16, 7168)),
        options=NORM_BACKWARD_OPTIONS,
        targets={
            "cpu": "runs; bit-exact against the reference in both flavors, with and without weight",
            "ascend": "lowers to AscendC (SIMD vector regions); runs on ascend-sim, not yet on an NPU",
            "ascend-sim": "runs the ascend source on the CPU model; bit-exact against the reference (ascend flavor)",
            "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
        },
        make_inputs=_norm_backward_inputs,
        source=_norm_backward_source,
    ),
    kernel_op_entry(
        PER_BLOCK_CAST_LOSSLESS,
        arguments=_lossless_arguments,
        family="quant",
        summary="exact FP4 -> E4M3 re-quantization to larger scaling blocks",
        default_shape=(1024, 4096),
        bench_shapes=_BLOCK_BENCH_SHAPES,
        options=LOSSLESS_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_lossless_inputs,
        source=_lossless_source,
    ),
    kernel_op_entry(
        BATCHED_TRANSPOSE_WEIGHT_SF,
        arguments=lambda inputs, options, flavor: {
            "transpose_sf1s": [options["transpose_sf1"]] * options["num_weights"]},
        family="quant",
        summary="packed UE8M0 SF of weights (n, k) and of their transposes from power-of-two block scales",
        default_shape=(1024, 4096),
        bench_shapes=((4096, 7168), (7168, 2048), (1024, 4096)),
        options=TRANSPOSE_OPTIONS,
        targets={
            "cpu": "runs; bit-exact against the reference in both flavors, block 32 and 128",
            "ascend": "lowers to AscendC (SIMT and SIMD vector regions); runs on ascend-sim, not yet on an NPU",
            "ascend-sim": "runs the ascend source on the CPU model; bit-exact against the reference (ascend flavor)",
            "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
        },
        make_inputs=_transpose_inputs,
        source=_transpose_source,
    ),
    kernel_op_entry(
        CAST,
        arguments=lambda inputs, options, flavor: {"dtype": _CAST_DTYPES[options["dtype"]]},
        family="quant",
        summary="elementwise fp32 / bf16 / E4M3 conversion, optionally with stochastic rounding",
        default_shape=(1024, 4096),
        bench_shapes=_BENCH_SHAPES,
        options=CAST_OPTIONS,
        targets={
            "cpu": "runs; bit-exact against the reference, every format pair and stochastic rounding",
            "ascend": "lowers to AscendC (SIMD vector region; DMA only for a same-format cast); runs on ascend-sim, "
                      "not yet on an NPU",
            "ascend-sim": "runs the ascend source on the CPU model; bit-exact against the reference",
            "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
        },
        make_inputs=_cast_inputs,
        source=_cast_source,
    ),
    kernel_op_entry(
        CAST_BACK,
        arguments=_cast_back_arguments,
        nbytes=_cast_back_nbytes,
        family="quant",
        summary="dequantization of E4M3 / FP4 data with block scaling factors to bf16 / fp32",
        default_shape=(1024, 4096),
        bench_shapes=_BENCH_SHAPES,
        options=CAST_BACK_OPTIONS,
        targets={
            "cpu": "runs; bit-exact against the reference in both flavors, every block and SF layout",
            "ascend": "lowers to AscendC (SIMT and SIMD vector regions); runs on ascend-sim, not yet on an NPU",
            "ascend-sim": "runs the ascend source on the CPU model; bit-exact against the reference (ascend flavor)",
            "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
        },
        make_inputs=_cast_back_inputs,
        source=_cast_back_source,
        aliases=("per_token_cast_back",),
    ),
    kernel_op_entry(
        SWIGLU_BACKWARD,
        arguments=_swiglu_backward_arguments,
        family="quant",
        summary="SwiGLU backward (gradients of gate and up, weight gradient, recomputed activation) in bf16/fp32",
        default_shape=_SWIGLU_DEFAULT_SHAPE,
        bench_shapes=_SWIGLU_BACKWARD_BENCH_SHAPES,
        options=SWIGLU_BACKWARD_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_swiglu_backward_inputs,
        source=lambda options, target, flavor: build_swiglu_backward.source(
            _swiglu_backward_spec(options, target, flavor, False), target),
    ),
    kernel_op_entry(
        SWIGLU_BACKWARD_AND_PER_TOKEN_CAST,
        arguments=_swiglu_backward_cast_arguments,
        family="quant",
        summary="SwiGLU backward of an E4M3 input, the gradient also quantized per token to E4M3 (2H wide)",
        default_shape=_SWIGLU_DEFAULT_SHAPE,
        bench_shapes=_SWIGLU_BACKWARD_BENCH_SHAPES,
        options=SWIGLU_BACKWARD_CAST_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_swiglu_backward_cast_inputs,
        source=lambda options, target, flavor: build_swiglu_backward.source(
            _swiglu_backward_spec(options, target, flavor, True), target),
    ),
    kernel_op_entry(
        SWIGLU_FORWARD,
        arguments=_swiglu_arguments,
        family="quant",
        summary="SwiGLU of MoE expert rows (x = [gate | up], psum layout, row weights, clamp counters) to bf16/fp32",
        default_shape=(1024, 4096),
        bench_shapes=_SWIGLU_BENCH_SHAPES,
        options=SWIGLU_FORWARD_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_swiglu_inputs,
        source=_swiglu_source,
    ),
    kernel_op_entry(
        SWIGLU_FORWARD_AND_PER_TOKEN_CAST,
        arguments=_swiglu_cast_arguments,
        family="quant",
        summary="SwiGLU of MoE expert rows quantized to E4M3 per token (groups of 32 or 128 channels)",
        default_shape=(1024, 4096),
        bench_shapes=_SWIGLU_BENCH_SHAPES,
        options=SWIGLU_CAST_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_swiglu_inputs,
        source=_swiglu_source,
    ),
    kernel_op_entry(
        SWIGLU_FORWARD_AND_PER_CHANNEL_CAST_AND_TRANSPOSE,
        arguments=_swiglu_channel_arguments,
        family="quant",
        summary="SwiGLU rounded to bf16, per-channel E4M3 over 32 or 128 tokens, transposed (TileKernels v1)",
        default_shape=(1024, 4096),
        bench_shapes=_BLOCK_BENCH_SHAPES,
        options=SWIGLU_CHANNEL_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_swiglu_channel_inputs,
        source=_swiglu_channel_source,
    ),
]
