"""``pre_apply_mix`` as two parallel-style TileLang kernels for ascend, cuda and cpu.

**Forward.** Work tiles of one token and ``BLOCK_H`` hidden columns go round-robin to persistent
workers (the hidden tiles of a token on consecutive iterations of one worker); the token count and
hidden size are runtime values, one compiled kernel per ``(n, flavor)``. Per tile: DMA the token's
``n`` mix weights and its ``(n, BLOCK_H)`` slice of the streams in; per column the stream mix of
``vmi_mhc.tl.mix`` (the flavor's fp32 chain) rounded to bf16 once; DMA it out.

**Backward.** Work tiles are whole tokens (the reduction over ``H`` of ``mix_grad`` stays in one
worker: no cross-core reduction). One compiled kernel per ``(n, H)``. Per token: DMA ``o_grad``,
the streams ``x``, the accumulated ``x_grad`` and the mix weights in; then

1. ``mix_grad[m] = Σ_h o_grad · x[m]`` per stream in vmi's fixed 64-lane order (``Shell.row_sum``
   with the products fused into the partials; columns past ``H`` enter as +0 · +0);
2. ``x_grad[m] = bf16(fma(mix[m], o_grad, x_grad[m]))`` per element, in place in the tile;

and DMA ``x_grad`` and ``mix_grad`` out. The token's whole row lives on chip, which bounds ``H``
by the Ascend unified buffer and a cuda block's shared memory (``max_hidden``).

On Ascend every phase is explicit vector code in a SIMD region: bf16 lanes widened by the loads
and packed by the stores, a stream's weight broadcast to the lanes of its row by a register
gather from a lane table (``ChunkAt.group``).
"""

from dataclasses import dataclass

from vmi_core.compile import CUDA_SHARED_LIMIT
from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LANES, fma, select

from ..tl.mix import row_at, stream_mix, stream_weight

# Hidden columns per forward work tile (as expand's: whole registers, few tail tiles).
BLOCK_H = 512
FWD_VERSIONS = 3
# Ascend unified-buffer budget of a kernel with SIMD regions only (spec §2), less a margin for
# the allocator's alignment of the small tiles.
UB_BYTES = 248 * 1024 - 1024


