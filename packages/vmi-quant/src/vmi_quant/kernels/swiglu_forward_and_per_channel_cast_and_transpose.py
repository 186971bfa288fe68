"""``swiglu_forward_and_per_channel_cast_and_transpose`` as one parallel-style TileLang kernel for
ascend, cuda and cpu.

SwiGLU (``vmi_quant.swiglu_forward_parallel``'s element math) rounded to bf16, then per-channel
E4M3 quantization with one scale per channel and ``num_per_tokens`` tokens, as
``per_channel_cast`` quantizes a bf16 input. A work tile is one token block (``npt`` tokens) by
``BLOCK_K`` channels, so each channel's amax is a column reduction inside the tile; tiles go
round-robin to persistent workers. Token count, hidden size, row stride and the clamp value are
runtime values. Per tile:

1. DMA the gate and up tiles (``npt x BLOCK_K``) into on-chip tiles;
2. per element: clamp, ``silu(a) * b`` in fp32, rounded to bf16;
3. per channel: the amax of the bf16 activations over the tile's rows, sf and sf_inv;
4. per element: ``e4m3(fl32(act * sf_inv))``, into a tile of the output's orientation;
5. DMA the data tile out (at ``(k0, row0)`` of the ``(H, T)`` output when transposed) and the
   fp32 SF tile.

On Ascend, phase 2 runs in a SIMT region (its ``exp`` is a function of scalar lanes,
``vmi_core.tl.elementary``), phases 3-4 as explicit vector code in a SIMD region; with the
transpose, phase 4 writes its codes at transposed positions and runs in a SIMT region.
"""

from dataclasses import dataclass

from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.elementary import exp
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, SIMT, Shell
from vmi_core.tl.simd import LANES, LaneVar, keep, maximum
from vmi_core.tl.vector import ChunkAt, ElementAt, decode, phase_barrier, store

from .common import KERNEL_DTYPE, ScaleRule, canonical_nan, encode, scale_from_amax
from .swiglu_forward import clamp_gate_up, silu_quotient

NUM_PER_TOKENS = (32, 128)
# Channels per work tile: a multiple of the vector width; the hidden size is a multiple of 64
# (a partial last tile is cut by the DMA).
BLOCK_K = 128
TOKEN_ALIGN = 128
HIDDEN_ALIGN = 64


@dataclass(frozen=True)
class SwigluPerChannelSpec:
    """Everything the kernel is specialised on (shapes and the clamp value are runtime values)."""

    num_per_tokens: int
    rule: ScaleRule
    transpose: bool = True
    with_clamp: bool = False
    flush_division: bool = False


