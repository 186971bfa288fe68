"""PyTorch reference (oracle) of the quantization ops."""

from vmi_quant.reference import elementwise, norm
from vmi_quant.reference.cast import cast, cast_and_cast_back, cast_back
from vmi_quant.reference.lossless import per_block_cast_lossless
from vmi_quant.reference.norm_backward import norm_backward
from vmi_quant.reference.transpose import batched_transpose_weight_sf

__all__ = [
    "batched_transpose_weight_sf", "cast", "cast_and_cast_back", "cast_back", "elementwise", "norm", "norm_backward",
    "per_block_cast_lossless",
]
