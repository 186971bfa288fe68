"""``per_token_cast`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

Work tiles are ``BLOCK_M`` tokens x ``BLOCK_K`` channels, handed out round-robin
to persistent workers, hidden tiles of one token tile on consecutive iterations.
Token count, hidden size and all strides are runtime values, so one compiled kernel
serves every shape of an option combination.
Per tile:

1. DMA the input tile into an on-chip tile (row stride = the token stride); for a
   pre-quantized input, gather and decode the input scales the tile touches;
2. per (token, group): amax of |x| by a per-lane accumulator over the group;
3. per (token, group): sf and sf_inv from the amax (or sf_inv = 1/sf from a given SF);
4. per element (per quad with stochastic rounding): scale, round and encode;
5. DMA the data tile out; scatter the SF tile into any SF layout (unused bytes of
   packed words are never touched).

On Ascend, phases 2-4 of plain inputs run as explicit vector code (a SIMD region,
``vmi_core.tl.vector``; with stochastic rounding a row's 32 quads are hashed in one register);
the SF gathers and scatters at computed addresses and quantized inputs run in SIMT regions.
"""


import math
from dataclasses import dataclass

import torch

from vmi_core.cpu_parallel import MIN_ROWS_PER_THREAD, fold_rows
from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, SIMT, Shell
from vmi_core.tl.simd import LANES, Vec, bitcast, keep, select
from vmi_core.tl.stochastic import sr_mix, sr_random16_at, stochastic_round
from vmi_core.tl.vector import ChunkAt, ElementAt, decode, deinterleave, gather, phase_barrier, store
from vmi_quant.sf_layout import SFLayout, sf_address

from .common import KERNEL_DTYPE, ScaleRule, canonical_nan, encode, encode_stochastic_quad, load_scale, scale_from_amax

MODES = ("cast", "sf_only", "cast_only")
# A tile covers whole groups (num_per_channels <= 128) and stays small enough for
# CPU stack arrays and the Ascend UB budget with double buffering.
BLOCK_M = 32
BLOCK_K = 128


@dataclass(frozen=True)
class QuantInput:
    """A pre-quantized input: its SF layout and blocks, and the multiplication order."""

    sf_layout: SFLayout
    block_m: int
    block_k: int
    dequant_first: bool


@dataclass(frozen=True)
class PerTokenCastSpec:
    """Everything a per_token_cast kernel is specialised on (shapes are runtime values)."""

    in_fmt: str
    fmt: str
    num_per_channels: int
    mode: str
    rule: ScaleRule
    sf_layout: SFLayout
    stochastic: bool = False
    quant_input: QuantInput | None = None


def _phys(fmt: str, cols: int) -> int:
    """Storage columns of ``cols`` logical elements (FP4: two per byte)."""
    return cols // 2 if fmt == "e2m1" else cols


