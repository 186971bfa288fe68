"""Speed baselines of vmi-moe's ops for ``vmi bench``: the straightforward torch composition of
each op (``torch.topk``, ``F.softplus``, sums and divisions in fp32), in the structure of the op's
``run`` outputs. Row sums use torch's own order, so weights may differ from the reference's
(sequential or butterfly) sums in the last bit; the bench shows whether they do.

The ``vmi`` command (``vmi_moe.ops.demo``) runs the gate with a routed scaling factor of ``SCALE``;
the baselines use the same one (tests-integration/test_baselines.py holds them to the reference).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vmi_core.targets import get_flavor
from vmi_core.tools.bench import Baseline, in_row_chunks

EPSILON = 1e-20
SCALE = 1.5


def topk_gate_baseline(op, options):
    k = options["num_topk"]

    def run(inputs, flavor, rows):
        scores = inputs["scores"]
        return (in_row_chunks(lambda a, b: torch.topk(scores[a:b], k, dim=1).indices, scores.shape[0], rows),)
    return Baseline(run, "torch.topk(scores, k).indices")


def normalize_weight_baseline(op, options):
    def one(w):
        denom = w.sum(-1) + EPSILON
        return denom, w / denom.unsqueeze(-1)

    def run(inputs, flavor, rows):
        w = inputs["topk_weights"]
        return in_row_chunks(lambda a, b: one(w[a:b]), w.shape[0], rows)
    return Baseline(run, "torch ops: d = w.sum(-1) + 1e-20, w / d", same_bits=False)


def moe_topk_gate_baseline(op, options):
    k, shared = options["num_topk"], options["num_shared_experts"]

    def one(logits, bias, mask):
        scores = F.softplus(logits).sqrt()
        keys = scores if bias is None else scores + bias
        idx = torch.topk(keys, k, dim=1).indices
        w = scores.gather(1, idx)
        weights = w / (w.sum(-1, keepdim=True) + EPSILON) * SCALE
        if shared:
            n, e = logits.shape
            idx = torch.cat([idx, torch.arange(e, e + shared).expand(n, shared)], dim=1)
            weights = torch.cat([weights, weights.new_ones(n, shared)], dim=1)
        if mask is not None:
            keep = mask.unsqueeze(1)
            idx = torch.where(keep, idx, -1)
            weights = torch.where(keep, weights, 0.0)
            scores = torch.where(keep, scores, 0.0)
        return idx, weights, scores

    def run(inputs, flavor, rows):
        logits, bias, mask = inputs["logits"], inputs["bias"], inputs["mask"]
        return in_row_chunks(lambda a, b: one(logits[a:b], bias, None if mask is None else mask[a:b]),
                             logits.shape[0], rows)
    # torch's float32 softplus and sqrt are not correctly rounded: scores (and so weights) may differ
    # from the reference's correctly rounded composition in the last bit.
    return Baseline(run, "torch ops: F.softplus(x).sqrt(), torch.topk(scores + bias), gather, w / w.sum(), "
                         "shared experts by torch.cat, mask by torch.where", same_bits=False)


def moe_topk_gate_backward_baseline(op, options):
    def one(scores, idx, weights, grad, mask, h):
        valid = idx >= 0
        slots = idx.clamp_min(0)
        g = torch.where(valid, grad, 0.0)
        denom = torch.where(valid, scores.gather(1, slots), 0.0).sum(-1, keepdim=True) + EPSILON
        inner = (g * weights).sum(-1, keepdim=True)
        delta = torch.where(valid, (SCALE * g - inner) / denom, 0.0)
        total = torch.zeros_like(scores).scatter_add_(1, slots, delta)
        if h is not None:
            inv = torch.where(mask.unsqueeze(1), 1.0 / scores.sum(-1, keepdim=True), 0.0)
            total += (h - (h * scores).sum(-1, keepdim=True) * inv) * inv
        positive = scores > 0
        safe = torch.where(positive, scores, 1.0)
        dy = torch.where(positive, -torch.expm1(-safe * safe) / (2 * safe), 0.0)
        return dy * total

    def run(inputs, flavor, rows):
        scores, h = inputs["scores"], inputs["grad_scores_sum"]
        tokens = scores.shape[0]
        per_seq = None if h is None else tokens // h.shape[0]

        def chunk(a, b):
            # The rows of grad_scores_sum of tokens a..b-1: one broadcast row when the chunk lies in one sequence.
            if h is None:
                hs = None
            elif a // per_seq == (b - 1) // per_seq:
                hs = h[a // per_seq].unsqueeze(0)
            else:
                hs = h.repeat_interleave(per_seq, dim=0)[a:b]
            return one(scores[a:b], inputs["topk_idx"][a:b], inputs["topk_weights"][a:b],
                       inputs["grad_topk_weights"][a:b], None if h is None else inputs["mask"][a:b], hs)
        return (in_row_chunks(chunk, tokens, rows),)
    return Baseline(run, "torch ops in fp32: gather, sums, scatter_add_, the aux term by broadcasting, "
                         "-expm1(-u^2) / 2u")


def get_fused_mapping_baseline(op, options):
    alignment = options["alignment"]

    def run(inputs, flavor, rows):
        topk_idx, num_experts = inputs["topk_idx"], inputs["num_experts"]
        num_tokens, num_topk = topk_idx.shape
        flat = topk_idx.flatten()
        used = flat >= 0
        counts = torch.bincount(flat[used], minlength=num_experts)
        sizes = (counts + alignment - 1) // alignment * alignment
        end = sizes.cumsum(0)
        start = end - sizes
        # Slots sorted by expert (unused last), each expert's in flat order; a slot's row is its place
        # in that order shifted by its expert's padding before it.
        order = torch.sort(torch.where(used, flat, num_experts), stable=True).indices[:int(used.sum())]
        experts = flat[order]
        rows = torch.arange(order.numel()) + (start - (counts.cumsum(0) - counts))[experts]
        total = (num_tokens * num_topk + (alignment - 1) * num_experts + alignment - 1) // alignment * alignment
        maps = torch.full((3, total), -1, dtype=torch.int32)
        maps[0, rows], maps[1, rows], maps[2, rows] = experts.int(), (order // num_topk).int(), order.int()
        token_topk_to_pos = torch.full((num_tokens * num_topk,), -1, dtype=torch.int32)
        token_topk_to_pos[order] = rows.int()
        return (*maps, token_topk_to_pos.view(num_tokens, num_topk), start.int(), end.int(), sizes.int())
    return Baseline(run, "torch ops: bincount, cumsum, a stable sort by expert, index writes", chunks=False)


def topk_sum_and_topk_group_idx_baseline(op, options):
    num_topk_sum, num_topk_groups = options["num_topk_sum"], options["num_topk_groups"]

    def one(scores):
        group_scores = torch.topk(scores, num_topk_sum, dim=-1).values.sum(-1)
        return torch.topk(group_scores, num_topk_groups, dim=-1).indices

    def run(inputs, flavor, rows):
        scores = inputs["scores"]
        return (in_row_chunks(lambda a, b: one(scores[a:b]), scores.shape[0], rows),)
    # torch.topk breaks ties between equal group scores in no documented order.
    return Baseline(run, "torch.topk of the scores per group, summed, then torch.topk of the groups",
                    same_bits=False)


def _counts(ids: torch.Tensor, num_ids: int) -> torch.Tensor:
    flat = ids.flatten()
    return torch.bincount(flat[flat >= 0], minlength=num_ids)


def group_count_baseline(op, options):
    def run(inputs, flavor, rows):
        return (_counts(inputs["group_idx"], inputs["num_groups"]).int(),)
    return Baseline(run, "torch.bincount of the entries >= 0", chunks=False)


def aux_fi_baseline(op, options):
    # The op's own rounding order: int64 products, each converted to fp32 once, one division.
    def run(inputs, flavor, rows):
        topk_idx, num_experts, num_aux_topk = inputs["topk_idx"], inputs["num_experts"], inputs["num_aux_topk"]
        num_tokens = topk_idx.shape[0]
        if num_tokens == 0:
            return (torch.zeros(num_experts),)
        numerator = (_counts(topk_idx, num_experts) * num_experts).float()
        return (numerator / torch.tensor(num_tokens * num_aux_topk).float(),)
    return Baseline(run, "torch ops: bincount, (count * E).float() / float(T * k)", chunks=False)


# reduce_fused: products and sums rounded separately (torch has no fused multiply-add), ``sum`` in
# its own order, and an unused slot's ``0 · row`` turns an inf or NaN of row 0 into NaN: the bits may
# differ from the reference's fma chain.
def reduce_fused_baseline(op, options):
    out_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "e4m3": torch.float8_e4m3fn}[options["dtype"]]
    if options["fp8_format"] == "e4m3":
        out_dtype = torch.float8_e4m3fn

    def one(x, x_sf, weights, pos, sf):
        used = pos >= 0
        rows = pos.clamp(min=0).long()
        scale = torch.ones(pos.shape) if weights is None else weights
        if x_sf is not None:
            scale = scale * x_sf[rows]
        scale = torch.where(used, scale, 0.0)
        acc = (x[rows].float() * scale.unsqueeze(-1)).sum(1)
        if sf is not None:
            acc = acc * sf[0]
        return acc.to(out_dtype)

    def run(inputs, flavor, rows):
        x, x_sf, weights, pos, sf = (inputs[k] for k in ("x", "x_sf", "topk_weights", "token_topk_to_pos", "sf"))
        return (in_row_chunks(lambda a, b: one(x, x_sf, None if weights is None else weights[a:b], pos[a:b], sf),
                              pos.shape[0], rows),)
    return Baseline(run, "torch ops: x[pos] * (w * x_sf[pos]), .sum(1) over the slots, * sf, .to(dtype)",
                    same_bits=False)


def mask_indices_by_tp_baseline(op, options):
    def one(v, per_gpu, num_tp_ranks, tp_rank):
        block = v // per_gpu
        keep = (v >= 0) & (block % num_tp_ranks == tp_rank)
        return torch.where(keep, (block // num_tp_ranks) * per_gpu + (v - block * per_gpu), -1).to(v.dtype)

    def run(inputs, flavor, rows):
        indices = inputs["indices"]
        per_gpu = inputs["n"] // inputs["num_ep_ranks"]
        return (in_row_chunks(lambda a, b: one(indices[a:b], per_gpu, inputs["num_tp_ranks"], inputs["tp_rank"]),
                              indices.shape[0], rows),)
    return Baseline(run, "torch ops: v // per_gpu, % num_tp_ranks == tp_rank, the local id by // and -, torch.where")


def inplace_unique_group_indices_baseline(op, options):
    num_topk = options["num_topk"]

    def one(ids):
        earlier = torch.ones(num_topk, num_topk, dtype=torch.bool, device=ids.device).tril(-1)
        repeated = ((ids.unsqueeze(2) == ids.unsqueeze(1)) & earlier).any(dim=2)
        return torch.where(repeated, -1, ids)

    def run(inputs, flavor, rows):
        ids = inputs["group_indices"]
        return (in_row_chunks(lambda a, b: one(ids[a:b]), ids.shape[0], rows),)
    return Baseline(run, "torch ops: pairwise == within each row, & an earlier-column mask, any(), torch.where "
                         "(a new tensor)")


def _expand(rows: torch.Tensor, pos: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    placed = pos >= 0
    num_topk = pos.shape[1]
    out[pos[placed].long()] = rows.unsqueeze(1).expand(-1, num_topk, -1)[placed]
    return out


def expand_to_fused_baseline(op, options):
    def run(inputs, flavor, rows):
        x, pos, pte = inputs["x"], inputs["token_topk_to_pos"], inputs["pos_to_expert"]
        return (_expand(x, pos, x.new_zeros((pte.shape[0], x.shape[1]))),)
    # The output of every row depends on the whole mapping: no row chunks.
    return Baseline(run, "torch ops: zeros, out[pos] = x[token] (index_put)", chunks=False)


def expand_to_fused_with_sf_baseline(op, options):
    col_major = options["use_tma_aligned_col_major_sf"]

    def run(inputs, flavor, rows):
        x, sf = inputs["x_data"], inputs["x_sf"]
        pos, pte = inputs["token_topk_to_pos"], inputs["pos_to_expert"]
        num_expanded, hidden_sf = pte.shape[0], sf.shape[1]
        out = _expand(x, pos, x.new_zeros((num_expanded, x.shape[1])))
        if col_major:
            align = get_flavor(flavor).col_major_align(sf.element_size())
            storage = sf.new_zeros((hidden_sf, -(-num_expanded // align) * align))
            out_sf = storage[:, :num_expanded].t()
        else:
            out_sf = sf.new_zeros((num_expanded, hidden_sf))
        return out, _expand(sf, pos, out_sf)
    return Baseline(run, "torch ops: zeros, out[pos] = x[token] and out_sf[pos] = sf[token] (index_put)",
                    chunks=False)


# top2_sum_gate's command: EP rank 7 of 8, the replica stride of TileKernels' kernels.
REPLICA_STRIDE = 23333
EP_RANK, NUM_EP_RANKS = 7, 8


def top2_sum_gate_baseline(op, options):
    k, shared, scoring = options["num_topk"], options["num_shared_experts"], options["scoring_func"]
    groups, kept = options["num_groups"], options["num_topk_groups"]
    num_tp_ranks = options["num_tp_ranks"]
    tp_rank = num_tp_ranks - 1

    def one(start, logits, bias, mask, fixed, given, table, count):
        n, e = logits.shape
        if scoring == "sigmoid":
            scores = torch.sigmoid(logits)
        elif scoring == "sqrtsoftplus":
            scores = F.softplus(logits).sqrt()
        else:
            scores = torch.softmax(logits, dim=1)
        keys = (logits if scoring == "softmax" else scores) + bias
        if groups != kept:
            group_scores = keys.view(n, groups, -1).topk(2, dim=-1).values.sum(-1)
            dropped = torch.ones(n, groups, dtype=torch.bool).scatter_(1, group_scores.topk(kept, dim=1).indices, False)
            keys = keys.masked_fill(dropped.repeat_interleave(e // groups, dim=1), float("-inf"))
        idx = torch.topk(keys, k, dim=1).indices
        if fixed is not None:
            idx = torch.where(fixed[:, None], given, idx)
        w = scores.gather(1, idx)
        weights = w / (w.sum(-1, keepdim=True) + EPSILON) * SCALE
        logical = torch.cat([idx, torch.arange(e, e + shared).expand(n, shared)], dim=1)
        weights = torch.cat([weights, weights.new_ones(n, shared)], dim=1)
        dup = 1
        physical = logical
        if table is not None:
            dup = table.shape[1]
            tokens = torch.arange(start, start + n)[:, None]
            replica = (EP_RANK + tokens * REPLICA_STRIDE) % count[logical].long()
            physical = table.long()[logical, replica]
        per_rank = (e + dup - 1) // NUM_EP_RANKS
        block = physical // per_rank
        local = torch.where(block % num_tp_ranks == tp_rank,
                            (block // num_tp_ranks) * per_rank + (physical - block * per_rank), -1)
        if mask is not None:
            keep = mask[:, None]
            local = torch.where(keep, local, -1)
            weights = torch.where(keep, weights, 0.0)
            idx = torch.where(keep, idx, -1)
        return local, weights, idx

    def run(inputs, flavor, rows):
        logits, bias, mask = inputs["logits"], inputs["bias"], inputs.get("mask")
        fixed, given = inputs.get("fix_routing_mask"), inputs["unmapped_topk_idx"]
        table, count = inputs.get("to_physical_map"), inputs.get("logical_count")

        def rows_of(t, a, b):
            return None if t is None else t[a:b]

        return in_row_chunks(lambda a, b: one(a, logits[a:b], bias, rows_of(mask, a, b), rows_of(fixed, a, b),
                                              given[a:b], table, count), logits.shape[0], rows)
    return Baseline(run, "torch ops: sigmoid / F.softplus().sqrt() / softmax, + bias, group top-2 sums by "
                         "topk(2).sum and topk, masked_fill, torch.topk(keys), gather, w / w.sum(), shared "
                         "experts by torch.cat, replicas by indexing, EP/TP masking by // and %, torch.where",
                    same_bits=False)


BASELINES = {
    "topk_gate": topk_gate_baseline,
    "normalize_weight": normalize_weight_baseline,
    "moe_topk_gate": moe_topk_gate_baseline,
    "moe_topk_gate_backward": moe_topk_gate_backward_baseline,
    "get_fused_mapping": get_fused_mapping_baseline,
    "topk_sum_and_topk_group_idx": topk_sum_and_topk_group_idx_baseline,
    "top2_sum_gate": top2_sum_gate_baseline,
    "group_count": group_count_baseline,
    "aux_fi": aux_fi_baseline,
    "expand_to_fused": expand_to_fused_baseline,
    "expand_to_fused_with_sf": expand_to_fused_with_sf_baseline,
    "reduce_fused": reduce_fused_baseline,
    "mask_indices_by_tp": mask_indices_by_tp_baseline,
    "inplace_unique_group_indices": inplace_unique_group_indices_baseline,
}
