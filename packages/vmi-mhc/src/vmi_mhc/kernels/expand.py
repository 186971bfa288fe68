"""``expand`` as two parallel-style TileLang kernels for ascend, cuda and cpu.

Both kernels hand out work tiles of one token and ``BLOCK_H`` hidden columns round-robin to
persistent workers (the hidden tiles of a token on consecutive iterations of one worker). The
token count and the hidden size are runtime values: one compiled kernel per stream count ``n``.

* Forward: DMA the token's slice of ``x`` in; copy it into each of the ``n`` rows of a
  ``(n, BLOCK_H)`` tile; DMA that tile out to the token's ``n`` streams (rows ``H`` apart).
* Backward: DMA the token's ``(n, BLOCK_H)`` slice of ``o_grad`` in; per column, the fp32 sum of
  the streams (stream 0, then 1 .. n-1 added in order), rounded to bf16 once; DMA it out.

Columns past ``H`` in a tail tile are computed on whatever the tile holds and never stored (the
DMA clamps them). On Ascend the copy and the sum are explicit vector code in a SIMD region: bf16
lanes widened into 32-bit lanes by the load and packed again by the store.
"""

from dataclasses import dataclass

from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import Shell

from ..tl.mix import row_at

# Hidden columns per work tile: whole 64-lane registers, and a divisor of the usual hidden sizes
# (1280 ... 7168 are multiples of 256) up to a quarter of them, so that few tiles are tails.
BLOCK_H = 512
# Buffer versions of the on-chip tiles: DMA in of the next tile, compute and DMA out overlap.
VERSIONS = 3


@dataclass(frozen=True)
class ExpandSpec:
    """Everything an expand kernel is specialised on (the token count and hidden size are runtime)."""

    mhc_mult: int


@kernel(simd_parallel=False)
def build_expand_fwd(spec: ExpandSpec, target: str):
    """The forward kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    n, BH = spec.mhc_mult, BLOCK_H
    M = TK.dynamic("M")
    H = TK.dynamic("H")

    @TK.prim_func
    def expand_fwd_kernel(X: TK.Tensor((M, H), "uint16"), O: TK.Tensor((M, n, H), "uint16")):
        with sh.persistent_kernel() as worker:
            for t, th in sh.tiles([M, T.ceildiv(H, BH)], worker, group_size=T.ceildiv(H, BH)):
                # A scalar, not a let binding: TileLang would inline the index math into every access.
                h0 = T.alloc_var("int32")
                h0 = th * BH
                x = sh.tile((BH,), "uint16")
                o = sh.tile((n, BH), "uint16")
                sh.buffer_versions({x: VERSIONS, o: VERSIONS})
                sh.elementwise_stream([(X[t, h0], x)], lambda x, at: row_at(at).load(x), [(o, O[t, 0, h0])])

    return expand_fwd_kernel


@kernel(simd_parallel=False)
def build_expand_bwd(spec: ExpandSpec, target: str):
    """The backward kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    n, BH = spec.mhc_mult, BLOCK_H
    M = TK.dynamic("M")
    H = TK.dynamic("H")

    def stream_sum(og, at):
        total = F.bf16_to_f32(row_at(at, 0).load(og))
        for m in range(1, n):
            total = total + F.bf16_to_f32(row_at(at, m).load(og))
        return F.f32_to_bf16(total)

    @TK.prim_func
    def expand_bwd_kernel(OG: TK.Tensor((M, n, H), "uint16"), XG: TK.Tensor((M, H), "uint16")):
        with sh.persistent_kernel() as worker:
            for t, th in sh.tiles([M, T.ceildiv(H, BH)], worker, group_size=T.ceildiv(H, BH)):
                h0 = T.alloc_var("int32")
                h0 = th * BH
                og = sh.tile((n, BH), "uint16")
                xg = sh.tile((BH,), "uint16")
                sh.buffer_versions({og: VERSIONS, xg: VERSIONS})
                sh.elementwise_stream([(OG[t, 0, h0], og)], stream_sum, [(xg, XG[t, h0])])

    return expand_bwd_kernel


def launch_fwd(call, target: str) -> None:
    """Run a validated forward call (``vmi_mhc.expand.ExpandFwdCall``) on ``target``."""
    x, o = bit_view(call.x), bit_view(call.o)
    build_expand_fwd.launch_rows(call.spec, target, x.shape[0],
                                 lambda kernel, start, stop: kernel(x[start:stop], o[start:stop]))


def launch_bwd(call, target: str) -> None:
    """Run a validated backward call (``vmi_mhc.expand.ExpandBwdCall``) on ``target``."""
    og, xg = bit_view(call.o_grad), bit_view(call.x_grad)
    build_expand_bwd.launch_rows(call.spec, target, og.shape[0],
                                 lambda kernel, start, stop: kernel(og[start:stop], xg[start:stop]))
