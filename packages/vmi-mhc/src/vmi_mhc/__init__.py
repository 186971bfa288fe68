"""vmi-mhc: mHC (manifold-constrained hyper-connection) ops as TileLang kernels.

Each op is one TileLang kernel body lowered for ``ascend``, ``cuda`` and ``cpu``
and checked against a PyTorch reference. The ops are being added; this release
provides the package and its version only.
"""

from .post import mhc_post_bwd, mhc_post_fwd
from .post_parallel import mhc_post_bwd_parallel, mhc_post_fwd_parallel

__version__ = "0.1.0"

__all__ = [
    "mhc_post_bwd", "mhc_post_bwd_parallel", "mhc_post_fwd", "mhc_post_fwd_parallel",
]
