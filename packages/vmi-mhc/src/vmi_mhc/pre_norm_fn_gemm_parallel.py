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
(``j`` ascending from +0.0 on cpu). On ascend and cuda both sums are ``T.gemm`` (``dᵀ·x`` and
``d·v``, each as the hi and lo GEMMs).

The cpu order is the reference's (``vmi_mhc.reference.pre_norm_fn_gemm``), bit for bit; the
matrix units add the same exact products in their own order (see the docs page for the bound).
On cpu the forward's token blocks, and the backward's column blocks, are split across threads
(``vmi_core.cpu_parallel``).
"""

from dataclasses import dataclass

import tilelang.language as T
import torch

from vmi_core.compile import cached_kernel, kernel_source
from vmi_core.cpu_parallel import launch_rows
from vmi_core.formats import bit_view
from vmi_core.targets import require_kernel
from vmi_core.tl import formats as F
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LANES, select

from .tl import tf32

# The mix width is padded to one 32-column GEMM tile (spec §3.4.3: n3 <= 32).
N_PAD = 32
# Tokens per work tile (forward) and per step of the backward's token loop.
BLOCK_T = 32
# Columns per backward work item.
BLOCK_K = 256
# Column chunks of the forward: the largest of these dividing the split width.
CHUNKS = (256, 128, 64)
# Operand kernel tiles.
SPLIT_ROWS = 8
SPLIT_COLS = 1024


def split_chunk(split_width: int) -> int:
    """Columns per forward chunk for splits of ``split_width`` columns (a multiple of 64)."""
    return next(c for c in CHUNKS if split_width % c == 0)


@dataclass(frozen=True)
class Tf32SplitSpec:
    """The operand kernel's specialisation: ``cols`` input columns into ``padded_cols``."""

    cols: int
    padded_cols: int

    @property
    def block_cols(self) -> int:
        return min(SPLIT_COLS, -(-self.padded_cols // LANES) * LANES)


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


def _bf16_dtype(sh: Shell) -> str:
    # The matrix units take real bf16 operands; the C backend has no bf16 type (bit views).
    return "uint16" if sh.is_cpu else "bfloat16"


def build_tf32_split(spec: Tf32SplitSpec, target: str):
    """The operand kernel: ``HI, LO (R, padded_cols)`` bf16 from fp32 ``SRC (R, cols)``."""
    sh = Shell(target)
    TK = sh.T
    C, CP, BR, BC = spec.cols, spec.padded_cols, SPLIT_ROWS, spec.block_cols
    NR = TK.dynamic("NR")

    def parts(src, col0, at):
        # Columns past ``cols`` are zero operands (DMA leaves stale data there on Ascend).
        v = tf32.round_to_tf32(select(at.column() + col0 < C, at.load(src), T.float32(0)))
        hi = tf32.split_hi(v)
        return hi, tf32.split_lo(v, hi)

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
                    sh.elementwise((BR, BC), lambda at: parts(src, col0, at), (hi, lo))
                sh.copy(hi, HI[row0, col0])
                sh.copy(lo, LO[row0, col0])

    return tf32_split_kernel


def build_gemm_fwd(spec: GemmSpec, target: str):
    """The forward GEMM + square sums of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    K, N3, S, KS, BK, BT = spec.hidden, spec.mix, spec.n_splits, spec.split_width, spec.chunk, BLOCK_T
    bf16 = _bf16_dtype(sh)
    M = TK.dynamic("M")

    @T.macro
    def products_loop_nest(x, hi, lo, v, acc):
        # The chunk's operand, transposed so that the mix index runs over consecutive elements.
        for k, j in T.Parallel(BK, N_PAD):
            v[k, j] = tf32.join(hi[j, k], lo[j, k])
        for t in T.serial(BT):
            for k in T.serial(BK):
                for j in T.Parallel(N_PAD):
                    acc[t, j] = acc[t, j] + F.bf16_to_f32(x[t, k]) * v[k, j]

    @T.macro
    def square_lanes(x, sq_lanes):
        for t, lane in T.Parallel(BT, LANES):
            for c in T.serial(BK // LANES):
                sq_lanes[t, lane] = sq_lanes[t, lane] + F.bf16_to_f32(x[t, c * LANES + lane]) * F.bf16_to_f32(
                    x[t, c * LANES + lane])

    @T.macro
    def fold_lanes(sq_lanes, sq):
        for t in T.Parallel(BT):
            folded = T.alloc_local((LANES,), "float32")
            for lane in T.serial(LANES):
                folded[lane] = sq_lanes[t, lane]
            for width in (32, 16, 8, 4, 2, 1):
                for lane in T.serial(width):
                    folded[lane] = folded[2 * lane] + folded[2 * lane + 1]
            sq[t] = folded[0]

    @TK.prim_func
    def gemm_fwd_kernel(X: TK.Tensor((M, K), bf16), HI: TK.Tensor((N_PAD, K), bf16),
                        LO: TK.Tensor((N_PAD, K), bf16), OUT: TK.Tensor((S, M, N3), "float32"),
                        SQ: TK.Tensor((S, M), "float32"), first_block: TK.int32, num_blocks: TK.int32):
        with sh.persistent_kernel() as worker:
            for tb, s in sh.tiles([num_blocks, S], worker):
                row0 = T.alloc_var("int32")
                row0 = (first_block + tb) * BT
                x = sh.tile((BT, BK), bf16)
                hi = sh.tile((N_PAD, BK), bf16)
                lo = sh.tile((N_PAD, BK), bf16)
                v = sh.tile((BK, N_PAD), "float32")
                acc = sh.tile((BT, N_PAD), "float32")
                sq_lanes = sh.tile((BT, LANES), "float32")
                sq = sh.tile((BT,), "float32")
                for t, j in T.Parallel(BT, N_PAD):
                    acc[t, j] = T.float32(0)
                for t, lane in T.Parallel(BT, LANES):
                    sq_lanes[t, lane] = T.float32(0)
                for kc in T.serial(KS // BK):
                    col0 = T.alloc_var("int32")
                    col0 = s * KS + kc * BK
                    sh.copy(X[row0, col0], x)
                    sh.copy(HI[0, col0], hi)
                    sh.copy(LO[0, col0], lo)
                    products_loop_nest(x, hi, lo, v, acc)
                    square_lanes(x, sq_lanes)
                fold_lanes(sq_lanes, sq)
                sh.copy(acc, OUT[s, row0, 0])
                sh.copy(sq, SQ[s, row0])

    return gemm_fwd_kernel


def build_gemm_bwd(spec: GemmSpec, target: str):
    """The backward GEMMs of ``spec`` for ``target`` (column-owned work items)."""
    sh = Shell(target)
    TK = sh.T
    K, N3, BT, BK = spec.hidden, spec.mix, BLOCK_T, BLOCK_K
    bf16 = _bf16_dtype(sh)
    M = TK.dynamic("M")

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
    def x_grad_loop_nest(x, xg, d, v, dsq, g, out):
        for t in T.serial(BT):
            for k in T.Parallel(BK):
                g[k] = T.float32(0)
            for j in T.serial(N3):
                for k in T.Parallel(BK):
                    g[k] = g[k] + d[t, j] * v[j, k]
            for k in T.Parallel(BK):
                out[t, k] = F.f32_to_bf16((F.bf16_to_f32(xg[t, k]) + g[k])
                                          + (F.bf16_to_f32(x[t, k]) + F.bf16_to_f32(x[t, k])) * dsq[t])

    @TK.prim_func
    def gemm_bwd_kernel(DHI: TK.Tensor((M, N_PAD), bf16), DLO: TK.Tensor((M, N_PAD), bf16),
                        DSQ: TK.Tensor((M,), "float32"), X: TK.Tensor((M, K), bf16),
                        HI: TK.Tensor((N_PAD, K), bf16), LO: TK.Tensor((N_PAD, K), bf16),
                        XG: TK.Tensor((M, K), bf16), FG: TK.Tensor((N3, K), "float32"),
                        first_block: TK.int32, num_blocks: TK.int32):
        with sh.persistent_kernel() as worker:
            for cb in sh.tiles([num_blocks], worker):
                col0 = T.alloc_var("int32")
                col0 = (first_block + cb) * BK
                hi = sh.tile((N_PAD, BK), bf16)
                lo = sh.tile((N_PAD, BK), bf16)
                v = sh.tile((N_PAD, BK), "float32")
                fg = sh.tile((N_PAD, BK), "float32")
                g = sh.tile((BK,), "float32")
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
                    x = sh.tile((BT, BK), bf16)
                    xg = sh.tile((BT, BK), bf16)
                    dhi = sh.tile((BT, N_PAD), bf16)
                    dlo = sh.tile((BT, N_PAD), bf16)
                    d = sh.tile((BT, N_PAD), "float32")
                    dsq = sh.tile((BT,), "float32")
                    out = sh.tile((BT, BK), bf16)
                    sh.copy(X[row0, col0], x)
                    sh.copy(XG[row0, col0], xg)
                    sh.copy(DHI[row0, 0], dhi)
                    sh.copy(DLO[row0, 0], dlo)
                    sh.copy(DSQ[row0], dsq)
                    operand_loop_nest(dhi, dlo, d, BT, N_PAD)
                    fn_grad_loop_nest(x, d, fg, valid_rows)
                    x_grad_loop_nest(x, xg, d, v, dsq, g, out)
                    sh.copy(out, XG[row0, col0])
                sh.copy(fg, FG[0, col0])

    return gemm_bwd_kernel


# The SIMD regions are explicit vector code.
KERNEL_CONFIG = {"simd_parallel": False}


def tf32_split_source(spec: Tf32SplitSpec, target: str) -> str:
    """Generated source of the operand kernel of ``spec`` for ``target`` (no hardware needed)."""
    return kernel_source(build_tf32_split, spec, target, **KERNEL_CONFIG)


def gemm_fwd_source(spec: GemmSpec, target: str) -> str:
    """Generated source of the forward kernel of ``spec`` for ``target`` (no hardware needed)."""
    return kernel_source(build_gemm_fwd, spec, target, **KERNEL_CONFIG)


def gemm_bwd_source(spec: GemmSpec, target: str) -> str:
    """Generated source of the backward kernel of ``spec`` for ``target`` (no hardware needed)."""
    return kernel_source(build_gemm_bwd, spec, target, **KERNEL_CONFIG)


def tf32_operand(src: torch.Tensor, rows: int, padded_cols: int, target: str) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 ``(hi, lo)`` of shape ``(rows, padded_cols)``: the TF32 split of fp32 ``src`` (its rows
    and columns first, zeros elsewhere)."""
    hi = torch.zeros((rows, padded_cols), dtype=torch.bfloat16, device=src.device)
    lo = torch.zeros((rows, padded_cols), dtype=torch.bfloat16, device=src.device)
    if src.numel():
        kernel = cached_kernel(build_tf32_split, Tf32SplitSpec(src.shape[1], padded_cols), target, **KERNEL_CONFIG)
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
    kernel = cached_kernel(build_gemm_fwd, spec, target, **KERNEL_CONFIG)
    x, hi, lo = (_operand_views(t, target) for t in (call.x, hi, lo))

    def run(start: int, stop: int) -> None:
        kernel(x, hi, lo, call.out_mul, call.sqrsum, start // BLOCK_T, -(-(stop - start) // BLOCK_T))

    launch_rows(target, run, num_tokens, align=BLOCK_T)


def launch_bwd(call, target: str) -> None:
    """Run a validated backward call (``vmi_mhc.pre_norm_fn_gemm.GemmBwdCall``) on ``target``."""
    spec = call.spec
    if call.x.shape[0] == 0:
        call.fn_grad.zero_()
        return
    hi, lo = tf32_operand(call.fn, N_PAD, spec.hidden, target)
    dhi, dlo = tf32_operand(call.out_mul_grad, call.x.shape[0], N_PAD, target)
    kernel = cached_kernel(build_gemm_bwd, spec, target, **KERNEL_CONFIG)
    dhi, dlo, x, hi, lo, xg = (_operand_views(t, target) for t in (dhi, dlo, call.x, hi, lo, call.x_grad))

    def run(start: int, stop: int) -> None:
        kernel(dhi, dlo, call.sqrsum_grad, x, hi, lo, xg, call.fn_grad, start, stop - start)

    launch_rows(target, run, spec.hidden // BLOCK_K, min_rows=1)


def mhc_pre_norm_fn_gemm_fwd_parallel(x: torch.Tensor, fn: torch.Tensor, out_mul_splitted: torch.Tensor | None,
                                      sqrsum_splitted: torch.Tensor | None, n_splits: int = 1, *,
                                      target: str | None = None, flavor: str | None = None
                                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``mhc_pre_norm_fn_gemm_fwd`` that always runs the parallel kernels.

    Same arguments, returns and errors as ``mhc_pre_norm_fn_gemm_fwd``, except for ``target``.

    Args:
        target: As for ``mhc_pre_norm_fn_gemm_fwd``, except that the reference ``"torch"`` is
            refused (also when it comes from ``$VMI_TARGET`` or from a meta x): this entry point
            always runs the kernels.

    Returns:
        ``(out_mul_splitted, sqrsum_splitted)``, as ``mhc_pre_norm_fn_gemm_fwd`` returns them.

    Raises:
        ValueError: The target resolves to ``"torch"``; and everything ``mhc_pre_norm_fn_gemm_fwd``
            raises.
    """
    # The dispatch module imports this one; by call time both are loaded.
    from .pre_norm_fn_gemm import mhc_pre_norm_fn_gemm_fwd

    require_kernel("mhc_pre_norm_fn_gemm_fwd_parallel", x, target)
    return mhc_pre_norm_fn_gemm_fwd(x, fn, out_mul_splitted, sqrsum_splitted, n_splits, target=target, flavor=flavor)


def mhc_pre_norm_fn_gemm_bwd_parallel(out_mul_grad: torch.Tensor, sqrsum_grad: torch.Tensor, x: torch.Tensor,
                                      fn: torch.Tensor, x_grad: torch.Tensor, fn_grad: torch.Tensor | None, *,
                                      target: str | None = None, flavor: str | None = None
                                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``mhc_pre_norm_fn_gemm_bwd`` that always runs the parallel kernels.

    Same arguments, returns and errors as ``mhc_pre_norm_fn_gemm_bwd``, except for ``target``.

    Args:
        target: As for ``mhc_pre_norm_fn_gemm_bwd``, except that the reference ``"torch"`` is
            refused (also when it comes from ``$VMI_TARGET`` or from a meta x): this entry point
            always runs the kernels.

    Returns:
        ``(x_grad, fn_grad)``, as ``mhc_pre_norm_fn_gemm_bwd`` returns them.

    Raises:
        ValueError: The target resolves to ``"torch"``; and everything ``mhc_pre_norm_fn_gemm_bwd``
            raises.
    """
    from .pre_norm_fn_gemm import mhc_pre_norm_fn_gemm_bwd

    require_kernel("mhc_pre_norm_fn_gemm_bwd_parallel", x, target)
    return mhc_pre_norm_fn_gemm_bwd(out_mul_grad, sqrsum_grad, x, fn, x_grad, fn_grad, target=target, flavor=flavor)
