"""``sinkhorn`` forward and backward as parallel-style TileLang kernels for ascend, cuda and cpu.

Both kernels deal work tiles of ``BLOCK_T`` tokens round-robin to persistent workers. Per tile:

1. DMA the tokens' 4x4 fp32 matrices (rows of 16) into on-chip tiles (the last tile's missing
   tokens are clamped away);
2. the softmax's exps: their arguments ``x - rowmax`` per token into a tile, the exps of the
   tile (``Shell.exp``; on Ascend a SIMT region, the other phases are SIMD);
3. one lane per token (``Shell.rowwise``; on Ascend explicit vector code, 64 tokens a register,
   the 16 entries gathered from UB into 16 registers), so every row and column sum is plain
   lane arithmetic in the flavor's tree (``vmi_mhc.tl.sinkhorn``) and no cross-lane reduction
   is needed:

   * forward: the Sinkhorn chain;
   * backward (by recompute, spec §3.9.3): replay the forward, recording every normalisation's
     input matrix and denominators, then walk the steps back from the output gradient, and
     finish with the softmax's backward;

4. DMA the results out.

``repeat`` and ``eps`` are runtime arguments: one compiled kernel per ``(direction, flavor)``.
The backward's replay store holds ``2 * MAX_BACKWARD_REPEAT`` steps: on Ascend a UB tile laid
out step-entry-major (each 64-token register stored and loaded whole), elsewhere a per-lane
local array.
"""


from dataclasses import dataclass

from vmi_core.kernel import kernel
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LaneVar, keep
from vmi_core.tl.vector import load, phase_barrier, store

from ..tl.sinkhorn import ENTRIES, N, divide_by, rows, sinkhorn_of_exps, softmax_shift, sum4, transpose

# Tokens per work tile: one per vector lane.
BLOCK_T = 64
# Bound of the backward's repeat: its replay store of 2R steps x (16 entries + 4 denominators)
# x 64 tokens fp32 (160 KiB at R = 16) plus the double-buffered in/out tiles and the exps' two
# fits the 216 KiB UB of a kernel with a SIMT region.
MAX_BACKWARD_REPEAT = 16
MAX_STEPS = 2 * MAX_BACKWARD_REPEAT


@dataclass(frozen=True)
class SinkhornSpec:
    """Everything a sinkhorn kernel is specialised on (token count, repeat and eps are runtime)."""

    flavor: str


def normalization_backward(g: list, a: list, dens: list, flavor: str) -> list:
    """The gradient with respect to ``a`` of the row normalisation ``y = a / (rowsum(a) + eps)``,
    from ``g`` (the gradient of ``y``) and its denominators ``dens``: ``(g - u) / den`` with
    ``u = rowsum(g * a) / den``, per row."""
    out = []
    for g_row, a_row, den in zip(rows(g), rows(a), dens, strict=True):
        (u,) = divide_by([sum4([keep(gk * ak) for gk, ak in zip(g_row, a_row, strict=True)], flavor)], den, flavor)
        out += divide_by([keep(gk - u) for gk in g_row], den, flavor)
    return out


def softmax_backward(g: list, p: list, flavor: str) -> list:
    """The gradient of the logits of ``p = softmax(rows)``: ``(g - rowsum(g * p)) * p``."""
    out = []
    for g_row, p_row in zip(rows(g), rows(p), strict=True):
        dot = sum4([keep(gk * pk) for gk, pk in zip(g_row, p_row, strict=True)], flavor)
        out += [keep((gk - dot) * pk) for gk, pk in zip(g_row, p_row, strict=True)]
    return out


class _StepStore:
    """The backward's replay store of the tokens at ``at``: per step, the normalisation's input
    matrix and its denominators (vector code: UB tiles indexed ``[row, token]``, a register per
    row; scalar code: a local array per lane)."""

    def __init__(self, at, matrices, denominators):
        self.at = at
        if at.vector:
            self.matrices, self.denominators = matrices, denominators
        else:
            self.matrices = T.alloc_local((MAX_STEPS * ENTRIES,), "float32")
            self.denominators = T.alloc_local((MAX_STEPS * N,), "float32")

    def _put(self, tile, row, value):
        if self.at.vector:
            T.evaluate(store(tile[row, self.at.row0], value))
        else:
            T.buffer_store(tile, value, [row])

    def _get(self, tile, row):
        if self.at.vector:
            return keep(load(tile[row, self.at.row0]))
        return keep(tile[row])

    def record(self, step, matrix, dens):
        for e, v in enumerate(matrix):
            self._put(self.matrices, step * ENTRIES + e, v)
        for k, v in enumerate(dens or ()):
            self._put(self.denominators, step * N + k, v)

    def matrix(self, step) -> list:
        return [self._get(self.matrices, step * ENTRIES + e) for e in range(ENTRIES)]

    def dens(self, step) -> list:
        return [self._get(self.denominators, step * N + k) for k in range(N)]


def softmax_exps(sh: Shell, x, shifted, exps):
    """The exps of the softmax of the token tile ``x``: ``exp(x - rowmax)`` into ``exps``."""

    def shift_token(at):
        for e, v in enumerate(softmax_shift([at.load(x, e) for e in range(ENTRIES)])):
            at.store(shifted, e, v)

    with sh.vector(SIMD):
        sh.rowwise(BLOCK_T, shift_token)
    sh.exp((BLOCK_T, ENTRIES), shifted, exps)


