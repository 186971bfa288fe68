"""``cast``: public dispatch (validation, allocation, backend choice).

Elementwise conversion of a contiguous tensor of any shape between fp32, bf16 and
float8_e4m3fn, optionally with stochastic rounding. Names and parameters follow
TileKernels v2; ``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry, support
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import randn

from ..kernels import cast as parallel
from ..reference import elementwise as reference
from . import demo

DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float8_e4m3fn: "e4m3"}


@dataclass
class CastCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.CastSpec
    x: torch.Tensor
    out: torch.Tensor


def _format(dtype, name: str) -> str:
    if dtype not in DTYPES:
        raise TypeError(f"{name} must be one of {tuple(DTYPES)}, got {dtype}")
    return DTYPES[dtype]


def _prepare(x, dtype, stochastic_rounding, target, flavor):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    target = resolve_target(x, target)
    # No bit of a cast depends on the flavor; the argument is still checked like every op's.
    resolve_flavor(target, flavor)
    in_fmt = _format(x.dtype, "x dtype")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    out_fmt = _format(dtype, "dtype")
    if not isinstance(stochastic_rounding, bool):
        raise TypeError(f"stochastic_rounding must be a bool, got {type(stochastic_rounding).__name__}")
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous, got shape {tuple(x.shape)} with strides {tuple(x.stride())}")
    if stochastic_rounding:
        if (in_fmt, out_fmt) not in parallel.STOCHASTIC_PAIRS:
            raise ValueError(f"stochastic_rounding supports {x.dtype} -> {dtype} only for the pairs "
                             f"{parallel.STOCHASTIC_PAIRS}")
        if x.numel() % 4:
            raise ValueError(f"stochastic_rounding needs x.numel() divisible by 4, got {x.numel()}")
    spec = parallel.CastSpec(in_fmt, out_fmt, stochastic_rounding)
    return target, CastCall(spec, x, torch.empty_like(x, dtype=dtype))


def _run(x, dtype, stochastic_rounding, *, out, target, flavor, launch):
    target, call = _prepare(x, dtype, stochastic_rounding, target, flavor)
    if launch and target == "torch":
        call.out.copy_(reference.cast(x, dtype, stochastic_rounding))
    elif launch:
        parallel.launch(call, target)
    return call.out


_DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPES.items()}
_OPTIONS = (
    Option("in_dtype", "fp32", tuple(_DTYPES_BY_NAME), "input dtype"),
    Option("dtype", "bf16", tuple(_DTYPES_BY_NAME), "output dtype"),
    Option("stochastic_rounding", False, help="stochastic rounding (fp32->bf16, fp32->e4m3, bf16->e4m3)"),
)


def _inputs(shape, options, seed):
    return {"x": randn(shape, seed, torch.float32).to(_DTYPES_BY_NAME[options["in_dtype"]])}


def _kernels(options, target, flavor):
    spec = parallel.CastSpec(options["in_dtype"], options["dtype"], options["stochastic_rounding"])
    return [(parallel.build_cast, spec)]


CAST = KernelOp(
    "cast", (Param("x", "Tensor"), Param("dtype", "ScalarType"), Param("stochastic_rounding", "bool", False)),
    ("out",), _run,
    command=Command(
        summary="elementwise fp32 / bf16 / E4M3 conversion, optionally with stochastic rounding",
        support=support("SIMD vector region; DMA only for a same-format cast",
                        cpu="bit-exact against the reference, every format pair and stochastic rounding",
                        ascend_sim="bit-exact against the reference"),
        default_shape=(1024, 4096), bench_shapes=demo.BENCH_SHAPES, make_inputs=_inputs, kernels=_kernels,
        options=_OPTIONS, arguments=lambda inputs, options, flavor: {"dtype": _DTYPES_BY_NAME[options["dtype"]]}))


def cast(x: torch.Tensor, dtype: torch.dtype, stochastic_rounding: bool = False, *, target: str | None = None,
         flavor: str | None = None) -> torch.Tensor:
    """``x`` converted elementwise to ``dtype``.

    Round to nearest even; E4M3 saturates to +-448 (infinities too) and keeps NaN.
    ``stochastic_rounding`` rounds with vmi-core's hash-based rule, the counter of each quad
    of four elements being its index in the flattened tensor: same input, same bits.

    Args:
        x: Contiguous tensor of any shape: float32, bfloat16 or float8_e4m3fn.
        dtype: Output dtype: ``torch.float32``, ``torch.bfloat16`` or ``torch.float8_e4m3fn``.
        stochastic_rounding: Round stochastically; only fp32 -> bf16, fp32 -> E4M3 and
            bf16 -> E4M3, with ``x.numel() % 4 == 0``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions (see ``vmi_core.targets``); no bit of a cast depends on it.

    Returns:
        A new contiguous tensor of ``dtype`` with the shape of ``x``.

    Raises:
        TypeError: ``x`` is not a tensor; ``x.dtype`` or ``dtype`` is not one of the three
            dtypes (or ``dtype`` is not a ``torch.dtype``); ``stochastic_rounding`` is not a
            bool.
        ValueError: ``x`` is not contiguous; ``stochastic_rounding`` for an unsupported
            dtype pair or with ``x.numel() % 4 != 0``.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return CAST(x, dtype, stochastic_rounding, target=target, flavor=flavor)


cast_parallel = parallel_entry(cast, "x")
