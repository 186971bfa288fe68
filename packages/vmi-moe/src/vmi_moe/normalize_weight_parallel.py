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

import tilelang.language as T
import torch

from vmi_core.compile import cached_kernel, kernel_source
from vmi_core.cpu_parallel import launch_rows
from vmi_core.targets import get_flavor, require_kernel
from vmi_core.tl.formats import f32_const
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import keep

from .kernel_common import DENOM_EPS, ordered_sum, padded, quotient, row_chunks

# Rows per work tile: one per SIMT thread.
BLOCK_M = 128


@dataclass(frozen=True)
class NormalizeWeightSpec:
    """Everything a normalize_weight kernel is specialised on."""

    num_topk: int
    flavor: str


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


# The SIMD region is explicit vector code.
KERNEL_CONFIG = {"simd_parallel": False}


def normalize_weight_source(spec: NormalizeWeightSpec, target: str) -> str:
    """Generated kernel source of ``spec`` for ``target`` (no hardware needed)."""
    return kernel_source(build_normalize_weight, spec, target, **KERNEL_CONFIG)


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_moe.normalize_weight.NormalizeWeightCall``) on ``target``."""
    kernel = cached_kernel(build_normalize_weight, call.spec, target, **KERNEL_CONFIG)

    def run(start: int, stop: int) -> None:
        for lo, hi in row_chunks(start, stop, call.spec.num_topk):
            kernel(call.weights[lo:hi], call.denominator[lo:hi], call.normalized[lo:hi])

    num_rows = call.weights.shape[0]
    launch_rows(target, run, num_rows, align=BLOCK_M, min_rows=4 * BLOCK_M)


def normalize_weight_parallel(topk_weights: torch.Tensor, *, target: str | None = None,
                              flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``normalize_weight`` that always runs the parallel kernel.

    Same arguments, returns and errors as ``normalize_weight``, except for ``target``.

    Args:
        target: As for ``normalize_weight``, except that the reference ``"torch"`` is refused (also when
            it comes from ``$VMI_TARGET`` or from a meta topk_weights): this entry point always
            runs the kernel.

    Returns:
        ``(denominator, normalized)``, as ``normalize_weight`` returns them.

    Raises:
        ValueError: The target resolves to ``"torch"``; and everything ``normalize_weight`` raises.
    """
    # The dispatch module imports this one; by call time both are loaded.
    from .normalize_weight import normalize_weight

    require_kernel("normalize_weight_parallel", topk_weights, target)
    return normalize_weight(topk_weights, target=target, flavor=flavor)
