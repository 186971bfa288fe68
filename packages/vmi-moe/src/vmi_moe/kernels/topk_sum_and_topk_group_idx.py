"""``topk_sum_and_topk_group_idx`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

Work tiles of ``block_m`` tokens go round-robin to persistent workers. Per tile:

1. DMA the score rows (``G`` groups of ``P`` experts) into an on-chip tile;
2. one lane per token, per group: one pass keeps the two largest scores (a score replaces the
   first only if strictly larger, so equal maxima are both kept: ``[5, 5, 1]`` gives 5 and 5); the
   group's score is the largest, or the sum of the two; NaN scores and NaN group scores (``inf +
   -inf``) are flagged;
3. per group, its rank: the groups with a larger score, or an equal one and a lower index;
4. per output slot ``r``: the group of rank ``r`` (a select over the groups: no lane writes at a
   column of its own), DMA'd out as int32 pairs (high words 0).

On Ascend steps 2–4 run as explicit vector code, one token per lane (``Shell.rowwise``: columns
gathered from UB and scattered back), and a SIMT region writes the status word for flagged
tokens. The token count is a runtime value: one compiled kernel per ``(G, P, S, K)``.
"""


from dataclasses import dataclass

import torch

from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LANES, LaneVar, cast, keep, select

from .common import (
    STATUS_NONFINITE,
    STATUS_WORDS,
    is_nan,
    kernel_rows,
    neg_inf,
    padded,
    raise_flagged_rows,
    row_bytes,
    row_chunks,
    tile_rows,
)


@dataclass(frozen=True)
class TopkGroupSpec:
    """Everything a topk_sum_and_topk_group_idx kernel is specialised on."""

    num_groups: int
    experts_per_group: int
    num_topk_sum: int
    num_topk_groups: int

    @property
    def block_m(self) -> int:
        """Tokens per work tile (score rows, group scores, ranks and index pairs)."""
        G = self.num_groups
        return tile_rows(row_bytes(G * self.experts_per_group, G, G, 2 * self.num_topk_groups))


def score_groups(key, group_score, bad, at, num_groups: int, group_size: int, num_topk_sum: int):
    """``group_score[row, g]`` = the largest of ``key[row, g*P : (g+1)*P]`` (``num_topk_sum = 1``) or
    the sum of its two largest (``2``), for the row at ``at`` (lane-generic: ``Shell.rowwise`` or a
    scalar ``RowAt``); ``bad[row]`` = 1 where a key or a group score is NaN, else 0.

    One pass per group keeps the two largest: a key replaces the first only if strictly larger, so
    equal maxima are both kept (``[5, 5, 1]`` sums to 10). Shared by ``top2_sum_gate``'s kernel.
    """
    G, P = num_groups, group_size
    nan = LaneVar(at.vector, "int32", 0)
    first = LaneVar(at.vector, "float32", neg_inf())
    second = LaneVar(at.vector, "float32", neg_inf())
    with T.serial(G) as g:
        first.set(neg_inf())
        second.set(neg_inf())
        with T.serial(P) as j:
            s = keep(at.load(key, g * P + j))
            nan.set(nan.get() | cast(F.flag(is_nan(s)), "int32"))
            above_first = keep(s > first.get())
            second.set(select(above_first, first.get(), select(s > second.get(), s, second.get())))
            first.set(select(above_first, s, first.get()))
        score = keep(first.get() if num_topk_sum == 1 else first.get() + second.get())
        nan.set(nan.get() | cast(F.flag(is_nan(score)), "int32"))
        at.store(group_score, g, score)
    at.store_row_value(bad, nan.get())


def rank_groups(group_score, rank, at, num_groups: int):
    """``rank[row, g]`` = the number of groups ahead of group ``g`` of the row at ``at``: a larger score,
    or an equal one at a lower index (lane-generic). Shared by ``top2_sum_gate``'s kernel."""
    G = num_groups
    count = LaneVar(at.vector, "int32", 0)
    with T.serial(G) as g:
        mine = keep(at.load(group_score, g))
        count.set(0)
        with T.serial(G) as i:
            other = keep(at.load(group_score, i))
            # Ahead: a larger score, or an equal one at a lower index (a condition on the loop only).
            equal_ahead = cast(F.flag(other == mine), "int32") * T.Cast("int32", i < g)
            count.set(count.get() + cast(F.flag(other > mine), "int32") + equal_ahead)
        at.store(rank, g, count.get())


@kernel(simd_parallel=False)
def build_topk_sum_and_topk_group_idx(spec: TopkGroupSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    G, P, KG = spec.num_groups, spec.experts_per_group, spec.num_topk_groups
    E = G * P
    BM = kernel_rows(spec.block_m, target)
    M = TK.dynamic("M")

    # Three passes over the rows: each reads what the one before stored (a barrier between them).
    def pick_groups(rank, idx, at):
        pick = LaneVar(at.vector, "int32", 0)
        with T.serial(KG) as r:
            pick.set(0)
            with T.serial(G) as g:
                pick.set(pick.get() + select(at.load(rank, g) == r, g, 0))
            at.store(idx, 2 * r, pick.get())
            at.store(idx, 2 * r + 1, 0)

    @T.macro
    def rank_rows(key, group_score, rank, idx, bad, valid):
        sh.rowwise(BM, lambda at: score_groups(key, group_score, bad, at, G, P, spec.num_topk_sum), valid)
        sh.rowwise(BM, lambda at: rank_groups(group_score, rank, at, G), valid)
        sh.rowwise(BM, lambda at: pick_groups(rank, idx, at), valid)

    @TK.prim_func
    def topk_sum_and_topk_group_idx_kernel(SCORES: TK.Tensor((M, E), "float32"),
                                           IDX: TK.Tensor((M, 2 * KG), "int32"),
                                           STATUS: TK.Tensor((STATUS_WORDS,), "int32")):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, BM)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * BM
                key = sh.tile((BM, padded(E)), "float32")
                group_score = sh.tile((BM, padded(G)), "float32")
                rank = sh.tile((BM, padded(G)), "int32")
                idx = sh.tile((BM, padded(2 * KG)), "int32")
                bad = sh.tile((max(BM, LANES),), "int32")
                sh.buffer_versions({key: 2, idx: 2})
                sh.copy(SCORES[row0, 0], key)
                with sh.vector(SIMD):
                    rank_rows(key, group_score, rank, idx, bad, M - row0)
                raise_flagged_rows(sh, bad, BM, M - row0, STATUS, STATUS_NONFINITE)
                sh.copy(idx, IDX[row0, 0])

    return topk_sum_and_topk_group_idx_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_moe.ops.topk_sum_and_topk_group_idx.TopkGroupCall``) on ``target``."""
    spec = call.spec
    scores = call.scores.view(call.scores.shape[0], -1)
    idx = call.topk_group_idx.view(torch.int32)

    def run(kernel, start: int, stop: int) -> None:
        for lo, hi in row_chunks(start, stop, scores.shape[1]):
            kernel(scores[lo:hi], idx[lo:hi], call.status)

    build_topk_sum_and_topk_group_idx.launch_rows(spec, target, scores.shape[0], run, align=spec.block_m)
