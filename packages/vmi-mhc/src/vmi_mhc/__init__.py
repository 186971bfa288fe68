"""vmi-mhc: mHC (manifold-constrained hyper-connection) ops as TileLang kernels.

Each op is one TileLang kernel body lowered for ``ascend``, ``cuda`` and ``cpu`` and checked
against a PyTorch reference (``vmi_mhc.reference``). The kernel-level entry points keep TileKernels
v2's names and arguments (outputs given and written, and also returned):

* ``expand_to_mhc_fwd`` / ``_bwd`` — the embedding copied into the n residual streams;
* ``mhc_pre_apply_mix_fwd`` / ``_bwd`` — the pre-mixed sublayer input ``Σ_m pre[m]·R[m]``;
* ``mhc_post_fwd`` / ``_bwd`` — the next residual ``post·x + Σ_i comb[i, ·]·R[i]``;
* ``mhc_multilayer_recompute`` — a run of layers' inputs and residuals rebuilt from ``R_0`` (the
  pre_apply_mix / post chain in one kernel, bit for bit);
* ``mhc_fn_normw_merge_fwd`` / ``_bwd``, ``mhc_pre_norm_fn_gemm_fwd`` / ``_bwd``,
  ``mhc_reduce_partials_and_rmsnorm_fwd`` / ``_bwd`` — ``norm_fn``: the weight merge, the prenorm
  GEMM (split-K partials, TF32 operands) and the split reduction with the RMS scale;
* ``mhc_head_compute_mix_fwd`` / ``_bwd`` — the LM head's pre mix ``σ(g·x + b) + eps`` (one gain);
* ``mhc_pre_split_mixes_fwd`` / ``_bwd`` — pre, post and comb logits from the mix vector;
* ``mhc_sinkhorn_fwd`` / ``_bwd`` — the Sinkhorn projection of the comb logits;
* ``mhc_pre_big_fuse_fwd`` — the inference ``pre`` (reduce, RMS, split, Sinkhorn and the pre
  mix applied) in one kernel, bit for bit the unfused chain.

Every op takes ``target=`` (``ascend``, ``cuda``, ``cpu``, ``ascend-sim`` or the reference
``torch``) and ``flavor=`` (``ascend`` or ``cuda`` bit conventions on ``cpu``); ``*_parallel``
entry points always run the kernel. The per-flavor arithmetic that the fused kernels must
reproduce lives in ``vmi_mhc.tl``.

The autograd layer keeps TileKernels v1's functional API (``vmi_mhc.autograd``,
``vmi_mhc.functional``): ``expand_to_mhc``, ``mhc_pre_norm_fn``, ``mhc_pre_split_mixes``,
``sinkhorn_normalize``, ``mhc_pre_apply_mix``, ``mhc_post``, ``mhc_head_compute_mix`` (each a
``torch.autograd.Function`` over the kernels above), and ``expand_from_embedding``, ``mhc_pre``,
``mhc_head``, ``mhc_pre_big_fuse`` (the layer functions; ``mhc_pre`` takes the fused kernel when
autograd does not record).
"""

from .autograd import (
    expand_to_mhc,
    mhc_head_compute_mix,
    mhc_post,
    mhc_pre_apply_mix,
    mhc_pre_norm_fn,
    mhc_pre_split_mixes,
    sinkhorn_normalize,
)
from .functional import expand_from_embedding, mhc_head, mhc_pre, mhc_pre_big_fuse
from .ops.expand import expand_to_mhc_bwd, expand_to_mhc_bwd_parallel, expand_to_mhc_fwd, expand_to_mhc_fwd_parallel
from .ops.head_compute_mix import (
    mhc_head_compute_mix_bwd,
    mhc_head_compute_mix_bwd_parallel,
    mhc_head_compute_mix_fwd,
    mhc_head_compute_mix_fwd_parallel,
)
from .ops.multilayer_recompute import mhc_multilayer_recompute, mhc_multilayer_recompute_parallel
from .ops.norm_fn import (
    mhc_fn_normw_merge_bwd,
    mhc_fn_normw_merge_bwd_parallel,
    mhc_fn_normw_merge_fwd,
    mhc_fn_normw_merge_fwd_parallel,
    mhc_reduce_partials_and_rmsnorm_bwd,
    mhc_reduce_partials_and_rmsnorm_bwd_parallel,
    mhc_reduce_partials_and_rmsnorm_fwd,
    mhc_reduce_partials_and_rmsnorm_fwd_parallel,
)
from .ops.post import mhc_post_bwd, mhc_post_bwd_parallel, mhc_post_fwd, mhc_post_fwd_parallel
from .ops.pre_apply_mix import (
    mhc_pre_apply_mix_bwd,
    mhc_pre_apply_mix_bwd_parallel,
    mhc_pre_apply_mix_fwd,
    mhc_pre_apply_mix_fwd_parallel,
)
from .ops.pre_big_fuse import mhc_pre_big_fuse_fwd, mhc_pre_big_fuse_fwd_parallel
from .ops.pre_norm_fn_gemm import (
    mhc_pre_norm_fn_gemm_bwd,
    mhc_pre_norm_fn_gemm_bwd_parallel,
    mhc_pre_norm_fn_gemm_fwd,
    mhc_pre_norm_fn_gemm_fwd_parallel,
)
from .ops.pre_split_mixes import (
    mhc_pre_split_mixes_bwd,
    mhc_pre_split_mixes_bwd_parallel,
    mhc_pre_split_mixes_fwd,
    mhc_pre_split_mixes_fwd_parallel,
)
from .ops.sinkhorn import mhc_sinkhorn_bwd, mhc_sinkhorn_bwd_parallel, mhc_sinkhorn_fwd, mhc_sinkhorn_fwd_parallel

__version__ = "0.1.0"

__all__ = [
    "expand_from_embedding",
    "expand_to_mhc",
    "expand_to_mhc_bwd",
    "expand_to_mhc_bwd_parallel",
    "expand_to_mhc_fwd",
    "expand_to_mhc_fwd_parallel",
    "mhc_fn_normw_merge_bwd",
    "mhc_fn_normw_merge_bwd_parallel",
    "mhc_fn_normw_merge_fwd",
    "mhc_fn_normw_merge_fwd_parallel",
    "mhc_head",
    "mhc_head_compute_mix",
    "mhc_head_compute_mix_bwd",
    "mhc_head_compute_mix_bwd_parallel",
    "mhc_head_compute_mix_fwd",
    "mhc_head_compute_mix_fwd_parallel",
    "mhc_multilayer_recompute",
    "mhc_multilayer_recompute_parallel",
    "mhc_post",
    "mhc_post_bwd",
    "mhc_post_bwd_parallel",
    "mhc_post_fwd",
    "mhc_post_fwd_parallel",
    "mhc_pre",
    "mhc_pre_apply_mix",
    "mhc_pre_apply_mix_bwd",
    "mhc_pre_apply_mix_bwd_parallel",
    "mhc_pre_apply_mix_fwd",
    "mhc_pre_apply_mix_fwd_parallel",
    "mhc_pre_big_fuse",
    "mhc_pre_big_fuse_fwd",
    "mhc_pre_big_fuse_fwd_parallel",
    "mhc_pre_norm_fn",
    "mhc_pre_norm_fn_gemm_bwd",
    "mhc_pre_norm_fn_gemm_bwd_parallel",
    "mhc_pre_norm_fn_gemm_fwd",
    "mhc_pre_norm_fn_gemm_fwd_parallel",
    "mhc_pre_split_mixes",
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
    "sinkhorn_normalize",
]
