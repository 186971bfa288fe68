"""``norm_backward`` (RMSNorm backward) as two parallel-style TileLang kernels for ascend, cuda and cpu.

**Row kernel.** Work tiles of ``block_m`` whole rows (``block_rows``) go round-robin to persistent
workers. Every worker first loads the weight and zeroes its fp32 partial row of the weight
gradient; per tile:

1. DMA the tile's rows of ``x``, ``out_grad`` (and ``residual_out_grad``) and their ``rstd``;
2. per row, ``dot = Σ xh · g`` in vmi's fixed lane order (``Shell.row_sum``), with
   ``xh = f32(x) · rstd``, ``d = f32(out_grad) · f32(out_scale)``, ``g = d · f32(w)``;
3. per element, ``dx = (g − xh · m) · rstd [+ f32(residual_out_grad)]`` with
   ``m = dot · f32(1/H)`` (``ascend`` flavor) or ``dot / H`` (``cuda`` flavor), rounded to x's
   dtype and stored by DMA;
4. per column, the worker's partial adds ``xh · d`` of the tile's valid rows in increasing order.

After its last tile each worker stores its partial row to ``workspace[worker]``; the tile
``t`` is the worker ``t mod P``'s, so the rows of every partial are known from ``(T, block_m, P)``
(``row_partials``). Every product and sum is one rounded fp32 operation (no FMA).

**Reduction kernel.** Persistent workers take ``REDUCE_BLOCK``-column tiles of the
``(P, H)`` workspace and add the ``P`` partials in order ``0 .. P-1`` from +0.0, then
``f32(weight_grad)``, and store the sum rounded to ``weight_grad``'s dtype in place. The
result is deterministic for a given ``P``.

On ``cpu`` a call's rows are split into ranges across threads (``vmi_core.cpu_parallel``); each
range runs the row kernel as one worker with its own workspace row, so there ``P`` is the
thread count and the partials are the ranges. On Ascend the row and column phases run as
explicit vector code (SIMD regions); per-row values (``rstd``, ``dot``) reach the lanes of a
row by a register gather (``vmi_core.tl.vector.ChunkAt.group``).
"""

from dataclasses import dataclass

import tilelang.language as T
import torch

from vmi_core.compile import cached_kernel, kernel_source
from vmi_core.cpu_parallel import MIN_ROWS_PER_THREAD, cpu_threads, launch_rows, row_ranges
from vmi_core.formats import bit_view
from vmi_core.targets import get_flavor, lowering_target, require_kernel
from vmi_core.tl import formats as F
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LANES, LaneVar, Vec, select
from vmi_core.tl.vector import ChunkAt, ElementAt, decode, phase_barrier, store

from .kernel_common import KERNEL_DTYPE

# Hidden sizes: multiples of ALIGN up to MAX_HIDDEN (tiles hold whole 64-lane registers: rows
# are padded to a multiple of LANES on chip and the padding is masked).
ALIGN = 32
MAX_HIDDEN = 8192
# Bytes of one input tile (x, out_grad, residual_out_grad, x_grad): rows per tile follow from it.
TILE_BYTES = 16384
MAX_BLOCK_M = 8
# Columns per tile of the reduction kernel.
REDUCE_BLOCK = LANES
# Workspace rows per on-chip tile of the reduction kernel.
REDUCE_ROWS = 64
# Ascend unified-buffer budget of the row kernel with SIMD regions only (spec §0.1).
UB_BYTES = 248 * 1024
_BYTES = {"bf16": 2, "fp32": 4}


