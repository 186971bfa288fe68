"""vmi-quant: FP8/FP4 quantization ops as parallel-style TileLang kernels, with PyTorch references."""

from .config import get_amax_clamp_for_quant, reset_runtime_config, set_amax_clamp_for_quant
from .per_token_cast import (
    per_token_cast,
    per_token_cast_with_precomputed_sf,
    per_token_cast_with_sf_only,
)
from .per_token_cast_parallel import per_token_cast_parallel

__version__ = "0.1.0"

__all__ = [
    "get_amax_clamp_for_quant",
    "per_token_cast",
    "per_token_cast_parallel",
    "per_token_cast_with_precomputed_sf",
    "per_token_cast_with_sf_only",
    "reset_runtime_config",
    "set_amax_clamp_for_quant",
]
