"""``norm_fn``'s stages A, A', C and D as parallel-style TileLang kernels for ascend, cuda and cpu.

**Merge forward / backward** (stages A, A'). Column blocks of ``fn`` (``MERGE_FWD_BLOCK`` /
``MERGE_BWD_BLOCK`` columns, all ``m`` rows) go round-robin to persistent workers; a block's
columns belong to one worker, so the column sums of the backward need no cross-worker reduction.
Per block: DMA the ``(m, block)`` slabs and the ``normw`` slice in (and, backward, the current
``fn_grad`` and ``normw_grad``: they accumulate), then

* forward: ``out_fn = fn · normw`` element-wise;
* backward: ``fn_grad = fma(g, normw, fn_grad)`` element-wise, and per column
  ``normw_grad = fma(g[j], fn[j], normw_grad)`` for ``j = 0 .. m-1`` in order (64 columns a
  register on Ascend, one lane per column elsewhere);

DMA out. Column tails are clamped by the DMA (any ``K``).

**Reduce forward** (stage C). Token blocks of ``TOKEN_BLOCK`` go round-robin to persistent
workers; all splits of a block are reduced by its worker. The accumulators start at +0.0; per
split ``s`` (ascending) the ``(block, n3)`` partial products and the block's partial square sums
are DMA'd in and added (``vmi_mhc.tl.rms.split_sum``). Then, one lane per token,
``r = rms_scale(sqrsum)`` and ``out = out_mul · r``; ``out_mul``, ``sqrsum`` and ``out`` are
DMA'd out.

**Reduce backward** (stage D). Same token blocks; one lane per token: ``r`` recomputed with the
forward's ``rms_scale``, ``out_mul_grad = g · r``, ``dot = fma(g[j], out_mul[j], dot)`` for
``j = 0 .. n3-1`` in order from +0.0, ``sqrsum_grad = sqrsum_grad(dot, r, sqrsum)``.

On Ascend every phase is explicit vector code (SIMD regions): the element-wise phases as
registers of 64 elements, the per-token phases one token per lane with the columns gathered and
scattered in UB (``Shell.rowwise``), the column sums 64 columns a register; on-chip token rows are
padded to ``PADDED_MIX`` floats there (``padded_mix``), and the padding is never stored. On ``cpu``
a call's column blocks (merge) or token blocks (reduce) are split across threads
(``vmi_core.cpu_parallel``).
"""

from dataclasses import dataclass

from vmi_core.kernel import kernel
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LANES, LaneVar, fma, keep
from vmi_core.tl.vector import ChunkAt, load, phase_barrier, store

from ..tl.lanes import zero
from ..tl.rms import rms_scale, split_sum, sqrsum_grad

# Columns per work tile of the merge kernels (the backward holds three (m, block) slabs).
MERGE_FWD_BLOCK = 256
MERGE_BWD_BLOCK = 128
# Rows of fn (= n3) and entries of a mix vector the on-chip rows hold.
MAX_MIX = 32
PADDED_MIX = 32
# Tokens per work tile of the reduce kernels: one per vector lane.
TOKEN_BLOCK = LANES
# Largest split count of the reduce forward.
MAX_SPLITS = 64


@dataclass(frozen=True)
class MergeSpec:
    """What a merge kernel is specialised on: the rows ``m`` of ``fn`` (``K`` is a runtime value)."""

    rows: int


@dataclass(frozen=True)
class ReduceSpec:
    """What a reduce kernel is specialised on (the token and split counts are runtime values)."""

    mix: int
    group_size: int
    eps: float
    flavor: str


def column_value(vector_tile, at):
    """``vector_tile[column]`` for the element(s) at ``at`` of an ``(m, block)`` slab."""
    return ChunkAt((), at.col0).load(vector_tile) if at.vector else vector_tile[at.j]


def padded_mix(sh: Shell, mix: int) -> int:
    """Floats of an on-chip token row: ``PADDED_MIX`` on Ascend (whole 32-byte rows for the gathers,
    two rows a register for the element-wise adds), the mix width elsewhere (so that cpu copies
    of whole tiles take the shell's unchecked path)."""
    return PADDED_MIX if sh.is_ascend else mix


