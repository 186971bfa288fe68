"""``per_block_cast`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

Scaling blocks are ``bm x bk`` (``bm, bk`` in {32, 128}). A work tile is one block row
(``bm`` tokens) by ``BLOCK_K`` channels, so it covers whole blocks; tiles go round-robin
to persistent workers. Token count, hidden size and all strides are runtime values
(the dispatch guarantees both are multiples of 128, so every tile is full). Per tile:

1. DMA the input tile into an on-chip tile (row stride = the token stride);
2. block amax in two levels: per (row, block) a per-lane accumulator over the block's
   ``bk`` columns, then per block a serial max over the ``bm`` row partials;
3. per block: sf and sf_inv from the amax (or sf_inv = 1/sf from a given SF);
4. per element: scale, round and encode;
5. DMA the data tile out; scatter the tile's SF row into any SF layout (unused bytes
   of packed words are never touched).

On Ascend, phases 2-4 run as explicit vector code (a SIMD region, ``vmi_core.tl.vector``);
the SF read or written at computed addresses runs in a SIMT region.
"""


from dataclasses import dataclass

from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, SIMT, Shell
from vmi_core.tl.vector import decode
from vmi_quant.sf_layout import SFLayout, sf_address

from .common import KERNEL_DTYPE, ScaleRule, encode, load_scale, scale_from_amax

MODES = ("cast", "sf_only", "cast_only")
BLOCK_SIZES = (32, 128)
# Channels per work tile: a multiple of every block width; M and K are multiples of it.
BLOCK_K = 128
ALIGN = 128


@dataclass(frozen=True)
class PerBlockCastSpec:
    """Everything a per_block_cast kernel is specialised on (shapes are runtime values)."""

    in_fmt: str
    fmt: str
    block_m: int
    block_k: int
    mode: str
    rule: ScaleRule
    sf_layout: SFLayout


def _phys(fmt: str, cols: int) -> int:
    """Storage columns of ``cols`` logical elements (FP4: two per byte)."""
    return cols // 2 if fmt == "e2m1" else cols


