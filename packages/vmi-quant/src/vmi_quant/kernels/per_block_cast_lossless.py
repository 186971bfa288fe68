"""``per_block_cast_lossless`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

FP4 data with power-of-two scales per input block is re-quantized to E4M3 with one
scale per (larger) output block, exactly. A work tile is ``BLOCK_M`` tokens (a multiple of
the output block height) x ``BLOCK_K`` channels, so it covers whole input and output
blocks; tiles go round-robin to persistent workers. Token count, hidden size and all
strides are runtime values (the dispatch guarantees multiples of 128). Per tile:

1. DMA the FP4 tile in; gather the exponents of the input blocks it covers (UE8M0
   bytes, or fp32 SF bits >> 23);
2. per output block: max and min of its input exponents by a per-lane serial loop;
   ``E_out = max(max - 6, 0)``; scatter ``E_out`` into any output SF layout; flag the
   call as invalid when ``min + 5 < E_out`` (the rescale would not be exact) or an SF is
   negative;
3. per element: ``e4m3(fp4 * 2^(E_in - E_out))`` (exact); DMA the E4M3 tile out.

The dispatch raises when the kernel flagged the call. On Ascend, steps 1-2 (gathers and
scatters at computed addresses, per-lane serial loops, the status flag) run in a SIMT region
and step 3 as explicit vector code (a SIMD region, ``vmi_core.tl.vector``).
"""


from dataclasses import dataclass

import torch

from vmi_core.cpu_parallel import run_rows
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, SIMT, Shell
from vmi_core.tl.vector import decode
from vmi_quant.sf_layout import SFLayout, sf_address

from ..reference.lossless import EXPONENT_FOOTROOM, EXPONENT_HEADROOM

BLOCK_K = 128
ALIGN = 128
MAX_BLOCK = 128


@dataclass(frozen=True)
class LosslessSpec:
    """Everything a per_block_cast_lossless kernel is specialised on (shapes are runtime values)."""

    in_sf_layout: SFLayout
    in_block_m: int
    in_block_k: int
    sf_layout: SFLayout
    block_m: int
    block_k: int


def tile_rows(spec: LosslessSpec) -> int:
    """Tokens per work tile: whole output blocks, at least 32."""
    return max(spec.block_m, 32)


