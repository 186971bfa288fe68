"""The prenorm GEMM of ``norm_fn`` (stages B and E) as parallel-style TileLang kernels for ascend,
cuda and cpu.

**Operand kernel** (``build_tf32_split``). The fp32 GEMM operands (``fn_eff``; in the backward
also ``d_out_mul``) are rounded to TF32 and split into bf16 ``hi + lo`` (``vmi_mhc.tl.tf32``),
into ``(rows, padded columns)`` buffers whose padding (rows past ``n3``, columns past ``n3``) is
zero: every target's GEMM reads these same values. Work tiles of ``SPLIT_ROWS`` rows and up to
``SPLIT_COLS`` columns go round-robin to persistent workers; element-wise SIMD on Ascend.

**Forward** (``build_gemm_fwd``). Work items ``(token block of BLOCK_T, split)``. Per item, over
the split's columns in chunks of ``chunk`` (DMA of x and of the operand's hi/lo chunk):

* the product ``acc[t, j] += x[t, k] · v[j, k]``: on ``ascend`` ``T.gemm`` on the Cube unit (L1
  operands, fp32 accumulator in L0C, two bf16 GEMMs ``x·hiᵀ`` and ``x·loᵀ`` into it), on
  ``cuda`` ``T.gemm`` (shared-memory operands, fragment accumulator, the same two GEMMs), on
  ``cpu`` a loop nest: per token, ``k`` ascending, ``j`` innermost (``N_PAD`` independent
  accumulators), each exact product added with one fp32 rounding from +0.0;
* ``Σ x²``: 64 lane partials per token over the split's columns, ``p[l] += x²`` for columns
  ``l, l + 64, ...`` (exact squares, one rounding each), folded once at the end of the split
  (the order of ``vmi_core.sums.lane_sum_fused``, identical on every target).

**Backward** (``build_gemm_bwd``). Work items are column blocks of ``BLOCK_K`` columns; each loops
over all tokens in blocks of ``BLOCK_T``, so it owns its columns of ``fn_grad`` (no cross-worker
reduction, deterministic): ``fn_grad[j, k] = Σ_t d[t, j] · x[t, k]`` (tokens ascending from +0.0 on
cpu) and ``x_grad[t, k] = bf16((f32(x_grad) + Σ_j d[t, j] · v[j, k]) + (2 · x[t, k]) · d_sqrsum[t])``
(``j`` ascending from +0.0 on cpu). On cuda both sums are ``T.gemm`` (``dᵀ·x`` and ``d·v`` as
hi/lo GEMMs); on ascend ``d·v`` is ``T.gemm`` on the Cube unit (with ``fn_eff`` in the ``(K, n3)``
layout its L1 GEMM takes) and ``fn_grad`` runs on the vector unit in the cpu order (the L1 GEMM
has no transposed first operand for ``dᵀ·x``).

The cpu order is the reference's (``vmi_mhc.reference.pre_norm_fn_gemm``), bit for bit; the
matrix units add the same exact products in their own order (see the docs page for the bound).
On cpu the forward's token blocks, and the backward's column blocks, are split across threads
(``vmi_core.cpu_parallel``).
"""

from dataclasses import dataclass

import torch

from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LANES, LaneVar, Vec, select
from vmi_core.tl.vector import ChunkAt, ElementAt, decode, phase_barrier, store

from ..tl import tf32

# The mix width is padded to one 32-column GEMM tile (spec §3.4.3: n3 <= 32).
N_PAD = 32
# Tokens per work tile (forward) and per step of the backward's token loop.
BLOCK_T = 32
# Tokens whose accumulators the cpu forward loop nest keeps in registers together.
TOKEN_GROUP = 4
# Columns per backward work item.
BLOCK_K = 256
# Column chunks of the forward: the largest of these dividing the split width.
CHUNKS = (256, 128, 64)
# The GEMM kernels mix Cube and vector code: on Ascend one worker is an AI core (one Cube unit and
# its two vector cores), and Ascend 950 has 32 (spec §2: ``cube_core_num``).
ASCEND_AI_CORES = 32
# Operand kernel tiles: whole 64-lane registers of a few rows (the operands are a few MB at most).
SPLIT_ROWS = 16
SPLIT_COLS = 64


