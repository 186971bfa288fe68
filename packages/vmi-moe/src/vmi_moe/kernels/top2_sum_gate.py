"""``top2_sum_gate`` (TileKernels v1's group-limited gate) as one parallel-style TileLang kernel for
ascend, cuda and cpu.

The replica counts and the physical map are loaded once per worker, with the bias row. Work tiles of
``block_m`` tokens go round-robin to persistent workers; per tile:

1. DMA the logit rows (and, with fixed routing, the given expert pairs) on chip;
2. one lane per token: its class (masked, fixed, normal), and for softmax the row's largest logit;
3. one lane per (token, expert): the score ``u`` (sigmoid ``1 / (1 + exp(-x))``, the flavor's
   sqrt-softplus, or softmax's numerator ``exp(x - max)``) and the ranking key (``u + bias``;
   softmax: ``x + bias``); flags for non-finite logits of routed tokens and non-finite keys of
   normally routed ones;
4. one lane per token:

   * softmax: the numerators summed in ascending expert order, each divided by the sum;
   * groups (``num_groups != num_topk_groups``): the top-2 sum of each group's keys and its stable
     rank (``topk_sum_and_topk_group_idx``'s lane functions), the keys of groups ranked
     ``num_topk_groups`` or later set to ``-inf``;
   * selection: ``K`` strict-``>`` scans over the keys (``common.next_in_rank``: descending, the
     lowest expert among equals), or the fixed experts;
   * weights: ``D = ((1e-20 + v_0) + v_1) + ...`` in slot order, ``fl(fl(v / D) * s)``, shared slots
     ``E + j`` with weight 1;
   * the replica ``(ep_rank + t * 23333) mod count`` (without int32 overflow), then the EP/TP
     masking of the physical id in exact int32 arithmetic (``mask_indices_by_tp``'s form);
     masked tokens: -1 and +0.0;

5. DMA indices (int32 pairs), weights and the logical indices out.

Steps 3 and 4 skip the tile's rows past the token count. The vector region is SIMT on Ascend (per-lane
serial scans, data-dependent gathers, integer division by runtime divisors, the scalar ``exp``), as in
``moe_topk_gate``'s kernel, whose pieces this one shares (``common``). Stores go only to the lane's own
row, so the only barriers are between the three passes. The token count, the logical-index row stride,
``ep_rank`` and the EP/TP sizes are runtime values; everything that changes the body is in the spec.
"""


from dataclasses import dataclass

import torch

from vmi_core.kernel import kernel
from vmi_core.targets import get_flavor
from vmi_core.tl.elementary import exp
from vmi_core.tl.formats import f32_const
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMT, Shell
from vmi_core.tl.simd import LaneVar
from vmi_core.tl.vector import RowAt
from vmi_moe.tl.softplus import sqrt_softplus_forward

from .common import (
    DENOM_EPS,
    STATUS_BAD_COUNT,
    STATUS_BAD_INDEX,
    STATUS_NONFINITE,
    STATUS_WORDS,
    clamp,
    is_nonfinite,
    kernel_rows,
    neg_inf,
    next_in_rank,
    ordered_sum,
    padded,
    pos_inf,
    quotient,
    row_bytes,
    row_chunks,
    tile_rows,
)
from .moe_topk_gate import REPLICA_STRIDE
from .topk_sum_and_topk_group_idx import rank_groups, score_groups

SCORING = ("sigmoid", "sqrtsoftplus", "softmax")
# The gate's group score: the sum of the two largest keys of a group.
GROUP_TOPK_SUM = 2
# Token class bits.
ACTIVE, FIXED = 1, 2


@dataclass(frozen=True)
class Top2GateSpec:
    """Everything a top2_sum_gate kernel is specialised on (the token count is a runtime value).

    ``num_groups`` and ``num_topk_groups`` are 0 when groups are off (TileKernels' ``num_groups ==
    num_topk_groups``)."""

    num_experts: int
    num_topk: int
    num_groups: int
    num_topk_groups: int
    num_shared: int
    num_replicas: int  # columns of the physical map (1 without a map)
    scoring: str
    flavor: str
    has_mask: bool = False
    has_fixed: bool = False
    has_unmapped: bool = False
    has_map: bool = False

    @property
    def grouped(self) -> bool:
        return self.num_groups != self.num_topk_groups

    @property
    def num_physical_topk(self) -> int:
        return self.num_topk + self.num_shared

    @property
    def num_logical(self) -> int:
        return self.num_experts + self.num_shared

    @property
    def block_m(self) -> int:
        """Tokens per work tile (logits/scores, keys, index pairs, weights, logical pairs, class,
        row max, group scores and ranks, NaN flags)."""
        E, K, P, G = self.num_experts, self.num_topk, self.num_physical_topk, max(self.num_groups, 1)
        return tile_rows(row_bytes(E, E, 2 * P, P, 2 * K, 1, 1, G, G, 1))