@kernel(simd_parallel=False, simt_8bit=True)
def build_per_block_cast_lossless(spec: LosslessSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    BM, BK = tile_rows(spec), BLOCK_K
    bm_in, bk_in, bm, bk = spec.in_block_m, spec.in_block_k, spec.block_m, spec.block_k
    in_rows, in_cols = BM // bm_in, BK // bk_in
    out_rows, out_cols = BM // bm, BK // bk
    # Input blocks per output block along each axis.
    span_m, span_k = bm // bm_in, bk // bk_in
    in_fp32 = spec.in_sf_layout.kind == "fp32"
    xsf_dtype = "float32" if in_fp32 else "uint8"
    sf_dtype = "float32" if spec.sf_layout.kind == "fp32" else "uint8"

    M = TK.dynamic("M")
    XK = TK.dynamic("XK")
    K = TK.dynamic("K")
    XSF_LEN = TK.dynamic("XSF_LEN")
    SF_LEN = TK.dynamic("SF_LEN")
    x_stride = TK.dynamic("x_stride")
    out_stride = TK.dynamic("out_stride")

    def exponent_of(stored):
        # fp32 SF: the sign lands above bit 7, so a negative SF exceeds 255 and is flagged.
        return T.reinterpret(stored, "uint32") >> F.u32(23) if in_fp32 else T.Cast("uint32", stored)

    @T.macro
    def load_exponents(XSF, e_in, in_m0, in_k0, xsf_sm, xsf_sk):
        for r, c in T.Parallel(in_rows, in_cols):
            e_in[r, c] = exponent_of(XSF[sf_address(in_m0 + r, in_k0 + c, xsf_sm, xsf_sk, spec.in_sf_layout)])

    @T.macro
    def output_exponents(e_in, e_out, SF, STATUS, out_m0, out_k0, sf_sm, sf_sk):
        for r, c in T.Parallel(out_rows, out_cols):
            # Per-lane registers, not tiles: a tile written inside the serial loops would need a
            # barrier in a branch only some threads take when there are fewer lanes than threads.
            hi = T.alloc_var("uint32")
            lo = T.alloc_var("uint32")
            hi = F.u32(0)
            lo = F.u32(0xFFFFFFFF)
            for u in T.serial(span_m):
                for v in T.serial(span_k):
                    hi = T.max(hi, e_in[r * span_m + u, c * span_k + v])
                    lo = T.min(lo, e_in[r * span_m + u, c * span_k + v])
            # A select, not T.max(hi, ...): TVM's C code generator binds a min/max operand to a
            # variable and reuses it for the same text later in the scope, even after a store (with
            # one input block per output block the loops above vanish, and hi's old value was used).
            e_out[r, c] = T.if_then_else(hi > F.u32(EXPONENT_HEADROOM), hi - F.u32(EXPONENT_HEADROOM), F.u32(0))
            if hi > F.u32(255) or e_out[r, c] > lo + F.u32(EXPONENT_FOOTROOM):
                STATUS[0] = T.int32(1)
            if sf_dtype == "float32":
                SF[sf_address(out_m0 + r, out_k0 + c, sf_sm, sf_sk, spec.sf_layout)] = \
                    F.pow2_from_exponent(e_out[r, c])
            else:
                SF[sf_address(out_m0 + r, out_k0 + c, sf_sm, sf_sk, spec.sf_layout)] = T.Cast("uint8", e_out[r, c])

    def rescaled(x, e_in, e_out, at):
        row = at.head[0]
        # 2^(E_in - E_out) as fp32; exact for every valid call (E_in - E_out in [-5, 6]).
        exponent = at.group(e_in, bk_in, row=row // bm_in) + F.u32(127) - at.group(e_out, bk, row=row // bm)
        return F.f32_to_e4m3(decode("e2m1", at, x) * F.pow2_from_exponent(exponent))

    @T.macro
    def rescale(x, e_in, e_out, q):
        sh.elementwise((BM, BK), lambda at: rescaled(x, e_in, e_out, at), q, fp4_tiles=(x,))

    @TK.prim_func
    def per_block_cast_lossless_kernel(
        X: TK.StridedTensor((M, XK), (x_stride, 1), "uint8"),
        XSF: TK.Tensor((XSF_LEN,), xsf_dtype),
        OUT: TK.StridedTensor((M, K), (out_stride, 1), "uint8"),
        SF: TK.Tensor((SF_LEN,), sf_dtype),
        STATUS: TK.Tensor((1,), "int32"),
        x_stride: TK.int32, out_stride: TK.int32,
        xsf_sm: TK.int32, xsf_sk: TK.int32, sf_sm: TK.int32, sf_sk: TK.int32,
    ):
        with sh.persistent_kernel() as worker:
            for tm, tk in sh.tiles([T.ceildiv(M, BM), T.ceildiv(K, BK)], worker, group_size=T.ceildiv(K, BK)):
                # Scalars, not let bindings: TileLang would inline the tile index math (with its
                # divisions) into every element access.
                row0 = T.alloc_var("int32")
                k0 = T.alloc_var("int32")
                in_m0 = T.alloc_var("int32")
                in_k0 = T.alloc_var("int32")
                out_m0 = T.alloc_var("int32")
                out_k0 = T.alloc_var("int32")
                row0 = tm * BM
                k0 = tk * BK
                in_m0 = tm * in_rows
                in_k0 = tk * in_cols
                out_m0 = tm * out_rows
                out_k0 = tk * out_cols
                x = sh.tile((BM, BK // 2), "uint8")
                e_in = sh.group_tile(in_rows, in_cols, "uint32")
                e_out = sh.group_tile(out_rows, out_cols, "uint32")
                q = sh.tile((BM, BK), "uint8")
                sh.buffer_versions({x: 2, q: 2})
                sh.copy(X[row0, k0 // 2], x)
                # Exponents gathered and scattered at computed addresses in SIMT, the rescale in SIMD.
                with sh.vector(SIMT):
                    load_exponents(XSF, e_in, in_m0, in_k0, xsf_sm, xsf_sk)
                    output_exponents(e_in, e_out, SF, STATUS, out_m0, out_k0, sf_sm, sf_sk)
                with sh.vector(SIMD):
                    rescale(x, e_in, e_out, q)
                sh.copy(q, OUT[row0, k0])

    return per_block_cast_lossless_kernel


def _row_align(layout: SFLayout, block_m: int) -> int:
    """Tokens per SF storage row (a packed word along M spans ``pack`` block rows)."""
    return block_m * (layout.pack if layout.pack_along_m else 1)


def launch(call, target: str) -> bool:
    """Run a validated call (``vmi_quant.per_block_cast_lossless.LosslessCall``); False if the kernel
    flagged the input as not losslessly representable."""
    spec = call.spec
    num_tokens = call.data.shape[0]
    if num_tokens == 0:
        return True
    kernel = build_per_block_cast_lossless.compiled(spec, target)
    x = call.data.view(torch.uint8)
    out = call.out.view(torch.uint8)
    status = torch.zeros(1, dtype=torch.int32, device=x.device)
    in_rows = _row_align(spec.in_sf_layout, spec.in_block_m)
    out_rows = _row_align(spec.sf_layout, spec.block_m)

    def run(start: int, stop: int) -> None:
        xsf, xsf_sm, xsf_sk = spec.in_sf_layout.kernel_view(call.in_sf[start // in_rows:])
        sf, sf_sm, sf_sk = spec.sf_layout.kernel_view(call.sf[start // out_rows:])
        kernel(x[start:stop], xsf, out[start:stop], sf, status, x.stride(0), out.stride(0), xsf_sm, xsf_sk,
               sf_sm, sf_sk)

    if target == "cpu":
        align = max(ALIGN, in_rows, out_rows)
        run_rows(run, num_tokens, align=align)
    else:
        run(0, num_tokens)
    return int(status.item()) == 0
