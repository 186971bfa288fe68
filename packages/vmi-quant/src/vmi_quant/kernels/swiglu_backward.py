"""``swiglu_backward`` and ``swiglu_backward_and_per_token_cast`` as one parallel-style TileLang
kernel for ascend, cuda and cpu.

A work tile is ``block_rows`` whole rows (all ``2H`` inputs of a token: the weight gradient sums
over the full row in vmi's fixed lane order, ``Shell.row_sum``), handed out round-robin to
persistent workers; the hidden size is part of the specialisation, the token count and the row
strides are runtime values. Per tile:

1. DMA the gate and up halves of ``x`` and the rows of ``act_x_grad`` into on-chip tiles;
2. per row: whether it lies inside an expert of the psum layout (a binary search over
   ``psum``) and its weight ``W`` (``topk · rsf``, 0 on padding rows); for an E4M3 input, the
   row's input scales;
3. per element, the backward of spec §7.2 (``exp``, the two divisions, ``inner`` in the
   flavor's form), giving ``[dA | dB]`` (bf16/fp32), ``act_out`` and, for the E4M3 output, the
   fp32 gradient; padding rows become +0 here;
4. per row: ``sum(g · act)`` in the fixed lane order (fused products), with ``topk_weights``;
5. E4M3 output: per 32/128-channel group of each half, the amax, ``(sf, sf_inv)`` by
   ``per_token_cast``'s rule (``kernels.common.scale_from_amax``) and the E4M3 codes;
6. the SF of the tile into any layout (0 on padding rows) and the weight gradient; DMA out.

On Ascend, phase 3 runs in a SIMT region (its ``exp`` is a function of scalar lanes,
``vmi_core.tl.elementary``), phases 4-5 as explicit vector code in a SIMD region
(``vmi_core.tl.vector``), phases 2 and 6 in SIMT regions, since they read and write global
memory at computed addresses (``psum`` entries, weights, scales, SF words of any layout).
"""


from dataclasses import dataclass

import torch

from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.elementary import exp
from vmi_core.tl.lazy import T, tirx
from vmi_core.tl.shell import SIMD, SIMT, Shell
from vmi_core.tl.simd import LANES, fma, keep, select
from vmi_core.tl.vector import decode
from vmi_quant.sf_layout import SFLayout, align, sf_address

from .common import KERNEL_DTYPE, ScaleRule, encode, scale_from_amax
from .swiglu_forward import clamp_gate_up

NUM_PER_CHANNELS = (32, 128)
HIDDEN_ALIGN = 64
# A tile holds whole rows: the largest hidden size keeps one row's tiles within the Ascend UB.
MAX_HIDDEN = 8192
# Rows per tile: about 2048 hidden elements a tile, at most 8 rows.
_ELEMENTS_PER_TILE = 2048
_MAX_BLOCK_ROWS = 8


@dataclass(frozen=True)
class SwigluBackwardSpec:
    """Everything a swiglu_backward kernel is specialised on (the token count is a runtime value).

    ``in_fmt``: ``"bf16"``, ``"fp32"`` or ``"e4m3"`` (with ``num_per_channels``, ``rule`` and
    ``sf_layout`` of the quantized gradient); ``grad_fmt`` and ``out_fmt``: ``"bf16"``/``"fp32"``;
    ``flavor``: ``"ascend"`` or ``"cuda"``; the flags say which optional inputs and outputs exist.
    """

    in_fmt: str
    grad_fmt: str
    out_fmt: str
    hidden: int
    flavor: str
    weights: bool
    clamp: bool
    recompute: bool
    psum: bool
    num_per_channels: int | None = None
    rule: ScaleRule | None = None
    sf_layout: SFLayout | None = None