@kernel(simd_parallel=False, simt_8bit=True)
def build_per_token_cast(spec: PerTokenCastSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    npc, fmt = spec.num_per_channels, spec.fmt
    BM, BK = BLOCK_M, BLOCK_K
    groups = BK // npc
    in_dtype = KERNEL_DTYPE[spec.in_fmt]
    in_cols, out_cols = _phys(spec.in_fmt, BK), _phys(fmt, BK)
    sf_dtype = "float32" if spec.sf_layout.kind == "fp32" else "uint8"
    qin = spec.quant_input
    qin_dtype = "float32" if qin is None or qin.sf_layout.kind == "fp32" else "uint8"
    qin_cols = 1 if qin is None else (BK - 1) // qin.block_k + 2
    writes_data = spec.mode != "sf_only"
    computes_sf = spec.mode != "cast_only"

    M = TK.dynamic("M")
    XK = TK.dynamic("XK")
    OK = TK.dynamic("OK")
    XSF_LEN = TK.dynamic("XSF_LEN")
    SF_LEN = TK.dynamic("SF_LEN")
    x_stride = TK.dynamic("x_stride")
    out_stride = TK.dynamic("out_stride")
    K = XK * 2 if spec.in_fmt == "e2m1" else XK
    num_sf_cols = T.ceildiv(K, npc)

    bk_in = 1 if qin is None else qin.block_k
    # Plain inputs run their amax, scale and quantize phases as vector code on Ascend; quantized
    # inputs (input-SF blocks of any width, FP4 nibbles) stay SIMT.
    vector_kind = SIMD if qin is None else SIMT

    def input_scale(s_in, k0, i, col):
        return s_in[i, (k0 + col) // bk_in - k0 // bk_in]

    def value(x, s_in, k0, at):
        v = decode(spec.in_fmt, at, x)
        return v if qin is None else v * input_scale(s_in, k0, at.i, at.j)

    def abs_value(x, s_in, k0, at):
        # Columns past the hidden size (a partial last tile or group) hold no data; where the copy
        # reads them as zeros a plain input needs no mask (which keeps the cpu loop vectorizable).
        magnitude = F.abs_bits(value(x, s_in, k0, at))
        if qin is None and sh.edges_read_as_zero:
            return magnitude
        return select(at.column() + k0 < K, magnitude, F.u32(0))

    def scaled(x, s_in, sf_inv, k0, at):
        if qin is not None and not qin.dequant_first:
            s = input_scale(s_in, k0, at.i, at.j) * at.group(sf_inv, npc)
            return decode(spec.in_fmt, at, x) * s
        return value(x, s_in, k0, at) * at.group(sf_inv, npc)

    @T.macro
    def load_input_scales(XSF, s_in, row0, k0, xsf_sm, xsf_sk):
        """Decode the input-SF blocks the tile touches (rows and columns clamped into range)."""
        for i, c in T.Parallel(BM, qin_cols):
            s_in[i, c] = load_scale(qin.sf_layout, XSF, T.min(row0 + i, M - 1) // qin.block_m,
                                    T.min(k0 // bk_in + c, T.max(K - 1, 0) // bk_in), xsf_sm, xsf_sk)

    @T.macro
    def compute_scales(x, s_in, k0, amax, sf_val, sf_inv):
        sh.segment_reduce(amax, (BM, BK), npc, lambda at: abs_value(x, s_in, k0, at), "max", F.u32(0))
        sh.elementwise(sh.group_domain(BM, groups), lambda at: scale_from_amax(spec.rule, at.load(amax)),
                       (sf_val, sf_inv))

    @T.macro
    def read_scales(SF, sf_inv, row0, k0, sf_sm, sf_sk):
        for i, g in T.Parallel(BM, groups):
            sf_inv[i, g] = T.float32(1.0) / load_scale(spec.sf_layout, SF, T.min(row0 + i, M - 1), k0 // npc + g,
                                                        sf_sm, sf_sk)

    def quantize_stochastic_row(x, s_in, sf_inv, k0, q, r):
        """Vector form of a row's ``encode_stochastic_quad`` calls: the row's 32 quads hashed in
        lanes 0..31 (two rounds of deinterleaving put each quad's elements in one lane), each
        element's 16-bit number gathered from its quad's lane."""
        low = keep(canonical_nan(scaled(x, s_in, sf_inv, k0, ChunkAt((r,), 0))))
        high = keep(canonical_nan(scaled(x, s_in, sf_inv, k0, ChunkAt((r,), LANES))))
        even, odd = deinterleave(low, high)
        y0, y2 = deinterleave(even, even)
        y1, y3 = deinterleave(odd, odd)
        counter = bitcast(Vec.lane_index(k0 // 4), "uint32")
        h = keep(sr_mix(F.f32_bits(y0), F.f32_bits(y1), F.f32_bits(y2), F.f32_bits(y3), counter))
        codes = []
        for y, col0 in ((low, 0), (high, LANES)):
            lane = bitcast(Vec.lane_index(col0), "uint32")
            r16 = sr_random16_at(gather(h, lane >> F.u32(2)), lane & F.u32(3))
            codes.append(encode(fmt, stochastic_round(y, r16, fmt)))
        if fmt == "e4m3":
            T.evaluate(store(q[r, 0], codes[0]))
            T.evaluate(store(q[r, LANES], codes[1]))
        else:
            even_codes, odd_codes = deinterleave(codes[0], codes[1])
            T.evaluate(store(q[r, 0], F.e2m1_pack(even_codes, odd_codes)))

    @T.macro
    def quantize(x, s_in, sf_inv, k0, q):
        if spec.stochastic and sh.in_simd:
            for r in T.serial(BM):
                quantize_stochastic_row(x, s_in, sf_inv, k0, q, r)
            phase_barrier()
        elif spec.stochastic:
            for i, qd in T.Parallel(BM, BK // 4):
                encode_stochastic_quad(fmt, scaled(x, s_in, sf_inv, k0, ElementAt((i,), 4 * qd)),
                                       scaled(x, s_in, sf_inv, k0, ElementAt((i,), 4 * qd + 1)),
                                       scaled(x, s_in, sf_inv, k0, ElementAt((i,), 4 * qd + 2)),
                                       scaled(x, s_in, sf_inv, k0, ElementAt((i,), 4 * qd + 3)),
                                       T.Cast("uint32", k0 // 4 + qd), q, i, 4 * qd)
        else:
            sh.elementwise((BM, BK), lambda at: encode(fmt, scaled(x, s_in, sf_inv, k0, at)), q,
                           pack_e2m1=fmt == "e2m1")

    @T.macro
    def scatter_scales(SF, sf_val, row0, k0, sf_sm, sf_sk):
        """Write the tile's SF into any layout; only existing blocks are touched."""
        for i, g in T.Parallel(BM, groups):
            if row0 + i < M and k0 // npc + g < num_sf_cols:
                SF[sf_address(row0 + i, k0 // npc + g, sf_sm, sf_sk, spec.sf_layout)] = sf_val[i, g]

    @T.macro
    def scales_and_data(x, s_in, k0, amax, sf_val, sf_inv, q, SF, row0, sf_sm, sf_sk):
        if computes_sf:
            compute_scales(x, s_in, k0, amax, sf_val, sf_inv)
        elif vector_kind == SIMT:
            read_scales(SF, sf_inv, row0, k0, sf_sm, sf_sk)
        if writes_data:
            quantize(x, s_in, sf_inv, k0, q)

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
                x = sh.tile((BM, in_cols), in_dtype)
                s_in = sh.tile((BM, qin_cols), "float32")
                amax = sh.group_tile(BM, groups, "uint32")
                sf_val = sh.group_tile(BM, groups, sf_dtype)
                sf_inv = sh.group_tile(BM, groups, "float32")
                q = sh.tile((BM, out_cols), "uint8")
                sh.buffer_versions({x: 2, q: 2})
                sh.copy(X[row0, _phys(spec.in_fmt, k0)], x)
                if vector_kind == SIMT:
                    with sh.vector(SIMT):
                        if qin is not None:
                            load_input_scales(XSF, s_in, row0, k0, xsf_sm, xsf_sk)
                        scales_and_data(x, s_in, k0, amax, sf_val, sf_inv, q, SF, row0, sf_sm, sf_sk)
                        if computes_sf:
                            scatter_scales(SF, sf_val, row0, k0, sf_sm, sf_sk)
                else:
                    # SF reads and writes at computed addresses in SIMT, the rest in SIMD.
                    if not computes_sf:
                        with sh.vector(SIMT):
                            read_scales(SF, sf_inv, row0, k0, sf_sm, sf_sk)
                    with sh.vector(SIMD):
                        scales_and_data(x, s_in, k0, amax, sf_val, sf_inv, q, SF, row0, sf_sm, sf_sk)
                    if computes_sf:
                        with sh.vector(SIMT):
                            scatter_scales(SF, sf_val, row0, k0, sf_sm, sf_sk)
                if writes_data:
                    sh.copy(q, OUT[row0, _phys(fmt, k0)])

    if writes_data:
        @TK.prim_func
        def per_token_cast_kernel(
            X: TK.StridedTensor((M, XK), (x_stride, 1), in_dtype),
            XSF: TK.Tensor((XSF_LEN,), qin_dtype),
            OUT: TK.StridedTensor((M, OK), (out_stride, 1), "uint8"),
            SF: TK.Tensor((SF_LEN,), sf_dtype),
            x_stride: TK.int32, out_stride: TK.int32,
            xsf_sm: TK.int32, xsf_sk: TK.int32, sf_sm: TK.int32, sf_sk: TK.int32,
        ):
            body(X, XSF, OUT, SF, xsf_sm, xsf_sk, sf_sm, sf_sk)
    else:
        @TK.prim_func
        def per_token_cast_kernel(
            X: TK.StridedTensor((M, XK), (x_stride, 1), in_dtype),
            XSF: TK.Tensor((XSF_LEN,), qin_dtype),
            SF: TK.Tensor((SF_LEN,), sf_dtype),
            x_stride: TK.int32,
            xsf_sm: TK.int32, xsf_sk: TK.int32, sf_sm: TK.int32, sf_sk: TK.int32,
        ):
            body(X, XSF, None, SF, xsf_sm, xsf_sk, sf_sm, sf_sk)

    return per_token_cast_kernel


def _fold_pieces(call, target: str) -> int:
    """Pieces each token splits into for ``fold_rows`` (1: no folding).

    Groups never straddle tokens, so a call of fewer tokens than a tile's height runs on its tokens
    cut into tile-wide rows (no padding rows computed) when every tensor is contiguous and row-major
    and the result does not depend on column positions (stochastic rounding hashes them).
    """
    spec, inp = call.spec, call.inp
    layout = spec.sf_layout
    if (target != "cpu" or inp.num_tokens >= BLOCK_M or spec.quant_input is not None or spec.stochastic
            or inp.hidden % BLOCK_K or layout.col_major or layout.pack_along_m
            or (BLOCK_K // spec.num_per_channels) % layout.pack):
        return 1
    return inp.hidden // BLOCK_K


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_quant.per_token_cast.PerTokenCastCall``) on ``target``."""
    spec, inp = call.spec, call.inp
    num_tokens = inp.num_tokens
    if num_tokens == 0:
        return
    x = bit_view(inp.data)
    out = None if call.out is None else bit_view(call.out)
    sf_grid = call.sf
    pieces = _fold_pieces(call, target)
    folded = fold_rows(pieces, *(t for t in (x, out, sf_grid) if t is not None)) if pieces > 1 else None
    if folded is None:
        pieces = 1
    else:
        x, sf_grid = folded[0], folded[-1]
        out = None if out is None else folded[1]
        num_tokens *= pieces
    qin = spec.quant_input
    # Rows of one input-SF block (or packed word along tokens) stay in one range.
    align = 1
    if qin is not None:
        align = qin.block_m * (qin.sf_layout.pack if qin.sf_layout.pack_along_m else 1)
    dummy = torch.zeros(1, dtype=torch.float32, device=x.device)

    def run(kernel, start: int, stop: int) -> None:
        if qin is None:
            xsf, xsf_sm, xsf_sk = dummy, 0, 0
        else:
            xsf, xsf_sm, xsf_sk = qin.sf_layout.kernel_view(inp.sf[start // align:])
        sf, sf_sm, sf_sk = spec.sf_layout.kernel_view(sf_grid[start:stop])
        rows = x[start:stop]
        if out is None:
            kernel(rows, xsf, sf, x.stride(0), xsf_sm, xsf_sk, sf_sm, sf_sk)
        else:
            kernel(rows, xsf, out[start:stop], sf, x.stride(0), out.stride(0), xsf_sm, xsf_sk, sf_sm, sf_sk)

    # Threads split by tokens, folded or not.
    build_per_token_cast.launch_rows(spec, target, num_tokens, run, align=math.lcm(align, BLOCK_M),
                                     min_rows=MIN_ROWS_PER_THREAD * pieces)
