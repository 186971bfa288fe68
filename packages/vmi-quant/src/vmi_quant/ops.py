"""vmi-quant's ops for the ``vmi`` command (entry point group ``vmi.ops``)."""

from __future__ import annotations

import torch

from vmi_core.registry import OpInfo, Option
from vmi_core.sf_layout import SFLayout
from vmi_core.targets import get_flavor
from vmi_core.testing import bitwise_mismatches, randn

from . import reference
from .per_token_cast import make_spec, per_token_cast
from .per_token_cast_parallel import per_token_cast_source

_DEVICE = {"cpu": "cpu", "cuda": "cuda", "ascend": "npu"}
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


def _compare(outputs, expected) -> list[str]:
    lines = []
    for name, actual, wanted in zip(("data", "sf"), outputs, expected, strict=True):
        if actual.shape != wanted.shape or actual.dtype != wanted.dtype:
            lines.append(f"  {name}: {actual.dtype}{tuple(actual.shape)} vs expected "
                         f"{wanted.dtype}{tuple(wanted.shape)}")
        else:
            lines += [f"  {name}{line}" for line in bitwise_mismatches(actual.cpu(), wanted.cpu())]
    return lines


def _ptc_inputs(shape, options, seed):
    return {"x": randn(shape, seed, _IN_DTYPES[options["in_dtype"]])}


def _ptc_run(inputs, options, target, flavor):
    x = inputs["x"].to(_DEVICE[target])
    return per_token_cast(x, options["fmt"], options["num_per_channels"],
                          stochastic_cast=options["stochastic_cast"], target=target,
                          flavor=flavor if target == "cpu" else None,
                          **{k: options[k] for k in _SF_OPTIONS})


def _ptc_reference(inputs, options, flavor):
    return reference.cast(inputs["x"], options["fmt"], (1, options["num_per_channels"]),
                          stochastic=options["stochastic_cast"], flavor=flavor,
                          **{k: options[k] for k in _SF_OPTIONS})


def _ptc_source(options, target, flavor):
    flavor = get_flavor(target if target in ("ascend", "cuda") else flavor)
    layout = SFLayout.of(flavor, packed=options["use_packed_ue8m0"], e4m3=options["use_e4m3_sf"],
                         col_major=options["use_tma_aligned_col_major_sf"])
    spec = make_spec(options["in_dtype"], options["fmt"], options["num_per_channels"], "cast", layout,
                     options["round_sf"], options["use_e4m3_sf"], options["stochastic_cast"])
    return per_token_cast_source(spec, target)


def _nbytes(inputs, outputs) -> int:
    return sum(t.numel() * t.element_size() for t in (inputs["x"], *outputs))


OPS = [
    OpInfo(
        name="per_token_cast",
        family="quant",
        summary="per-token FP8 (E4M3) / FP4 (E2M1) quantization with per-group scaling factors",
        default_shape=(1024, 4096),
        bench_shapes=((4096, 7168), (1024, 4096), (128, 7168)),
        options=PER_TOKEN_CAST_OPTIONS,
        targets={
            "cpu": "runs; bit-exact against the reference in both flavors, every option",
            "ascend": "lowers to AscendC (SIMT vector regions); not run without an NPU",
            "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
        },
        make_inputs=_ptc_inputs,
        run=_ptc_run,
        reference=_ptc_reference,
        check=_compare,
        source=_ptc_source,
        nbytes=_nbytes,
    ),
]