@kernel(simd_parallel=False, simt_8bit=True)
def build_swiglu_per_channel(spec: SwigluPerChannelSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    BM, BK = spec.num_per_tokens, BLOCK_K
    in_dtype = KERNEL_DTYPE["bf16"]

    M = TK.dynamic("M")
    XW = TK.dynamic("XW")
    NB = TK.dynamic("NB")
    x_stride = TK.dynamic("x_stride")
    out_stride = TK.dynamic("out_stride")
    H = XW // 2

    def activation(xl, xr, clamp, at):
        a, b = decode("bf16", at, xl), decode("bf16", at, xr)
        if spec.with_clamp:
            a, b = clamp_gate_up(a, b, clamp)
        # The exp stays in the fused phase, on scalar lanes (a SIMT region on Ascend): the fp32
        # (BM, BK) tiles of Shell.exp, which swiglu_forward uses, would not fit the Ascend UB beside
        # this kernel's tiles.
        a = keep(a)
        y = silu_quotient(a, exp(-a), spec.flush_division, False) * b
        return F.f32_to_bf16(canonical_nan(y))

    def channel_value(tile, at):
        """``tile[0, j]``: the per-channel value of the element at ``at``."""
        return (ChunkAt((0,), at.col0) if at.vector else ElementAt((0,), at.j)).load(tile)

    @T.macro
    def column_amax_lanes(act, amax):
        # One lane per channel, a serial max over the tile's rows in a per-lane scalar.
        for j in T.Parallel(BK):
            running = T.alloc_var("uint32")
            running = F.u32(0)
            for r in T.serial(BM):
                running = T.max(running, F.abs_bits(decode("bf16", ElementAt((r,), j), act)))
            amax[0, j] = running

    @T.macro
    def column_amax_registers(act, amax):
        # 64 channels a register: a running lane-wise vmax over the tile's rows.
        for c in T.serial(BK // LANES):
            running = LaneVar(True, "uint32", F.abs_bits(decode("bf16", ChunkAt((0,), c * LANES), act)))
            for r in T.serial(1, BM):
                running.set(maximum(running.get(), F.abs_bits(decode("bf16", ChunkAt((r,), c * LANES), act))))
            T.evaluate(store(amax[0, c * LANES], running.get()))
        phase_barrier()

    @T.macro
    def activations(xl, xr, clamp, act):
        sh.elementwise((BM, BK), lambda at: activation(xl, xr, clamp, at), act)

    @T.macro
    def scales(act, amax, sf_val, sf_inv):
        if sh.in_simd:
            column_amax_registers(act, amax)
        else:
            column_amax_lanes(act, amax)
        sh.elementwise((1, BK), lambda at: scale_from_amax(spec.rule, at.load(amax)), (sf_val, sf_inv))

    @T.macro
    def quantize(act, sf_inv, q):
        sh.elementwise((BM, BK), lambda at: encode("e4m3", decode("bf16", at, act) * channel_value(sf_inv, at)), q)

    @T.macro
    def quantize_transposed(act, sf_inv, qt):
        for j, i in T.Parallel(BK, BM):
            qt[j, i] = encode("e4m3", F.bf16_to_f32(act[i, j]) * sf_inv[0, j])

    out_shape = (XW // 2, M) if spec.transpose else (M, XW // 2)

    @TK.prim_func
    def swiglu_per_channel_kernel(
        X: TK.StridedTensor((M, XW), (x_stride, 1), in_dtype),
        OUT: TK.StridedTensor(out_shape, (out_stride, 1), "uint8"),
        SF: TK.Tensor((NB, XW // 2), "float32"),
        x_stride: TK.int32, out_stride: TK.int32, clamp: TK.float32,
    ):
        with sh.persistent_kernel() as worker:
            for tm, tk in sh.tiles([T.ceildiv(M, BM), T.ceildiv(H, BK)], worker, group_size=T.ceildiv(H, BK)):
                # Scalars, not let bindings: TileLang would inline the index math into every access.
                row0 = T.alloc_var("int32")
                k0 = T.alloc_var("int32")
                row0 = tm * BM
                k0 = tk * BK
                xl = sh.tile((BM, BK), in_dtype)
                xr = sh.tile((BM, BK), in_dtype)
                act = sh.tile((BM, BK), "uint16")
                amax = sh.tile((1, BK), "uint32")
                sf_val = sh.tile((1, BK), "float32")
                sf_inv = sh.tile((1, BK), "float32")
                q = sh.tile((BK, BM) if spec.transpose else (BM, BK), "uint8")
                sh.buffer_versions({xl: 2, xr: 2, q: 2})
                sh.copy(X[row0, k0], xl)
                sh.copy(X[row0, H + k0], xr)
                with sh.vector(SIMT):
                    activations(xl, xr, clamp, act)
                with sh.vector(SIMD):
                    scales(act, amax, sf_val, sf_inv)
                    if not spec.transpose:
                        quantize(act, sf_inv, q)
                if spec.transpose:
                    # SIMT: each code goes to its transposed position in the tile.
                    with sh.vector(SIMT):
                        quantize_transposed(act, sf_inv, q)
                    sh.copy(q, OUT[k0, row0])
                else:
                    sh.copy(q, OUT[row0, k0])
                sh.copy(sf_val, SF[tm, k0])

    return swiglu_per_channel_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_quant.swiglu_forward_and_per_channel_cast_and_transpose.Call``)."""
    spec = call.spec
    x, out = bit_view(call.x), bit_view(call.out)
    npt = spec.num_per_tokens
    clamp = 0.0 if call.clamp_value is None else call.clamp_value

    def run(kernel, start: int, stop: int) -> None:
        # The transposed output's rows are channels: a token range is a column range of it.
        out_part = out[:, start:stop] if spec.transpose else out[start:stop]
        kernel(x[start:stop], out_part, call.sf[start // npt:stop // npt], x.stride(0), out.stride(0), clamp)

    build_swiglu_per_channel.launch_rows(spec, target, call.x.shape[0], run, align=TOKEN_ALIGN)
