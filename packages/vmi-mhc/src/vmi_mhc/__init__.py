"""vmi-mhc: mHC (manifold-constrained hyper-connection) ops as TileLang kernels.

Each op is one TileLang kernel body lowered for ``ascend``, ``cuda`` and ``cpu``
and checked against a PyTorch reference. The ops are being added; this release
provides the package and its version only.
"""

from .sinkhorn import mhc_sinkhorn_bwd, mhc_sinkhorn_fwd
from .sinkhorn_parallel import mhc_sinkhorn_bwd_parallel, mhc_sinkhorn_fwd_parallel

__version__ = "0.1.0"

__all__ = [
    "mhc_sinkhorn_bwd",
    "mhc_sinkhorn_bwd_parallel",
    "mhc_sinkhorn_fwd",
    "mhc_sinkhorn_fwd_parallel",
]
