"""``topk_gate`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

Work tiles of ``block_m`` tokens go round-robin to persistent workers. Per tile:

1. DMA the score rows into an on-chip tile;
2. one lane per token: flag non-finite scores, then ``K`` strict-``>`` scans over the
   row, each taking the largest score ranked after the previous pick (lowest expert
   among equals); the row is only read;
3. DMA the indices out as int32 pairs (high words 0).

The vector region is SIMT on Ascend: per-lane serial scans with compares, selects and
data-dependent stores, which TileLang 0.1.15's SIMD lowering does not accept. The
token count is a runtime value: one compiled kernel per ``(E, K)``.
"""


from dataclasses import dataclass

import tilelang.language as T
import torch

from vmi_core.compile import cached_kernel, kernel_source
from vmi_core.cpu_parallel import launch_rows
from vmi_core.tl.shell import SIMT, Shell

from .kernel_common import (
    STATUS_NONFINITE,
    STATUS_WORDS,
    is_nonfinite,
    next_in_rank,
    padded,
    pos_inf,
    row_bytes,
    row_chunks,
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


def build_topk_gate(spec: TopkGateSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    E, K = spec.num_experts, spec.num_topk
    BM = spec.block_m
    M = TK.dynamic("M")

    @TK.prim_func
    def topk_gate_kernel(SCORES: TK.Tensor((M, E), "float32"), IDX: TK.Tensor((M, 2 * K), "int32"),
                         STATUS: TK.Tensor((STATUS_WORDS,), "int32")):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, BM)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * BM
                key = sh.tile((BM, padded(E)), "float32")
                idx = sh.tile((BM, padded(2 * K)), "int32")
                sh.buffer_versions({key: 2, idx: 2})
                sh.copy(SCORES[row0, 0], key)
                with sh.vector(SIMT):
                    for i in T.Parallel(BM):
                        bad = T.alloc_var("int32")
                        bad = 0
                        for e in T.serial(E):
                            bad = bad | T.Cast("int32", is_nonfinite(key[i, e]))
                        # Rows past the token count hold stale data.
                        if bad > 0 and row0 + i < M:
                            STATUS[STATUS_NONFINITE] = 1
                        last_value = T.alloc_local((1,), "float32")
                        last_column = T.alloc_local((1,), "int32")
                        last_value[0] = pos_inf()
                        last_column[0] = -1
                        for k in T.serial(K):
                            next_in_rank(key, i, E, last_value, last_column)
                            idx[i, 2 * k] = last_column[0]
                            idx[i, 2 * k + 1] = 0
                sh.copy(idx, IDX[row0, 0])

    return topk_gate_kernel


def topk_gate_source(spec: TopkGateSpec, target: str) -> str:
    """Generated kernel source of ``spec`` for ``target`` (no hardware needed)."""
    return kernel_source(build_topk_gate, spec, target)


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_moe.topk_gate.TopkGateCall``) on ``target``."""
    spec = call.spec
    kernel = cached_kernel(build_topk_gate, spec, target)
    idx = call.topk_idx.view(torch.int32)

    def run(start: int, stop: int) -> None:
        for lo, hi in row_chunks(start, stop, spec.num_experts):
            kernel(call.scores[lo:hi], idx[lo:hi], call.status)

    launch_rows(target, run, call.scores.shape[0], align=spec.block_m, min_rows=256)


def topk_gate_parallel(scores, num_topk, *, target: str | None = None, flavor: str | None = None):
    """``topk_gate`` that always runs the parallel kernel (same arguments)."""
    # The dispatch module imports this one; by call time both are loaded.
    from .topk_gate import run_topk_gate

    return run_topk_gate(scores, num_topk, target, flavor, kernel_only=True)
