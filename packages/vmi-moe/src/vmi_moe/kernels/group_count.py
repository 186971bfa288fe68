"""``group_count`` and ``aux_fi`` as parallel-style TileLang kernels for ascend, cuda and cpu.

Both ops count the entries of an int64 ``[T, K]`` id tensor per id, then reduce the counts:

1. **count** — ``get_fused_mapping``'s first step (``build_fused_mapping_count``): per work tile of
   tokens, one lane counts the tile's entries per id into the tile's row of a ``[tiles, E]`` table
   and flags ids outside ``[-1, E)`` in the status word; on cpu the tiles split across threads.
2. **sum** (``build_count_sum``, this module) — work tiles of up to ``SUM_IDS`` ids go round-robin to
   persistent workers. Per tile: the table's rows come on chip ``SUM_ROWS`` at a time (DMA, double
   buffered) and one lane per id adds its column in tile order (exact int32: no row order changes a
   bit); then the totals go out (``group_count``), or each lane turns its total into the expert's
   frequency (``aux_fi``) and those go out.

``aux_fi``'s frequency is ``fl(count * E) / fl(T * num_aux_topk)``: both integer products exact in
int64, each converted to fp32 once (round to nearest even: a C conversion on every target), and the
quotient made the correctly rounded one by its residual (``common.quotient``, checked: nothing
changes where the division is IEEE). An id with no entry, and every id of an empty batch, gets +0.

On Ascend the sum's lanes run in SIMT regions (a serial loop of a runtime length per lane); the
table's row count and the token count are runtime values: one compiled sum per ``(E, output)``.
"""


from dataclasses import dataclass

from vmi_core.kernel import kernel
from vmi_core.tl.formats import f32_const
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMT, Shell
from vmi_core.tl.simd import keep

from .common import padded, quotient
from .get_fused_mapping import FusedMappingSpec, count_table

# Ids per work tile of the sum: one SIMT thread each.
SUM_IDS = 128
# Table rows per DMA chunk of the sum.
SUM_ROWS = 64
# What the sum writes.
COUNTS = "counts"
FREQUENCIES = "frequencies"


@dataclass(frozen=True)
class CountSumSpec:
    """Everything a sum kernel is specialised on: the id count and what it writes (``COUNTS``:
    int32 totals; ``FREQUENCIES``: ``aux_fi``'s fp32 quotients)."""

    num_ids: int
    output: str

    @property
    def block_ids(self) -> int:
        """Ids per work tile: ``SUM_IDS``, or fewer ids rounded up to whole 32-byte rows."""
        return min(SUM_IDS, padded(self.num_ids))


def frequency(count, num_experts: int, num_tokens, num_aux_topk):
    """``aux_fi``'s quotient of one expert's total ``count`` (a lane value): ``fl(count * E) /
    fl(T * num_aux_topk)``, +0 where ``count`` is 0 (also for ``T = 0``, where the quotient would be
    ``0 / 0``)."""
    count = keep(count)
    numerator = keep(T.Cast("float32", T.Cast("int64", count) * T.int64(num_experts)))
    denominator = keep(T.Cast("float32", T.Cast("int64", num_tokens) * T.Cast("int64", num_aux_topk)))
    return T.Select(count > 0, quotient(numerator, denominator, True), f32_const(0.0))


@kernel(simd_parallel=False)
def build_count_sum(spec: CountSumSpec, target: str):
    """Step 2: the per-id totals of the count table, written as counts or as ``aux_fi``'s frequencies."""
    sh = Shell(target)
    TK = sh.T
    E, BE, PR = spec.num_ids, spec.block_ids, SUM_ROWS
    NT = TK.dynamic("NT")
    if spec.output not in (COUNTS, FREQUENCIES):
        raise ValueError(f"output must be {COUNTS!r} or {FREQUENCIES!r}, got {spec.output!r}")

    @T.macro
    def column_totals(TABLE, col0, total):
        """``total[j]`` = the sum of column ``col0 + j`` of the table, its rows in order."""
        parts = sh.tile((PR, BE), "int32")
        sh.buffer_versions({parts: 2})
        with sh.vector(SIMT):
            for j in T.Parallel(BE):
                total[j] = 0
        for chunk in T.serial(T.ceildiv(NT, PR)):
            # Loop bounds from a scalar: Ascend's barrier planner takes no UB load there.
            num_rows = T.alloc_var("int32")
            num_rows = T.min(PR, NT - chunk * PR)
            sh.copy(TABLE[chunk * PR, col0], parts)
            with sh.vector(SIMT):
                for j in T.Parallel(BE):
                    running = T.alloc_var("int32")
                    running = total[j]
                    for p in T.serial(num_rows):
                        running = running + parts[p, j]
                    total[j] = running

    if spec.output == COUNTS:
        @TK.prim_func
        def group_count_sum_kernel(TABLE: TK.Tensor((NT, E), "int32"), OUT: TK.Tensor((E,), "int32")):
            with sh.persistent_kernel() as worker:
                for te in sh.tiles([T.ceildiv(E, BE)], worker):
                    col0 = T.alloc_var("int32")
                    col0 = te * BE
                    total = sh.tile((BE,), "int32")
                    column_totals(TABLE, col0, total)
                    sh.copy(total, OUT[col0])

        return group_count_sum_kernel

    @TK.prim_func
    def aux_fi_sum_kernel(TABLE: TK.Tensor((NT, E), "int32"), OUT: TK.Tensor((E,), "float32"),
                          num_tokens: TK.int32, num_aux_topk: TK.int32):
        with sh.persistent_kernel() as worker:
            for te in sh.tiles([T.ceildiv(E, BE)], worker):
                col0 = T.alloc_var("int32")
                col0 = te * BE
                total = sh.tile((BE,), "int32")
                fi = sh.tile((BE,), "float32")
                column_totals(TABLE, col0, total)
                with sh.vector(SIMT):
                    for j in T.Parallel(BE):
                        fi[j] = frequency(total[j], E, num_tokens, num_aux_topk)
                sh.copy(fi, OUT[col0])

    return aux_fi_sum_kernel


def count_spec(num_ids: int, num_topk: int) -> FusedMappingSpec:
    """The count step's specialisation for ``num_ids`` ids and ``num_topk`` columns."""
    return FusedMappingSpec(num_ids, num_topk)


def launch_group_count(call, target: str) -> None:
    """Run a validated call (``vmi_moe.ops.group_count.GroupCountCall``) on ``target``: count, sum."""
    num_groups = call.counts.shape[0]
    table = count_table(count_spec(num_groups, call.group_idx.shape[1]), call.group_idx, call.status, target)
    build_count_sum.compiled(CountSumSpec(num_groups, COUNTS), target)(table, call.counts)


def launch_aux_fi(call, target: str) -> None:
    """Run a validated call (``vmi_moe.ops.aux_fi.AuxFiCall``) on ``target``: count, sum to frequencies."""
    num_experts = call.fi.shape[0]
    num_tokens, num_topk = call.topk_idx.shape
    table = count_table(count_spec(num_experts, num_topk), call.topk_idx, call.status, target)
    build_count_sum.compiled(CountSumSpec(num_experts, FREQUENCIES), target)(table, call.fi, num_tokens,
                                                                            call.num_aux_topk)

