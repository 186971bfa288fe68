"""``cast_back`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

Work tiles are ``BLOCK_M`` tokens x ``BLOCK_K`` channels, handed out round-robin
to persistent workers, hidden tiles of one token tile on consecutive iterations.
Per tile:

1. DMA the quantized data tile (E4M3, or packed FP4 bytes) into an on-chip tile;
2. gather the SF blocks the tile touches from any SF layout and decode them to fp32
   (block indices clamped into the grid, so partial tiles read nothing out of range);
3. per element: ``fl32(float(q) * sf)``, stored as fp32 or rounded to bf16 (RNE);
4. DMA the output tile out.

The scaling block ``(bm, bk)`` is a compile-time value (any bm, bk >= 1); token
count, hidden size and the data and SF strides are runtime values. On Ascend the SF
gather (computed addresses) runs in a SIMT region; step 3 runs as explicit vector code
(a SIMD region, ``vmi_core.tl.vector``) for E4M3 data whose SF columns are power-of-two
lane groups of the tile (``bk`` a power of two dividing 128, or a multiple of 128), and
in the SIMT region otherwise (FP4 nibbles, other block widths).
"""


import math
from dataclasses import dataclass

import torch

from vmi_core.cpu_parallel import MIN_ROWS_PER_THREAD, fold_rows
from vmi_core.kernel import kernel
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, SIMT, Shell
from vmi_core.tl.vector import decode
from vmi_quant.sf_layout import SFLayout

from .common import KERNEL_DTYPE, load_scale

IN_FORMATS = ("e4m3", "e2m1")
OUT_FORMATS = ("fp32", "bf16")
# A tile of 32 tokens x 128 channels keeps the SF tile of the finest block (1, 1)
# as small as the data tile, and every tile fits CPU stack arrays and the Ascend UB.
BLOCK_M = 32
BLOCK_K = 128


@dataclass(frozen=True)
class CastBackSpec:
    """Everything a cast_back kernel is specialised on (shapes and strides are runtime values)."""

    in_fmt: str
    out_fmt: str
    sf_layout: SFLayout
    block_m: int
    block_k: int

    def __post_init__(self) -> None:
        if self.in_fmt not in IN_FORMATS or self.out_fmt not in OUT_FORMATS:
            raise ValueError(f"cast_back converts {IN_FORMATS} to {OUT_FORMATS}, got {(self.in_fmt, self.out_fmt)}")
        if self.block_m < 1 or self.block_k < 1:
            raise ValueError(f"blocks must be positive, got {(self.block_m, self.block_k)}")


def _phys(fmt: str, cols: int) -> int:
    """Storage columns of ``cols`` logical elements (FP4: two per byte)."""
    return cols // 2 if fmt == "e2m1" else cols


