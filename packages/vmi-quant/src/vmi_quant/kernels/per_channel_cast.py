"""``per_channel_cast`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

Every channel gets one scaling factor per ``num_per_tokens`` consecutive tokens (blocks
``(npt, 1)``, ``npt`` in {32, 128}). A work tile is one token block (``npt`` tokens) by
``BLOCK_K = 128`` channels, so each channel's amax is a column reduction inside the tile and no
work crosses tiles; tiles go round-robin to persistent workers. Token count, hidden size and the
row strides are runtime values (the dispatch guarantees both extents are multiples of 128, so
every tile is full). Per tile:

1. DMA the input tile into an on-chip tile (row stride = the token stride); a pre-quantized
   input also gathers and decodes its per-token SF blocks ``(1, npc)`` for the tile;
2. per channel: the amax of ``|v|`` over the tile's ``npt`` rows, with ``v = x`` or, for a
   pre-quantized input, ``v = fl32(q · s_in)``;
3. per channel: sf and sf_inv from the amax (``kernels.common.scale_from_amax``);
4. per element: ``e4m3(fl32(v · sf_inv))`` (the product order of spec §1.2 for every flavor);
5. DMA the data tile out; an fp32 SF tile goes out by DMA, UE8M0 exponents packed along the
   tokens are stored byte by byte into their words (the unused bytes are never written).

On Ascend, phases 2-4 run as explicit vector code (a SIMD region, ``vmi_core.tl.vector``); the
input-SF gather and the packed-SF store run in SIMT regions (computed addresses).
"""

from dataclasses import dataclass

import torch

from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, SIMT, Shell
from vmi_core.tl.simd import LANES, LaneVar, maximum
from vmi_core.tl.vector import ChunkAt, ElementAt, decode, phase_barrier, store
from vmi_quant.sf_layout import SFLayout, sf_address

from .common import KERNEL_DTYPE, ScaleRule, encode, load_scale, scale_from_amax

NUM_PER_TOKENS = (32, 128)
NUM_PER_CHANNELS = (32, 128)
# Channels per work tile (its rows are one token block): a multiple of every num_per_channels
# and of the vector width. T and H are multiples of ALIGN.
BLOCK_K = 128
ALIGN = 128


@dataclass(frozen=True)
class PerChannelCastSpec:
    """Everything a per_channel_cast kernel is specialised on (shapes are runtime values).

    ``in_fmt``: ``"bf16"``, ``"fp32"`` or ``"e4m3"`` (a pre-quantized input); ``in_sf_layout`` and
    ``num_per_channels`` describe the input SF of a pre-quantized input (None otherwise).
    """

    in_fmt: str
    num_per_tokens: int
    rule: ScaleRule
    sf_layout: SFLayout
    in_sf_layout: SFLayout | None = None
    num_per_channels: int | None = None