@kernel(simd_parallel=False, simt_8bit=True)
def build_per_block_cast(spec: PerBlockCastSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    fmt, in_fmt = spec.fmt, spec.in_fmt
    BM, BK, bk = spec.block_m, BLOCK_K, spec.block_k
    groups = BK // bk
    in_dtype = KERNEL_DTYPE[in_fmt]
    sf_dtype = "float32" if spec.sf_layout.kind == "fp32" else "uint8"
    writes_data = spec.mode != "sf_only"
    computes_sf = spec.mode != "cast_only"

    M = TK.dynamic("M")
    K = TK.dynamic("K")
    OK = TK.dynamic("OK")
    SF_LEN = TK.dynamic("SF_LEN")
    x_stride = TK.dynamic("x_stride")
    out_stride = TK.dynamic("out_stride")

    def scaled(x, sf_inv, at):
        return decode(in_fmt, at, x) * at.group(sf_inv, bk, row=0)

    @T.macro
    def compute_scales(x, row_max, block_max, sf_val, sf_inv):
        sh.segment_reduce(row_max, (BM, BK), bk, lambda at: F.abs_bits(decode(in_fmt, at, x)), "max", F.u32(0))
        sh.column_reduce(block_max, row_max, (BM, groups), "max", F.u32(0))
        sh.elementwise(sh.group_domain(1, groups), lambda at: scale_from_amax(spec.rule, at.load(block_max)),
                       (sf_val, sf_inv))

    @T.macro
    def read_scales(SF, sf_inv, sf_m, sf_k, sf_sm, sf_sk):
        for g in T.Parallel(groups):
            sf_inv[0, g] = T.float32(1.0) / load_scale(spec.sf_layout, SF, sf_m, sf_k + g, sf_sm, sf_sk)

    @T.macro
    def quantize(x, sf_inv, q):
        sh.elementwise((BM, BK), lambda at: encode(fmt, scaled(x, sf_inv, at)), q, pack_e2m1=fmt == "e2m1")

    @T.macro
    def scatter_scales(SF, sf_val, sf_m, sf_k, sf_sm, sf_sk):
        """Write the tile's blocks into any SF layout; only their own bytes are touched."""
        for g in T.Parallel(groups):
            SF[sf_address(sf_m, sf_k + g, sf_sm, sf_sk, spec.sf_layout)] = sf_val[0, g]

    @T.macro
    def body(X, OUT, SF, sf_sm, sf_sk):
        with sh.persistent_kernel() as worker:
            for tm, tk in sh.tiles([T.ceildiv(M, BM), T.ceildiv(K, BK)], worker, group_size=T.ceildiv(K, BK)):
                # Scalars, not let bindings: TileLang would inline the tile index math (with its
                # divisions) into every element access.
                row0 = T.alloc_var("int32")
                k0 = T.alloc_var("int32")
                sf_m = T.alloc_var("int32")
                sf_k = T.alloc_var("int32")
                row0 = tm * BM
                k0 = tk * BK
                sf_m = tm
                sf_k = tk * groups
                x = sh.tile((BM, BK), in_dtype)
                row_max = sh.group_tile(BM, groups, "uint32")
                block_max = sh.group_tile(1, groups, "uint32")
                sf_val = sh.group_tile(1, groups, sf_dtype)
                sf_inv = sh.group_tile(1, groups, "float32")
                if writes_data:
                    q = sh.tile((BM, _phys(fmt, BK)), "uint8")
                    sh.buffer_versions({x: 2, q: 2})
                else:
                    q = None
                    sh.buffer_versions({x: 2})
                sh.copy(X[row0, k0], x)
                # SF reads and writes at computed addresses in SIMT, the rest in SIMD.
                if not computes_sf:
                    with sh.vector(SIMT):
                        read_scales(SF, sf_inv, sf_m, sf_k, sf_sm, sf_sk)
                with sh.vector(SIMD):
                    if computes_sf:
                        compute_scales(x, row_max, block_max, sf_val, sf_inv)
                    if writes_data:
                        quantize(x, sf_inv, q)
                if computes_sf:
                    with sh.vector(SIMT):
                        scatter_scales(SF, sf_val, sf_m, sf_k, sf_sm, sf_sk)
                if writes_data:
                    sh.copy(q, OUT[row0, _phys(fmt, k0)])

    if writes_data:
        @TK.prim_func
        def per_block_cast_kernel(
            X: TK.StridedTensor((M, K), (x_stride, 1), in_dtype),
            OUT: TK.StridedTensor((M, OK), (out_stride, 1), "uint8"),
            SF: TK.Tensor((SF_LEN,), sf_dtype),
            x_stride: TK.int32, out_stride: TK.int32, sf_sm: TK.int32, sf_sk: TK.int32,
        ):
            body(X, OUT, SF, sf_sm, sf_sk)
    else:
        @TK.prim_func
        def per_block_cast_kernel(
            X: TK.StridedTensor((M, K), (x_stride, 1), in_dtype),
            SF: TK.Tensor((SF_LEN,), sf_dtype),
            x_stride: TK.int32, sf_sm: TK.int32, sf_sk: TK.int32,
        ):
            body(X, None, SF, sf_sm, sf_sk)

    return per_block_cast_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_quant.per_block_cast.PerBlockCastCall``) on ``target``."""
    spec = call.spec
    x = bit_view(call.x)
    out = None if call.out is None else bit_view(call.out)
    bm = spec.block_m

    def run(kernel, start: int, stop: int) -> None:
        sf, sf_sm, sf_sk = spec.sf_layout.kernel_view(call.sf[start // bm:stop // bm])
        if out is None:
            kernel(x[start:stop], sf, x.stride(0), sf_sm, sf_sk)
        else:
            kernel(x[start:stop], out[start:stop], sf, x.stride(0), out.stride(0), sf_sm, sf_sk)

    build_per_block_cast.launch_rows(spec, target, call.x.shape[0], run, align=ALIGN)
