"""``norm_forward`` and ``norm_forward_and_per_token_cast`` as one parallel-style TileLang kernel
for ascend, cuda and cpu.

A work tile is ``BLOCK_M`` whole rows (tokens) of ``align(H, 64)`` columns, handed out round-robin
to persistent workers; ``BLOCK_M`` is the largest power of two whose tiles fit the on-chip budget
(a UB share on Ascend, the stack on cpu). The kernel is specialised on the hidden size, ``eps``,
``out_scale`` and the flavor (the rstd constants); the token count and the row strides are
runtime values. Per tile:

1. DMA the rows of x (and of the residual, and the weight) into on-chip tiles (row stride = the
   tensor's);
2. with a residual: ``r = x + residual`` rounded to x's dtype, written over the x tile (it is
   also the ``residual_out`` tile);
3. per row: ``S = sum r_i^2`` in the fixed lane order of ``Shell.row_sum`` (fused multiply-adds;
   columns past ``H`` count as zeros), then ``rstd`` by ``vmi_core.tl.rstd`` (one lane per row);
4. per element: ``y = f32(f32(r * rstd) * w')``, ``w' = f32(w * out_scale)``, rounded to x's
   dtype (``u``), and for fp32 x with a bf16 side output ``bf16(y)``;
5. quantising variant: per (row, 32-group) amax of ``|u|``, scales (``kernels.common.scale_from_amax``)
   and E4M3 codes, as ``per_token_cast`` computes them; the SF is scattered into its layout and the
   exponent bytes into the Mega MoE rows;
6. DMA the outputs out.

On Ascend, phases 2-5 run as explicit vector code in one SIMD region (``vmi_core.tl.vector``); the
SF and Mega MoE scatters run in a SIMT region (computed addresses).
"""

from dataclasses import dataclass

import torch

from vmi_core.cpu_parallel import launch_rows
from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.rstd import rstd
from vmi_core.tl.shell import SIMD, SIMT, Shell
from vmi_core.tl.simd import LANES, Vec, keep, select, simd
from vmi_core.tl.vector import ChunkAt, ElementAt, decode, group_tile_shape
from vmi_quant.sf_layout import SFLayout, align, sf_address

from .common import KERNEL_DTYPE, ScaleRule, canonical_nan, encode, scale_from_amax

MAX_HIDDEN = 8192
NUM_PER_CHANNELS = 32
# Bytes of all tiles of one work tile (times the buffer versions on Ascend: inside the UB share of
# a vector core; on cpu, stack arrays of each thread).
TILE_BYTES = 64 * 1024
MAX_BLOCK_M = 64
MEGA_SLAB = 128
_ELEMENT_BYTES = {"fp32": 4, "bf16": 2}


@dataclass(frozen=True)
class QuantSpec:
    """The quantising variant: scale rule, SF layout, bf16 side output, Mega MoE block (0: none)."""

    rule: ScaleRule
    sf_layout: SFLayout
    with_out_bf16: bool
    mega_block_m: int = 0


@dataclass(frozen=True)
class NormForwardSpec:
    """Everything a norm_forward kernel is specialised on (token count and strides are runtime values)."""

    in_fmt: str
    hidden: int
    eps: float
    flavor: str
    out_scale: float
    has_weight: bool
    has_residual: bool
    quant: QuantSpec | None = None


def padded_hidden(hidden: int) -> int:
    """Columns of a work tile: whole vector registers."""
    return align(hidden, LANES)


