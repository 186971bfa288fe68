"""``topk_gate`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

Work tiles of ``block_m`` tokens go round-robin to persistent workers. Per tile:

1. DMA the score rows into an on-chip tile;
2. one lane per token: flag non-finite scores, then pick the row's ``K`` largest in rank
   order (descending, the lowest expert among equals); the row is only read. Where a lane
   is a loop iteration (cpu, cuda), one pass keeps a running top-``K`` list that an entry
   enters only by beating its last strictly, and rows past the token count are skipped (a
   decode call ranks its tokens, not a whole tile); vector lanes (Ascend) make ``K``
   strict-``>`` scans, each taking the largest score ranked after the previous pick. Both
   pick the same experts for finite scores; a row with another score raises;
3. DMA the indices out as int32 pairs (high words 0).

On Ascend step 2 runs as explicit vector code, one token per lane (``Shell.rowwise``:
columns gathered from UB, the picks scattered), and a SIMT region writes the status word
for flagged tokens. The token count is a runtime value: one compiled kernel per ``(E, K)``.
"""


from dataclasses import dataclass

import torch

from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LANES, LaneVar, cast

from .common import (
    STATUS_NONFINITE,
    STATUS_WORDS,
    is_nonfinite,
    kernel_rows,
    next_in_rank,
    padded,
    pos_inf,
    raise_flagged_rows,
    row_bytes,
    row_chunks,
    running_top_k,
    tile_rows,
)


@dataclass(frozen=True)
class TopkGateSpec:
    """Everything a topk_gate kernel is specialised on."""

    num_experts: int
    num_topk: int

    @property
    def block_m(self) -> int:
        """Tokens per work tile (score row and index pairs)."""
        return tile_rows(row_bytes(self.num_experts, 2 * self.num_topk))


@kernel(simd_parallel=False)
def build_topk_gate(spec: TopkGateSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    E, K = spec.num_experts, spec.num_topk
    BM = kernel_rows(spec.block_m, target)
    M = TK.dynamic("M")

    def select_row(key, idx, bad, at):
        nonfinite = LaneVar(at.vector, "int32", 0)
        with T.serial(E) as e:
            nonfinite.set(nonfinite.get() | cast(F.flag(is_nonfinite(at.load(key, e))), "int32"))
        at.store_row_value(bad, nonfinite.get())
        if not at.vector:
            values = T.alloc_local((K,), "float32")
            columns = T.alloc_local((K,), "int32")
            running_top_k(at, key, E, K, values, columns)
            for k in range(K):
                at.store(idx, 2 * k, columns[k])
                at.store(idx, 2 * k + 1, 0)
            return
        last_value = LaneVar(at.vector, "float32", pos_inf())
        last_column = LaneVar(at.vector, "int32", -1)
        with T.serial(K) as k:
            next_in_rank(at, key, E, last_value, last_column)
            at.store(idx, 2 * k, last_column.get())
            at.store(idx, 2 * k + 1, 0)


    @T.macro
    def select_rows(key, idx, bad, valid):
        sh.rowwise(BM, lambda at: select_row(key, idx, bad, at), valid)

    @TK.prim_func
    def topk_gate_kernel(SCORES: TK.Tensor((M, E), "float32"), IDX: TK.Tensor((M, 2 * K), "int32"),
                         STATUS: TK.Tensor((STATUS_WORDS,), "int32")):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, BM)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * BM
                key = sh.tile((BM, padded(E)), "float32")
                idx = sh.tile((BM, padded(2 * K)), "int32")
                bad = sh.tile((max(BM, LANES),), "int32")
                sh.buffer_versions({key: 2, idx: 2})
                sh.copy(SCORES[row0, 0], key)
                # The scans in vector code, one token per lane; the status word (a global store
                # from flagged lanes) in SIMT.
                with sh.vector(SIMD):
                    select_rows(key, idx, bad, M - row0)
                raise_flagged_rows(sh, bad, BM, M - row0, STATUS, STATUS_NONFINITE)
                sh.copy(idx, IDX[row0, 0])

    return topk_gate_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_moe.topk_gate.TopkGateCall``) on ``target``."""
    spec = call.spec
    idx = call.topk_idx.view(torch.int32)

    def run(kernel, start: int, stop: int) -> None:
        for lo, hi in row_chunks(start, stop, spec.num_experts):
            kernel(call.scores[lo:hi], idx[lo:hi], call.status)

    build_topk_gate.launch_rows(spec, target, call.scores.shape[0], run, align=spec.block_m)