@kernel(simd_parallel=False, simt_8bit=True)
def build_per_channel_cast(spec: PerChannelCastSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    npt, npc = spec.num_per_tokens, spec.num_per_channels
    BM, BK = npt, BLOCK_K
    in_fmt, qin = spec.in_fmt, spec.in_sf_layout
    in_dtype = KERNEL_DTYPE[in_fmt]
    packed = spec.sf_layout.kind == "ue8m0"
    sf_dtype = "uint8" if packed else "float32"
    qin_dtype = "float32" if qin is None or qin.kind == "fp32" else "uint8"
    groups_in = 1 if qin is None else BK // npc

    M = TK.dynamic("M")
    K = TK.dynamic("K")
    NB = TK.dynamic("NB")
    XSF_LEN = TK.dynamic("XSF_LEN")
    SF_LEN = TK.dynamic("SF_LEN")
    x_stride = TK.dynamic("x_stride")

    def value(x, s_in, at):
        v = decode(in_fmt, at, x)
        return v if qin is None else v * at.group(s_in, npc)

    def abs_value(x, s_in, at):
        return F.abs_bits(value(x, s_in, at))

    def channel_value(tile, at):
        """``tile[0, j]``: the per-channel value of the element at ``at``."""
        return (ChunkAt((0,), at.col0) if at.vector else ElementAt((0,), at.j)).load(tile)

    @T.macro
    def load_input_scales(XSF, s_in, row0, k0, xsf_sm, xsf_sk):
        for i, g in T.Parallel(BM, groups_in):
            s_in[i, g] = load_scale(qin, XSF, row0 + i, k0 // npc + g, xsf_sm, xsf_sk)

    @T.macro
    def column_amax_lanes(x, s_in, amax):
        # One lane per channel, a serial max over the tile's rows in a per-lane scalar (amax is
        # stored once: see the shell's note on barriers in thread-guarded loops).
        for j in T.Parallel(BK):
            running = T.alloc_var("uint32")
            running = F.u32(0)
            for r in T.serial(npt):
                running = T.max(running, abs_value(x, s_in, ElementAt((r,), j)))
            amax[0, j] = running

    @T.macro
    def column_amax_registers(x, s_in, amax):
        # 64 channels a register: a running lane-wise vmax over the tile's rows.
        for c in T.serial(BK // LANES):
            running = LaneVar(True, "uint32", abs_value(x, s_in, ChunkAt((0,), c * LANES)))
            for r in T.serial(1, npt):
                running.set(maximum(running.get(), abs_value(x, s_in, ChunkAt((r,), c * LANES))))
            T.evaluate(store(amax[0, c * LANES], running.get()))
        phase_barrier()

    @T.macro
    def scales_and_data(x, s_in, amax, sf_val, sf_inv, q):
        if sh.in_simd:
            column_amax_registers(x, s_in, amax)
        else:
            column_amax_lanes(x, s_in, amax)
        sh.elementwise((1, BK), lambda at: scale_from_amax(spec.rule, at.load(amax)), (sf_val, sf_inv))
        sh.elementwise((BM, BK), lambda at: encode("e4m3", value(x, s_in, at) * channel_value(sf_inv, at)), q)

    @T.macro
    def store_packed_scales(SF, sf_val, tm, k0, sf_sm, sf_sk):
        """UE8M0 bytes into words packed along the tokens; only the tile's own bytes are touched."""
        for j in T.Parallel(BK):
            SF[sf_address(tm, k0 + j, sf_sm, sf_sk, spec.sf_layout)] = sf_val[0, j]

    @T.macro
    def body(X, XSF, OUT, SF, xsf_sm, xsf_sk, sf_sm, sf_sk):
        with sh.persistent_kernel() as worker:
            for tm, tk in sh.tiles([T.ceildiv(M, BM), T.ceildiv(K, BK)], worker, group_size=T.ceildiv(K, BK)):
                # Scalars, not let bindings: TileLang would inline the tile index math (with its
                # divisions) into every element access.
                row0 = T.alloc_var("int32")
                k0 = T.alloc_var("int32")
                row0 = tm * BM
                k0 = tk * BK
                x = sh.tile((BM, BK), in_dtype)
                s_in = None if qin is None else sh.group_tile(BM, groups_in, "float32")
                amax = sh.tile((1, BK), "uint32")
                sf_val = sh.tile((1, BK), sf_dtype)
                sf_inv = sh.tile((1, BK), "float32")
                q = sh.tile((BM, BK), "uint8")
                sh.buffer_versions({x: 2, q: 2})
                sh.copy(X[row0, k0], x)
                if qin is not None:
                    # SIMT: the input SF is read at computed addresses (any layout, packed bytes).
                    with sh.vector(SIMT):
                        load_input_scales(XSF, s_in, row0, k0, xsf_sm, xsf_sk)
                with sh.vector(SIMD):
                    scales_and_data(x, s_in, amax, sf_val, sf_inv, q)
                if packed:
                    # SIMT: a word packs the exponents of `pack` token blocks, which other tiles
                    # hold: the tile's bytes are stored at computed addresses.
                    with sh.vector(SIMT):
                        store_packed_scales(SF, sf_val, tm, k0, sf_sm, sf_sk)
                else:
                    sh.copy(sf_val, SF[tm, k0])
                sh.copy(q, OUT[row0, k0])

    if packed:
        @TK.prim_func
        def per_channel_cast_kernel(
            X: TK.StridedTensor((M, K), (x_stride, 1), in_dtype),
            XSF: TK.Tensor((XSF_LEN,), qin_dtype),
            OUT: TK.Tensor((M, K), "uint8"),
            SF: TK.Tensor((SF_LEN,), "uint8"),
            x_stride: TK.int32, xsf_sm: TK.int32, xsf_sk: TK.int32, sf_sm: TK.int32, sf_sk: TK.int32,
        ):
            body(X, XSF, OUT, SF, xsf_sm, xsf_sk, sf_sm, sf_sk)
    else:
        @TK.prim_func
        def per_channel_cast_kernel(
            X: TK.StridedTensor((M, K), (x_stride, 1), in_dtype),
            XSF: TK.Tensor((XSF_LEN,), qin_dtype),
            OUT: TK.Tensor((M, K), "uint8"),
            SF: TK.Tensor((NB, K), "float32"),
            x_stride: TK.int32, xsf_sm: TK.int32, xsf_sk: TK.int32,
        ):
            body(X, XSF, OUT, SF, xsf_sm, xsf_sk, 0, 0)

    return per_channel_cast_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_quant.per_channel_cast.PerChannelCastCall``) on ``target``."""
    spec, inp = call.spec, call.inp
    num_tokens = inp.num_tokens
    if num_tokens == 0:
        return
    x, out = bit_view(inp.data), bit_view(call.out)
    npt, layout = spec.num_per_tokens, spec.sf_layout
    # Rows of one SF row (a packed word holds `pack` token blocks) stay in one range.
    sf_rows = npt * layout.pack
    dummy = torch.zeros(1, dtype=torch.float32, device=x.device)

    def run(kernel, start: int, stop: int) -> None:
        if spec.in_sf_layout is None:
            xsf, xsf_sm, xsf_sk = dummy, 0, 0
        else:
            xsf, xsf_sm, xsf_sk = spec.in_sf_layout.kernel_view(inp.sf[start:stop])
        rows, out_rows = x[start:stop], out[start:stop]
        if layout.kind == "ue8m0":
            sf, sf_sm, sf_sk = layout.kernel_view(call.sf[start // sf_rows:-(-stop // sf_rows)])
            kernel(rows, xsf, out_rows, sf, x.stride(0), xsf_sm, xsf_sk, sf_sm, sf_sk)
        else:
            kernel(rows, xsf, out_rows, call.sf[start // npt:stop // npt], x.stride(0), xsf_sm, xsf_sk)

    build_per_channel_cast.launch_rows(spec, target, num_tokens, run, align=sf_rows)
