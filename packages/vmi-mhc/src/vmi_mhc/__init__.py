"""vmi-mhc: mHC (manifold-constrained hyper-connection) ops as TileLang kernels.

Each op is one TileLang kernel body lowered for ``ascend``, ``cuda`` and ``cpu``
and checked against a PyTorch reference. The ops are being added.
"""

from .expand import expand_to_mhc_bwd, expand_to_mhc_fwd
from .expand_parallel import expand_to_mhc_bwd_parallel, expand_to_mhc_fwd_parallel
from .pre_apply_mix import mhc_pre_apply_mix_bwd, mhc_pre_apply_mix_fwd
from .pre_apply_mix_parallel import mhc_pre_apply_mix_bwd_parallel, mhc_pre_apply_mix_fwd_parallel

__version__ = "0.1.0"

__all__ = [
    "expand_to_mhc_bwd",
    "expand_to_mhc_bwd_parallel",
    "expand_to_mhc_fwd",
    "expand_to_mhc_fwd_parallel",
    "mhc_pre_apply_mix_bwd",
    "mhc_pre_apply_mix_bwd_parallel",
    "mhc_pre_apply_mix_fwd",
    "mhc_pre_apply_mix_fwd_parallel",
]
