"""PyTorch reference (oracle) of the quantization ops."""

from vmi_quant.reference.cast import cast, cast_back

__all__ = ["cast", "cast_back"]
