"""``norm_backward`` (RMSNorm backward) as two parallel-style TileLang kernels for ascend, cuda and cpu.

**Row kernel.** The rows are cut into *row blocks* of ``ROW_BLOCK`` consecutive rows, which go
round-robin to persistent workers; a block is ``ROW_BLOCK / block_m`` work tiles of ``block_m``
whole rows (``block_rows``). Every worker loads the weight once; per row block it zeroes an fp32
partial row of the weight gradient, and per tile:

1. DMA the tile's rows of ``x``, ``out_grad`` (and ``residual_out_grad``) and their ``rstd``;
2. per row, ``dot = Σ xh · g`` in vmi's fixed lane order (``Shell.row_sum``), with
   ``xh = f32(x) · rstd``, ``d = f32(out_grad) · f32(out_scale)``, ``g = d · f32(w)``;
3. per element, ``dx = (g − xh · m) · rstd [+ f32(residual_out_grad)]`` with
   ``m = dot · f32(1/H)`` (``ascend`` flavor) or ``dot / H`` (``cuda`` flavor), rounded to x's
   dtype and stored by DMA;
4. per column, the partial adds ``xh · d`` of the tile's rows in increasing order;

then it stores the partial to row ``b`` of a ``(ceil(T / ROW_BLOCK), H)`` fp32 workspace.

**Reduction kernel.** Persistent workers take ``REDUCE_BLOCK``-column tiles of the workspace and
add its rows in order ``0, 1, ...`` from +0.0, then ``f32(weight_grad)``, and store the sum
rounded to ``weight_grad``'s dtype in place.

Every product and sum is one rounded fp32 operation (no FMA), and the weight gradient's order
depends on ``T`` only: every target (and any worker or thread count) gives the same bits as the
reference. On ``cpu`` a call's row blocks are split across threads (``vmi_core.cpu_parallel``).
On Ascend the row and column phases run as explicit vector code (SIMD regions); per-row values
(``rstd``, ``dot``) reach the lanes of a row by a register gather (``ChunkAt.group``).
"""

from dataclasses import dataclass

import torch

from vmi_core.cpu_parallel import launch_rows
from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.targets import get_flavor
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LANES, LaneVar, Vec, select
from vmi_core.tl.vector import ChunkAt, ElementAt, decode, phase_barrier, store

from .common import KERNEL_DTYPE

# Hidden sizes: multiples of ALIGN up to MAX_HIDDEN (tiles hold whole 64-lane registers: rows
# are padded to a multiple of LANES on chip and the padding is masked).
ALIGN = 32
MAX_HIDDEN = 8192
# Bytes of one input tile (x, out_grad, residual_out_grad, x_grad): rows per tile follow from it.
TILE_BYTES = 16384
MAX_BLOCK_M = 8
# Rows per partial sum of the weight gradient (a multiple of every block_m): enough blocks to
# keep 64 workers busy from a few thousand rows on, few workspace rows (T / 32 of H floats).
ROW_BLOCK = 32
# Columns per tile of the reduction kernel, and workspace rows per on-chip tile.
REDUCE_BLOCK = LANES
REDUCE_ROWS = 64
# Ascend unified-buffer budget of the row kernel with SIMD regions only (spec §0.1).
UB_BYTES = 248 * 1024
_BYTES = {"bf16": 2, "fp32": 4}


