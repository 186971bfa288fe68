"""``unpack_from_e2m1fn_x2``: packed FP4 (E2M1) bytes to floating-point values (TileKernels' name).

A host-side torch function, no kernel: it runs on the tensor's device with torch ops.
"""

from __future__ import annotations

import torch

from vmi_core.formats import e2m1_decode, e2m1_unpack

_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The FP4 values of packed E2M1 bytes: ``[..., L]`` -> ``[..., 2L]``.

    Element ``2j`` of the result is byte ``j``'s low nibble, element ``2j + 1`` its high nibble
    (the packing every vmi op and TileKernels use); a nibble is sign, 2 exponent bits, 1
    mantissa bit: ``±{0, 0.5, 1, 1.5, 2, 3, 4, 6}``, ``-0.0`` for nibble 8. Every value is exact in
    each ``out_dtype``.

    Args:
        x: int8 or uint8 tensor of at least one dimension, any strides.
        out_dtype: float32 (default), bfloat16, float16 or float64.

    Returns:
        A new contiguous ``out_dtype`` tensor of shape ``(*x.shape[:-1], 2 * x.shape[-1])`` on
        ``x``'s device.

    Raises:
        TypeError: ``x`` is not an int8/uint8 tensor, or ``out_dtype`` is not one of the above.
        ValueError: ``x`` is 0-d.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"x must be int8 or uint8 (packed E2M1 pairs), got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (the packed pairs), got a 0-d tensor")
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {_OUT_DTYPES}, got {out_dtype!r}")
    return e2m1_decode(e2m1_unpack(x)).to(out_dtype)