def padded_hidden(hidden: int) -> int:
    return -(-hidden // LANES) * LANES


def block_rows(in_fmt: str, hidden: int) -> int:
    """Rows per work tile: as many as fit ``TILE_BYTES`` (at least 1, at most ``MAX_BLOCK_M``)."""
    return max(1, min(MAX_BLOCK_M, TILE_BYTES // (padded_hidden(hidden) * _BYTES[in_fmt])))


def num_workers(target: str) -> int:
    """Partial rows of the weight gradient on ``target``: its persistent workers, or on ``cpu``
    the most row ranges a call is split into (one per thread)."""
    if target == "cpu":
        return cpu_threads()
    return Shell(lowering_target(target)).workers


@dataclass(frozen=True)
class NormBackwardSpec:
    """Everything the row kernel is specialised on (the token count and row strides are runtime
    values). ``workers``: partial rows of the workspace (``num_workers``)."""

    in_fmt: str
    hidden: int
    has_weight: bool
    has_residual_grad: bool
    out_scale: float
    flavor: str
    workers: int

    @property
    def block_m(self) -> int:
        return block_rows(self.in_fmt, self.hidden)


@dataclass(frozen=True)
class WeightGradReduceSpec:
    """Everything the reduction kernel is specialised on."""

    hidden: int
    workers: int
    out_fmt: str


def _buffer_versions(spec: NormBackwardSpec) -> int:
    """2 (DMA overlaps compute) when the double-buffered tiles fit the Ascend UB, else 1."""
    hp, bm = padded_hidden(spec.hidden), spec.block_m
    io_tiles = 3 + spec.has_residual_grad
    fixed = hp * 4 + hp * _BYTES[spec.in_fmt] + 2 * (bm + LANES) * 4 + hp * 4
    return 2 if fixed + 2 * io_tiles * bm * hp * _BYTES[spec.in_fmt] <= UB_BYTES else 1


def zero(at):
    """+0.0 in the lane(s) at ``at``."""
    return Vec.splat(0.0, "float32") if at.vector else T.float32(0)


def build_norm_backward(spec: NormBackwardSpec, target: str):
    """The row kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target, workers=1 if target == "cpu" else spec.workers)
    TK = sh.T
    H, HP, BM = spec.hidden, padded_hidden(spec.hidden), spec.block_m
    in_fmt, in_dtype = spec.in_fmt, KERNEL_DTYPE[spec.in_fmt]
    ascend_flavor = get_flavor(spec.flavor).name == "ascend"
    inv_hidden = F.f32_const(1.0 / H)
    out_scale = F.f32_const(spec.out_scale)

    M = TK.dynamic("M")
    NP = TK.dynamic("NP")
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

    def grad(xh, d, w, at):
        return d * weight_value(w, at) if spec.has_weight else d

    def dot_term(x, og, w, rstd, at):
        xh, d = xh_and_d(x, og, rstd, at)
        return masked(at, xh * grad(xh, d, w, at))

    def x_grad(x, og, rog, w, rstd, dot, at):
        xh, d = xh_and_d(x, og, rstd, at)
        g = grad(xh, d, w, at)
        m = row_value(dot, at) * inv_hidden if ascend_flavor else row_value(dot, at) / T.float32(H)
        dx = (g - xh * m) * row_value(rstd, at)
        if spec.has_residual_grad:
            dx = dx + decode(in_fmt, at, rog)
        return F.f32_to_bf16(dx) if in_fmt == "bf16" else dx

    @T.macro
    def weight_partial_lanes(x, og, rstd, partial, valid_rows):
        # One lane per column, the tile's rows in order in a per-lane scalar (partial is stored
        # once: see the shell's note on barriers in thread-guarded loops).
        for j in T.Parallel(HP):
            running = T.alloc_var("float32")
            running = partial[j]
            for r in T.serial(valid_rows):
                xh, d = xh_and_d(x, og, rstd, ElementAt((r,), j))
                running = running + masked(ElementAt((r,), j), xh * d)
            partial[j] = running

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
    def rows(x, og, rog, w, rstd, dot, dx, partial, valid_rows):
        sh.row_sum(dot, (BM, HP), lambda at: dot_term(x, og, w, rstd, at))
        sh.elementwise((BM, HP), lambda at: x_grad(x, og, rog, w, rstd, dot, at), dx)
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
        WS: TK.Tensor((NP, HP), "float32"),
        x_stride: TK.int32, og_stride: TK.int32, rog_stride: TK.int32,
    ):
        with sh.persistent_kernel() as worker:
            w = sh.tile((HP,), in_dtype)
            partial = sh.tile((HP,), "float32")
            if spec.has_weight:
                sh.copy(W[0], w)
                with sh.vector(SIMD):
                    sh.elementwise((HP,), zero, partial)
            for tm in sh.tiles([T.ceildiv(M, BM)], worker):
                # Scalars, not let bindings: TileLang would inline the index math into every access.
                row0 = T.alloc_var("int32")
                valid_rows = T.alloc_var("int32")
                row0 = tm * BM
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
                sh.copy(partial, WS[worker, 0])

    return norm_backward_kernel


def build_weight_grad_reduce(spec: WeightGradReduceSpec, target: str):
    """The reduction kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    H, HP, P, BK = spec.hidden, padded_hidden(spec.hidden), spec.workers, REDUCE_BLOCK
    PR = min(P, REDUCE_ROWS)
    out_fmt, out_dtype = spec.out_fmt, KERNEL_DTYPE[spec.out_fmt]

    @T.macro
    def add_rows_lanes(parts, total, n):
        for j in T.Parallel(BK):
            running = T.alloc_var("float32")
            running = total[j]
            for p in T.serial(n):
                running = running + parts[p, j]
            total[j] = running

    @T.macro
    def add_rows_registers(parts, total, n):
        running = LaneVar(True, "float32", ChunkAt((), 0).load(total))
        for p in T.serial(n):
            running.set(running.get() + ChunkAt((p,), 0).load(parts))
        T.evaluate(store(total[0], running.get()))
        phase_barrier()

    @T.macro
    def add_chunk(WS, parts, total, k0, p0, n):
        sh.copy(WS[p0, k0], parts)
        with sh.vector(SIMD):
            if sh.in_simd:
                add_rows_registers(parts, total, n)
            else:
                add_rows_lanes(parts, total, n)

    def add_partials(WS, parts, total, k0):
        # The partials in order, PR workspace rows at a time (a few on-chip bytes however many
        # workers there are); a Python loop: the chunks are unrolled.
        for p0 in range(0, P, PR):
            add_chunk(WS, parts, total, k0, p0, min(PR, P - p0))

    def rounded(total, wg, at):
        value = at.load(total) + decode(out_fmt, at, wg)
        return F.f32_to_bf16(value) if out_fmt == "bf16" else value

    @TK.prim_func
    def weight_grad_reduce_kernel(WS: TK.Tensor((P, HP), "float32"), WG: TK.Tensor((H,), out_dtype)):
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
                add_partials(WS, parts, total, k0)
                with sh.vector(SIMD):
                    sh.elementwise((BK,), lambda at: rounded(total, wg, at), out)
                sh.copy(out, WG[k0])

    return weight_grad_reduce_kernel


# Both kernels' SIMD regions are explicit vector code.
KERNEL_CONFIG = {"simd_parallel": False}


def norm_backward_source(spec: NormBackwardSpec, target: str) -> str:
    """Generated source of the row kernel of ``spec`` for ``target`` (no hardware needed)."""
    return kernel_source(build_norm_backward, spec, target, **KERNEL_CONFIG)


def weight_grad_reduce_source(spec: WeightGradReduceSpec, target: str) -> str:
    """Generated source of the reduction kernel of ``spec`` for ``target`` (no hardware needed)."""
    return kernel_source(build_weight_grad_reduce, spec, target, **KERNEL_CONFIG)


def cpu_row_ranges(num_rows: int, spec: NormBackwardSpec) -> list[tuple[int, int]]:
    """The row ranges a ``cpu`` call runs on its threads, one workspace row each."""
    return row_ranges(num_rows, spec.workers, spec.block_m, MIN_ROWS_PER_THREAD)


def row_partials(num_rows: int, spec: NormBackwardSpec, target: str) -> torch.Tensor:
    """int64 ``(num_rows,)``: the workspace row (partial sum) each row's ``xh · d`` goes to.

    ``cpu``: the index of the row's range (``cpu_row_ranges``); elsewhere the worker of the row's
    tile, ``(row // block_m) mod workers``. Within a partial the rows are added in increasing order.
    """
    rows = torch.arange(num_rows)
    if target == "cpu":
        stops = torch.tensor([stop for _, stop in cpu_row_ranges(num_rows, spec)])
        return torch.bucketize(rows, stops, right=True)
    return rows // spec.block_m % spec.workers


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_quant.norm_backward.NormBackwardCall``) on ``target``."""
    spec = call.spec
    num_rows = call.x.shape[0]
    if num_rows == 0:
        return
    kernel = cached_kernel(build_norm_backward, spec, target, **KERNEL_CONFIG)
    x, og, dx = bit_view(call.x), bit_view(call.out_grad), bit_view(call.x_grad)
    rog = og if call.residual_out_grad is None else bit_view(call.residual_out_grad)
    weight = torch.zeros(spec.hidden, dtype=x.dtype) if call.weight is None else bit_view(call.weight)
    workspace = torch.zeros((spec.workers if spec.has_weight else 1, padded_hidden(spec.hidden)),
                            dtype=torch.float32, device=x.device)
    strides = (x.stride(0), og.stride(0), rog.stride(0))

    def run(start: int, stop: int, partial: int) -> None:
        kernel(x[start:stop], og[start:stop], rog[start:stop], weight, call.rstd[start:stop], dx[start:stop],
               workspace[partial:partial + 1] if target == "cpu" else workspace, *strides)

    if target == "cpu":
        ranges = cpu_row_ranges(num_rows, spec)
        index = {start: k for k, (start, _) in enumerate(ranges)}
        launch_rows(target, lambda start, stop: run(start, stop, index[start]), num_rows, align=spec.block_m)
    else:
        run(0, num_rows, 0)
    if spec.has_weight:
        reduce_spec = WeightGradReduceSpec(spec.hidden, spec.workers, KERNEL_FMT[call.weight_grad.dtype])
        reduce = cached_kernel(build_weight_grad_reduce, reduce_spec, target, **KERNEL_CONFIG)
        reduce(workspace, bit_view(call.weight_grad))


KERNEL_FMT = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def norm_backward_parallel(out_grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                           rstd: torch.Tensor, residual_out_grad: torch.Tensor | None = None,
                           out_scale: float = 1.0, weight_grad: torch.Tensor | None = None, *,
                           target: str | None = None,
                           flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``norm_backward`` that always runs the parallel kernels.

    Same arguments, returns and errors as ``norm_backward``, except for ``target``.

    Args:
        target: As for ``norm_backward``, except that the reference ``"torch"`` is refused (also
            when it comes from ``$VMI_TARGET`` or from a meta x): this entry point always runs the
            kernels.

    Returns:
        ``(x_grad, weight_grad)``, as ``norm_backward`` returns them.

    Raises:
        ValueError: The target resolves to ``"torch"``; and everything ``norm_backward`` raises.
    """
    # The dispatch module imports this one; by call time both are loaded.
    from .norm_backward import norm_backward

    require_kernel("norm_backward_parallel", x, target)
    return norm_backward(out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad, target=target,
                         flavor=flavor)
