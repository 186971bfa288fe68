"""vmi-mhc: mHC (manifold-constrained hyper-connection) ops as TileLang kernels.

Each op is one TileLang kernel body lowered for ``ascend``, ``cuda`` and ``cpu``
and checked against a PyTorch reference. The ops are being added; this release
provides the package and its version only.
"""

from .pre_norm_fn_gemm import mhc_pre_norm_fn_gemm_bwd, mhc_pre_norm_fn_gemm_fwd
from .pre_norm_fn_gemm_parallel import mhc_pre_norm_fn_gemm_bwd_parallel, mhc_pre_norm_fn_gemm_fwd_parallel

__version__ = "0.1.0"


__all__ = [
    "mhc_pre_norm_fn_gemm_bwd",
    "mhc_pre_norm_fn_gemm_bwd_parallel",
    "mhc_pre_norm_fn_gemm_fwd",
    "mhc_pre_norm_fn_gemm_fwd_parallel",
]
