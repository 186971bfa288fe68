"""vmi-mhc: mHC (manifold-constrained hyper-connection) ops as TileLang kernels.

Each op is one TileLang kernel body lowered for ``ascend``, ``cuda`` and ``cpu``
and checked against a PyTorch reference. The ops are being added.
"""

from .expand import expand_to_mhc_bwd, expand_to_mhc_fwd
from .expand_parallel import expand_to_mhc_bwd_parallel, expand_to_mhc_fwd_parallel
from .norm_fn import (
    mhc_fn_normw_merge_bwd,
    mhc_fn_normw_merge_fwd,
    mhc_reduce_partials_and_rmsnorm_bwd,
    mhc_reduce_partials_and_rmsnorm_fwd,
)
from .norm_fn_parallel import (
    mhc_fn_normw_merge_bwd_parallel,
    mhc_fn_normw_merge_fwd_parallel,
    mhc_reduce_partials_and_rmsnorm_bwd_parallel,
    mhc_reduce_partials_and_rmsnorm_fwd_parallel,
)
from .post import mhc_post_bwd, mhc_post_fwd
from .post_parallel import mhc_post_bwd_parallel, mhc_post_fwd_parallel
from .pre_apply_mix import mhc_pre_apply_mix_bwd, mhc_pre_apply_mix_fwd
from .pre_apply_mix_parallel import mhc_pre_apply_mix_bwd_parallel, mhc_pre_apply_mix_fwd_parallel
from .pre_norm_fn_gemm import mhc_pre_norm_fn_gemm_bwd, mhc_pre_norm_fn_gemm_fwd
from .pre_norm_fn_gemm_parallel import mhc_pre_norm_fn_gemm_bwd_parallel, mhc_pre_norm_fn_gemm_fwd_parallel
from .pre_split_mixes import mhc_pre_split_mixes_bwd, mhc_pre_split_mixes_fwd
from .pre_split_mixes_parallel import mhc_pre_split_mixes_bwd_parallel, mhc_pre_split_mixes_fwd_parallel
from .sinkhorn import mhc_sinkhorn_bwd, mhc_sinkhorn_fwd
from .sinkhorn_parallel import mhc_sinkhorn_bwd_parallel, mhc_sinkhorn_fwd_parallel

__version__ = "0.1.0"

__all__ = [
    "expand_to_mhc_bwd",
    "expand_to_mhc_bwd_parallel",
    "expand_to_mhc_fwd",
    "expand_to_mhc_fwd_parallel",
    "mhc_fn_normw_merge_bwd",
    "mhc_fn_normw_merge_bwd_parallel",
    "mhc_fn_normw_merge_fwd",
    "mhc_fn_normw_merge_fwd_parallel",
    "mhc_post_bwd",
    "mhc_post_bwd_parallel",
    "mhc_post_fwd",
    "mhc_post_fwd_parallel",
    "mhc_pre_apply_mix_bwd",
    "mhc_pre_apply_mix_bwd_parallel",
    "mhc_pre_apply_mix_fwd",
    "mhc_pre_apply_mix_fwd_parallel",
    "mhc_pre_norm_fn_gemm_bwd",
    "mhc_pre_norm_fn_gemm_bwd_parallel",
    "mhc_pre_norm_fn_gemm_fwd",
    "mhc_pre_norm_fn_gemm_fwd_parallel",
    "mhc_pre_split_mixes_bwd",
    "mhc_pre_split_mixes_bwd_parallel",
    "mhc_pre_split_mixes_fwd",
    "mhc_pre_split_mixes_fwd_parallel",
    "mhc_reduce_partials_and_rmsnorm_bwd",
    "mhc_reduce_partials_and_rmsnorm_bwd_parallel",
    "mhc_reduce_partials_and_rmsnorm_fwd",
    "mhc_reduce_partials_and_rmsnorm_fwd_parallel",
    "mhc_sinkhorn_bwd",
    "mhc_sinkhorn_bwd_parallel",
    "mhc_sinkhorn_fwd",
    "mhc_sinkhorn_fwd_parallel",
]