def padded_hidden(hidden: int) -> int:
    return -(-hidden // LANES) * LANES


def block_rows(in_fmt: str, hidden: int) -> int:
    """Rows per work tile: as many as fit ``TILE_BYTES`` (at least 1, at most ``MAX_BLOCK_M``)."""
    return max(1, min(MAX_BLOCK_M, TILE_BYTES // (padded_hidden(hidden) * _BYTES[in_fmt])))


def num_row_blocks(num_rows: int) -> int:
    """Partial sums (workspace rows) of the weight gradient of ``num_rows`` rows."""
    return -(-num_rows // ROW_BLOCK)


@dataclass(frozen=True)
class NormBackwardSpec:
    """Everything the row kernel is specialised on (the token count and row strides are runtime
    values)."""

    in_fmt: str
    hidden: int
    has_weight: bool
    has_residual_grad: bool
    out_scale: float
    flavor: str

    @property
    def block_m(self) -> int:
        return block_rows(self.in_fmt, self.hidden)


@dataclass(frozen=True)
class WeightGradReduceSpec:
    """Everything the reduction kernel is specialised on."""

    hidden: int
    out_fmt: str


def _buffer_versions(spec: NormBackwardSpec) -> int:
    """Versions of the per-tile input and output tiles: 2 (DMA overlaps compute) when they fit the
    Ascend UB next to the weight, the partial row (two versions: its store overlaps the next row
    block) and the per-row tables; else 1."""
    hp, bm = padded_hidden(spec.hidden), spec.block_m
    io_tiles = 3 + spec.has_residual_grad
    fixed = hp * _BYTES[spec.in_fmt] + 2 * hp * 4 + 2 * (bm + LANES) * 4
    return 2 if fixed + 2 * io_tiles * bm * hp * _BYTES[spec.in_fmt] <= UB_BYTES else 1


def zero(at):
    """+0.0 in the lane(s) at ``at``."""
    return Vec.splat(0.0, "float32") if at.vector else T.float32(0)


@kernel(simd_parallel=False)
def build_norm_backward(spec: NormBackwardSpec, target: str):
    """The row kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    H, HP, BM = spec.hidden, padded_hidden(spec.hidden), spec.block_m
    in_fmt, in_dtype = spec.in_fmt, KERNEL_DTYPE[spec.in_fmt]
    ascend_flavor = get_flavor(spec.flavor).name == "ascend"
    inv_hidden = F.f32_const(1.0 / H)
    out_scale = F.f32_const(spec.out_scale)

    M = TK.dynamic("M")
    NB = TK.dynamic("NB")
    x_stride = TK.dynamic("x_stride")
    og_stride = TK.dynamic("og_stride")
    rog_stride = TK.dynamic("rog_stride")

    def row_value(table, at):
        """``table[row]`` in every lane of the element(s) at ``at``, from a 1-D lane table of
        per-row values: the vector form gathers it (lane ``l`` of the chunk starting at column
        ``row · LANES`` belongs to group ``row`` of size ``LANES``)."""
        if at.vector:
            return ChunkAt((), at.head[0] * LANES).group(table, LANES)
        return table[at.i]

    def weight_value(w, at):
        return decode(in_fmt, ChunkAt((), at.col0) if at.vector else ElementAt((), at.j), w)

    def xh_and_d(x, og, rstd, at):
        xh = decode(in_fmt, at, x) * row_value(rstd, at)
        d = decode(in_fmt, at, og) * out_scale
        return xh, d

    def masked(at, value):
        # Columns past H hold zeros (cpu) or stale data (Ascend DMA): keep them out of the sums.
        return value if H == HP else select(at.column() < H, value, T.float32(0))

    def grad(d, w, at):
        return d * weight_value(w, at) if spec.has_weight else d

    def dot_term(x, og, w, rstd, at):
        xh, d = xh_and_d(x, og, rstd, at)
        return masked(at, xh * grad(d, w, at))

    def x_grad(x, og, rog, w, rstd, dot, at):
        xh, d = xh_and_d(x, og, rstd, at)
        g = grad(d, w, at)
        m = row_value(dot, at) * inv_hidden if ascend_flavor else row_value(dot, at) / T.float32(H)
        dx = (g - xh * m) * row_value(rstd, at)
        if spec.has_residual_grad:
            dx = dx + decode(in_fmt, at, rog)
        return F.f32_to_bf16(dx) if in_fmt == "bf16" else dx

    @T.macro
    def weight_partial_lanes(x, og, rstd, partial, valid_rows):
        # The tile's rows in order, one lane per column: the rows outer, so that the column loop
        # runs over consecutive elements (vectorised on cpu); the loop over the rows is outside the
        # lanes' branch, so its barriers (cuda) are taken by every thread.
        for r in T.serial(valid_rows):
            for j in T.Parallel(HP):
                xh, d = xh_and_d(x, og, rstd, ElementAt((r,), j))
                partial[j] = partial[j] + masked(ElementAt((r,), j), xh * d)

    @T.macro
    def weight_partial_registers(x, og, rstd, partial, valid_rows):
        # 64 columns a register, the tile's rows in order.
        for c in T.serial(HP // LANES):
            running = LaneVar(True, "float32", ChunkAt((), c * LANES).load(partial))
            for r in T.serial(valid_rows):
                xh, d = xh_and_d(x, og, rstd, ChunkAt((r,), c * LANES))
                running.set(running.get() + masked(ChunkAt((r,), c * LANES), xh * d))
            T.evaluate(store(partial[c * LANES], running.get()))
        phase_barrier()

    @T.macro
    def x_grad_lanes(x, og, rog, w, rstd, dot, dx):
        # Row by row: the row's rstd and dot are loop invariants and the columns consecutive
        # elements (vectorised on cpu; the shell's element-wise loop flattens the tile).
        for r in T.serial(BM):
            for j in T.Parallel(HP):
                dx[r, j] = x_grad(x, og, rog, w, rstd, dot, ElementAt((r,), j))

    @T.macro
    def rows(x, og, rog, w, rstd, dot, dx, partial, valid_rows):
        sh.row_sum(dot, (BM, HP), lambda at: dot_term(x, og, w, rstd, at))
        if sh.in_simd:
            sh.elementwise((BM, HP), lambda at: x_grad(x, og, rog, w, rstd, dot, at), dx)
        else:
            x_grad_lanes(x, og, rog, w, rstd, dot, dx)
        if spec.has_weight:
            if sh.in_simd:
                weight_partial_registers(x, og, rstd, partial, valid_rows)
            else:
                weight_partial_lanes(x, og, rstd, partial, valid_rows)

    @TK.prim_func
    def norm_backward_kernel(
        X: TK.StridedTensor((M, H), (x_stride, 1), in_dtype),
        OG: TK.StridedTensor((M, H), (og_stride, 1), in_dtype),
        ROG: TK.StridedTensor((M, H), (rog_stride, 1), in_dtype),
        W: TK.Tensor((H,), in_dtype),
        RSTD: TK.Tensor((M,), "float32"),
        DX: TK.Tensor((M, H), in_dtype),
        WS: TK.Tensor((NB, HP), "float32"),
        x_stride: TK.int32, og_stride: TK.int32, rog_stride: TK.int32,
    ):
        with sh.persistent_kernel() as worker:
            w = sh.tile((HP,), in_dtype) if spec.has_weight else None
            partial = sh.tile((HP,), "float32") if spec.has_weight else None
            if spec.has_weight:
                sh.copy(W[0], w)
            for block in sh.tiles([T.ceildiv(M, ROW_BLOCK)], worker):
                # Scalars, not let bindings: TileLang would inline the index math into every access.
                num_tiles = T.alloc_var("int32")
                num_tiles = T.min(ROW_BLOCK // BM, T.ceildiv(M - block * ROW_BLOCK, BM))
                if spec.has_weight:
                    with sh.vector(SIMD):
                        sh.elementwise((HP,), zero, partial)
                for tm in T.serial(num_tiles):
                    row0 = T.alloc_var("int32")
                    valid_rows = T.alloc_var("int32")
                    row0 = block * ROW_BLOCK + tm * BM
                    valid_rows = T.min(BM, M - row0)
                    x = sh.tile((BM, HP), in_dtype)
                    og = sh.tile((BM, HP), in_dtype)
                    rog = sh.tile((BM, HP), in_dtype) if spec.has_residual_grad else None
                    rstd = sh.lane_table(BM, "float32")
                    dot = sh.lane_table(BM, "float32")
                    dx = sh.tile((BM, HP), in_dtype)
                    versions = _buffer_versions(spec)
                    sh.buffer_versions({t: versions for t in (x, og, rog, dx) if t is not None})
                    sh.copy(X[row0, 0], x)
                    sh.copy(OG[row0, 0], og)
                    if spec.has_residual_grad:
                        sh.copy(ROG[row0, 0], rog)
                    sh.copy(RSTD[row0], rstd)
                    with sh.vector(SIMD):
                        rows(x, og, rog, w, rstd, dot, dx, partial, valid_rows)
                    sh.copy(dx, DX[row0, 0])
                if spec.has_weight:
                    sh.copy(partial, WS[block, 0])

    return norm_backward_kernel


@kernel(simd_parallel=False)
def build_weight_grad_reduce(spec: WeightGradReduceSpec, target: str):
    """The reduction kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    H, HP, BK, PR = spec.hidden, padded_hidden(spec.hidden), REDUCE_BLOCK, REDUCE_ROWS
    NB = TK.dynamic("NB")
    out_fmt, out_dtype = spec.out_fmt, KERNEL_DTYPE[spec.out_fmt]

    def rounded(total, wg, at):
        value = at.load(total) + decode(out_fmt, at, wg)
        return F.f32_to_bf16(value) if out_fmt == "bf16" else value

    @T.macro
    def add_buffer(total, wg, out):
        sh.elementwise((BK,), lambda at: rounded(total, wg, at), out)

    @TK.prim_func
    def weight_grad_reduce_kernel(WS: TK.Tensor((NB, HP), "float32"), WG: TK.Tensor((H,), out_dtype)):
        with sh.persistent_kernel() as worker:
            for tk in sh.tiles([HP // BK], worker):
                k0 = T.alloc_var("int32")
                k0 = tk * BK
                parts = sh.tile((PR, BK), "float32")
                total = sh.tile((BK,), "float32")
                wg = sh.tile((BK,), out_dtype)
                out = sh.tile((BK,), out_dtype)
                sh.copy(WG[k0], wg)
                with sh.vector(SIMD):
                    sh.elementwise((BK,), zero, total)
                # The partials in order, PR workspace rows at a time.
                for chunk in T.serial(T.ceildiv(NB, PR)):
                    num_parts = T.alloc_var("int32")
                    num_parts = T.min(PR, NB - chunk * PR)
                    sh.copy(WS[chunk * PR, k0], parts)
                    with sh.vector(SIMD):
                        sh.accumulate_rows(parts, total, num_parts, BK)
                with sh.vector(SIMD):
                    add_buffer(total, wg, out)
                sh.copy(out, WG[k0])

    return weight_grad_reduce_kernel


def row_partials(num_rows: int) -> torch.Tensor:
    """int64 ``(num_rows,)``: the partial sum (workspace row) of each row's ``xh · d``, its row
    block ``row // ROW_BLOCK``; within a partial the rows are added in increasing order."""
    return torch.arange(num_rows) // ROW_BLOCK


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_quant.norm_backward.NormBackwardCall``) on ``target``."""
    spec = call.spec
    num_rows = call.x.shape[0]
    if num_rows == 0:
        return
    kernel = build_norm_backward.compiled(spec, target)
    x, og, dx = bit_view(call.x), bit_view(call.out_grad), bit_view(call.x_grad)
    rog = og if call.residual_out_grad is None else bit_view(call.residual_out_grad)
    device = x.device
    weight = torch.zeros(spec.hidden, dtype=x.dtype, device=device) if call.weight is None else bit_view(call.weight)
    blocks = num_row_blocks(num_rows) if spec.has_weight else 1
    workspace = torch.empty((blocks, padded_hidden(spec.hidden)), dtype=torch.float32, device=device)
    strides = (x.stride(0), og.stride(0), rog.stride(0))

    def run(start: int, stop: int) -> None:
        parts = workspace[start // ROW_BLOCK:num_row_blocks(stop)] if spec.has_weight else workspace
        kernel(x[start:stop], og[start:stop], rog[start:stop], weight, call.rstd[start:stop], dx[start:stop],
               parts, *strides)

    launch_rows(target, run, num_rows, align=ROW_BLOCK)
    if spec.has_weight:
        reduce_spec = WeightGradReduceSpec(spec.hidden, KERNEL_FMT[call.weight_grad.dtype])
        reduce = build_weight_grad_reduce.compiled(reduce_spec, target)
        reduce(workspace, bit_view(call.weight_grad))


KERNEL_FMT = {torch.bfloat16: "bf16", torch.float32: "fp32"}
