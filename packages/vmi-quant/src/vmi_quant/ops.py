"""vmi-quant's ops for the ``vmi`` command (entry point group ``vmi.ops``)."""

from __future__ import annotations

import torch

from vmi_core.registry import OpInfo, Option
from vmi_core.sf_layout import SFLayout
from vmi_core.targets import device_of, flavor_argument, resolve_flavor
from vmi_core.testing import compare_named, randn

from . import reference
from .cast import cast
from .cast_back import cast_back
from .cast_back_parallel import CastBackSpec, cast_back_source
from .cast_parallel import CastSpec, cast_source
from .per_block_cast import make_spec as make_block_spec
from .per_block_cast import per_block_cast
from .per_block_cast_lossless import make_spec as make_lossless_spec
from .per_block_cast_lossless import per_block_cast_lossless
from .per_block_cast_lossless_parallel import per_block_cast_lossless_source
from .per_block_cast_parallel import per_block_cast_source
from .per_token_cast import make_spec, per_token_cast
from .per_token_cast_and_cast_back import make_spec as make_round_trip_spec
from .per_token_cast_and_cast_back import per_token_cast_and_cast_back
from .per_token_cast_and_cast_back_parallel import per_token_cast_and_cast_back_source
from .per_token_cast_parallel import per_token_cast_source
from .reference import elementwise
from .reference.lossless import per_block_cast_lossless as reference_lossless

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
_SF_OPTIONS = ("round_sf", "use_packed_ue8m0", "use_tma_aligned_col_major_sf", "use_e4m3_sf")


def _ptc_inputs(shape, options, seed):
    return {"x": randn(shape, seed, _IN_DTYPES[options["in_dtype"]])}


def _ptc_run(inputs, options, target, flavor):
    x = inputs["x"].to(device_of(target))
    return per_token_cast(x, options["fmt"], options["num_per_channels"],
                          stochastic_cast=options["stochastic_cast"], target=target,
                          flavor=flavor_argument(target, flavor),
                          **{k: options[k] for k in _SF_OPTIONS})


def _ptc_reference(inputs, options, flavor):
    return reference.cast(inputs["x"], options["fmt"], (1, options["num_per_channels"]),
                          stochastic=options["stochastic_cast"], flavor=flavor,
                          **{k: options[k] for k in _SF_OPTIONS})


def _ptc_source(options, target, flavor):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    layout = SFLayout.of(flavor, packed=options["use_packed_ue8m0"], e4m3=options["use_e4m3_sf"],
                         col_major=options["use_tma_aligned_col_major_sf"])
    spec = make_spec(options["in_dtype"], options["fmt"], options["num_per_channels"], "cast", layout,
                     options["round_sf"], options["use_e4m3_sf"], options["stochastic_cast"])
    return per_token_cast_source(spec, target)


def _nbytes(inputs, outputs) -> int:
    return sum(t.numel() * t.element_size() for t in (inputs["x"], *outputs))


# --- per_token_cast_and_cast_back ---

