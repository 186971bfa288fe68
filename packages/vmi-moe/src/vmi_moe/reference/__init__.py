"""PyTorch reference (oracle) of the MoE routing ops."""

from vmi_moe.reference.backward import moe_topk_gate_backward
from vmi_moe.reference.counts import aux_fi, group_count
from vmi_moe.reference.expand import expand_to_fused, expand_to_fused_with_sf
from vmi_moe.reference.gate import force_random_route, moe_topk_gate_forward, resolve_collisions
from vmi_moe.reference.group_gate import top2_sum_gate
from vmi_moe.reference.indices import inplace_unique_group_indices, mask_indices_by_tp, unique_group_indices
from vmi_moe.reference.mapping import get_fused_mapping
from vmi_moe.reference.normalize import denominator, normalize_weight
from vmi_moe.reference.reduce import reduce_fused
from vmi_moe.reference.topk import stable_topk, topk_gate, topk_sum_and_topk_group_idx

__all__ = [
    "aux_fi",
    "denominator",
    "expand_to_fused",
    "expand_to_fused_with_sf",
    "force_random_route",
    "get_fused_mapping",
    "group_count",
    "inplace_unique_group_indices",
    "mask_indices_by_tp",
    "moe_topk_gate_backward",
    "moe_topk_gate_forward",
    "normalize_weight",
    "reduce_fused",
    "resolve_collisions",
    "stable_topk",
    "top2_sum_gate",
    "topk_gate",
    "topk_sum_and_topk_group_idx",
    "unique_group_indices",
]
