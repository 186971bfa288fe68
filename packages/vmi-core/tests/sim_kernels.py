"""A small kernel for the ascend-sim tests: every row of X divided by its largest |x|.

It has what the op kernels have (persistent work tiles over the cores, double-buffered
DMA in and out with tails, one SIMT region whose two phases TileLang separates with a
barrier) in a source short enough to break on purpose.
"""


import tilelang.language as T

from vmi_core.compile import cached_kernel, lower_artifact
from vmi_core.tl.reduce import segment_reduce
from vmi_core.tl.shell import SIMT, Shell

COLUMNS = 64


def build_row_scale(block_m: int, target: str):
    sh = Shell(target)
    TK = sh.T
    M = TK.dynamic("M")

    @TK.prim_func
    def row_scale(X: TK.Tensor((M, COLUMNS), "float32"), Y: TK.Tensor((M, COLUMNS), "float32")):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, block_m)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * block_m
                x = sh.tile((block_m, COLUMNS), "float32")
                amax = sh.tile((block_m, 1), "float32")
                y = sh.tile((block_m, COLUMNS), "float32")
                sh.buffer_versions({x: 2, y: 2})
                sh.copy(X[row0, 0], x)
                with sh.vector(SIMT):
                    segment_reduce(amax, block_m, 1, COLUMNS, lambda i, j, x=x: T.max(x[i, j], -x[i, j]), "max",
                                   T.float32(0))
                    for i, j in T.Parallel(block_m, COLUMNS):
                        y[i, j] = x[i, j] / amax[i, 0]
                sh.copy(y, Y[row0, 0])

    return row_scale


def row_scale(x, block_m: int, target: str):
    y = x.new_empty(x.shape)
    cached_kernel(build_row_scale, block_m, target)(x, y)
    return y


def row_scale_reference(x):
    return x / x.abs().amax(dim=1, keepdim=True)


def row_scale_artifact(block_m: int):
    """TileLang's ascend lowering of the kernel: its source and device module."""
    return lower_artifact(build_row_scale(block_m, "ascend"), "ascend")