ROUND_TRIP_OPTIONS = (
    Option("fmt", "e4m3", ("e4m3", "e2m1"), "quantized format of the round trip"),
    Option("num_per_channels", 32, (16, 32, 64, 128), "channels per scaling factor"),
    Option("in_dtype", "bf16", tuple(_IN_DTYPES), "input dtype"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_e4m3_sf", False, help="E4M3 scaling factors"),
)


def _round_trip_run(inputs, options, target, flavor):
    x = inputs["x"].to(device_of(target)).clone()
    per_token_cast_and_cast_back(x, options["fmt"], options["num_per_channels"], options["round_sf"],
                                 options["use_e4m3_sf"], target=target, flavor=flavor_argument(target, flavor))
    return (x,)


def _round_trip_reference(inputs, options, flavor):
    return (reference.cast_and_cast_back(inputs["x"], options["fmt"], options["num_per_channels"],
                                         round_sf=options["round_sf"], use_e4m3_sf=options["use_e4m3_sf"],
                                         flavor=flavor),)


def _round_trip_source(options, target, flavor):
    spec = make_round_trip_spec(options["in_dtype"], options["fmt"], options["num_per_channels"],
                                options["round_sf"], options["use_e4m3_sf"])
    return per_token_cast_and_cast_back_source(spec, target)


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
_BLOCK_SF_OPTIONS = ("round_sf", "use_packed_ue8m0", "use_tma_aligned_col_major_sf")


def _pbc_run(inputs, options, target, flavor):
    return per_block_cast(inputs["x"].to(device_of(target)), options["fmt"], (options["block_m"], options["block_k"]),
                          target=target, flavor=flavor_argument(target, flavor),
                          **{k: options[k] for k in _BLOCK_SF_OPTIONS})


def _pbc_reference(inputs, options, flavor):
    return reference.cast(inputs["x"], options["fmt"], (options["block_m"], options["block_k"]), flavor=flavor,
                          **{k: options[k] for k in _BLOCK_SF_OPTIONS})


def _pbc_source(options, target, flavor):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    layout = SFLayout.of(flavor, packed=options["use_packed_ue8m0"],
                         col_major=options["use_tma_aligned_col_major_sf"], block_k=options["block_k"])
    spec = make_block_spec(options["in_dtype"], options["fmt"], (options["block_m"], options["block_k"]), "cast",
                           layout, options["round_sf"])
    return per_block_cast_source(spec, target)


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
_LOSSLESS_SF_OPTIONS = ("use_packed_ue8m0", "use_tma_aligned_col_major_sf")


def _lossless_blocks(options):
    return (options["x_block_m"], options["x_block_k"]), (options["out_block_m"], options["out_block_k"])


def _lossless_inputs(shape, options, seed):
    # FP4 with fp32 power-of-two scales; every |x| >= max|x| / 2^9 keeps the block scales within
    # the 11 binades one output block can hold.
    x = randn(shape, seed)
    floor = x.abs().max() / 2**9 if x.numel() else 0.0
    x = torch.where(x.abs() < floor, torch.copysign(torch.full_like(x, float(floor)), x), x)
    return {"x": reference.cast(x, "e2m1", _lossless_blocks(options)[0], round_sf=True)}


def _lossless_run(inputs, options, target, flavor):
    data, sf = (t.to(device_of(target)) for t in inputs["x"])
    return per_block_cast_lossless((data, sf), "e4m3", *_lossless_blocks(options), round_sf=True, target=target,
                                   flavor=flavor_argument(target, flavor),
                                   **{k: options[k] for k in _LOSSLESS_SF_OPTIONS})


def _lossless_reference(inputs, options, flavor):
    return reference_lossless(inputs["x"], "e4m3", *_lossless_blocks(options), round_sf=True, flavor=flavor,
                              **{k: options[k] for k in _LOSSLESS_SF_OPTIONS})


def _lossless_source(options, target, flavor):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    x_block, out_block = _lossless_blocks(options)
    in_layout = SFLayout.of(flavor, packed=False, block_k=x_block[1])
    layout = SFLayout.of(flavor, packed=options["use_packed_ue8m0"],
                         col_major=options["use_tma_aligned_col_major_sf"], block_k=out_block[1])
    return per_block_cast_lossless_source(make_lossless_spec(in_layout, x_block, layout, out_block), target)


def _lossless_nbytes(inputs, outputs) -> int:
    return sum(t.numel() * t.element_size() for t in (*inputs["x"], *outputs))


# Prefill sizes (throughput) and decode sizes (1, 4, 16 tokens: microseconds per call).
_BENCH_SHAPES = ((4096, 7168), (1024, 4096), (128, 7168), (1, 7168), (4, 7168), (16, 7168))
# per_block_cast(_lossless) need M and K multiples of 128: no decode sizes.
_BLOCK_BENCH_SHAPES = ((4096, 7168), (1024, 4096), (128, 7168))

_PARALLEL_TARGETS = {
    "cpu": "runs; bit-exact against the reference in both flavors, every option",
    "ascend": "lowers to AscendC (SIMD and SIMT vector regions); runs on ascend-sim, not yet on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model; bit-exact against the reference (ascend flavor)",
    "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
}

_compare_data_sf = compare_named(("data", "sf"))


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


def _compare_tensor(output, expected) -> list[str]:
    return compare_named(("out",))((output,), (expected,))


def _cast_nbytes(inputs, output) -> int:
    return sum(t.numel() * t.element_size() for t in (inputs["x"], output))


def _cast_inputs(shape, options, seed):
    return {"x": randn(shape, seed, torch.float32).to(_CAST_DTYPES[options["in_dtype"]])}


def _cast_run(inputs, options, target, flavor):
    return cast(inputs["x"].to(device_of(target)), _CAST_DTYPES[options["dtype"]], options["stochastic_rounding"],
                target=target, flavor=flavor_argument(target, flavor))


def _cast_reference(inputs, options, flavor):
    return elementwise.cast(inputs["x"], _CAST_DTYPES[options["dtype"]], options["stochastic_rounding"])


def _cast_source(options, target, flavor):
    return cast_source(CastSpec(options["in_dtype"], options["dtype"], options["stochastic_rounding"]), target)


def _cast_back_block(options) -> tuple[int, int]:
    return options["block_m"], options["block_k"]


def _cast_back_inputs(shape, options, seed):
    # Quantized once per flavor (packed UE8M0 words differ); run and reference pick theirs.
    flags = ("round_sf", "use_packed_ue8m0", "use_tma_aligned_col_major_sf", "use_e4m3_sf")
    x = randn(shape, seed)
    return {flavor: reference.cast(x, options["x_fmt"], _cast_back_block(options), flavor=flavor,
                                   **{k: options[k] for k in flags})
            for flavor in ("ascend", "cuda")}


def _cast_back_run(inputs, options, target, flavor):
    data, sf = (t.to(device_of(target)) for t in inputs[resolve_flavor(target, flavor_argument(target, flavor)).name])
    return cast_back((data, sf), options["fmt"], _cast_back_block(options), target=target,
                     flavor=flavor_argument(target, flavor))


def _cast_back_reference(inputs, options, flavor):
    return reference.cast_back(inputs[flavor], options["fmt"], _cast_back_block(options), flavor=flavor)


def _cast_back_nbytes(inputs, output) -> int:
    return sum(t.numel() * t.element_size() for t in (*inputs["ascend"], output))


def _cast_back_source(options, target, flavor):
    flavor = resolve_flavor(target, flavor_argument(target, flavor))
    layout = SFLayout.of(flavor, packed=options["use_packed_ue8m0"], e4m3=options["use_e4m3_sf"],
                         col_major=options["use_tma_aligned_col_major_sf"], block_k=options["block_k"])
    spec = CastBackSpec(options["x_fmt"], options["fmt"], layout, *_cast_back_block(options))
    return cast_back_source(spec, target)


OPS = [
    OpInfo(
        name="per_token_cast",
        family="quant",
        summary="per-token FP8 (E4M3) / FP4 (E2M1) quantization with per-group scaling factors",
        default_shape=(1024, 4096),
        bench_shapes=_BENCH_SHAPES,
        options=PER_TOKEN_CAST_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_ptc_inputs,
        run=_ptc_run,
        reference=_ptc_reference,
        check=_compare_data_sf,
        source=_ptc_source,
        nbytes=_nbytes,
    ),
    OpInfo(
        name="per_token_cast_and_cast_back",
        family="quant",
        summary="in-place per-token FP8/FP4 quantize-dequantize round trip (quantization noise)",
        default_shape=(1024, 4096),
        bench_shapes=_BENCH_SHAPES,
        options=ROUND_TRIP_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_ptc_inputs,
        run=_round_trip_run,
        reference=_round_trip_reference,
        check=compare_named(("x",)),
        source=_round_trip_source,
        nbytes=lambda inputs, outputs: 2 * inputs["x"].numel() * inputs["x"].element_size(),
    ),
    OpInfo(
        name="per_block_cast",
        family="quant",
        summary="per-block (bm x bk) FP8 (E4M3) / FP4 (E2M1) quantization with block scaling factors",
        default_shape=(1024, 4096),
        bench_shapes=_BLOCK_BENCH_SHAPES,
        options=PER_BLOCK_CAST_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_ptc_inputs,
        run=_pbc_run,
        reference=_pbc_reference,
        check=_compare_data_sf,
        source=_pbc_source,
        nbytes=_nbytes,
    ),
    OpInfo(
        name="per_block_cast_lossless",
        family="quant",
        summary="exact FP4 -> E4M3 re-quantization to larger scaling blocks",
        default_shape=(1024, 4096),
        bench_shapes=_BLOCK_BENCH_SHAPES,
        options=LOSSLESS_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_lossless_inputs,
        run=_lossless_run,
        reference=_lossless_reference,
        check=_compare_data_sf,
        source=_lossless_source,
        nbytes=_lossless_nbytes,
    ),
    OpInfo(
        name="cast",
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
        run=_cast_run,
        reference=_cast_reference,
        check=_compare_tensor,
        source=_cast_source,
        nbytes=_cast_nbytes,
    ),
    OpInfo(
        name="cast_back",
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
        run=_cast_back_run,
        reference=_cast_back_reference,
        check=_compare_tensor,
        source=_cast_back_source,
        nbytes=_cast_back_nbytes,
        aliases=("per_token_cast_back",),
    ),
]
