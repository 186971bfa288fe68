"""``moe_topk_gate_forward`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

The replica counts, the physical map and the bias rows are loaded once per worker.
Work tiles of ``block_m`` tokens go round-robin to persistent workers; per tile:

1. DMA the logit rows (and, with fixed routing, the given expert pairs) on chip;
2. one lane per token: its class (masked > force-random > fixed > normal);
3. one lane per (token, expert): scores ``u = sqrt(softplus(logit))`` (flavor's
   formula), ranking keys ``u + bias`` (image bias for image tokens), a flag for
   non-finite logits of routed tokens;
4. one lane per token:

   * selection: ``K`` strict-``>`` scans over the keys, each taking the largest key
     ranked after the previous pick (descending, lowest expert among equals), or the
     fixed experts;
   * weights: ``D = sum(u_sel) + 1e-20`` in the flavor's order, ``fl(fl(u / D) * s)``
     (quotient checked in the ascend flavor), shared slots ``E + j`` with weight 1;
   * replica choice ``(ep_rank + t * 23333) mod count``, computed without overflow;
   * force-random tokens: hash-drawn weights and draws, made distinct by the
     collision-removal rounds; masked tokens: -1 and +0.0 everywhere;

5. DMA indices (int32 pairs), weights, logical indices and scores out.

Steps 3 and 4 skip the tile's rows past the token count: a decode call computes its tokens, not
a whole tile (the copies out stop at the token count).

The vector region is SIMT on Ascend: per-lane serial scans, integer hashing, data
dependent gathers and branches, none of which TileLang 0.1.15's SIMD lowering of
``T.Parallel`` accepts. Within a token's lane, stores go only to that token's row at
loop-indexed columns, so the only barriers are between the three passes. The token
count and the logical-index row stride are runtime
values; everything that changes the body (sizes, options, flavor) is in the spec.
"""


from dataclasses import dataclass

import torch

from vmi_core.kernel import kernel
from vmi_core.targets import get_flavor
from vmi_core.tl import formats as F
from vmi_core.tl.formats import f32_const
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMT, Shell
from vmi_core.tl.simd import LaneVar
from vmi_core.tl.stochastic import sr_mix, sr_word
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
    next_in_rank,
    ordered_sum,
    padded,
    pos_inf,
    quotient,
    row_bytes,
    row_chunks,
    tile_rows,
)

# The replica-choice multiplier of the token index.
REPLICA_STRIDE = 23333
# The fourth hash word of force-random draws: non-zero, so token 0 / lane 0 / rank 0 is not the all-zero hash.
RANDOM_TAG = 0x9E3779B9
_INT32_MAX = 2**31 - 1
# Token class bits.
ACTIVE, FORCED, FIXED, IMAGE = 1, 2, 4, 8


def is_routed(cls):
    """Active and not force-random: the token's scores are computed and ranked."""
    return cls & (ACTIVE | FORCED) == ACTIVE


@dataclass(frozen=True)
class GateSpec:
    """Everything a gate kernel is specialised on (the token count is a runtime value)."""

    num_experts: int
    num_topk: int
    num_shared: int
    num_replicas: int  # columns of the physical map (1 without a map)
    flavor: str
    has_mask: bool = False
    has_bias: bool = False
    has_image: bool = False
    has_fixed: bool = False
    has_unmapped: bool = False
    has_map: bool = False
    has_force_random: bool = False
    has_scores: bool = False

    @property
    def num_physical_topk(self) -> int:
        return self.num_topk + self.num_shared

    @property
    def num_logical(self) -> int:
        return self.num_experts + self.num_shared

    @property
    def block_m(self) -> int:
        """Tokens per work tile (logits/scores, keys, index pairs, weights, logical pairs,
        class)."""
        E, K, P = self.num_experts, self.num_topk, self.num_physical_topk
        return tile_rows(row_bytes(E, E, 2 * P, P, 2 * K, 1))