def row_value(table, at):
    """``table[row]`` of a 1-D per-token tile for the token(s) at ``at`` (one per lane)."""
    return load(table[at.row0]) if at.vector else table[at.i]


@kernel(simd_parallel=False)
def build_merge_fwd(spec: MergeSpec, target: str):
    """The merge forward's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    M, BK = spec.rows, MERGE_FWD_BLOCK
    KC = TK.dynamic("KC")
    ld = TK.dynamic("ld")

    @TK.prim_func
    def fn_normw_merge_fwd_kernel(FN: TK.StridedTensor((M, KC), (ld, 1), "float32"),
                                  NW: TK.Tensor((KC,), "float32"),
                                  OUT: TK.StridedTensor((M, KC), (ld, 1), "float32"), ld: TK.int32):
        with sh.persistent_kernel() as worker:
            for tk in sh.tiles([T.ceildiv(KC, BK)], worker):
                k0 = T.alloc_var("int32")
                k0 = tk * BK
                fn = sh.tile((M, BK), "float32")
                nw = sh.tile((BK,), "float32")
                out = sh.tile((M, BK), "float32")
                sh.buffer_versions({fn: 2, nw: 2, out: 2})
                sh.elementwise_stream([(FN[0, k0], fn), (NW[k0], nw)],
                                      lambda fn, nw, at: at.load(fn) * column_value(nw, at), [(out, OUT[0, k0])])

    return fn_normw_merge_fwd_kernel


@kernel(simd_parallel=False)
def build_merge_bwd(spec: MergeSpec, target: str):
    """The merge backward's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    M, BK = spec.rows, MERGE_BWD_BLOCK
    KC = TK.dynamic("KC")
    ld = TK.dynamic("ld")

    @T.macro
    def fn_grad(g, nw, fg):
        # In place: each element is read, then written, by the same lane.
        sh.elementwise((M, BK), lambda at: fma(at.load(g), column_value(nw, at), at.load(fg)), fg)

    @T.macro
    def normw_grad_lanes(g, fn, nwg):
        # One lane per column, the rows in order in a per-lane scalar (stored once).
        for k in T.Parallel(BK):
            running = T.alloc_var("float32")
            running = nwg[k]
            for j in T.serial(M):
                running = fma(g[j, k], fn[j, k], running)
            nwg[k] = running

    @T.macro
    def normw_grad_registers(g, fn, nwg):
        # 64 columns a register, the rows in order.
        for c in T.serial(BK // LANES):
            running = LaneVar(True, "float32", ChunkAt((), c * LANES).load(nwg))
            for j in T.serial(M):
                running.set(fma(ChunkAt((j,), c * LANES).load(g), ChunkAt((j,), c * LANES).load(fn), running.get()))
            T.evaluate(store(nwg[c * LANES], running.get()))
        phase_barrier()

    @TK.prim_func
    def fn_normw_merge_bwd_kernel(FN: TK.StridedTensor((M, KC), (ld, 1), "float32"),
                                  NW: TK.Tensor((KC,), "float32"),
                                  G: TK.StridedTensor((M, KC), (ld, 1), "float32"),
                                  FG: TK.StridedTensor((M, KC), (ld, 1), "float32"),
                                  NWG: TK.Tensor((KC,), "float32"), ld: TK.int32):
        with sh.persistent_kernel() as worker:
            for tk in sh.tiles([T.ceildiv(KC, BK)], worker):
                k0 = T.alloc_var("int32")
                k0 = tk * BK
                fn = sh.tile((M, BK), "float32")
                g = sh.tile((M, BK), "float32")
                fg = sh.tile((M, BK), "float32")
                nw = sh.tile((BK,), "float32")
                nwg = sh.tile((BK,), "float32")
                sh.buffer_versions({fn: 2, g: 2, fg: 2, nw: 2, nwg: 2})
                sh.copy(FN[0, k0], fn)
                sh.copy(G[0, k0], g)
                sh.copy(FG[0, k0], fg)
                sh.copy(NW[k0], nw)
                sh.copy(NWG[k0], nwg)
                with sh.vector(SIMD):
                    fn_grad(g, nw, fg)
                    if sh.in_simd:
                        normw_grad_registers(g, fn, nwg)
                    else:
                        normw_grad_lanes(g, fn, nwg)
                sh.copy(fg, FG[0, k0])
                sh.copy(nwg, NWG[k0])

    return fn_normw_merge_bwd_kernel


@kernel(simd_parallel=False)
def build_reduce_fwd(spec: ReduceSpec, target: str):
    """The reduce forward's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    N3, NP, BT = spec.mix, padded_mix(sh, spec.mix), TOKEN_BLOCK
    S = TK.dynamic("S")
    TT = TK.dynamic("TT")
    p_stride = TK.dynamic("p_stride")
    q_stride = TK.dynamic("q_stride")

    def scale_row(acc, sq, out, at):
        r = keep(rms_scale(row_value(sq, at), spec.group_size, spec.eps, spec.flavor))
        with T.serial(N3) as j:
            at.store(out, j, at.load(acc, j) * r)

    @T.macro
    def add_split(acc, p, sq, q):
        sh.elementwise((BT, NP), lambda at: split_sum(at.load(acc), at.load(p)), acc)
        sh.elementwise((BT,), lambda at: split_sum(at.load(sq), at.load(q)), sq)

    @T.macro
    def scale_rows(acc, sq, out):
        sh.rowwise(BT, lambda at: scale_row(acc, sq, out, at))

    @TK.prim_func
    def reduce_partials_and_rmsnorm_fwd_kernel(
        P: TK.StridedTensor((S, TT, N3), (p_stride, N3, 1), "float32"),
        Q: TK.StridedTensor((S, TT), (q_stride, 1), "float32"),
        OM: TK.Tensor((TT, N3), "float32"),
        SQ: TK.Tensor((TT,), "float32"),
        OUT: TK.Tensor((TT, N3), "float32"),
        p_stride: TK.int32, q_stride: TK.int32,
    ):
        with sh.persistent_kernel() as worker:
            for tb in sh.tiles([T.ceildiv(TT, BT)], worker):
                t0 = T.alloc_var("int32")
                t0 = tb * BT
                p = sh.tile((BT, NP), "float32")
                q = sh.tile((BT,), "float32")
                acc = sh.tile((BT, NP), "float32")
                sq = sh.tile((BT,), "float32")
                out = sh.tile((BT, NP), "float32")
                sh.buffer_versions({p: 2, q: 2})
                with sh.vector(SIMD):
                    sh.elementwise((BT, NP), zero, acc)
                    sh.elementwise((BT,), zero, sq)
                for s in T.serial(S):
                    sh.copy(P[s, t0, 0], p)
                    sh.copy(Q[s, t0], q)
                    with sh.vector(SIMD):
                        add_split(acc, p, sq, q)
                with sh.vector(SIMD):
                    scale_rows(acc, sq, out)
                sh.copy(acc, OM[t0, 0])
                sh.copy(sq, SQ[t0])
                sh.copy(out, OUT[t0, 0])

    return reduce_partials_and_rmsnorm_fwd_kernel


@kernel(simd_parallel=False)
def build_reduce_bwd(spec: ReduceSpec, target: str):
    """The reduce backward's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    N3, NP, BT = spec.mix, padded_mix(sh, spec.mix), TOKEN_BLOCK
    TT = TK.dynamic("TT")

    def token_grads(g, om, sq, dom, dsq, at):
        sqrsum = keep(row_value(sq, at))
        r = keep(rms_scale(sqrsum, spec.group_size, spec.eps, spec.flavor))
        dot = LaneVar(at.vector, "float32", 0.0)
        with T.serial(N3) as j:
            gj = keep(at.load(g, j))
            dot.set(fma(gj, at.load(om, j), dot.get()))
            at.store(dom, j, gj * r)
        at.store_row_value(dsq, sqrsum_grad(dot.get(), r, sqrsum, spec.group_size, spec.eps, spec.flavor))

    @T.macro
    def token_rows(g, om, sq, dom, dsq):
        sh.rowwise(BT, lambda at: token_grads(g, om, sq, dom, dsq, at))

    @TK.prim_func
    def reduce_partials_and_rmsnorm_bwd_kernel(
        G: TK.Tensor((TT, N3), "float32"),
        OM: TK.Tensor((TT, N3), "float32"),
        SQ: TK.Tensor((TT,), "float32"),
        DOM: TK.Tensor((TT, N3), "float32"),
        DSQ: TK.Tensor((TT,), "float32"),
    ):
        with sh.persistent_kernel() as worker:
            for tb in sh.tiles([T.ceildiv(TT, BT)], worker):
                t0 = T.alloc_var("int32")
                t0 = tb * BT
                g = sh.tile((BT, NP), "float32")
                om = sh.tile((BT, NP), "float32")
                sq = sh.tile((BT,), "float32")
                dom = sh.tile((BT, NP), "float32")
                dsq = sh.tile((BT,), "float32")
                sh.buffer_versions({g: 2, om: 2, sq: 2, dom: 2, dsq: 2})
                sh.copy(G[t0, 0], g)
                sh.copy(OM[t0, 0], om)
                sh.copy(SQ[t0], sq)
                with sh.vector(SIMD):
                    token_rows(g, om, sq, dom, dsq)
                sh.copy(dom, DOM[t0, 0])
                sh.copy(dsq, DSQ[t0])

    return reduce_partials_and_rmsnorm_bwd_kernel


def launch_merge_fwd(call, target: str) -> None:
    """Run a validated merge forward call (``vmi_mhc.norm_fn.MergeFwdCall``) on ``target``."""
    fn, normw, out_fn = call.fn, call.normw, call.out_fn

    def run(kernel, start: int, stop: int) -> None:
        kernel(fn[:, start:stop], normw[start:stop], out_fn[:, start:stop], fn.stride(0))

    build_merge_fwd.launch_rows(call.spec, target, fn.shape[1], run, align=MERGE_FWD_BLOCK,
                                min_rows=16 * MERGE_FWD_BLOCK)


def launch_merge_bwd(call, target: str) -> None:
    """Run a validated merge backward call (``vmi_mhc.norm_fn.MergeBwdCall``) on ``target``."""
    fn, normw, g, fn_grad, normw_grad = call.fn, call.normw, call.out_fn_grad, call.fn_grad, call.normw_grad

    def run(kernel, start: int, stop: int) -> None:
        kernel(fn[:, start:stop], normw[start:stop], g[:, start:stop], fn_grad[:, start:stop],
               normw_grad[start:stop], fn.stride(0))

    build_merge_bwd.launch_rows(call.spec, target, fn.shape[1], run, align=MERGE_BWD_BLOCK,
                                min_rows=16 * MERGE_BWD_BLOCK)


def launch_reduce_fwd(call, target: str) -> None:
    """Run a validated reduce forward call (``vmi_mhc.norm_fn.ReduceFwdCall``) on ``target``."""
    partials, partial_sqrsums = call.out_mul_splitted[:, :, 0], call.sqrsum_splitted[:, :, 0]
    out_mul, sqrsum, out = call.out_mul[:, 0], call.sqrsum[:, 0], call.out

    def run(kernel, start: int, stop: int) -> None:
        kernel(partials[:, start:stop], partial_sqrsums[:, start:stop], out_mul[start:stop], sqrsum[start:stop],
               out[start:stop], partials.stride(0), partial_sqrsums.stride(0))

    build_reduce_fwd.launch_rows(call.spec, target, out.shape[0], run, align=TOKEN_BLOCK)


def launch_reduce_bwd(call, target: str) -> None:
    """Run a validated reduce backward call (``vmi_mhc.norm_fn.ReduceBwdCall``) on ``target``."""
    out_grad, out_mul, sqrsum = call.out_grad, call.out_mul[:, 0], call.sqrsum[:, 0]
    d_out_mul, d_sqrsum = call.out_mul_grad[:, 0], call.sqrsum_grad[:, 0]

    def run(kernel, start: int, stop: int) -> None:
        kernel(out_grad[start:stop], out_mul[start:stop], sqrsum[start:stop], d_out_mul[start:stop],
               d_sqrsum[start:stop])

    build_reduce_bwd.launch_rows(call.spec, target, out_grad.shape[0], run, align=TOKEN_BLOCK)
