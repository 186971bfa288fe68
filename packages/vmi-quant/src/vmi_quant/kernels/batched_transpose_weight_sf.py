"""``batched_transpose_weight_sf`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

From the fp32 power-of-two block scales ``sf[g, rn, rk]`` of a weight ``(G, n, k)`` (blocks of
``bs x bs``), the kernel writes the packed UE8M0 exponents of the weight's SF along K,
broadcast over the ``bs`` weight rows of each block row (``sf0``, storage ``[G][P0][n]``), and
of the transposed weight's SF along N (``sf1``, storage ``[G][P1][k]``). A work tile is
``S x S`` scales of one group (``S * bs = 512`` weight rows or columns); tiles go round-robin to
persistent workers over the domain ``(group, scale-row tile, scale-column tile)``; ``G``, the
scale grid and every stride are runtime values. Per tile:

1. DMA the ``S x S`` fp32 scales in (clamped at the grid's edges);
2. form the packed words: ``w0[p, r]`` holds the exponents of scales ``(r, p*pf + j)`` and
   ``w1[p, c]`` those of ``(p*pf + j, c)`` in byte ``j``; scales outside the grid count as 0,
   so the pad bytes of a last word are 0. Every in-range scale whose bits are not those of +0
   or a finite power of two (``bits & 0x807FFFFF != 0``, or +inf) raises the status word;
3. broadcast: ``stage0[p, i] = w0[p, i // bs]`` and ``stage1[p, i] = w1[p, i // bs]`` over the
   tile's ``S * bs`` weight rows / columns; DMA them to ``sf0[g, P0 words, n rows]`` and
   ``sf1[g, P1 words, k columns]`` (clamped at the edges).

One launch per weight: every weight is its own tensor, and a single launch over a table of
tensor addresses has no portable form in TileLang (a kernel's global buffers are its
parameters); the launch per weight takes the weight's runtime shape instead.

On Ascend, step 2 is a SIMT region: it is a transpose of the tile (``w0`` reads each row's
scales down the columns, ``w1`` each column's down the rows) with per-(row, column) edge masks
and a status store from flagged lanes, and it touches ``S*S`` scales against the ``2*S*S*bs/pf``
words step 3 writes. Step 3, the bulk of the bytes, is explicit vector code (a SIMD region:
``at.group`` gathers each word into the lanes of its ``bs`` rows, the store narrows to the word).
"""

from dataclasses import dataclass

import torch

from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T, tirx
from vmi_core.tl.shell import SIMD, SIMT, Shell
from vmi_core.tl.simd import cast

BLOCK_SIZES = (32, 128)
# Weight rows (or columns) of one work tile: a staging tile is (S / pf) x 512 words.
TILE_WEIGHT_ROWS = 512
# Bits that are 0 in +0 and in every positive power of two: the sign and the mantissa.
NOT_POW2_BITS = 0x807FFFFF
# Kernel word types (TileLang's C wrapper has no uint32 buffers; the int32 words are the same bits).
_WORD_DTYPES = {2: "uint16", 4: "int32"}


@dataclass(frozen=True)
class TransposeSpec:
    """Everything a kernel is specialised on: block size and exponents per word."""

    block_size: int
    pack: int


def tile_scales(block_size: int) -> int:
    """Scales per side of a work tile."""
    return TILE_WEIGHT_ROWS // block_size


