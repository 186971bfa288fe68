"""``normalize_weight`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

Work tiles of ``BLOCK_M`` rows go round-robin to persistent workers. Per tile:

1. DMA the weight rows into an on-chip tile;
2. one lane per row: ``D = sum(w) + 1e-20`` in the flavor's summation order (the
   order of the gate's own denominator), then ``w / D`` per weight (checked to be the
   correctly rounded quotient in the ascend flavor);
3. DMA the denominators and the normalised rows out.

On Ascend step 2 runs as explicit vector code, 64 rows at a time, one row per lane
(``Shell.rowwise``: columns gathered and scattered in UB), so each lane keeps the
flavor's summation order. The row count is a runtime value: one compiled kernel per
``(K, flavor)``.
"""


from dataclasses import dataclass

from vmi_core.kernel import kernel
from vmi_core.targets import get_flavor
from vmi_core.tl.formats import f32_const
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import keep

from .common import DENOM_EPS, ordered_sum, padded, quotient, row_chunks

# Rows per work tile: one per SIMT thread.
BLOCK_M = 128


@dataclass(frozen=True)
class NormalizeWeightSpec:
    """Everything a normalize_weight kernel is specialised on."""

    num_topk: int
    flavor: str


@kernel(simd_parallel=False)
def build_normalize_weight(spec: NormalizeWeightSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    K, BM = spec.num_topk, BLOCK_M
    flavor = get_flavor(spec.flavor)
    M = TK.dynamic("M")

    def normalize_row(w, d, n, at):
        den = keep(ordered_sum([at.load(w, col) for col in range(K)], flavor.gate_sum_order) + f32_const(DENOM_EPS))
        at.store_row_value(d, den)
        with T.serial(K) as j:
            at.store(n, j, quotient(at.load(w, j), den, flavor.gate_quotient_check))

    @T.macro
    def normalize(w, d, n):
        sh.rowwise(BM, lambda at: normalize_row(w, d, n, at))

    @TK.prim_func
    def normalize_weight_kernel(W: TK.Tensor((M, K), "float32"), DEN: TK.Tensor((M,), "float32"),
                                OUT: TK.Tensor((M, K), "float32")):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, BM)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * BM
                w = sh.tile((BM, padded(K)), "float32")
                d = sh.tile((BM,), "float32")
                n = sh.tile((BM, padded(K)), "float32")
                sh.buffer_versions({w: 2, d: 2, n: 2})
                sh.copy(W[row0, 0], w)
                with sh.vector(SIMD):
                    normalize(w, d, n)
                sh.copy(d, DEN[row0])
                sh.copy(n, OUT[row0, 0])

    return normalize_weight_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_moe.normalize_weight.NormalizeWeightCall``) on ``target``."""

    def run(kernel, start: int, stop: int) -> None:
        for lo, hi in row_chunks(start, stop, call.spec.num_topk):
            kernel(call.weights[lo:hi], call.denominator[lo:hi], call.normalized[lo:hi])

    build_normalize_weight.launch_rows(call.spec, target, call.weights.shape[0], run, align=BLOCK_M,
                                       min_rows=4 * BLOCK_M)