def split_chunk(split_width: int) -> int:
    """Columns per forward chunk for splits of ``split_width`` columns (a multiple of 64)."""
    return next(c for c in CHUNKS if split_width % c == 0)


@dataclass(frozen=True)
class Tf32SplitSpec:
    """The operand kernel's specialisation: none (its shapes are runtime values), one kernel per
    target."""


@dataclass(frozen=True)
class GemmSpec:
    """The GEMM kernels' specialisation (the token count is a runtime value)."""

    hidden: int  # K = n·H
    mix: int  # n3
    n_splits: int = 1

    @property
    def split_width(self) -> int:
        return self.hidden // self.n_splits

    @property
    def chunk(self) -> int:
        return split_chunk(self.split_width)


def _gemm_shell(target: str) -> Shell:
    return Shell(target, workers=ASCEND_AI_CORES if target == "ascend" else None)


def _bf16_dtype(sh: Shell) -> str:
    # The matrix units take real bf16 operands; the C backend has no bf16 type (bit views).
    return "uint16" if sh.is_cpu else "bfloat16"


@kernel(simd_parallel=False)
def build_tf32_split(spec: Tf32SplitSpec, target: str):
    """The operand kernel: ``HI, LO (R, CP)`` bf16 from fp32 ``SRC (R, C)``, ``C <= CP``."""
    sh = Shell(target)
    TK = sh.T
    BR, BC = SPLIT_ROWS, SPLIT_COLS
    NR = TK.dynamic("NR")
    C = TK.dynamic("C")
    CP = TK.dynamic("CP")

    def parts(src, col0, cols, at):
        # Columns past ``cols`` are zero operands (DMA leaves stale data there on Ascend).
        v = tf32.round_to_tf32(select(at.column() + col0 < cols, at.load(src), T.float32(0)))
        hi = tf32.split_hi(v)
        return hi, tf32.split_lo(v, hi)

    @T.macro
    def split_tile(src, hi, lo, col0, cols):
        sh.elementwise((BR, BC), lambda at: parts(src, col0, cols, at), (hi, lo))

    @TK.prim_func
    def tf32_split_kernel(SRC: TK.Tensor((NR, C), "float32"), HI: TK.Tensor((NR, CP), "uint16"),
                          LO: TK.Tensor((NR, CP), "uint16")):
        with sh.persistent_kernel() as worker:
            for tr, tc in sh.tiles([T.ceildiv(NR, BR), T.ceildiv(CP, BC)], worker):
                row0 = T.alloc_var("int32")
                col0 = T.alloc_var("int32")
                row0 = tr * BR
                col0 = tc * BC
                src = sh.tile((BR, BC), "float32")
                hi = sh.tile((BR, BC), "uint16")
                lo = sh.tile((BR, BC), "uint16")
                sh.buffer_versions({src: 2, hi: 2, lo: 2})
                sh.copy(SRC[row0, col0], src)
                with sh.vector(SIMD):
                    split_tile(src, hi, lo, col0, C)
                sh.copy(hi, HI[row0, col0])
                sh.copy(lo, LO[row0, col0])

    return tf32_split_kernel


def _decode_bf16(tile, index):
    """An element of a bf16 tile as fp32: bit math on the C backend's uint16 view, a conversion
    where the tile is a real bf16 tile (cuda)."""
    value = tile[index]
    if str(tile.dtype) == "bfloat16":
        return T.Cast("float32", value)
    return F.bf16_to_f32(value)


def _shifted(at, offset: int):
    """The position ``offset`` columns right of ``at`` (a lane element or a 64-lane chunk)."""
    return ChunkAt(at.head, at.col0 + offset) if at.vector else ElementAt(at.head, at.j + offset)


