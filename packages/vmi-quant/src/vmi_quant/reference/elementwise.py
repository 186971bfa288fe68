"""PyTorch reference of the elementwise ``cast`` (spec quant-a §4, §1.4, §1.10).

Conversions between fp32, bf16 and float8_e4m3fn of a contiguous tensor of any
shape: RNE, E4M3 with finite saturation, NaN kept. Stochastic rounding hashes each
quad of four consecutive elements of the flattened tensor (widened to fp32) with
the quad's index, truncated to 32 bits, as the counter.
"""

from __future__ import annotations

import torch

from vmi_core.formats import bf16_decode, bf16_encode, e4m3_decode, e4m3_encode
from vmi_core.stochastic import random16, stochastic_round

FORMATS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float8_e4m3fn: "e4m3"}
STOCHASTIC_PAIRS = (("fp32", "bf16"), ("fp32", "e4m3"), ("bf16", "e4m3"))


def _format(dtype, name: str) -> str:
    if dtype not in FORMATS:
        raise ValueError(f"{name} must be one of {tuple(FORMATS)}, got {dtype}")
    return FORMATS[dtype]


def _to_f32(flat: torch.Tensor, fmt: str) -> torch.Tensor:
    if fmt == "fp32":
        return flat
    if fmt == "bf16":
        return bf16_decode(flat.view(torch.int16))
    return e4m3_decode(flat.view(torch.uint8))


def _from_f32(values: torch.Tensor, fmt: str) -> torch.Tensor:
    if fmt == "fp32":
        return values
    if fmt == "bf16":
        return bf16_encode(values).view(torch.bfloat16)
    return e4m3_encode(values).view(torch.float8_e4m3fn)


def cast(x: torch.Tensor, dtype: torch.dtype, stochastic_rounding: bool = False) -> torch.Tensor:
    """``x`` converted to ``dtype`` (same shape), optionally with stochastic rounding."""
    in_fmt, out_fmt = _format(x.dtype, "x.dtype"), _format(dtype, "dtype")
    if not x.is_contiguous():
        raise ValueError("x must be contiguous")
    n = x.numel()
    if stochastic_rounding:
        if (in_fmt, out_fmt) not in STOCHASTIC_PAIRS:
            raise ValueError(f"stochastic rounding supports only {STOCHASTIC_PAIRS}, got {(in_fmt, out_fmt)}")
        if n % 4:
            raise ValueError(f"stochastic rounding needs numel divisible by 4, got {n}")
    if in_fmt == out_fmt:
        return x.clone()
    values = _to_f32(x.reshape(-1), in_fmt)
    if stochastic_rounding:
        counters = torch.arange(n // 4, dtype=torch.int64, device=x.device) & 0xFFFFFFFF
        values = stochastic_round(values, out_fmt, random16(values, counters))
    return _from_f32(values, out_fmt).reshape(x.shape)