def block_m(spec: NormForwardSpec) -> int:
    """Rows per work tile: the largest power of two (at most ``MAX_BLOCK_M``) whose tiles fit ``TILE_BYTES``."""
    esize = _ELEMENT_BYTES[spec.in_fmt]
    row_bytes = (2 + spec.has_residual) * esize
    if spec.quant is not None:
        row_bytes += 1 + (2 if spec.quant.with_out_bf16 and spec.in_fmt == "fp32" else 0)
    rows = max(1, TILE_BYTES // (row_bytes * padded_hidden(spec.hidden)))
    return min(MAX_BLOCK_M, 1 << (rows.bit_length() - 1))


def _row_value(tile, at):
    """``tile[row]``, the per-row value of the element(s) at ``at``: a broadcast load in vector code."""
    if at.vector:
        return Vec(simd().vld(tile[at.head[0]], dist="BRC_B32"))
    return tile[at.i]


def _column_at(at):
    """The position of ``at``'s column(s) in row 0 (of a one-row per-column tile)."""
    return ChunkAt((0,), at.col0) if at.vector else ElementAt((0,), at.j)


def _rows_value(tile, at):
    """``tile[i]`` of a 1-D per-row tile under ``Shell.rowwise`` (the lanes' rows in vector code)."""
    if at.vector:
        return Vec(simd().vld(tile[at.row0]))
    return tile[at.i]


@kernel(simd_parallel=False, simt_8bit=True)
def build_norm_forward(spec: NormForwardSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    H, HP, BM = spec.hidden, padded_hidden(spec.hidden), block_m(spec)
    in_fmt, quant = spec.in_fmt, spec.quant
    dtype = KERNEL_DTYPE[in_fmt]
    is_bf16 = in_fmt == "bf16"
    groups = HP // NUM_PER_CHANNELS
    num_groups = H // NUM_PER_CHANNELS
    layout = quant.sf_layout if quant is not None else SFLayout("fp32")
    sf_dtype = "float32" if layout.kind == "fp32" else "uint8"
    out_dtype = "uint8" if quant is not None else dtype
    # fp32 x: the bf16 side output is a tile of its own; bf16 x: it is u itself.
    bf16_tile = quant is not None and quant.with_out_bf16 and not is_bf16
    mega_bm = 0 if quant is None else quant.mega_block_m
    scale = F.f32_const(spec.out_scale)
    # Per-(row, group) tiles with ``group_tile_shape``'s padding for ``at.group``; in vector code the
    # scale phase runs over whole registers: rows of a power of two up to one register, or of whole
    # registers.
    group_shape = group_tile_shape(sh.is_ascend, BM, groups)
    if sh.is_ascend:
        cols = group_shape[1]
        group_shape = (group_shape[0], align(cols, LANES) if cols > LANES else 1 << (cols - 1).bit_length())
    # Vector code reads the square sums and writes the rstd a register of rows at a time.
    sum_len = align(BM, LANES) if sh.is_ascend else BM

    M = TK.dynamic("M")
    MR = TK.dynamic("MR")
    MRO = TK.dynamic("MRO")
    MO = TK.dynamic("MO")
    MB = TK.dynamic("MB")
    SF_LEN = TK.dynamic("SF_LEN")
    MEGA_LEN = TK.dynamic("MEGA_LEN")
    x_stride = TK.dynamic("x_stride")
    res_stride = TK.dynamic("res_stride")
    rout_stride = TK.dynamic("rout_stride")
    out_stride = TK.dynamic("out_stride")
    bf16_stride = TK.dynamic("bf16_stride")

    def to_x_dtype(y):
        """``y`` rounded to x's dtype, a NaN as the canonical +NaN."""
        y = canonical_nan(y)
        return F.f32_to_bf16(y) if is_bf16 else y

    def residual_sum(x, res, at):
        return to_x_dtype(decode(in_fmt, at, x) + decode(in_fmt, at, res))

    def square_term(x, at):
        r = decode(in_fmt, at, x)
        if H % LANES:
            # Columns past H hold no data (stale on Ascend): they add zeros.
            r = select(at.column() < H, r, F.like(F.f32_const(0.0), r))
        r = keep(r)
        return r, r

    def normalized(x, w, rs, at):
        factor = scale
        if spec.has_weight:
            factor = decode(in_fmt, _column_at(at), w)
            if spec.out_scale != 1.0:
                factor = factor * scale
        y = keep(keep(decode(in_fmt, at, x) * _row_value(rs, at)) * factor)
        if bf16_tile:
            return to_x_dtype(y), F.f32_to_bf16(canonical_nan(y))
        return to_x_dtype(y)

    def quant_code(u, sf_inv, at):
        return encode("e4m3", decode(in_fmt, at, u) * at.group(sf_inv, NUM_PER_CHANNELS))

    @T.macro
    def normalize(x, res, w, ss, rs, u, ob):
        if spec.has_residual:
            sh.elementwise((BM, HP), lambda at: residual_sum(x, res, at), x)
        sh.row_sum(ss, (BM, HP), lambda at: square_term(x, at), fused=True)
        # The ascend flavor's compensation turns an infinite sum into a NaN of the target's making.
        sh.rowwise(BM, lambda at: at.store_row_value(rs, canonical_nan(rstd(_rows_value(ss, at), H, spec.eps,
                                                                            spec.flavor))))
        sh.elementwise((BM, HP), lambda at: normalized(x, w, rs, at), (u, ob) if bf16_tile else u)

    @T.macro
    def quantize(u, amax, sf_val, sf_inv, q):
        sh.segment_reduce(amax, (BM, HP), NUM_PER_CHANNELS, lambda at: F.abs_bits(decode(in_fmt, at, u)), "max",
                          F.u32(0))
        sh.elementwise((BM, group_shape[1]), lambda at: scale_from_amax(quant.rule, at.load(amax)),
                       (sf_val, sf_inv))
        sh.elementwise((BM, HP), lambda at: quant_code(u, sf_inv, at), q)

    def mega_row(t):
        i = t % mega_bm
        return ((t // mega_bm) * align(mega_bm, MEGA_SLAB) + (i // MEGA_SLAB) * MEGA_SLAB + (i % 32) * 4
                + (i % MEGA_SLAB) // 32)

    def exponent_byte(stored):
        if layout.kind == "ue8m0":
            return stored
        return T.Cast("uint8", (T.reinterpret(stored, "uint32") >> T.uint32(23)) & T.uint32(0xFF))

    @T.macro
    def scatter_scales(SF, MEGA, sf_val, row0, sf_sm, sf_sk, mega_stride, token0):
        """Scales into any SF layout and exponent bytes into the Mega MoE rows; only existing rows
        and groups are touched."""
        for i, g in T.Parallel(BM, groups):
            if row0 + i < M and g < num_groups:
                SF[sf_address(row0 + i, g, sf_sm, sf_sk, layout)] = sf_val[i, g]
                if mega_bm:
                    MEGA[((g // 4) * mega_stride + mega_row(token0 + row0 + i)) * 4 + g % 4] = \
                        exponent_byte(sf_val[i, g])

    @TK.prim_func
    def norm_forward_kernel(
        X: TK.StridedTensor((M, H), (x_stride, 1), dtype),
        W: TK.Tensor((1, H), dtype),
        RES: TK.StridedTensor((MR, H), (res_stride, 1), dtype),
        ROUT: TK.StridedTensor((MRO, H), (rout_stride, 1), dtype),
        OUT: TK.StridedTensor((MO, H), (out_stride, 1), out_dtype),
        OB: TK.StridedTensor((MB, H), (bf16_stride, 1), "uint16"),
        RSTD: TK.Tensor((M,), "float32"),
        SF: TK.Tensor((SF_LEN,), sf_dtype),
        MEGA: TK.Tensor((MEGA_LEN,), "uint8"),
        x_stride: TK.int32, res_stride: TK.int32, rout_stride: TK.int32, out_stride: TK.int32,
        bf16_stride: TK.int32, sf_sm: TK.int32, sf_sk: TK.int32, mega_stride: TK.int32, token0: TK.int32,
    ):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, BM)], worker):
                # A scalar, not a let binding: TileLang would inline the index math into every access.
                row0 = T.alloc_var("int32")
                row0 = tm * BM
                x = sh.tile((BM, HP), dtype)
                res = sh.tile((BM, HP), dtype) if spec.has_residual else None
                w = sh.tile((1, HP), dtype) if spec.has_weight else None
                ss = sh.tile((sum_len,), "float32")
                rs = sh.tile((sum_len,), "float32")
                u = sh.tile((BM, HP), dtype)
                ob = sh.tile((BM, HP), "uint16") if bf16_tile else None
                sh.buffer_versions({x: 2})
                sh.copy(X[row0, 0], x)
                if spec.has_residual:
                    sh.copy(RES[row0, 0], res)
                if spec.has_weight:
                    sh.copy(W[0, 0], w)
                if quant is None:
                    with sh.vector(SIMD):
                        normalize(x, res, w, ss, rs, u, ob)
                    sh.copy(u, OUT[row0, 0])
                else:
                    amax = sh.tile(group_shape, "uint32")
                    sf_val = sh.tile(group_shape, sf_dtype)
                    sf_inv = sh.tile(group_shape, "float32")
                    q = sh.tile((BM, HP), "uint8")
                    with sh.vector(SIMD):
                        normalize(x, res, w, ss, rs, u, ob)
                        quantize(u, amax, sf_val, sf_inv, q)
                    # SIMT: the SF and Mega MoE bytes go to computed addresses (any layout).
                    with sh.vector(SIMT):
                        scatter_scales(SF, MEGA, sf_val, row0, sf_sm, sf_sk, mega_stride, token0)
                    sh.copy(q, OUT[row0, 0])
                    if quant.with_out_bf16:
                        sh.copy(ob if bf16_tile else u, OB[row0, 0])
                if spec.has_residual:
                    sh.copy(x, ROUT[row0, 0])
                sh.copy(rs if sum_len == BM else rs[0:BM], RSTD[row0])

    return norm_forward_kernel


def _rows(t: torch.Tensor | None, dummy: torch.Tensor, start: int, stop: int) -> tuple[torch.Tensor, int]:
    """Rows ``[start, stop)`` of an optional ``(T, H)`` tensor and its row stride; an absent one is a
    one-row dummy the kernel never touches (its code is specialised out)."""
    return (dummy, dummy.stride(0)) if t is None else (t[start:stop], t.stride(0))


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_quant.norm_forward.NormForwardCall``) on ``target``: one launch per
    batch, each split by rows across threads on cpu."""
    spec, quant = call.spec, call.spec.quant
    batch, tokens, hidden = call.x.shape
    if batch * tokens == 0:
        return
    kernel = build_norm_forward.compiled(spec, target)
    x, out = bit_view(call.x), bit_view(call.out)
    device = x.device
    row_dummy = torch.zeros((1, hidden), dtype=x.dtype, device=device)
    bf16_dummy = torch.zeros((1, hidden), dtype=torch.uint16, device=device)
    weight = row_dummy if call.weight is None else bit_view(call.weight).view(1, hidden)
    sf_dummy = torch.zeros(1, dtype=torch.float32, device=device)
    mega, mega_stride = torch.zeros(1, dtype=torch.uint8, device=device), 0
    if call.mega_moe_sf is not None:
        # The window of every word column's rows, (R, H / 128) with strides (1, R), as bytes.
        mega_stride = call.mega_moe_sf.shape[0]
        mega = torch.as_strided(call.mega_moe_sf, (call.mega_moe_sf.numel(),), (1,)).view(torch.uint8)

    def batch_of(t: torch.Tensor | None, b: int) -> torch.Tensor | None:
        return None if t is None else bit_view(t[b])

    for b in range(batch):
        x_b, out_b, rstd_b = x[b], out[b], call.rstd[b]
        residual, residual_out, out_bf16 = (batch_of(t, b) for t in (call.residual, call.residual_out, call.out_bf16))

        def run(start: int, stop: int, b=b, x_b=x_b, out_b=out_b, rstd_b=rstd_b, residual=residual,
                residual_out=residual_out, out_bf16=out_bf16) -> None:
            sf, sf_sm, sf_sk = sf_dummy, 0, 0
            if quant is not None:
                sf, sf_sm, sf_sk = quant.sf_layout.kernel_view(call.sf[b][start:stop])
            res, res_stride = _rows(residual, row_dummy, start, stop)
            rout, rout_stride = _rows(residual_out, row_dummy, start, stop)
            ob, ob_stride = _rows(out_bf16, bf16_dummy, start, stop)
            kernel(x_b[start:stop], weight, res, rout, out_b[start:stop], ob, rstd_b[start:stop], sf, mega,
                   x_b.stride(0), res_stride, rout_stride, out_b.stride(0), ob_stride, sf_sm, sf_sk, mega_stride,
                   start)

        launch_rows(target, run, tokens, align=block_m(spec))