@kernel
def build_moe_topk_gate(spec: GateSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    E, K, P, L, DUP = spec.num_experts, spec.num_topk, spec.num_physical_topk, spec.num_logical, spec.num_replicas
    BM = kernel_rows(spec.block_m, target)
    flavor = get_flavor(spec.flavor)
    M = TK.dynamic("M")
    un_stride = TK.dynamic("un_stride")

    def rows_or_one(present: bool):
        # Absent optional inputs are one-element placeholders.
        return M if present else 1

    @T.macro
    def draw_random(draw, taken, rw, token, ep_rank, num_physical):
        """Force-random: P distinct physical experts in [0, num_physical) and weights in (0, 1].

        Lane ``l`` hashes (ep_rank, token, l, RANDOM_TAG): word 0 gives the weight
        ``((r0 >> 8) + 1) * 2^-24``, word 1 the draw ``r1 mod (num_physical - l)``. Then P
        rounds: the smallest unresolved draw (lowest lane among equals) resolves, and every
        unresolved later lane whose draw is not below it steps up by one.
        """
        h = T.alloc_var("uint32")
        m = T.alloc_var("int32")
        winner = T.alloc_var("int32")
        for lane in T.serial(P):
            h = sr_mix(T.Cast("uint32", ep_rank), T.Cast("uint32", token), T.Cast("uint32", lane),
                       F.u32(RANDOM_TAG), F.u32(0))
            rw[lane] = T.Cast("float32", T.Cast("int32", (sr_word(h, 0) >> F.u32(8)) + F.u32(1))) \
                * f32_const(2.0**-24)
            draw[lane] = T.Cast("int32", T.truncmod(sr_word(h, 1), T.Cast("uint32", num_physical - lane)))
            taken[lane] = 0
        for _ in T.serial(P):
            m = _INT32_MAX
            winner = 0
            for lane in T.serial(P):
                if taken[lane] == 0 and draw[lane] < m:
                    m = draw[lane]
                    winner = lane
            for lane in T.serial(P):
                if lane == winner:
                    taken[lane] = 1
                elif lane > winner and taken[lane] == 0 and draw[lane] >= m:
                    draw[lane] = draw[lane] + 1

    @T.macro
    def body(LOGITS, MASK, BIAS, IBIAS, IMASK, FIXMASK, UNMAPPED, MAP, COUNT, FORCE, IDX, W, SCORES, STATUS,
             row_base, ep_rank, scale):
        with sh.persistent_kernel() as worker:
            bias_t = sh.tile((padded(E),), "float32")
            ibias_t = sh.tile((padded(E),), "float32")
            count_t = sh.tile((padded(L),), "int32")
            map_t = sh.tile((padded(L * DUP),), "int32")
            if spec.has_bias:
                sh.copy(BIAS[0], bias_t)
            if spec.has_image:
                sh.copy(IBIAS[0], ibias_t)
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
                sh.buffer_versions({x: 2, key: 2, oi: 2, ow: 2, un: 2})
                sh.copy(LOGITS[row0, 0], x)
                if spec.has_fixed:
                    sh.copy(UNMAPPED[row0, 0], un)
                with sh.vector(SIMT):
                    # Token classes, one lane per token. Rows past the token count hold
                    # stale data: inactive, never flagged.
                    for i in T.Parallel(BM):
                        row = T.alloc_var("int32")
                        active = T.alloc_var("int32")
                        forced = T.alloc_var("int32")
                        fixed = T.alloc_var("int32")
                        row = T.min(row0 + i, M - 1)
                        active = T.Cast("int32", row0 + i < M)
                        if spec.has_mask:
                            active = active * T.Cast("int32", MASK[row] != 0)
                        forced = 0
                        if spec.has_force_random:
                            forced = active * T.Cast("int32", FORCE[row] != 0)
                        fixed = 0
                        if spec.has_fixed:
                            fixed = active * (1 - forced) * T.Cast("int32", FIXMASK[row] != 0)
                        image = T.alloc_var("int32")
                        image = 0
                        if spec.has_image:
                            image = T.Cast("int32", IMASK[row] != 0)
                        # One store per lane: a read-modify-write here would need a barrier.
                        cls[i] = active * ACTIVE + forced * FORCED + fixed * FIXED + image * IMAGE

                    # Scores and ranking keys, one lane per (token, expert); only routed rows are inspected.
                    # Rows past the token count are skipped (a decode call scores its tokens, not the tile).
                    for i, e in T.Parallel(BM, E):
                        u = T.alloc_var("float32")
                        if row0 + i < M:
                            if is_routed(cls[i]):
                                if is_nonfinite(x[i, e]):
                                    STATUS[STATUS_NONFINITE] = 1
                            u = sqrt_softplus_forward(x[i, e], flavor)
                            u = T.Select(is_routed(cls[i]), u, f32_const(0.0))
                            x[i, e] = u
                            if spec.has_image and spec.has_bias:
                                key[i, e] = u + T.Select(cls[i] & IMAGE != 0, ibias_t[e], bias_t[e])
                            elif spec.has_image:
                                key[i, e] = u + T.Select(cls[i] & IMAGE != 0, ibias_t[e], f32_const(0.0))
                            elif spec.has_bias:
                                key[i, e] = u + bias_t[e]
                            else:
                                key[i, e] = u

                    # Selection, weights, replicas and random routing, one lane per token.
                    for i in T.Parallel(BM):
                        row = T.alloc_var("int32")
                        active = T.alloc_var("int32")
                        forced = T.alloc_var("int32")
                        fixed = T.alloc_var("int32")
                        routed = T.alloc_var("int32")
                        d = T.alloc_var("float32")
                        q = T.alloc_var("float32")
                        count = T.alloc_var("int32")
                        replica = T.alloc_var("int32")
                        num_physical = T.alloc_var("int32")
                        last_value = LaneVar(False, "float32", pos_inf())
                        last_column = LaneVar(False, "int32", -1)
                        row = T.min(row0 + i, M - 1)
                        active = T.Cast("int32", cls[i] & ACTIVE != 0)
                        forced = T.Cast("int32", cls[i] & FORCED != 0)
                        fixed = T.Cast("int32", cls[i] & FIXED != 0)
                        routed = T.Cast("int32", is_routed(cls[i]))

                        # Per-lane arrays: the logical routed experts and their weights.
                        sel = T.alloc_local((K,), "int32")
                        weight = T.alloc_local((K,), "float32")
                        if spec.has_force_random:
                            # Per-lane arrays, drawn for every token (no branch on the class) and
                            # used by force-random ones.
                            draw = T.alloc_local((P,), "int32")
                            taken = T.alloc_local((P,), "int32")
                            rw = T.alloc_local((P,), "float32")

                        # Rows past the token count are skipped (a decode call selects for its tokens,
                        # not the tile): their rows of the output tiles are never copied out.
                        if row0 + i < M:
                            # Selection.
                            if fixed > 0:
                                for j in T.serial(K):
                                    if un[i, 2 * j + 1] != 0 or un[i, 2 * j] < 0 or un[i, 2 * j] > E - 1:
                                        STATUS[STATUS_BAD_INDEX] = 1
                                    sel[j] = clamp(un[i, 2 * j], 0, E - 1)
                            else:
                                for j in T.serial(K):
                                    next_in_rank(RowAt(i), key, E, last_value, last_column)
                                    sel[j] = last_column.get()

                            # Weights: unbiased scores over their sum, then the scaling factor.
                            d = ordered_sum([x[i, clamp(sel[slot], 0, E - 1)] for slot in range(K)],
                                            flavor.gate_sum_order) + f32_const(DENOM_EPS)
                            for j in T.serial(K):
                                q = quotient(x[i, clamp(sel[j], 0, E - 1)], d, flavor.gate_quotient_check)
                                weight[j] = T.Select(routed > 0, q * scale, f32_const(0.0))
                                un[i, 2 * j] = T.Select(routed > 0, sel[j], -1)
                                un[i, 2 * j + 1] = T.Select(routed > 0, 0, -1)

                            if spec.has_force_random:
                                num_physical = L
                                if spec.has_map:
                                    num_physical = 0
                                    for e in T.serial(L):
                                        num_physical = num_physical + count_t[e]
                                if forced > 0 and num_physical < P:
                                    STATUS[STATUS_BAD_COUNT] = 1
                                draw_random(draw, taken, rw, row_base + row, ep_rank, T.max(num_physical, P))

                            # Each output slot written once: physical ids (replica ``(ep_rank + token * 23333)
                            # mod count`` without int32 overflow), or the random draws, or -1 pairs for
                            # masked tokens; routed weights, 1.0 for shared slots, or the random weights.
                            for j in T.serial(P):
                                logical = T.alloc_var("int32")
                                logical = T.Select(j < K, sel[T.min(j, K - 1)], E + j - K)
                                slot_weight = T.alloc_var("float32")
                                slot_weight = T.Select(j < K, weight[T.min(j, K - 1)],
                                                       T.Select(routed > 0, f32_const(1.0), f32_const(0.0)))
                                if spec.has_map:
                                    count = count_t[clamp(logical, 0, L - 1)]
                                    if routed > 0 and (count < 1 or count > DUP):
                                        STATUS[STATUS_BAD_COUNT] = 1
                                    count = clamp(count, 1, DUP)
                                    replica = 0
                                    if DUP > 1:
                                        replica = T.truncmod(T.truncmod(ep_rank, count)
                                                             + T.truncmod(row_base + row, count)
                                                             * T.truncmod(REPLICA_STRIDE, count), count)
                                    logical = map_t[clamp(logical * DUP + replica, 0, L * DUP - 1)]
                                if spec.has_force_random:
                                    logical = T.Select(forced > 0, draw[j], logical)
                                    slot_weight = T.Select(forced > 0, rw[j], slot_weight)
                                ow[i, j] = slot_weight
                                oi[i, 2 * j] = T.Select(active > 0, logical, -1)
                                oi[i, 2 * j + 1] = T.Select(active > 0, 0, -1)
                sh.copy(oi, IDX[row0, 0])
                sh.copy(ow, W[row0, 0])
                if spec.has_unmapped:
                    sh.copy(un, UNMAPPED[row0, 0])
                if spec.has_scores:
                    sh.copy(x, SCORES[row0, 0])

    @TK.prim_func
    def moe_topk_gate_kernel(
        LOGITS: TK.Tensor((M, E), "float32"),
        MASK: TK.Tensor((rows_or_one(spec.has_mask),), "uint8"),
        BIAS: TK.Tensor((E if spec.has_bias else 1,), "float32"),
        IBIAS: TK.Tensor((E if spec.has_image else 1,), "float32"),
        IMASK: TK.Tensor((rows_or_one(spec.has_image),), "uint8"),
        FIXMASK: TK.Tensor((rows_or_one(spec.has_fixed),), "uint8"),
        UNMAPPED: TK.StridedTensor((rows_or_one(spec.has_unmapped), 2 * K), (un_stride, 1), "int32"),
        MAP: TK.Tensor((L * DUP if spec.has_map else 1,), "int32"),
        COUNT: TK.Tensor((L if spec.has_map else 1,), "int32"),
        FORCE: TK.Tensor((rows_or_one(spec.has_force_random),), "uint8"),
        IDX: TK.Tensor((M, 2 * P), "int32"),
        W: TK.Tensor((M, P), "float32"),
        SCORES: TK.Tensor((rows_or_one(spec.has_scores), E), "float32"),
        STATUS: TK.Tensor((STATUS_WORDS,), "int32"),
        un_stride: TK.int32,
        row_base: TK.int32,
        ep_rank: TK.int32,
        scale: TK.float32,
    ):
        body(LOGITS, MASK, BIAS, IBIAS, IMASK, FIXMASK, UNMAPPED, MAP, COUNT, FORCE, IDX, W, SCORES, STATUS,
             row_base, ep_rank, scale)

    return moe_topk_gate_kernel


def _bytes(t: torch.Tensor | None, rows: slice | None = None) -> torch.Tensor | None:
    if t is None:
        return None
    t = t.view(torch.uint8)
    return t if rows is None else t[rows]


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_moe.moe_topk_gate.GateCall``) on ``target``."""
    spec = call.spec
    device = call.logits.device
    zeros = {dtype: torch.zeros(1, dtype=dtype, device=device) for dtype in (torch.uint8, torch.float32, torch.int32)}
    no_unmapped = torch.zeros(1, 2 * spec.num_topk, dtype=torch.int32, device=device)
    no_scores = torch.zeros(1, spec.num_experts, dtype=torch.float32, device=device)
    idx = call.topk_idx.view(torch.int32)
    unmapped = None if call.unmapped is None else call.unmapped.view(torch.int32)
    flat_map = None if call.to_physical_map is None else call.to_physical_map.view(-1)

    def rows_of(t, lo, hi, placeholder):
        return placeholder if t is None else t[lo:hi]

    def run(kernel, start: int, stop: int) -> None:
        for lo, hi in row_chunks(start, stop, spec.num_experts):
            un = rows_of(unmapped, lo, hi, no_unmapped)
            kernel(call.logits[lo:hi], rows_of(_bytes(call.mask), lo, hi, zeros[torch.uint8]),
                   call.bias if call.bias is not None else zeros[torch.float32],
                   call.image_bias if call.image_bias is not None else zeros[torch.float32],
                   rows_of(_bytes(call.image_token_mask), lo, hi, zeros[torch.uint8]),
                   rows_of(_bytes(call.fix_routing_mask), lo, hi, zeros[torch.uint8]),
                   un, flat_map if flat_map is not None else zeros[torch.int32],
                   call.logical_count if call.logical_count is not None else zeros[torch.int32],
                   rows_of(_bytes(call.force_random), lo, hi, zeros[torch.uint8]),
                   idx[lo:hi], call.topk_weights[lo:hi], rows_of(call.scores, lo, hi, no_scores), call.status,
                   un.stride(0), lo, call.ep_rank, call.routed_scaling_factor)

    build_moe_topk_gate.launch_rows(spec, target, call.logits.shape[0], run, align=spec.block_m)