def padded_hidden(hidden: int) -> int:
    return -(-hidden // LANES) * LANES


def bwd_token_bytes(mhc_mult: int, hidden: int) -> int:
    """Unified-buffer bytes of one version of the backward's per-token tiles: ``o_grad``, ``x``
    and ``x_grad`` rows (bf16, padded to whole registers), the mix lane table and ``mix_grad``."""
    return 2 * padded_hidden(hidden) * (1 + 2 * mhc_mult) + 4 * (mhc_mult + LANES) + 4 * mhc_mult


# A cuda block's shared memory, less a margin for the alignment of the tiles in it.
CUDA_SHARED_BYTES = CUDA_SHARED_LIMIT - 2048


def max_hidden(mhc_mult: int) -> int:
    """The largest hidden size whose backward token row fits on chip once, on every target: in the
    Ascend unified buffer and in a cuda block's shared memory (which also holds the row sums'
    64-lane partials)."""
    fixed = 4 * (2 * mhc_mult + LANES)
    hidden = min(UB_BYTES - fixed, CUDA_SHARED_BYTES - fixed - 4 * LANES * mhc_mult) // (2 * (1 + 2 * mhc_mult))
    return hidden // LANES * LANES


def bwd_versions(mhc_mult: int, hidden: int) -> int:
    """Buffer versions of the backward's tiles: 3, else 2 (DMA overlaps compute) where they fit."""
    return next((v for v in (3, 2) if v * bwd_token_bytes(mhc_mult, hidden) <= UB_BYTES), 1)


@dataclass(frozen=True)
class PreApplyMixFwdSpec:
    """Everything a forward kernel is specialised on (token count and hidden size are runtime)."""

    mhc_mult: int
    flavor: str


@dataclass(frozen=True)
class PreApplyMixBwdSpec:
    """Everything a backward kernel is specialised on (the token count is runtime). Both flavors
    compute the same bits."""

    mhc_mult: int
    hidden: int


@kernel(simd_parallel=False)
def build_pre_apply_mix_fwd(spec: PreApplyMixFwdSpec, target: str):
    """The forward kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    n, BH = spec.mhc_mult, BLOCK_H
    M = TK.dynamic("M")
    H = TK.dynamic("H")

    def mixed(x, mix, at):
        weights = [stream_weight(mix, at, m) for m in range(n)]
        streams = [F.bf16_to_f32(row_at(at, m).load(x)) for m in range(n)]
        return F.f32_to_bf16(stream_mix(spec.flavor, weights, streams))

    @T.macro
    def apply_mix(x, mix, o):
        sh.elementwise((BH,), lambda at: mixed(x, mix, at), o)

    @TK.prim_func
    def pre_apply_mix_fwd_kernel(X: TK.Tensor((M, n, H), "uint16"), MIX: TK.Tensor((M, n), "float32"),
                                 O: TK.Tensor((M, H), "uint16")):
        with sh.persistent_kernel() as worker:
            for t, th in sh.tiles([M, T.ceildiv(H, BH)], worker, group_size=T.ceildiv(H, BH)):
                # Scalars, not let bindings: TileLang would inline the index math into every access.
                h0 = T.alloc_var("int32")
                h0 = th * BH
                mix = sh.lane_table(n, "float32")
                x = sh.tile((n, BH), "uint16")
                o = sh.tile((BH,), "uint16")
                sh.buffer_versions({mix: FWD_VERSIONS, x: FWD_VERSIONS, o: FWD_VERSIONS})
                sh.copy(MIX[t, 0], mix)
                sh.copy(X[t, 0, h0], x)
                with sh.vector(SIMD):
                    apply_mix(x, mix, o)
                sh.copy(o, O[t, h0])

    return pre_apply_mix_fwd_kernel


@kernel(simd_parallel=False)
def build_pre_apply_mix_bwd(spec: PreApplyMixBwdSpec, target: str):
    """The backward kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    n, H, HP = spec.mhc_mult, spec.hidden, padded_hidden(spec.hidden)
    versions = bwd_versions(n, H)
    M = TK.dynamic("M")

    def masked(at, value):
        # Columns past H hold zeros (cpu) or stale data (Ascend DMA): keep them out of the sums.
        return value if H == HP else select(at.column() < H, value, T.float32(0))

    def mix_grad_term(og, x, at):
        return (masked(at, F.bf16_to_f32(row_at(at).load(og))), masked(at, F.bf16_to_f32(at.load(x))))

    def x_grad(og, xg, mix, at):
        grad = fma(stream_weight(mix, at, at.head[0]), F.bf16_to_f32(row_at(at).load(og)), F.bf16_to_f32(at.load(xg)))
        return F.f32_to_bf16(grad)

    @T.macro
    def token(og, x, xg, mix, mix_grad):
        sh.row_sum(mix_grad, (n, HP), lambda at: mix_grad_term(og, x, at), fused=True)
        sh.elementwise((n, HP), lambda at: x_grad(og, xg, mix, at), xg)

    @TK.prim_func
    def pre_apply_mix_bwd_kernel(OG: TK.Tensor((M, H), "uint16"), X: TK.Tensor((M, n, H), "uint16"),
                                 MIX: TK.Tensor((M, n), "float32"), XG: TK.Tensor((M, n, H), "uint16"),
                                 MG: TK.Tensor((M, n), "float32")):
        with sh.persistent_kernel() as worker:
            for t in sh.tiles([M], worker):
                og = sh.tile((HP,), "uint16")
                x = sh.tile((n, HP), "uint16")
                xg = sh.tile((n, HP), "uint16")
                mix = sh.lane_table(n, "float32")
                mix_grad = sh.tile((n,), "float32")
                sh.buffer_versions({og: versions, x: versions, xg: versions, mix: versions, mix_grad: versions})
                sh.copy(OG[t, 0], og)
                sh.copy(X[t, 0, 0], x)
                sh.copy(XG[t, 0, 0], xg)
                sh.copy(MIX[t, 0], mix)
                with sh.vector(SIMD):
                    token(og, x, xg, mix, mix_grad)
                sh.copy(xg, XG[t, 0, 0])
                sh.copy(mix_grad, MG[t, 0])

    return pre_apply_mix_bwd_kernel


def launch_fwd(call, target: str) -> None:
    """Run a validated forward call (``vmi_mhc.pre_apply_mix.PreApplyMixFwdCall``) on ``target``."""
    x, o = bit_view(call.x), bit_view(call.o)
    build_pre_apply_mix_fwd.launch_rows(
        call.spec, target, x.shape[0],
        lambda kernel, start, stop: kernel(x[start:stop], call.mix[start:stop], o[start:stop]))


def launch_bwd(call, target: str) -> None:
    """Run a validated backward call (``vmi_mhc.pre_apply_mix.PreApplyMixBwdCall``) on ``target``:
    ``call.x_grad`` is updated in place and ``call.mix_grad`` written."""
    og, x, xg = bit_view(call.o_grad), bit_view(call.x), bit_view(call.x_grad)

    def run(kernel, start: int, stop: int) -> None:
        kernel(og[start:stop], x[start:stop], call.mix[start:stop], xg[start:stop], call.mix_grad[start:stop])

    build_pre_apply_mix_bwd.launch_rows(call.spec, target, x.shape[0], run)