@kernel(simd_parallel=False)
def build_sinkhorn_forward(spec: SinkhornSpec, target: str):
    """The forward kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    BT = BLOCK_T
    M = TK.dynamic("M")

    def forward_tokens(at, exps, y, repeat, eps):
        out = sinkhorn_of_exps([at.load(exps, e) for e in range(ENTRIES)], repeat, eps, spec.flavor)
        for e, v in enumerate(out):
            at.store(y, e, v)

    @T.macro
    def forward(x, shifted, exps, y, repeat, eps):
        softmax_exps(sh, x, shifted, exps)
        with sh.vector(SIMD):
            sh.rowwise(BT, lambda at: forward_tokens(at, exps, y, repeat, eps))

    @TK.prim_func
    def sinkhorn_forward_kernel(X: TK.Tensor((M, ENTRIES), "float32"), Y: TK.Tensor((M, ENTRIES), "float32"),
                                repeat: TK.int32, eps: TK.float32):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, BT)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * BT
                x = sh.tile((BT, ENTRIES), "float32")
                shifted = sh.tile((BT, ENTRIES), "float32")
                exps = sh.tile((BT, ENTRIES), "float32")
                y = sh.tile((BT, ENTRIES), "float32")
                sh.buffer_versions({x: 2, y: 2})
                sh.copy(X[row0, 0], x)
                forward(x, shifted, exps, y, repeat, eps)
                sh.copy(y, Y[row0, 0])

    return sinkhorn_forward_kernel


@kernel(simd_parallel=False)
def build_sinkhorn_backward(spec: SinkhornSpec, target: str):
    """The backward kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    BT = BLOCK_T
    M = TK.dynamic("M")
    flavor = spec.flavor

    def backward_tokens(at, g_tile, exps, gi_tile, matrices, denominators, repeat, eps):
        steps = _StepStore(at, matrices, denominators)
        sinkhorn_of_exps([at.load(exps, e) for e in range(ENTRIES)], repeat, eps, flavor, steps.record)
        if at.vector:
            # The reverse walk loads what the replay stored.
            phase_barrier()
        # The steps back from the last, each on the lines-as-rows orientation of its record (the
        # output gradient transposed for the last step, a column step), handing the next one the
        # transposed gradient: after 2R - 1 steps it is upright.
        state = [LaneVar(at.vector, "float32", v) for v in transpose([at.load(g_tile, e) for e in range(ENTRIES)])]
        with T.serial(2 * repeat - 1) as q:
            step = 2 * repeat - 1 - q
            g = normalization_backward([keep(s.get()) for s in state], steps.matrix(step), steps.dens(step), flavor)
            for s, v in zip(state, transpose(g), strict=True):
                s.set(v)
        g = [keep(s.get()) for s in state]
        # The step-1 input is p + eps: its gradient is the softmax output's.
        grad_logits = softmax_backward(g, steps.matrix(0), flavor)
        for e, v in enumerate(grad_logits):
            at.store(gi_tile, e, v)

    @T.macro
    def backward(g, x, shifted, exps, gi, matrices, denominators, repeat, eps):
        softmax_exps(sh, x, shifted, exps)
        with sh.vector(SIMD):
            sh.rowwise(BT, lambda at: backward_tokens(at, g, exps, gi, matrices, denominators, repeat, eps))

    @TK.prim_func
    def sinkhorn_backward_kernel(G: TK.Tensor((M, ENTRIES), "float32"), X: TK.Tensor((M, ENTRIES), "float32"),
                                 GI: TK.Tensor((M, ENTRIES), "float32"), repeat: TK.int32, eps: TK.float32):
        with sh.persistent_kernel() as worker:
            # The replay store of vector code (scalar lanes keep theirs in local arrays).
            matrices = sh.tile((MAX_STEPS * ENTRIES, BT), "float32") if sh.is_ascend else None
            denominators = sh.tile((MAX_STEPS * N, BT), "float32") if sh.is_ascend else None
            for tm in sh.tiles([T.ceildiv(M, BT)], worker):
                row0 = T.alloc_var("int32")
                row0 = tm * BT
                g = sh.tile((BT, ENTRIES), "float32")
                x = sh.tile((BT, ENTRIES), "float32")
                shifted = sh.tile((BT, ENTRIES), "float32")
                exps = sh.tile((BT, ENTRIES), "float32")
                gi = sh.tile((BT, ENTRIES), "float32")
                sh.buffer_versions({g: 2, x: 2, gi: 2})
                sh.copy(G[row0, 0], g)
                sh.copy(X[row0, 0], x)
                backward(g, x, shifted, exps, gi, matrices, denominators, repeat, eps)
                sh.copy(gi, GI[row0, 0])

    return sinkhorn_backward_kernel


def launch_forward(call, target: str) -> None:
    """Run a validated forward call (``vmi_mhc.sinkhorn.SinkhornForwardCall``) on ``target``."""
    x, y = call.comb_res_mix.view(-1, ENTRIES), call.comb_res_mix_out.view(-1, ENTRIES)

    def run(kernel, start: int, stop: int) -> None:
        kernel(x[start:stop], y[start:stop], call.repeat, call.eps)

    build_sinkhorn_forward.launch_rows(call.spec, target, x.shape[0], run, align=BLOCK_T)


def launch_backward(call, target: str) -> None:
    """Run a validated backward call (``vmi_mhc.sinkhorn.SinkhornBackwardCall``) on ``target``."""
    g, x = call.grad_output.view(-1, ENTRIES), call.x.view(-1, ENTRIES)
    gi = call.grad_input.view(-1, ENTRIES)

    def run(kernel, start: int, stop: int) -> None:
        kernel(g[start:stop], x[start:stop], gi[start:stop], call.repeat, call.eps)

    build_sinkhorn_backward.launch_rows(call.spec, target, x.shape[0], run, align=BLOCK_T)