@kernel(simd_parallel=False)
def build_batched_transpose_weight_sf(spec: TransposeSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    bs, pf = spec.block_size, spec.pack
    S = tile_scales(bs)
    W = S // pf
    R = S * bs
    # Scale-tile rows of at least 32 bytes (a DMA's UB row pitch); columns past S are not read.
    XC = max(S, 8)
    word = _WORD_DTYPES[pf]

    G = TK.dynamic("G")
    NSN = TK.dynamic("NSN")
    NSK = TK.dynamic("NSK")
    P0 = TK.dynamic("P0")
    P1 = TK.dynamic("P1")
    N = TK.dynamic("N")
    K = TK.dynamic("K")
    sf_sg = TK.dynamic("sf_sg")
    sf_sn = TK.dynamic("sf_sn")
    sf0_sg = TK.dynamic("sf0_sg")
    sf0_sp = TK.dynamic("sf0_sp")
    sf1_sg = TK.dynamic("sf1_sg")

    def in_grid(row, col, rows, cols):
        # Scales past the grid's edges count as +0. The cpu copy reads them as zeros already;
        # elsewhere they are masked (the masks are most of the kernel's lowering time).
        return True if sh.edges_read_as_zero else tirx.all(row < rows, col < cols)

    def masked(valid, value):
        return value if valid is True else T.Select(valid, value, F.u32(0))

    def exponent(x, valid):
        # The scales are checked: a valid one's bits are its biased exponent << 23.
        return masked(valid, T.reinterpret(x, "uint32") >> F.u32(23))

    def not_pow2(x, valid):
        bits = T.reinterpret(x, "uint32")
        # A mantissa or sign bit (-0, subnormals, NaN, negatives), or +inf (exponent 255).
        return masked(valid, (bits & F.u32(NOT_POW2_BITS)) | T.Cast("uint32", bits > F.u32(0x7F7FFFFF)))

    def packed(x, rows, cols, positions):
        # Byte j: the exponent of the scale at ``positions[j]``.
        value = F.u32(0)
        for j, (row, col) in enumerate(positions):
            value = value | (exponent(x[row, col], in_grid(row, col, rows, cols)) << F.u32(8 * j))
        return value

    def along_k(p, r):
        return [(r, p * pf + j) for j in range(pf)]

    def along_n(p, c):
        return [(p * pf + j, c) for j in range(pf)]

    def row_flags(x, rows, cols, p, r):
        # The scales of w0[p, r]: over the tile's (p, r), every scale once.
        bad = F.u32(0)
        for row, col in along_k(p, r):
            bad = bad | not_pow2(x[row, col], in_grid(row, col, rows, cols))
        return bad

    @T.macro
    def words(x, w0, w1, STATUS, rows, cols):
        for p, r in T.Parallel(W, S):
            if row_flags(x, rows, cols, p, r) != F.u32(0):
                STATUS[0] = T.int32(1)
            w0[p, r] = packed(x, rows, cols, along_k(p, r))
            w1[p, r] = packed(x, rows, cols, along_n(p, r))

    @T.macro
    def broadcast(w0, w1, stage0, stage1):
        sh.elementwise((W, R), lambda at: cast(at.group(w0, bs), word), stage0)
        sh.elementwise((W, R), lambda at: cast(at.group(w1, bs), word), stage1)

    @TK.prim_func
    def batched_transpose_weight_sf_kernel(
        SF: TK.StridedTensor((G, NSN, NSK), (sf_sg, sf_sn, 1), "float32"),
        SF0: TK.StridedTensor((G, P0, N), (sf0_sg, sf0_sp, 1), word),
        SF1: TK.StridedTensor((G, P1, K), (sf1_sg, K, 1), word),
        STATUS: TK.Tensor((1,), "int32"),
        sf_sg: TK.int32, sf_sn: TK.int32, sf0_sg: TK.int32, sf0_sp: TK.int32, sf1_sg: TK.int32,
    ):
        with sh.persistent_kernel() as worker:
            # No tile reuses another's data, so tiles are not grouped per worker (the grouping's
            # index math nearly doubles the Ascend lowering time).
            for g, tn, tk in sh.tiles([G, T.ceildiv(NSN, S), T.ceildiv(NSK, S)], worker):
                # Scalars, not let bindings: TileLang would inline the index math into every access
                # (every element of an edge copy on cpu).
                group = T.alloc_var("int32")
                r0 = T.alloc_var("int32")
                c0 = T.alloc_var("int32")
                rows = T.alloc_var("int32")
                cols = T.alloc_var("int32")
                group = g
                r0 = tn * S
                c0 = tk * S
                rows = NSN - r0
                cols = NSK - c0
                x = sh.tile((S, XC), "float32")
                w0 = sh.group_tile(W, S, "uint32")
                w1 = sh.group_tile(W, S, "uint32")
                stage0 = sh.tile((W, R), word)
                stage1 = sh.tile((W, R), word)
                sh.buffer_versions({x: 2, stage0: 2, stage1: 2})
                sh.copy(SF[group, r0, c0], x)
                # The transpose into packed words in SIMT, the broadcast in SIMD.
                with sh.vector(SIMT):
                    words(x, w0, w1, STATUS, rows, cols)
                with sh.vector(SIMD):
                    broadcast(w0, w1, stage0, stage1)
                sh.copy(stage0, SF0[group, c0 // pf, r0 * bs])
                sh.copy(stage1, SF1[group, r0 // pf, c0 * bs])

    return batched_transpose_weight_sf_kernel


def launch(spec: TransposeSpec, sf: torch.Tensor, sf0: torch.Tensor, sf1: torch.Tensor, status: torch.Tensor,
           target: str) -> None:
    """Run ``spec`` on one weight: ``sf`` its ``(G, n/bs, k/bs)`` scales, ``sf0`` and ``sf1`` the
    ``(G, P0, n)`` / ``(G, P1, k)`` storage of its outputs, ``status`` its one int32 status word
    (set to 1 when a scale is not a power of two)."""
    if sf.numel() == 0:
        return
    bs, pf = spec.block_size, spec.pack
    word = torch.uint16 if pf == 2 else torch.int32
    sf0, sf1 = sf0.view(word), sf1.view(word)

    def run(kernel, start: int, stop: int) -> None:
        part = sf[:, start:stop]
        out0 = sf0[:, :, start * bs:stop * bs]
        out1 = sf1[:, start // pf:-(-stop // pf)]
        kernel(part, out0, out1, status, part.stride(0), part.stride(1), out0.stride(0), out0.stride(1),
               out1.stride(0))

    build_batched_transpose_weight_sf.launch_rows(spec, target, sf.shape[1], run, align=tile_scales(bs),
                                                  min_rows=tile_scales(bs))
