"""``inplace_unique_group_indices`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

Work tiles of ``block_m`` tokens go round-robin to persistent workers. Per tile:

1. DMA the rows of group ids on chip (int64 ids as int32 pairs);
2. one lane per token walks its ``K`` ids in order: an id is checked against ``[-1, num_groups)``
   (a valid id's high word is its low word's sign), then compared with every earlier id of the row
   (low words: within a valid row they decide equality); an id equal to an earlier one becomes
   ``-1``, every other id stays. A row with an id outside the range sets its lane's flag;
3. DMA the rows out, to a scratch tensor (the dispatch copies it over the caller's ids only when no
   flag is set), and a SIMT region writes the status word for flagged tokens.

Comparing with the earlier ids of the row, ``K (K - 1) / 2`` compares per token, needs no table
of seen groups: ``num_groups`` is any int32 and a runtime value, like the token count. On Ascend
step 2 runs as explicit vector code, 64 tokens at a time, one per lane (``Shell.rowwise``: columns
gathered and scattered in UB). One compiled kernel per ``K``.
"""


from dataclasses import dataclass

import torch

from vmi_core.kernel import kernel
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LANES, LaneVar, Pred, keep, select

from .common import (
    STATUS_BAD_INDEX,
    STATUS_WORDS,
    kernel_rows,
    padded,
    raise_flagged_rows,
    row_bytes,
    row_chunks,
    tile_rows,
)


@dataclass(frozen=True)
class UniqueGroupSpec:
    """Everything an inplace_unique_group_indices kernel is specialised on."""

    num_topk: int

    @property
    def block_m(self) -> int:
        """Tokens per work tile (id pairs in and out)."""
        return tile_rows(row_bytes(2 * self.num_topk, 2 * self.num_topk))


def _either(a, b):
    """``a or b`` per lane (predicate registers, or scalar TIR conditions)."""
    return a | b if isinstance(a, Pred) else T.Or(a, b)


@kernel(simd_parallel=False)
def build_inplace_unique_group_indices(spec: UniqueGroupSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    K = spec.num_topk
    BM = kernel_rows(spec.block_m, target)
    M = TK.dynamic("M")

    def unique_row(ix, out, bad, num_groups, at):
        flagged = LaneVar(at.vector, "int32", 0)
        seen = LaneVar(at.vector, "int32", 0)
        with T.serial(K) as j:
            lo = keep(at.load(ix, 2 * j))
            hi = keep(at.load(ix, 2 * j + 1))
            outside = _either(_either(lo < -1, lo >= num_groups), hi != (lo >> 31))
            flagged.set(select(outside, 1, flagged.get()))
            seen.set(0)
            with T.serial(j) as i:
                seen.set(select(at.load(ix, 2 * i) == lo, 1, seen.get()))
            repeated = keep(seen.get() != 0)
            at.store(out, 2 * j, select(repeated, -1, lo))
            at.store(out, 2 * j + 1, select(repeated, -1, hi))
        at.store_row_value(bad, flagged.get())

    @T.macro
    def unique_rows(ix, out, bad, num_groups, valid):
        sh.rowwise(BM, lambda at: unique_row(ix, out, bad, num_groups, at), valid)

    @TK.prim_func
    def inplace_unique_group_indices_kernel(IDX: TK.Tensor((M, 2 * K), "int32"), OUT: TK.Tensor((M, 2 * K), "int32"),
                                            STATUS: TK.Tensor((STATUS_WORDS,), "int32"), num_groups: TK.int32):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, BM)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * BM
                ix = sh.tile((BM, padded(2 * K)), "int32")
                out = sh.tile((BM, padded(2 * K)), "int32")
                bad = sh.tile((max(BM, LANES),), "int32")
                sh.buffer_versions({ix: 2, out: 2})
                sh.copy(IDX[row0, 0], ix)
                # The compares in vector code, one token per lane; the status word (a global store
                # from flagged lanes) in SIMT.
                with sh.vector(SIMD):
                    unique_rows(ix, out, bad, num_groups, M - row0)
                raise_flagged_rows(sh, bad, BM, M - row0, STATUS, STATUS_BAD_INDEX)
                sh.copy(out, OUT[row0, 0])

    return inplace_unique_group_indices_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_moe.ops.inplace_unique_group_indices.UniqueGroupCall``) on ``target``:
    the caller's ids are read, the results go to the call's scratch tensor."""
    spec = call.spec
    src, dst = call.group_indices.view(torch.int32), call.staged.view(torch.int32)

    def run(kernel, start: int, stop: int) -> None:
        for lo, hi in row_chunks(start, stop, 2 * spec.num_topk):
            kernel(src[lo:hi], dst[lo:hi], call.status, call.num_groups)

    build_inplace_unique_group_indices.launch_rows(spec, target, call.group_indices.shape[0], run,
                                                   align=spec.block_m, min_rows=4 * spec.block_m)
