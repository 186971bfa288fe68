"""``mask_indices_by_tp`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

Work tiles of ``block_m`` tokens go round-robin to persistent workers. Per tile:

1. DMA the id rows on chip (int64 ids as int32 pairs, int32 ids as they are);
2. one lane per token walks its ``K`` ids: an id ``v`` in ``[0, 2^31)`` is kept when its block
   ``g = v / per_gpu`` satisfies ``g % num_tp_ranks == tp_rank`` and becomes
   ``(g / num_tp_ranks) * per_gpu + (v - g * per_gpu)``; a negative id, or one of another rank,
   becomes ``-1``; an int64 id of ``2^31`` or more raises the ``STATUS_BAD_INDEX`` flag (and is
   written as ``-1``, never returned: the dispatch raises);
3. DMA the rows out (an int64 result's high word is its sign).

The kept value is TileKernels' ``w - (w // per_dp) * (per_dp - per_gpu)`` with ``w = v - tp_rank *
per_gpu``: with ``g = dp * num_tp_ranks + tp_rank`` and ``v = g * per_gpu + s`` (``0 <= s <
per_gpu``), ``w = dp * per_dp + s``, so ``w // per_dp = dp`` and the result is ``dp * per_gpu + s``
(never negative). Every intermediate lies in ``[0, v]``: int32 arithmetic is exact, whatever the
rank counts.

On Ascend step 2 is a SIMT region: the vector unit has no integer division (``asc_div`` takes
floats only), and each id needs two by runtime divisors. ``per_gpu``, ``num_tp_ranks``, ``tp_rank``
and the token count are runtime values: one compiled kernel per ``(K, id dtype)``.
"""


from dataclasses import dataclass

import torch

from vmi_core.kernel import kernel
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMT, Shell

from .common import STATUS_BAD_INDEX, STATUS_WORDS, kernel_rows, padded, row_bytes, row_chunks, tile_rows


@dataclass(frozen=True)
class MaskIndicesSpec:
    """Everything a mask_indices_by_tp kernel is specialised on: ``wide`` for int64 ids (int32 pairs)."""

    num_topk: int
    wide: bool

    @property
    def words(self) -> int:
        """int32 words per token row."""
        return 2 * self.num_topk if self.wide else self.num_topk

    @property
    def block_m(self) -> int:
        """Tokens per work tile (id rows in and out)."""
        return tile_rows(row_bytes(self.words, self.words))


@kernel(simd_parallel=False)
def build_mask_indices_by_tp(spec: MaskIndicesSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    K, W, wide = spec.num_topk, spec.words, spec.wide
    BM = kernel_rows(spec.block_m, target)
    M = TK.dynamic("M")

    def low(ix, i, k):
        return ix[i, 2 * k] if wide else ix[i, k]

    def high(ix, i, k):
        # An int32 id's high word would be its sign: it never flags, it is never kept when negative.
        return ix[i, 2 * k + 1] if wide else ix[i, k] >> 31

    def store(out, i, k, value):
        if wide:
            T.buffer_store(out, value, [i, 2 * k])
            T.buffer_store(out, value >> 31, [i, 2 * k + 1])
        else:
            T.buffer_store(out, value, [i, k])

    @T.macro
    def mask_rows(ix, out, STATUS, row0, per_gpu, num_tp_ranks, tp_rank):
        for i in T.Parallel(BM):
            lo = T.alloc_var("int32")
            hi = T.alloc_var("int32")
            v = T.alloc_var("int32")
            block = T.alloc_var("int32")
            rest = T.alloc_var("int32")
            result = T.alloc_var("int32")
            bad = T.alloc_var("int32")
            bad = 0
            for k in T.serial(K):
                lo = low(ix, i, k)
                hi = high(ix, i, k)
                # Ids of 2^31 or more (an int64's high word above 0, or 0 with the low word's top bit).
                if T.Or(hi > 0, T.And(hi == 0, lo < 0)):
                    bad = 1
                # Every lane divides a value in [0, 2^31): the divisions are exact truncations.
                v = T.max(lo, 0)
                block = T.truncdiv(v, per_gpu)
                # The offset in the block first, in a variable of its own: the sum below then never
                # exceeds v (no reassociation through a larger intermediate).
                rest = v - block * per_gpu
                result = T.Select(T.And(T.And(hi == 0, lo >= 0), T.truncmod(block, num_tp_ranks) == tp_rank),
                                  T.truncdiv(block, num_tp_ranks) * per_gpu + rest, -1)
                store(out, i, k, result)
            # Rows past the token count hold stale data, or nothing.
            if bad > 0 and row0 + i < M:
                STATUS[STATUS_BAD_INDEX] = 1

    @TK.prim_func
    def mask_indices_by_tp_kernel(IDX: TK.Tensor((M, W), "int32"), OUT: TK.Tensor((M, W), "int32"),
                                  STATUS: TK.Tensor((STATUS_WORDS,), "int32"), per_gpu: TK.int32,
                                  num_tp_ranks: TK.int32, tp_rank: TK.int32):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, BM)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * BM
                ix = sh.tile((BM, padded(W)), "int32")
                out = sh.tile((BM, padded(W)), "int32")
                sh.buffer_versions({ix: 2, out: 2})
                sh.copy(IDX[row0, 0], ix)
                # Integer division per id: SIMT on Ascend (the vector unit divides floats only).
                with sh.vector(SIMT):
                    mask_rows(ix, out, STATUS, row0, per_gpu, num_tp_ranks, tp_rank)
                sh.copy(out, OUT[row0, 0])

    return mask_indices_by_tp_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_moe.ops.mask_indices_by_tp.MaskIndicesCall``) on ``target``."""
    spec = call.spec
    src, dst = call.indices.view(torch.int32), call.masked.view(torch.int32)

    def run(kernel, start: int, stop: int) -> None:
        for lo, hi in row_chunks(start, stop, spec.words):
            kernel(src[lo:hi], dst[lo:hi], call.status, call.per_gpu, call.num_tp_ranks, call.tp_rank)

    build_mask_indices_by_tp.launch_rows(spec, target, call.indices.shape[0], run, align=spec.block_m,
                                         min_rows=4 * spec.block_m)
