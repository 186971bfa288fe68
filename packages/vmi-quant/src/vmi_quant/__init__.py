"""vmi-quant: FP8/FP4 quantization ops as parallel-style TileLang kernels, with PyTorch references."""

from .autograd import NormCastOptions, RMSNormFunction, SwiGLUFunction
from .config import (
    get_amax_clamp_for_quant,
    get_token_alignment,
    reset_runtime_config,
    set_amax_clamp_for_quant,
    set_token_alignment,
)
from .fp4 import unpack_from_e2m1fn_x2
from .ops.batched_transpose_weight_sf import batched_transpose_weight_sf, batched_transpose_weight_sf_parallel
from .ops.cast import cast, cast_parallel
from .ops.cast_back import cast_back, cast_back_parallel, per_token_cast_back, per_token_cast_back_parallel
from .ops.norm_backward import norm_backward, norm_backward_parallel
from .ops.norm_forward import (
    norm_forward,
    norm_forward_and_per_token_cast,
    norm_forward_and_per_token_cast_parallel,
    norm_forward_parallel,
)
from .ops.per_block_cast import (
    per_block_cast,
    per_block_cast_parallel,
    per_block_cast_with_precomputed_sf,
    per_block_cast_with_sf_only,
)
from .ops.per_block_cast_lossless import per_block_cast_lossless, per_block_cast_lossless_parallel
from .ops.per_channel_cast import per_channel_cast, per_channel_cast_parallel
from .ops.per_token_cast import (
    per_token_cast,
    per_token_cast_parallel,
    per_token_cast_with_precomputed_sf,
    per_token_cast_with_sf_only,
)
from .ops.per_token_cast_and_cast_back import per_token_cast_and_cast_back, per_token_cast_and_cast_back_parallel
from .ops.swiglu_backward import (
    swiglu_backward,
    swiglu_backward_and_per_token_cast,
    swiglu_backward_and_per_token_cast_parallel,
    swiglu_backward_parallel,
)
from .ops.swiglu_forward import (
    swiglu_forward,
    swiglu_forward_and_per_token_cast,
    swiglu_forward_and_per_token_cast_parallel,
    swiglu_forward_parallel,
)
from .ops.swiglu_forward_and_per_channel_cast_and_transpose import (
    swiglu_forward_and_per_channel_cast_and_transpose,
    swiglu_forward_and_per_channel_cast_and_transpose_parallel,
)

__version__ = "0.1.0"

__all__ = [
    "NormCastOptions",
    "RMSNormFunction",
    "SwiGLUFunction",
    "batched_transpose_weight_sf",
    "batched_transpose_weight_sf_parallel",
    "cast",
    "cast_back",
    "cast_back_parallel",
    "cast_parallel",
    "get_amax_clamp_for_quant",
    "get_token_alignment",
    "norm_backward",
    "norm_backward_parallel",
    "norm_forward",
    "norm_forward_and_per_token_cast",
    "norm_forward_and_per_token_cast_parallel",
    "norm_forward_parallel",
    "per_block_cast",
    "per_block_cast_lossless",
    "per_block_cast_lossless_parallel",
    "per_block_cast_parallel",
    "per_block_cast_with_precomputed_sf",
    "per_block_cast_with_sf_only",
    "per_channel_cast",
    "per_channel_cast_parallel",
    "per_token_cast",
    "per_token_cast_and_cast_back",
    "per_token_cast_and_cast_back_parallel",
    "per_token_cast_back",
    "per_token_cast_back_parallel",
    "per_token_cast_parallel",
    "per_token_cast_with_precomputed_sf",
    "per_token_cast_with_sf_only",
    "reset_runtime_config",
    "set_token_alignment",
    "set_amax_clamp_for_quant",
    "swiglu_backward",
    "swiglu_backward_and_per_token_cast",
    "swiglu_backward_and_per_token_cast_parallel",
    "swiglu_backward_parallel",
    "swiglu_forward",
    "swiglu_forward_and_per_channel_cast_and_transpose",
    "swiglu_forward_and_per_channel_cast_and_transpose_parallel",
    "swiglu_forward_and_per_token_cast",
    "swiglu_forward_and_per_token_cast_parallel",
    "swiglu_forward_parallel",
    "unpack_from_e2m1fn_x2",
]
