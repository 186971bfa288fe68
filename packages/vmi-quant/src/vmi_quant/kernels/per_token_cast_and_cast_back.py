"""``per_token_cast_and_cast_back`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

An in-place quantize-dequantize round trip. Work tiles are ``BLOCK_M`` tokens x
``BLOCK_K`` channels, handed out round-robin to persistent workers. Token count,
hidden size and the row stride are runtime values. Per tile:

1. DMA the tile in (row stride = the token stride);
2. per (token, group): amax of |x| by a per-lane accumulator over the group;
3. per (token, group): sf (as an fp32 value) and sf_inv from the amax;
4. per element: ``q = cast(x * sf_inv)``, then ``x = to_input_dtype(float(q) * sf)``;
5. DMA the tile back to where it came from (partial tiles clamped, so columns past
   the hidden size of a padded row are never written).

Phases 2-4 run as explicit vector code on Ascend (one SIMD region, ``vmi_core.tl.vector``).
"""


from dataclasses import dataclass

from vmi_core.cpu_parallel import MIN_ROWS_PER_THREAD, fold_rows
from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import select
from vmi_core.tl.vector import decode

from .common import KERNEL_DTYPE, ScaleRule, dequantize, encode, scale_value_from_amax

# A tile covers whole groups (num_per_channels <= 128 divides the hidden size).
BLOCK_M = 32
BLOCK_K = 128


@dataclass(frozen=True)
class CastAndCastBackSpec:
    """Everything a round-trip kernel is specialised on (shapes and strides are runtime values)."""

    in_fmt: str
    fmt: str
    num_per_channels: int
    rule: ScaleRule


@kernel(simd_parallel=False)
def build_per_token_cast_and_cast_back(spec: CastAndCastBackSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    npc, fmt, in_fmt = spec.num_per_channels, spec.fmt, spec.in_fmt
    BM, BK = BLOCK_M, BLOCK_K
    groups = BK // npc
    dtype = KERNEL_DTYPE[in_fmt]

    M = TK.dynamic("M")
    K = TK.dynamic("K")
    x_stride = TK.dynamic("x_stride")

    def abs_value(x, k0, at):
        # Columns past the hidden size (a partial last tile) hold no data; where the copy reads
        # them as zeros no mask is needed (which keeps the cpu loop vectorizable).
        magnitude = F.abs_bits(decode(in_fmt, at, x))
        if sh.edges_read_as_zero:
            return magnitude
        return select(at.column() + k0 < K, magnitude, F.u32(0))

    def round_trip(x, sf_val, sf_inv, at):
        code = encode(fmt, decode(in_fmt, at, x) * at.group(sf_inv, npc))
        back = dequantize(fmt, code, at.group(sf_val, npc))
        return back if in_fmt == "fp32" else F.f32_to_bf16(back)

    @T.macro
    def compute_scales(x, k0, amax, sf_val, sf_inv):
        sh.segment_reduce(amax, (BM, BK), npc, lambda at: abs_value(x, k0, at), "max", F.u32(0))
        sh.elementwise(sh.group_domain(BM, groups), lambda at: scale_value_from_amax(spec.rule, at.load(amax)),
                       (sf_val, sf_inv))

    @T.macro
    def cast_and_cast_back(x, sf_val, sf_inv):
        sh.elementwise((BM, BK), lambda at: round_trip(x, sf_val, sf_inv, at), x)

    @TK.prim_func
    def per_token_cast_and_cast_back_kernel(
        X: TK.StridedTensor((M, K), (x_stride, 1), dtype),
        x_stride: TK.int32,
    ):
        with sh.persistent_kernel() as worker:
            for tm, tk in sh.tiles([T.ceildiv(M, BM), T.ceildiv(K, BK)], worker, group_size=T.ceildiv(K, BK)):
                # Scalars, not let bindings: TileLang would inline the tile index math into every access.
                row0 = T.alloc_var("int32")
                k0 = T.alloc_var("int32")
                row0 = tm * BM
                k0 = tk * BK
                x = sh.tile((BM, BK), dtype)
                amax = sh.group_tile(BM, groups, "uint32")
                sf_val = sh.group_tile(BM, groups, "float32")
                sf_inv = sh.group_tile(BM, groups, "float32")
                sh.buffer_versions({x: 2})
                sh.copy(X[row0, k0], x)
                with sh.vector(SIMD):
                    compute_scales(x, k0, amax, sf_val, sf_inv)
                    cast_and_cast_back(x, sf_val, sf_inv)
                sh.copy(x, X[row0, k0])

    return per_token_cast_and_cast_back_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_quant.per_token_cast_and_cast_back.CastAndCastBackCall``) on ``target``."""
    bits = bit_view(call.x)
    num_tokens, hidden = bits.shape
    # Groups never straddle tokens: a call of fewer tokens than a tile's height runs on its tokens
    # cut into tile-wide rows (no padding rows computed) when x is contiguous.
    pieces = hidden // BLOCK_K if target == "cpu" and num_tokens < BLOCK_M and hidden % BLOCK_K == 0 else 1
    folded = fold_rows(pieces, bits) if pieces > 1 else None
    if folded is None:
        pieces = 1
    else:
        bits = folded[0]

    def run(kernel, start: int, stop: int) -> None:
        kernel(bits[start:stop], bits.stride(0))

    # Threads split by tokens, folded or not.
    build_per_token_cast_and_cast_back.launch_rows(call.spec, target, bits.shape[0], run, align=BLOCK_M,
                                                   min_rows=MIN_ROWS_PER_THREAD * pieces)