@kernel(simd_parallel=False)
def build_gemm_fwd(spec: GemmSpec, target: str):
    """The forward GEMM + square sums of ``spec`` for ``target``."""
    sh = _gemm_shell(target)
    TK = sh.T
    K, N3, S, KS, BK, BT = spec.hidden, spec.mix, spec.n_splits, spec.split_width, spec.chunk, BLOCK_T
    bf16 = _bf16_dtype(sh)
    M = TK.dynamic("M")

    @T.macro
    def products_loop_nest(x, hi, lo, v, acc):
        # The chunk's operand, transposed so that the mix index runs over consecutive elements.
        for k, j in T.Parallel(BK, N_PAD):
            v[k, j] = tf32.join(hi[j, k], lo[j, k])
        for tg in T.serial(BT // TOKEN_GROUP):
            # A group of tokens' accumulators in local rows (registers: independent chains), the k
            # loop over them.
            rows = T.alloc_local((TOKEN_GROUP * N_PAD,), "float32")
            for r in T.serial(TOKEN_GROUP * N_PAD):
                rows[r] = acc[tg * TOKEN_GROUP + r // N_PAD, r % N_PAD]
            for k in T.serial(BK):
                for tt in T.serial(TOKEN_GROUP):
                    for j in T.serial(N_PAD):
                        rows[tt * N_PAD + j] = (rows[tt * N_PAD + j]
                                                + F.bf16_to_f32(x[tg * TOKEN_GROUP + tt, k]) * v[k, j])
            for r in T.serial(TOKEN_GROUP * N_PAD):
                acc[tg * TOKEN_GROUP + r // N_PAD, r % N_PAD] = rows[r]

    @T.macro
    def products_matrix_unit(x, hi, lo, acc, first):
        # v = hi + lo: two bf16 GEMMs of exact products into the fp32 accumulator.
        T.gemm(x, hi, acc, transpose_B=True, clear_accum=first)
        T.gemm(x, lo, acc, transpose_B=True)

    def square_lanes(x, sq_lanes, at):
        # Lane l adds the squares of columns l, l + 64, ... of the chunk in order.
        running = at.load(sq_lanes)
        for c in range(BK // LANES):
            if at.vector:
                value = decode("bf16", _shifted(at, c * LANES), x)
            else:
                value = _decode_bf16(x, (at.i, at.j + c * LANES))
            running = running + value * value
        return running

    @T.macro
    def zero_lanes(sq_lanes):
        sh.elementwise((BT, LANES), lambda at: Vec.splat(0.0, "float32") if at.vector else T.float32(0), sq_lanes)

    @T.macro
    def square_chunk(x, sq_lanes):
        sh.elementwise((BT, LANES), lambda at: square_lanes(x, sq_lanes, at), sq_lanes)

    @T.macro
    def fold_lanes(sq_lanes, sq):
        # One term per lane from +0.0, then the six folds: the lane order of vmi_core.sums.
        sh.row_sum(sq, (BT, LANES), lambda at: at.load(sq_lanes))

    @TK.prim_func
    def gemm_fwd_kernel(X: TK.Tensor((M, K), bf16), XV: TK.Tensor((M, K), "uint16"),
                        HI: TK.Tensor((N_PAD, K), bf16), LO: TK.Tensor((N_PAD, K), bf16),
                        OUT: TK.Tensor((S, M, N3), "float32"), SQ: TK.Tensor((S, M), "float32"),
                        first_block: TK.int32, num_blocks: TK.int32):
        with sh.persistent_kernel() as worker:
            for tb, s in sh.tiles([num_blocks, S], worker):
                row0 = T.alloc_var("int32")
                row0 = (first_block + tb) * BT
                sq_lanes = sh.tile((BT, LANES), "float32")
                sq = sh.tile((BT,), "float32")
                if sh.is_ascend:
                    x_mat = TK.alloc_l1((BT, BK), bf16)
                    hi = TK.alloc_l1((N_PAD, BK), bf16)
                    lo = TK.alloc_l1((N_PAD, BK), bf16)
                    acc = TK.alloc_l0c((BT, N_PAD), "float32")
                    x = sh.tile((BT, BK), "uint16")
                elif sh.is_cuda:
                    x = sh.tile((BT, BK), bf16)
                    hi = sh.tile((N_PAD, BK), bf16)
                    lo = sh.tile((N_PAD, BK), bf16)
                    acc = T.alloc_fragment((BT, N_PAD), "float32")
                else:
                    x = sh.tile((BT, BK), bf16)
                    hi = sh.tile((N_PAD, BK), bf16)
                    lo = sh.tile((N_PAD, BK), bf16)
                    v = sh.tile((BK, N_PAD), "float32")
                    acc = sh.tile((BT, N_PAD), "float32")
                    for t, j in T.Parallel(BT, N_PAD):
                        acc[t, j] = T.float32(0)
                with sh.vector(SIMD):
                    zero_lanes(sq_lanes)
                for kc in T.serial(KS // BK):
                    col0 = T.alloc_var("int32")
                    col0 = s * KS + kc * BK
                    if sh.is_ascend:
                        T.copy(X[row0, col0], x_mat)
                        T.copy(HI[0, col0], hi)
                        T.copy(LO[0, col0], lo)
                        products_matrix_unit(x_mat, hi, lo, acc, kc == 0)
                        sh.copy(XV[row0, col0], x)
                    else:
                        sh.copy(XV[row0, col0] if sh.is_cpu else X[row0, col0], x)
                        sh.copy(HI[0, col0], hi)
                        sh.copy(LO[0, col0], lo)
                        if sh.is_cuda:
                            products_matrix_unit(x, hi, lo, acc, kc == 0)
                        else:
                            products_loop_nest(x, hi, lo, v, acc)
                    with sh.vector(SIMD):
                        square_chunk(x, sq_lanes)
                with sh.vector(SIMD):
                    fold_lanes(sq_lanes, sq)
                if sh.is_cpu:
                    sh.copy(acc, OUT[s, row0, 0])
                else:
                    # Straight from the accumulator (L0C on Ascend, registers on cuda).
                    T.copy(acc, OUT[s, row0, 0])
                sh.copy(sq, SQ[s, row0])

    return gemm_fwd_kernel


def fn_operand_shape(hidden: int, target: str) -> tuple[int, int]:
    """Layout of the backward's ``fn`` operand: ``(N_PAD, K)``, or ``(K, N_PAD)`` on Ascend, whose
    L1 GEMM takes its second operand as ``(N, K)`` only (NT form) and here ``N`` runs over ``K``."""
    return (hidden, N_PAD) if target in ("ascend", "ascend-sim") else (N_PAD, hidden)


@kernel(simd_parallel=False)
def build_gemm_bwd(spec: GemmSpec, target: str):
    """The backward GEMMs of ``spec`` for ``target`` (column-owned work items)."""
    sh = _gemm_shell(target)
    TK = sh.T
    K, N3, BT, BK = spec.hidden, spec.mix, BLOCK_T, BLOCK_K
    bf16 = _bf16_dtype(sh)
    M = TK.dynamic("M")
    MP = TK.dynamic("MP")
    FN_SHAPE = fn_operand_shape(K, target)

    @T.macro
    def operand_loop_nest(hi, lo, v, rows, cols):
        for r, c in T.Parallel(rows, cols):
            v[r, c] = tf32.join(hi[r, c], lo[r, c])

    @T.macro
    def fn_grad_loop_nest(x, d, fg, valid_rows):
        # Tokens ascending (only the valid ones: tail rows must not contribute).
        for t in T.serial(valid_rows):
            for j in T.serial(N3):
                for k in T.Parallel(BK):
                    fg[j, k] = fg[j, k] + d[t, j] * F.bf16_to_f32(x[t, k])

    @T.macro
    def fn_grad_registers(x, d, fg, valid_rows):
        # The cpu order in 64-column registers: per (j, chunk), tokens ascending; d[t, j] reaches
        # the lanes by a register gather from the token's row of d.
        for j in T.serial(N3):
            for c in T.serial(BK // LANES):
                running = LaneVar(True, "float32", ChunkAt((j,), c * LANES).load(fg))
                for t in T.serial(valid_rows):
                    running.set(running.get() + ChunkAt((), j * LANES).group(d, LANES, row=t)
                                * decode("bf16", ChunkAt((t,), c * LANES), x))
                T.evaluate(store(fg[j, c * LANES], running.get()))
        phase_barrier()

    @T.macro
    def fn_grad_cuda(x, dhi, dlo, fg, first):
        # fn_grad += dᵀ·x with d = dhi + dlo. Tail rows of the last token block are zero in d
        # (the operand buffers are zero-padded to whole blocks), so they add nothing.
        T.gemm(dhi, x, fg, transpose_A=True, clear_accum=first)
        T.gemm(dlo, x, fg, transpose_A=True)

    @T.macro
    def x_grad_products_matrix_unit(dhi, dlo, hi, lo, gx, fn_transposed):
        # d·v with d = dhi + dlo and v = hi + lo: four bf16 GEMMs of exact products.
        T.gemm(dhi, hi, gx, transpose_B=fn_transposed, clear_accum=True)
        T.gemm(dhi, lo, gx, transpose_B=fn_transposed)
        T.gemm(dlo, hi, gx, transpose_B=fn_transposed)
        T.gemm(dlo, lo, gx, transpose_B=fn_transposed)

    def x_grad_value(xg, gemm, x, dsq):
        return F.f32_to_bf16((F.bf16_to_f32(xg) + gemm) + (x + x) * dsq)

    @T.macro
    def x_grad_loop_nest(x, xg, d, v, dsq):
        for t in T.serial(BT):
            # The token's BK sums in a local row, j outer.
            g = T.alloc_local((BK,), "float32")
            for k in T.serial(BK):
                g[k] = T.float32(0)
            for j in T.serial(N3):
                for k in T.serial(BK):
                    g[k] = g[k] + d[t, j] * v[j, k]
            for k in T.serial(BK):
                xg[t, k] = x_grad_value(xg[t, k], g[k], F.bf16_to_f32(x[t, k]), dsq[t])

    @T.macro
    def x_grad_cuda(x, xg, gx, dsq):
        for t, k in T.Parallel(BT, BK):
            xg[t, k] = x_grad_value(xg[t, k], gx[t, k], _decode_bf16(x, (t, k)), dsq[t])

    def row_value(table, at):
        # The row's value in every lane of a chunk (a register gather from the 1-D table).
        if at.vector:
            return ChunkAt((), at.head[0] * LANES).group(table, LANES)
        return table[at.i]

    def x_grad_vector(x, xg, gx, dsq, at):
        return x_grad_value(at.load(xg), at.load(gx), decode("bf16", at, x), row_value(dsq, at))

    @T.macro
    def zero_registers(fg):
        sh.elementwise((N_PAD, BK), lambda at: Vec.splat(0.0, "float32"), fg)

    @T.macro
    def vector_phases(x, xg, gx, dsq, dhi_v, dlo_v, d, fg, valid_rows):
        sh.elementwise((BT, N_PAD), lambda at: tf32.join(at.load(dhi_v), at.load(dlo_v)), d)
        fn_grad_registers(x, d, fg, valid_rows)
        sh.elementwise((BT, BK), lambda at: x_grad_vector(x, xg, gx, dsq, at), xg)

    @TK.prim_func
    def gemm_bwd_kernel(DHI: TK.Tensor((MP, N_PAD), bf16), DLO: TK.Tensor((MP, N_PAD), bf16),
                        DHIV: TK.Tensor((MP, N_PAD), "uint16"), DLOV: TK.Tensor((MP, N_PAD), "uint16"),
                        DSQ: TK.Tensor((M,), "float32"), X: TK.Tensor((M, K), bf16), XV: TK.Tensor((M, K), "uint16"),
                        HI: TK.Tensor(FN_SHAPE, bf16), LO: TK.Tensor(FN_SHAPE, bf16),
                        XG: TK.Tensor((M, K), "uint16"), FG: TK.Tensor((N3, K), "float32"),
                        first_block: TK.int32, num_blocks: TK.int32):
        with sh.persistent_kernel() as worker:
            if sh.is_ascend:
                # The vector phases on one AIV of the AI core: the Cube writes its products
                # (L0C -> UB) into sub-block 0's UB only, and x_grad is read-modify-write.
                T.sblock_attr({"vector_count": T.int32(1)})
            for cb in sh.tiles([num_blocks], worker):
                col0 = T.alloc_var("int32")
                col0 = (first_block + cb) * BK
                if sh.is_ascend:
                    hi = TK.alloc_l1((BK, N_PAD), bf16)
                    lo = TK.alloc_l1((BK, N_PAD), bf16)
                    fg = sh.tile((N_PAD, BK), "float32")
                    T.copy(HI[col0, 0], hi)
                    T.copy(LO[col0, 0], lo)
                    with sh.vector(SIMD):
                        zero_registers(fg)
                elif sh.is_cuda:
                    hi = sh.tile((N_PAD, BK), bf16)
                    lo = sh.tile((N_PAD, BK), bf16)
                    fg = T.alloc_fragment((N_PAD, BK), "float32")
                    sh.copy(HI[0, col0], hi)
                    sh.copy(LO[0, col0], lo)
                else:
                    hi = sh.tile((N_PAD, BK), bf16)
                    lo = sh.tile((N_PAD, BK), bf16)
                    v = sh.tile((N_PAD, BK), "float32")
                    fg = sh.tile((N_PAD, BK), "float32")
                    sh.copy(HI[0, col0], hi)
                    sh.copy(LO[0, col0], lo)
                    operand_loop_nest(hi, lo, v, N_PAD, BK)
                    for j, k in T.Parallel(N_PAD, BK):
                        fg[j, k] = T.float32(0)
                for tb in T.serial(T.ceildiv(M, BT)):
                    row0 = T.alloc_var("int32")
                    valid_rows = T.alloc_var("int32")
                    row0 = tb * BT
                    valid_rows = T.min(BT, M - row0)
                    xg = sh.tile((BT, BK), "uint16")
                    sh.copy(XG[row0, col0], xg)
                    if sh.is_ascend:
                        # x·v on the Cube unit; fn_grad on the vector unit in the cpu order (the
                        # L1 GEMM has no transposed first operand for dᵀ·x).
                        dhi = TK.alloc_l1((BT, N_PAD), bf16)
                        dlo = TK.alloc_l1((BT, N_PAD), bf16)
                        gx_acc = TK.alloc_l0c((BT, BK), "float32")
                        x = sh.tile((BT, BK), "uint16")
                        dhi_v = sh.tile((BT, N_PAD), "uint16")
                        dlo_v = sh.tile((BT, N_PAD), "uint16")
                        # Two rows past the block: the gathers of the last row read a whole register.
                        d = sh.tile((BT + LANES // N_PAD, N_PAD), "float32")
                        gx = sh.tile((BT, BK), "float32")
                        dsq = sh.lane_table(BT, "float32")
                        T.copy(DHI[row0, 0], dhi)
                        T.copy(DLO[row0, 0], dlo)
                        x_grad_products_matrix_unit(dhi, dlo, hi, lo, gx_acc, True)
                        T.copy(gx_acc, gx)
                        sh.copy(XV[row0, col0], x)
                        sh.copy(DHIV[row0, 0], dhi_v)
                        sh.copy(DLOV[row0, 0], dlo_v)
                        sh.copy(DSQ[row0], dsq)
                        with sh.vector(SIMD):
                            vector_phases(x, xg, gx, dsq, dhi_v, dlo_v, d, fg, valid_rows)
                    elif sh.is_cuda:
                        x = sh.tile((BT, BK), bf16)
                        dhi = sh.tile((BT, N_PAD), bf16)
                        dlo = sh.tile((BT, N_PAD), bf16)
                        gx = T.alloc_fragment((BT, BK), "float32")
                        dsq = sh.tile((BT,), "float32")
                        sh.copy(X[row0, col0], x)
                        sh.copy(DHI[row0, 0], dhi)
                        sh.copy(DLO[row0, 0], dlo)
                        sh.copy(DSQ[row0], dsq)
                        fn_grad_cuda(x, dhi, dlo, fg, tb == 0)
                        x_grad_products_matrix_unit(dhi, dlo, hi, lo, gx, False)
                        x_grad_cuda(x, xg, gx, dsq)
                    else:
                        x = sh.tile((BT, BK), bf16)
                        dhi = sh.tile((BT, N_PAD), bf16)
                        dlo = sh.tile((BT, N_PAD), bf16)
                        d = sh.tile((BT, N_PAD), "float32")
                        dsq = sh.tile((BT,), "float32")
                        sh.copy(XV[row0, col0], x)
                        sh.copy(DHI[row0, 0], dhi)
                        sh.copy(DLO[row0, 0], dlo)
                        sh.copy(DSQ[row0], dsq)
                        operand_loop_nest(dhi, dlo, d, BT, N_PAD)
                        fn_grad_loop_nest(x, d, fg, valid_rows)
                        x_grad_loop_nest(x, xg, d, v, dsq)
                    sh.copy(xg, XG[row0, col0])
                if sh.is_cuda:
                    T.copy(fg, FG[0, col0])
                else:
                    sh.copy(fg, FG[0, col0])

    return gemm_bwd_kernel


def tf32_operand(src: torch.Tensor, rows: int, padded_cols: int, target: str) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 ``(hi, lo)`` of shape ``(rows, padded_cols)``: the TF32 split of fp32 ``src`` (its rows
    and columns first, zeros elsewhere)."""
    hi = torch.zeros((rows, padded_cols), dtype=torch.bfloat16, device=src.device)
    lo = torch.zeros((rows, padded_cols), dtype=torch.bfloat16, device=src.device)
    if src.numel():
        kernel = build_tf32_split.compiled(Tf32SplitSpec(), target)
        kernel(src, bit_view(hi[:src.shape[0]]), bit_view(lo[:src.shape[0]]))
    return hi, lo


def _operand_views(t: torch.Tensor, target: str) -> torch.Tensor:
    return bit_view(t) if target == "cpu" else t


def launch_fwd(call, target: str) -> None:
    """Run a validated forward call (``vmi_mhc.pre_norm_fn_gemm.GemmFwdCall``) on ``target``."""
    spec = call.spec
    num_tokens = call.x.shape[0]
    if num_tokens == 0:
        return
    hi, lo = tf32_operand(call.fn, N_PAD, spec.hidden, target)
    x, hi, lo = (_operand_views(t, target) for t in (call.x, hi, lo))
    xv = bit_view(call.x)

    def run(kernel, start: int, stop: int) -> None:
        kernel(x, xv, hi, lo, call.out_mul, call.sqrsum, start // BLOCK_T, -(-(stop - start) // BLOCK_T))

    build_gemm_fwd.launch_rows(spec, target, num_tokens, run, align=BLOCK_T)


def launch_bwd(call, target: str) -> None:
    """Run a validated backward call (``vmi_mhc.pre_norm_fn_gemm.GemmBwdCall``) on ``target``."""
    spec = call.spec
    if call.x.shape[0] == 0:
        call.fn_grad.zero_()
        return
    if fn_operand_shape(spec.hidden, target)[0] == N_PAD:
        hi, lo = tf32_operand(call.fn, N_PAD, spec.hidden, target)
    else:
        # The Ascend operand layout (K, N_PAD): the parameter transposed once per call.
        hi, lo = tf32_operand(call.fn.t().contiguous(), spec.hidden, N_PAD, target)
    # Rows padded to whole token blocks: the matrix units read d by whole blocks.
    dhi, dlo = tf32_operand(call.out_mul_grad, -(-call.x.shape[0] // BLOCK_T) * BLOCK_T, N_PAD, target)
    views = [bit_view(t) for t in (dhi, dlo, call.x, call.x_grad)]
    dhi, dlo, x, hi, lo = (_operand_views(t, target) for t in (dhi, dlo, call.x, hi, lo))

    def run(kernel, start: int, stop: int) -> None:
        kernel(dhi, dlo, views[0], views[1], call.sqrsum_grad, x, views[2], hi, lo, views[3], call.fn_grad, start,
               stop - start)

    build_gemm_bwd.launch_rows(spec, target, spec.hidden // BLOCK_K, run, min_rows=1)