@kernel
def build_top2_sum_gate(spec: Top2GateSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    E, K, P, L, DUP = spec.num_experts, spec.num_topk, spec.num_physical_topk, spec.num_logical, spec.num_replicas
    G, KG = max(spec.num_groups, 1), spec.num_topk_groups
    PG = E // G
    BM = kernel_rows(spec.block_m, target)
    flavor = get_flavor(spec.flavor)
    check = flavor.gate_quotient_check
    M = TK.dynamic("M")
    un_stride = TK.dynamic("un_stride")

    def rows_or_one(present: bool):
        # Absent optional inputs are one-element placeholders.
        return M if present else 1

    def score_of(x, row_max):
        """The unbiased score of logit ``x`` (softmax: the numerator ``exp(x - max)``)."""
        if spec.scoring == "sigmoid":
            return quotient(f32_const(1.0), f32_const(1.0) + exp(-x), check)
        if spec.scoring == "sqrtsoftplus":
            return sqrt_softplus_forward(x, flavor)
        return exp(x - row_max)

    @T.macro
    def body(LOGITS, BIAS, MASK, FIXMASK, UNMAPPED, MAP, COUNT, IDX, W, STATUS, row_base, ep_rank, scale, per_rank,
             num_tp_ranks, tp_rank):
        with sh.persistent_kernel() as worker:
            bias_t = sh.tile((padded(E),), "float32")
            count_t = sh.tile((padded(L),), "int32")
            map_t = sh.tile((padded(L * DUP),), "int32")
            sh.copy(BIAS[0], bias_t)
            if spec.has_map:
                sh.copy(COUNT[0], count_t)
                sh.copy(MAP[0], map_t)
            for tm in sh.tiles([T.ceildiv(M, BM)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * BM
                x = sh.tile((BM, padded(E)), "float32")
                key = sh.tile((BM, padded(E)), "float32")
                oi = sh.tile((BM, padded(2 * P)), "int32")
                ow = sh.tile((BM, padded(P)), "float32")
                un = sh.tile((BM, padded(2 * K)), "int32")
                cls = sh.tile((BM,), "int32")
                row_max = sh.tile((BM,), "float32")
                group_score = sh.tile((BM, padded(G)), "float32")
                rank = sh.tile((BM, padded(G)), "int32")
                nan_group = sh.tile((BM,), "int32")
                sh.buffer_versions({x: 2, key: 2, oi: 2, ow: 2, un: 2})
                sh.copy(LOGITS[row0, 0], x)
                if spec.has_fixed:
                    sh.copy(UNMAPPED[row0, 0], un)
                with sh.vector(SIMT):
                    # Token classes (and softmax's row maximum), one lane per token. Rows past the token
                    # count hold stale data: inactive, never flagged.
                    for i in T.Parallel(BM):
                        row = T.alloc_var("int32")
                        active = T.alloc_var("int32")
                        fixed = T.alloc_var("int32")
                        row = T.min(row0 + i, M - 1)
                        active = T.Cast("int32", row0 + i < M)
                        if spec.has_mask:
                            active = active * T.Cast("int32", MASK[row] != 0)
                        fixed = 0
                        if spec.has_fixed:
                            fixed = active * T.Cast("int32", FIXMASK[row] != 0)
                        cls[i] = active * ACTIVE + fixed * FIXED
                        if spec.scoring == "softmax":
                            m = T.alloc_var("float32")
                            m = neg_inf()
                            for e in T.serial(E):
                                # A select: the Ascend SIMT API has no float max.
                                m = T.Select(x[i, e] > m, x[i, e], m)
                            row_max[i] = m

                    # Scores and ranking keys, one lane per (token, expert); routed rows are inspected.
                    for i, e in T.Parallel(BM, E):
                        u = T.alloc_var("float32")
                        if row0 + i < M:
                            if cls[i] & ACTIVE != 0:
                                if is_nonfinite(x[i, e]):
                                    STATUS[STATUS_NONFINITE] = 1
                            u = score_of(x[i, e], row_max[i])
                            if spec.scoring == "softmax":
                                key[i, e] = x[i, e] + bias_t[e]
                            else:
                                key[i, e] = u + bias_t[e]
                            # The keys rank the normally routed tokens: an infinite bias, or a softmax
                            # logit + bias past the fp32 range, has no place in the order.
                            if cls[i] == ACTIVE:
                                if is_nonfinite(key[i, e]):
                                    STATUS[STATUS_NONFINITE] = 1
                            x[i, e] = T.Select(cls[i] & ACTIVE != 0, u, f32_const(0.0))

                    # Softmax's quotients, groups, selection, weights, replicas and EP/TP masking, one
                    # lane per token.
                    for i in T.Parallel(BM):
                        row = T.alloc_var("int32")
                        active = T.alloc_var("int32")
                        fixed = T.alloc_var("int32")
                        d = T.alloc_var("float32")
                        q = T.alloc_var("float32")
                        count = T.alloc_var("int32")
                        replica = T.alloc_var("int32")
                        last_value = LaneVar(False, "float32", pos_inf())
                        last_column = LaneVar(False, "int32", -1)
                        row = T.min(row0 + i, M - 1)
                        active = T.Cast("int32", cls[i] & ACTIVE != 0)
                        fixed = T.Cast("int32", cls[i] & FIXED != 0)
                        sel = T.alloc_local((K,), "int32")
                        weight = T.alloc_local((K,), "float32")
                        if row0 + i < M:
                            if spec.scoring == "softmax":
                                # The numerators summed in ascending expert order (at least 1: the
                                # largest is exp(0)), then one correctly rounded division each.
                                if active > 0:
                                    s = T.alloc_var("float32")
                                    s = f32_const(0.0)
                                    for e in T.serial(E):
                                        s = s + x[i, e]
                                    for e in T.serial(E):
                                        x[i, e] = quotient(x[i, e], s, check)

                            # Selection.
                            if fixed > 0:
                                for j in T.serial(K):
                                    if un[i, 2 * j + 1] != 0 or un[i, 2 * j] < 0 or un[i, 2 * j] > E - 1:
                                        STATUS[STATUS_BAD_INDEX] = 1
                                    sel[j] = clamp(un[i, 2 * j], 0, E - 1)
                            else:
                                if spec.grouped:
                                    # Group scores (top-2 sums of the keys) and their stable ranks; the
                                    # experts of the groups ranked num_topk_groups or later drop out.
                                    score_groups(key, group_score, nan_group, RowAt(i), G, PG, GROUP_TOPK_SUM)
                                    rank_groups(group_score, rank, RowAt(i), G)
                                    for e in T.serial(E):
                                        if rank[i, e // PG] >= KG:
                                            key[i, e] = neg_inf()
                                for j in T.serial(K):
                                    next_in_rank(RowAt(i), key, E, last_value, last_column)
                                    sel[j] = last_column.get()

                            # Weights: unbiased scores over 1e-20 + their sum in slot order, then the
                            # scaling factor.
                            d = ordered_sum([f32_const(DENOM_EPS)] + [x[i, clamp(sel[slot], 0, E - 1)]
                                                                      for slot in range(K)], "sequential")
                            for j in T.serial(K):
                                q = quotient(x[i, clamp(sel[j], 0, E - 1)], d, check)
                                weight[j] = T.Select(active > 0, q * scale, f32_const(0.0))
                                un[i, 2 * j] = T.Select(active > 0, sel[j], -1)
                                un[i, 2 * j + 1] = T.Select(active > 0, 0, -1)

                            # Each output slot written once: the physical id (replica ``(ep_rank + token *
                            # 23333) mod count`` without int32 overflow), EP/TP-masked, or -1 pairs for
                            # masked tokens; routed weights, 1.0 for shared slots.
                            for j in T.serial(P):
                                # One variable per step: TileLang's common-subexpression elimination
                                # may reuse a load of a variable across a later store to it.
                                logical = T.alloc_var("int32")
                                physical = T.alloc_var("int32")
                                block = T.alloc_var("int32")
                                rest = T.alloc_var("int32")
                                local = T.alloc_var("int32")
                                logical = T.Select(j < K, sel[T.min(j, K - 1)], E + j - K)
                                slot_weight = T.alloc_var("float32")
                                slot_weight = T.Select(j < K, weight[T.min(j, K - 1)],
                                                       T.Select(active > 0, f32_const(1.0), f32_const(0.0)))
                                physical = logical
                                if spec.has_map:
                                    count = count_t[clamp(logical, 0, L - 1)]
                                    if active > 0 and (count < 1 or count > DUP):
                                        STATUS[STATUS_BAD_COUNT] = 1
                                    replica = 0
                                    if DUP > 1:
                                        c = clamp(count, 1, DUP)
                                        replica = T.truncmod(T.truncmod(ep_rank, c) + T.truncmod(row_base + row, c)
                                                             * T.truncmod(REPLICA_STRIDE, c), c)
                                    physical = map_t[clamp(logical * DUP + replica, 0, L * DUP - 1)]
                                    if active > 0 and physical < 0:
                                        STATUS[STATUS_BAD_COUNT] = 1
                                # EP/TP masking: the id's EP block ``id / per_rank`` is kept when it
                                # belongs to tp_rank, renumbered to the rank's local experts; every
                                # intermediate lies in [0, id].
                                block = T.truncdiv(T.max(physical, 0), per_rank)
                                rest = T.max(physical, 0) - block * per_rank
                                local = T.Select(T.truncmod(block, num_tp_ranks) == tp_rank,
                                                 T.truncdiv(block, num_tp_ranks) * per_rank + rest, -1)
                                ow[i, j] = slot_weight
                                oi[i, 2 * j] = T.Select(active > 0, local, -1)
                                oi[i, 2 * j + 1] = T.Select(T.And(active > 0, local >= 0), 0, -1)
                sh.copy(oi, IDX[row0, 0])
                sh.copy(ow, W[row0, 0])
                if spec.has_unmapped:
                    sh.copy(un, UNMAPPED[row0, 0])

    @TK.prim_func
    def top2_sum_gate_kernel(
        LOGITS: TK.Tensor((M, E), "float32"),
        BIAS: TK.Tensor((E,), "float32"),
        MASK: TK.Tensor((rows_or_one(spec.has_mask),), "uint8"),
        FIXMASK: TK.Tensor((rows_or_one(spec.has_fixed),), "uint8"),
        UNMAPPED: TK.StridedTensor((rows_or_one(spec.has_unmapped), 2 * K), (un_stride, 1), "int32"),
        MAP: TK.Tensor((L * DUP if spec.has_map else 1,), "int32"),
        COUNT: TK.Tensor((L if spec.has_map else 1,), "int32"),
        IDX: TK.Tensor((M, 2 * P), "int32"),
        W: TK.Tensor((M, P), "float32"),
        STATUS: TK.Tensor((STATUS_WORDS,), "int32"),
        un_stride: TK.int32,
        row_base: TK.int32,
        ep_rank: TK.int32,
        scale: TK.float32,
        per_rank: TK.int32,
        num_tp_ranks: TK.int32,
        tp_rank: TK.int32,
    ):
        body(LOGITS, BIAS, MASK, FIXMASK, UNMAPPED, MAP, COUNT, IDX, W, STATUS, row_base, ep_rank, scale, per_rank,
             num_tp_ranks, tp_rank)

    return top2_sum_gate_kernel


def _bytes(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.view(torch.uint8)


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_moe.ops.top2_sum_gate.Top2GateCall``) on ``target``."""
    spec = call.spec
    device = call.logits.device
    zeros = {dtype: torch.zeros(1, dtype=dtype, device=device) for dtype in (torch.uint8, torch.int32)}
    no_unmapped = torch.zeros(1, 2 * spec.num_topk, dtype=torch.int32, device=device)
    idx = call.topk_idx.view(torch.int32)
    unmapped = None if call.unmapped is None else call.unmapped.view(torch.int32)
    flat_map = None if call.to_physical_map is None else call.to_physical_map.view(-1)
    mask, fixed = _bytes(call.mask), _bytes(call.fix_routing_mask)

    def rows_of(t, lo, hi, placeholder):
        return placeholder if t is None else t[lo:hi]

    def run(kernel, start: int, stop: int) -> None:
        for lo, hi in row_chunks(start, stop, spec.num_experts):
            un = rows_of(unmapped, lo, hi, no_unmapped)
            kernel(call.logits[lo:hi], call.bias, rows_of(mask, lo, hi, zeros[torch.uint8]),
                   rows_of(fixed, lo, hi, zeros[torch.uint8]), un,
                   flat_map if flat_map is not None else zeros[torch.int32],
                   call.logical_count if call.logical_count is not None else zeros[torch.int32],
                   idx[lo:hi], call.topk_weights[lo:hi], call.status, un.stride(0), lo, call.ep_rank,
                   call.routed_scaling_factor, call.per_rank, call.num_tp_ranks, call.tp_rank)

    build_top2_sum_gate.launch_rows(spec, target, call.logits.shape[0], run, align=spec.block_m)