def _blocks_touched(tile: int, block: int) -> int:
    """The most blocks of size ``block`` that a tile of ``tile`` elements starting at a
    multiple of ``tile`` touches."""
    if tile % block == 0:
        return tile // block
    if block % tile == 0:
        return 1
    return -(-(tile - 1) // block) + 1


def _block_offset(origin, first_block, offset, tile: int, block: int):
    """Index, relative to ``first_block`` (the block of ``origin``, a multiple of ``tile``),
    of the block holding element ``origin + offset``."""
    if tile % block == 0:
        return offset // block
    if block % tile == 0:
        return 0
    return (origin + offset) // block - first_block


def _kernel_config(spec: CastBackSpec) -> dict:
    # The SIMT region reads 8-bit data (and 8-bit SF bytes); SIMD regions are explicit vector code.
    return {"simt_8bit": True, "simd_parallel": False}


@kernel(config=_kernel_config)
def build_cast_back(spec: CastBackSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    BM, BK = BLOCK_M, BLOCK_K
    bm, bk = spec.block_m, spec.block_k
    layout = spec.sf_layout
    in_cols = _phys(spec.in_fmt, BK)
    out_dtype = "float32" if spec.out_fmt == "fp32" else "uint16"
    sf_dtype = "float32" if layout.kind == "fp32" else "uint8"
    sf_rows, sf_cols = _blocks_touched(BM, bm), _blocks_touched(BK, bk)

    M = TK.dynamic("M")
    XK = TK.dynamic("XK")
    K = TK.dynamic("K")
    SF_LEN = TK.dynamic("SF_LEN")
    x_stride = TK.dynamic("x_stride")

    @T.macro
    def load_scales(SF, s, sf_r0, sf_c0, sf_sm, sf_sk):
        """Decode the SF blocks the tile touches (indices clamped into the grid)."""
        for r, c in T.Parallel(sf_rows, sf_cols):
            s[r, c] = load_scale(layout, SF, T.min(sf_r0 + r, T.ceildiv(M, bm) - 1),
                                 T.min(sf_c0 + c, T.ceildiv(K, bk) - 1), sf_sm, sf_sk)

    # SF column of an element relative to the tile's first block: a group of the tile row when
    # blocks divide the tile width (or span it), else computed from the absolute column.
    column_group = bk if BK % bk == 0 else (BK if bk % BK == 0 else None)
    vector = column_group is not None and column_group & (column_group - 1) == 0 and spec.in_fmt != "e2m1"

    def dequantized(x, s, row0, k0, sf_r0, sf_c0, at):
        sf_row = _block_offset(row0, sf_r0, at.head[0], BM, bm)
        if column_group is None:
            scale = s[sf_row, _block_offset(k0, sf_c0, at.j, BK, bk)]
        else:
            scale = at.group(s, column_group, row=sf_row)
        y = decode(spec.in_fmt, at, x) * scale
        return y if spec.out_fmt == "fp32" else F.f32_to_bf16(y)

    @T.macro
    def dequantize(x, s, o, row0, k0, sf_r0, sf_c0):
        sh.elementwise((BM, BK), lambda at: dequantized(x, s, row0, k0, sf_r0, sf_c0, at), o)

    @TK.prim_func
    def cast_back_kernel(
        X: TK.StridedTensor((M, XK), (x_stride, 1), KERNEL_DTYPE[spec.in_fmt]),
        SF: TK.Tensor((SF_LEN,), sf_dtype),
        OUT: TK.Tensor((M, K), out_dtype),
        x_stride: TK.int32, sf_sm: TK.int32, sf_sk: TK.int32,
    ):
        with sh.persistent_kernel() as worker:
            for tm, tk in sh.tiles([T.ceildiv(M, BM), T.ceildiv(K, BK)], worker, group_size=T.ceildiv(K, BK)):
                # Scalars, not let bindings: TileLang would inline the index math (with its
                # divisions) into every element access.
                row0 = T.alloc_var("int32")
                k0 = T.alloc_var("int32")
                sf_r0 = T.alloc_var("int32")
                sf_c0 = T.alloc_var("int32")
                row0 = tm * BM
                k0 = tk * BK
                sf_r0 = row0 // bm
                sf_c0 = k0 // bk
                x = sh.tile((BM, in_cols), KERNEL_DTYPE[spec.in_fmt])
                s = sh.group_tile(sf_rows, sf_cols, "float32")
                o = sh.tile((BM, BK), out_dtype)
                sh.buffer_versions({x: 2, o: 2})
                sh.copy(X[row0, _phys(spec.in_fmt, k0)], x)
                # The SF gather at computed addresses in SIMT; the dequantization in SIMD where the
                # tile's SF columns are lane groups of a power-of-two width.
                with sh.vector(SIMT):
                    load_scales(SF, s, sf_r0, sf_c0, sf_sm, sf_sk)
                    if not vector:
                        dequantize(x, s, o, row0, k0, sf_r0, sf_c0)
                if vector:
                    with sh.vector(SIMD):
                        dequantize(x, s, o, row0, k0, sf_r0, sf_c0)
                sh.copy(o, OUT[row0, k0])

    return cast_back_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_quant.cast_back.CastBackCall``) on ``target``."""
    spec = call.spec
    num_tokens, hidden = call.out.shape
    if hidden == 0:
        return
    x = call.data.view(torch.uint8)
    out = call.out.view(torch.uint16) if spec.out_fmt == "bf16" else call.out
    layout = spec.sf_layout
    sf_grid = call.sf
    pieces = 1
    # A call of fewer tokens than a tile's height, with one SF row per token, runs on its tokens cut
    # into tile-wide rows (no padding rows computed) when every tensor is contiguous and row-major.
    if (target == "cpu" and num_tokens < BLOCK_M and spec.block_m == 1 and hidden % BLOCK_K == 0
            and BLOCK_K % spec.block_k == 0 and not layout.col_major and not layout.pack_along_m
            and (BLOCK_K // spec.block_k) % layout.pack == 0):
        folded = fold_rows(hidden // BLOCK_K, x, out, sf_grid)
        if folded is not None:
            x, out, sf_grid = folded
            pieces = hidden // BLOCK_K
            num_tokens *= pieces
    # A row range starts at a block boundary (and at a word boundary of an SF packed along tokens).
    sf_rows_per_sf_row = spec.block_m * (layout.pack if layout.pack_along_m else 1)

    def run(kernel, start: int, stop: int) -> None:
        sf, sf_sm, sf_sk = layout.kernel_view(sf_grid[start // sf_rows_per_sf_row:])
        kernel(x[start:stop], sf, out[start:stop], x.stride(0), sf_sm, sf_sk)

    # Threads split by tokens, folded or not.
    build_cast_back.launch_rows(spec, target, num_tokens, run, align=math.lcm(sf_rows_per_sf_row, BLOCK_M),
                                min_rows=MIN_ROWS_PER_THREAD * pieces)
