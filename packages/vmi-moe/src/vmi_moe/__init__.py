"""vmi-moe: MoE routing ops as TileLang kernels.

Each op is one TileLang kernel body lowered for ``ascend``, ``cuda`` and ``cpu``
and checked against a PyTorch reference (``vmi_moe.reference``):

* ``topk_gate`` — plain top-k over expert scores, ties to the lowest index;
* ``normalize_weight`` — ``w / (sum(w) + 1e-20)`` in the gate's summation order;
* ``moe_topk_gate_forward`` (alias ``moe_topk_gate``) — the sqrt-softplus gate with
  bias, shared experts, fixed and force-random routing and replica mapping;
* ``moe_topk_gate_backward`` — its gradient, with the sequence-level auxiliary term;
* ``moe_topk_gate_autograd`` — the gate with autograd (a registered backward);
* ``get_fused_mapping`` — the expert-major layout of the routed slots, ranges aligned per expert;
* ``topk_sum_and_topk_group_idx`` — group-limited routing's group ranking (top-1 or top-2 sums);
* ``top2_sum_gate`` — TileKernels v1's group-limited gate (sigmoid, sqrt-softplus or softmax scores,
  top-2-sum group ranking, shared experts, replicas, EP/TP masking);
* ``group_count``, ``aux_fi`` — entries per id, and the load-balancing frequency ``count·E / (T·k)``;
* ``expand_to_fused``, ``expand_to_fused_with_sf`` — token rows (and per-token SF) copied to their slots'
  rows of the fused layout, padding rows zero;
* ``reduce_fused`` — the expanded expert rows summed back per token (weighted, fma in slot order);
* ``mask_indices_by_tp`` — keep one TP rank's expert ids, renumbered to its local experts;
* ``inplace_unique_group_indices`` — per token, repeated group ids become -1, in place.

Every op takes ``target=`` (``ascend``, ``cuda``, ``cpu`` or the reference ``torch``)
and ``flavor=`` (``ascend`` or ``cuda`` bit conventions on ``cpu``); ``*_parallel``
entry points always run the kernel.
"""

from vmi_moe.autograd import moe_topk_gate_autograd
from vmi_moe.ops.aux_fi import aux_fi, aux_fi_parallel
from vmi_moe.ops.expand_to_fused import (
    expand_to_fused,
    expand_to_fused_parallel,
    expand_to_fused_with_sf,
    expand_to_fused_with_sf_parallel,
)
from vmi_moe.ops.get_fused_mapping import get_fused_mapping, get_fused_mapping_parallel
from vmi_moe.ops.group_count import group_count, group_count_parallel
from vmi_moe.ops.inplace_unique_group_indices import (
    inplace_unique_group_indices,
    inplace_unique_group_indices_parallel,
)
from vmi_moe.ops.mask_indices_by_tp import mask_indices_by_tp, mask_indices_by_tp_parallel
from vmi_moe.ops.moe_topk_gate import moe_topk_gate, moe_topk_gate_forward, moe_topk_gate_forward_parallel
from vmi_moe.ops.moe_topk_gate_backward import moe_topk_gate_backward, moe_topk_gate_backward_parallel
from vmi_moe.ops.normalize_weight import normalize_weight, normalize_weight_parallel
from vmi_moe.ops.reduce_fused import reduce_fused, reduce_fused_parallel
from vmi_moe.ops.top2_sum_gate import top2_sum_gate, top2_sum_gate_parallel
from vmi_moe.ops.topk_gate import topk_gate, topk_gate_parallel
from vmi_moe.ops.topk_sum_and_topk_group_idx import (
    topk_sum_and_topk_group_idx,
    topk_sum_and_topk_group_idx_parallel,
)

__version__ = "0.1.0"

__all__ = [
    "aux_fi",
    "aux_fi_parallel",
    "expand_to_fused",
    "expand_to_fused_parallel",
    "expand_to_fused_with_sf",
    "expand_to_fused_with_sf_parallel",
    "get_fused_mapping",
    "get_fused_mapping_parallel",
    "group_count",
    "group_count_parallel",
    "inplace_unique_group_indices",
    "inplace_unique_group_indices_parallel",
    "mask_indices_by_tp",
    "mask_indices_by_tp_parallel",
    "moe_topk_gate_autograd",
    "moe_topk_gate_backward",
    "moe_topk_gate_backward_parallel",
    "moe_topk_gate",
    "moe_topk_gate_forward",
    "moe_topk_gate_forward_parallel",
    "normalize_weight",
    "normalize_weight_parallel",
    "reduce_fused",
    "reduce_fused_parallel",
    "top2_sum_gate",
    "top2_sum_gate_parallel",
    "topk_gate",
    "topk_gate_parallel",
    "topk_sum_and_topk_group_idx",
    "topk_sum_and_topk_group_idx_parallel",
]