def block_rows(hidden: int) -> int:
    """Rows per work tile for a hidden size."""
    return max(1, min(_MAX_BLOCK_ROWS, _ELEMENTS_PER_TILE // hidden))


# The Ascend UB a vector core gives a kernel with a SIMT region (spec quant-b §0.1).
ASCEND_UB_BYTES = 216 * 1024
_BYTES = {"bf16": 2, "fp32": 4, "e4m3": 1}


def ascend_ub_bytes(spec: SwigluBackwardSpec) -> int:
    """The UB the tiles of ``spec`` take on Ascend (the inputs in two buffer versions)."""
    H, rows = spec.hidden, block_rows(spec.hidden)
    row_elements = rows * H
    total = 2 * row_elements * (2 * _BYTES[spec.in_fmt] + _BYTES[spec.grad_fmt])
    total += row_elements * 2 * _BYTES[spec.out_fmt]
    total += row_elements * _BYTES[spec.out_fmt] if spec.recompute else 0
    total += row_elements * 4 if spec.weights else 0
    if spec.num_per_channels is not None:
        # The fp32 gradient halves and their E4M3 codes; seven padded tiles of per-group values
        # (input scales, amax, SF and multipliers of both halves), counted as 4-byte values.
        total += row_elements * (2 * 4 + 2)
        groups = -(-(H // spec.num_per_channels) // LANES) * LANES
        total += 7 * (rows + 1) * groups * 4
    return total


@kernel(simd_parallel=False, simt_8bit=True)
def build_swiglu_backward(spec: SwigluBackwardSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    H, npc = spec.hidden, spec.num_per_channels
    BM = block_rows(H)
    quantized = npc is not None
    groups = H // npc if quantized else 1
    in_dtype = KERNEL_DTYPE[spec.in_fmt]
    grad_dtype = KERNEL_DTYPE[spec.grad_fmt]
    out_dtype = KERNEL_DTYPE[spec.out_fmt]
    sf_dtype = "uint8" if quantized and spec.sf_layout.kind == "ue8m0" else "float32"
    fused_inner = spec.flavor == "cuda"
    # A per-row value read through ``at.group`` with one group spanning the whole row.
    row_span = 1 << (2 * H).bit_length()

    M = TK.dynamic("M")
    E = TK.dynamic("E")
    TOPK_LEN = TK.dynamic("TOPK_LEN")
    XSF_M = TK.dynamic("XSF_M")
    ACT_M = TK.dynamic("ACT_M")
    Q_M = TK.dynamic("Q_M")
    WG_LEN = TK.dynamic("WG_LEN")
    SF_LEN = TK.dynamic("SF_LEN")
    x_stride = TK.dynamic("x_stride")
    g_stride = TK.dynamic("g_stride")

    def row_tile(dtype):
        return sh.group_tile(BM, 1, dtype)

    def scale_tile(dtype):
        # Vector code reads a register of group values from any 32-byte boundary of a row
        # (``at.group``) and runs whole-register phases over the groups: rows padded to whole
        # registers, plus one row for the read past the last row.
        if sh.is_ascend:
            return sh.tile((BM + 1, align(groups, LANES)), dtype)
        return sh.tile((BM, groups), dtype)

    scale_domain = (BM, align(groups, LANES) if sh.is_ascend else groups)

    def divide(num, den):
        # Scalar lanes: the ascend flavor's division is the vector unit's, modelled.
        return F.flavor_quotient(num, den, spec.flavor == "ascend", False)

    def out_value(v):
        return F.f32_to_bf16(v) if spec.out_fmt == "bf16" else v

    def backward_terms(xa, xb, sa, sb, gt, w_row, valid_row, clamp, at):
        """§7.2 at ``at``: the outputs of the element-wise phase, in the order of its tiles."""
        a = decode(spec.in_fmt, at, xa)
        b = decode(spec.in_fmt, at, xb)
        if quantized:
            a = a * at.group(sa, npc)
            b = b * at.group(sb, npc)
        a, b = keep(a), keep(b)
        g = keep(decode(spec.grad_fmt, at, gt))
        w = keep(at.group(w_row, row_span))
        invalid = at.group(valid_row, row_span) < F.f32_const(0.5)
        one, zero = F.like(F.f32_const(1.0), a), F.f32_const(0.0)
        if spec.clamp:
            # Compare and select, as the forward and the reference: min/max would turn a -0.0 at a
            # zero clamp into +0.0.
            a_c, b_c = (keep(v) for v in clamp_gate_up(a, b, clamp))
        else:
            a_c, b_c = a, b
        den = keep(one + exp(-a_c))
        s = keep(divide(one, den))
        act = keep(divide(a_c, den) * b_c)
        gws = keep((g * w) * s)
        one_minus_s = keep(one - s)
        if fused_inner:
            inner = keep(fma(a_c, one_minus_s, one))
        else:
            inner = keep(one + keep(a_c * one_minus_s))
        zero_a, zero_b = invalid, invalid
        if spec.clamp:
            zero_a = tirx.Or(a > clamp, zero_a)
            zero_b = tirx.Or(tirx.Or(b > clamp, b < -clamp), zero_b)
        d_a = keep(select(zero_a, zero, keep(gws * b_c) * inner))
        d_b = keep(select(zero_b, zero, gws * a_c))
        values = [out_value(d_a), out_value(d_b)]
        if spec.recompute:
            values.append(out_value(select(invalid, zero, act * w)))
        if spec.weights:
            values.append(act)
        if quantized:
            values += [d_a, d_b]
        return tuple(values)

    @T.macro
    def row_setup(TOPK, PSUM, XSF, w_row, valid_row, sa, sb, row0, row_base, alignment, rsf):
        """Per row: psum validity (binary search for the first expert whose aligned end lies
        past the row), the weight; for an E4M3 input the row's input scales."""
        for i in T.Parallel(BM):
            row = T.alloc_var("int32")
            inside = T.alloc_var("int32")
            weight = T.alloc_var("float32")
            row = row0 + i
            inside = T.Cast("int32", row < M)
            if spec.psum:
                lo = T.alloc_var("int32")
                hi = T.alloc_var("int32")
                lo = 0
                hi = E
                for _ in T.serial(32):
                    if lo < hi:
                        mid = T.alloc_var("int32")
                        mid = (lo + hi) >> 1
                        if (PSUM[mid] + alignment - 1) // alignment * alignment <= row_base + row:
                            lo = mid + 1
                        else:
                            hi = mid
                if lo < E:
                    if row_base + row >= PSUM[lo]:
                        inside = 0
                else:
                    inside = 0
            if spec.weights:
                weight = TOPK[T.min(row, M - 1)] * rsf
            else:
                weight = T.float32(1.0)
            valid_row[i, 0] = T.Select(inside != 0, T.float32(1.0), T.float32(0.0))
            w_row[i, 0] = T.Select(inside != 0, weight, T.float32(0.0))
        if quantized:
            for i, g in T.Parallel(BM, groups):
                sa[i, g] = XSF[T.min(row0 + i, M - 1), g]
                sb[i, g] = XSF[T.min(row0 + i, M - 1), groups + g]

    @T.macro
    def backward(xa, xb, sa, sb, gt, w_row, valid_row, clamp, outs):
        sh.elementwise((BM, H), lambda at: backward_terms(xa, xb, sa, sb, gt, w_row, valid_row, clamp, at), outs)

    @T.macro
    def weight_row_sums(gt, act_f, weight_sum):
        sh.row_sum(weight_sum, (BM, H), lambda at: (decode(spec.grad_fmt, at, gt), at.load(act_f)), fused=True)

    @T.macro
    def quantize_half(v, amax, sf_val, sf_inv, q):
        sh.segment_reduce(amax, (BM, H), npc, lambda at: F.abs_bits(at.load(v)), "max", F.u32(0))
        sh.elementwise(scale_domain, lambda at: scale_from_amax(spec.rule, at.load(amax)), (sf_val, sf_inv))
        sh.elementwise((BM, H), lambda at: encode("e4m3", at.load(v) * at.group(sf_inv, npc)), q)

    @T.macro
    def store_rows(WG, SF, valid_row, weight_sum, sfv_a, sfv_b, row0, rsf, sf_sm, sf_sk):
        if spec.weights:
            for i in T.Parallel(BM):
                if row0 + i < M:
                    WG[row0 + i] = T.Select(valid_row[i, 0] != T.float32(0.0), weight_sum[i] * rsf, T.float32(0.0))
        if quantized:
            for i, g in T.Parallel(BM, groups):
                if row0 + i < M:
                    SF[sf_address(row0 + i, g, sf_sm, sf_sk, spec.sf_layout)] = T.Select(
                        valid_row[i, 0] != T.float32(0.0), sfv_a[i, g], T.Cast(sf_dtype, 0))
                    SF[sf_address(row0 + i, groups + g, sf_sm, sf_sk, spec.sf_layout)] = T.Select(
                        valid_row[i, 0] != T.float32(0.0), sfv_b[i, g], T.Cast(sf_dtype, 0))

    @T.macro
    def body(X, XSF, G, TOPK, PSUM, XG, ACT, Q, WG, SF, row_base, alignment, rsf, clamp, sf_sm, sf_sk):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, BM)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * BM
                xa = sh.tile((BM, H), in_dtype)
                xb = sh.tile((BM, H), in_dtype)
                gt = sh.tile((BM, H), grad_dtype)
                w_row = row_tile("float32")
                valid_row = row_tile("float32")
                ga = sh.tile((BM, H), out_dtype)
                gb = sh.tile((BM, H), out_dtype)
                outs = [ga, gb]
                act_o = act_f = weight_sum = None
                if spec.recompute:
                    act_o = sh.tile((BM, H), out_dtype)
                    outs.append(act_o)
                if spec.weights:
                    act_f = sh.tile((BM, H), "float32")
                    weight_sum = sh.tile((BM,), "float32")
                    outs.append(act_f)
                sa = sb = va = vb = amax = sfv_a = sfv_b = inv_a = inv_b = qa = qb = None
                if quantized:
                    sa = scale_tile("float32")
                    sb = scale_tile("float32")
                    va = sh.tile((BM, H), "float32")
                    vb = sh.tile((BM, H), "float32")
                    outs += [va, vb]
                    amax = scale_tile("uint32")
                    sfv_a = scale_tile(sf_dtype)
                    sfv_b = scale_tile(sf_dtype)
                    inv_a = scale_tile("float32")
                    inv_b = scale_tile("float32")
                    qa = sh.tile((BM, H), "uint8")
                    qb = sh.tile((BM, H), "uint8")
                sh.buffer_versions({xa: 2, xb: 2, gt: 2})
                sh.copy(X[row0, 0], xa)
                sh.copy(X[row0, H], xb)
                sh.copy(G[row0, 0], gt)
                with sh.vector(SIMT):
                    row_setup(TOPK, PSUM, XSF, w_row, valid_row, sa, sb, row0, row_base, alignment, rsf)
                with sh.vector(SIMT):
                    backward(xa, xb, sa, sb, gt, w_row, valid_row, clamp, tuple(outs))
                if spec.weights or quantized:
                    with sh.vector(SIMD):
                        if spec.weights:
                            weight_row_sums(gt, act_f, weight_sum)
                        if quantized:
                            quantize_half(va, amax, sfv_a, inv_a, qa)
                            quantize_half(vb, amax, sfv_b, inv_b, qb)
                if spec.weights or quantized:
                    with sh.vector(SIMT):
                        store_rows(WG, SF, valid_row, weight_sum, sfv_a, sfv_b, row0, rsf, sf_sm, sf_sk)
                sh.copy(ga, XG[row0, 0])
                sh.copy(gb, XG[row0, H])
                if spec.recompute:
                    sh.copy(act_o, ACT[row0, 0])
                if quantized:
                    sh.copy(qa, Q[row0, 0])
                    sh.copy(qb, Q[row0, H])

    @TK.prim_func
    def swiglu_backward_kernel(
        X: TK.StridedTensor((M, 2 * H), (x_stride, 1), in_dtype),
        XSF: TK.Tensor((XSF_M, 2 * groups), "float32"),
        G: TK.StridedTensor((M, H), (g_stride, 1), grad_dtype),
        TOPK: TK.Tensor((TOPK_LEN,), "float32"),
        PSUM: TK.Tensor((E,), "int32"),
        XG: TK.Tensor((M, 2 * H), out_dtype),
        ACT: TK.Tensor((ACT_M, H), out_dtype),
        Q: TK.Tensor((Q_M, 2 * H), "uint8"),
        WG: TK.Tensor((WG_LEN,), "float32"),
        SF: TK.Tensor((SF_LEN,), sf_dtype),
        x_stride: TK.int32, g_stride: TK.int32, row_base: TK.int32, alignment: TK.int32, rsf: TK.float32,
        clamp: TK.float32, sf_sm: TK.int32, sf_sk: TK.int32,
    ):
        body(X, XSF, G, TOPK, PSUM, XG, ACT, Q, WG, SF, row_base, alignment, rsf, clamp, sf_sm, sf_sk)

    return swiglu_backward_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_quant.swiglu_backward.SwigluBackwardCall``) on ``target``."""
    spec = call.spec
    num_tokens = call.x.shape[0]
    if num_tokens == 0:
        return
    x, g = bit_view(call.x), bit_view(call.act_x_grad)
    x_grad, act_out = bit_view(call.x_grad), bit_view(call.act_out)
    device = x.device
    f32_dummy = torch.zeros(1, dtype=torch.float32, device=device)
    psum = call.psum if call.psum is not None else torch.zeros(1, dtype=torch.int32, device=device)
    rsf = 1.0 if call.routed_scaling_factor is None else call.routed_scaling_factor
    clamp = 0.0 if call.clamp_value is None else call.clamp_value
    quantized = spec.num_per_channels is not None
    q = bit_view(call.x_grad_fp8) if quantized else torch.zeros((1, 2 * spec.hidden), dtype=torch.uint8,
                                                                  device=device)
    act = act_out if spec.recompute else torch.zeros((1, spec.hidden), dtype=act_out.dtype, device=device)
    xsf_dummy = torch.zeros((1, 2), dtype=torch.float32, device=device)

    def run(kernel, start: int, stop: int) -> None:
        xsf = call.x_sf[start:stop] if quantized else xsf_dummy
        topk = call.topk_weights[start:stop] if spec.weights else f32_dummy
        weight_grad = call.weight_grad[start:stop] if spec.weights else f32_dummy
        if quantized:
            sf, sf_sm, sf_sk = spec.sf_layout.kernel_view(call.x_grad_fp8_sf[start:stop])
        else:
            sf, sf_sm, sf_sk = f32_dummy, 0, 0
        kernel(x[start:stop], xsf, g[start:stop], topk, psum, x_grad[start:stop],
               act[start:stop] if spec.recompute else act, q[start:stop] if quantized else q, weight_grad, sf,
               x.stride(0), g.stride(0), start, call.alignment, rsf, clamp, sf_sm, sf_sk)

    build_swiglu_backward.launch_rows(spec, target, num_tokens, run, align=block_rows(spec.hidden))
