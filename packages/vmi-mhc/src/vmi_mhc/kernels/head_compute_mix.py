"""``head_compute_mix`` forward and backward as parallel-style TileLang kernels for ascend, cuda and cpu.

The token axis is cut into *token tiles* of ``TOKEN_BLOCK`` consecutive tokens; a tile's token ``t``
is lane ``t`` of one 64-lane register on Ascend (``Shell.rowwise``: the tile's ``n`` columns
gathered and scattered in UB), a parallel lane elsewhere. Every worker reads the gain once as a
scalar and the ``n`` biases once into an on-chip table (a stream's bias reaches the lanes by a
register gather). The arithmetic is ``pre_split_mixes``' pre chain (``vmi_mhc.tl.split_mixes``,
``vmi_mhc.tl.sigmoid``), so the head's mix has the bits of the split's pre mix.

**Forward.** Persistent over token tiles: DMA the ``(64, n)`` input in; per stream ``j``
``out = fl(σ(fl(fl(x · scale) + base[j])) + pre_eps)``, the sigmoids' exps over an ``(n, 64)`` tile
(``Shell.exp``); DMA the output out (tails clamped).

**Backward.** Persistent over the ``P`` partial rows: row ``p`` owns the ``K`` consecutive token
tiles ``[p·K, (p+1)·K)`` (``K = max(1, ceil(tiles / P))``, a runtime value) and walks them in order.
Per tile: DMA the input and the output gradient in; per stream ``gz = fl(fl(d · s) · fl(1 - s))``
with ``s`` recomputed (its exps over an ``(n, 64)`` tile, as in the forward), zero in the lanes past
the last token; ``input_mix_grad = fl(gz · scale)`` (DMA out); ``gz`` is added into row ``j`` of a
``(n + 1, 64)`` per-lane accumulator (lane = token within the tile) and each token's
``Σ_j fl(gz · x)`` (streams in increasing order) into row ``n``.
After the row's last tile, ``Shell.row_sum`` folds each accumulator row in vmi's lane order, which
makes the row's sums ``vmi_core.sums.lane_sum`` of its tokens' terms, and the ``n + 1`` sums are
written to row ``p`` of the two partial buffers (a row without tokens skips the fold and writes
+0.0).

Every product and sum is one rounded fp32 operation (no FMA); the partial rows depend on the
inputs and ``P`` only: every target, worker count and thread count gives the reference's bits.
On Ascend every phase runs as explicit vector code (SIMD regions) except the backward's final
stores, single global-memory elements written from a SIMT region. The token count and ``P`` are
runtime values: one compiled kernel per stream count and flavor.
"""

from dataclasses import dataclass

from vmi_core.kernel import kernel
from vmi_core.targets import get_flavor
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, SIMT, Shell
from vmi_core.tl.simd import LANES, LaneVar, Vec, keep, select

from ..tl.lanes import BiasTable, load_token_lanes, store_token_lanes, zero
from ..tl.sigmoid import sigmoid_of_exp
from ..tl.split_mixes import logit, pre_mix

# Tokens per tile: one register of token lanes (also the lane sums' width).
TOKEN_BLOCK = LANES


def tiles_per_row(num_tokens: int, num_rows: int) -> int:
    """``K``: the token tiles each of ``num_rows`` partial rows owns (at least 1)."""
    num_tiles = -(-num_tokens // TOKEN_BLOCK)
    return max(1, -(-num_tiles // num_rows))


@dataclass(frozen=True)
class HeadComputeMixSpec:
    """Everything the kernels are specialised on (the token count, the partial row count and
    ``pre_eps`` are runtime values)."""

    n: int
    flavor: str

    @property
    def flush_division(self) -> bool:
        """The ascend flavor's division: subnormal operands and quotients flushed to zero."""
        return get_flavor(self.flavor).name == "ascend"


class _Streams:
    """Reads stream ``j`` (a loop variable) of the token(s) at ``at``: its bias and its logit."""

    def __init__(self, at, x, biases, gain):
        self.at, self.x, self.gain = at, x, gain
        self.bias = BiasTable(biases, at)

    def logit(self, j):
        """``fl(fl(x · scale) + base[j])`` (``vmi_mhc.tl.split_mixes.logit``)."""
        return logit(self.at.load(self.x, j), self.gain, self.bias[j])


def _store_negated_logits(x, biases, gain, n: int, neg_z, at):
    """``-z`` of the ``n`` streams of the token(s) at ``at``, into an ``(n, 64)`` tile (one token per
    column, so the exps run in whole registers for any ``n``)."""
    streams = _Streams(at, x, biases, gain)
    with T.serial(n) as j:
        store_token_lanes(neg_z, j, at, -streams.logit(j))


def _sigmoid_exps(sh: Shell, x, biases, gain, n: int, neg_z, exp_neg_z):
    """``exp(-z)`` of a token tile's streams, a tile at a time (``Shell.exp``), for the sigmoids."""
    with sh.vector(SIMD):
        sh.rowwise(TOKEN_BLOCK, lambda at: _store_negated_logits(x, biases, gain, n, neg_z, at))
    sh.exp((n, TOKEN_BLOCK), neg_z, exp_neg_z)


@kernel(simd_parallel=False)
def build_head_compute_mix_fwd(spec: HeadComputeMixSpec, target: str):
    """The forward kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    BT, N = TOKEN_BLOCK, spec.n
    M = TK.dynamic("M")

    def mix_token(exp_neg_z, out, pre_eps, at):
        with T.serial(N) as j:
            s = sigmoid_of_exp(load_token_lanes(exp_neg_z, j, at), spec.flush_division, sh.in_simd)
            at.store(out, j, pre_mix(s, pre_eps))

    @T.macro
    def mix(x, biases, neg_z, exp_neg_z, out, gain, pre_eps):
        _sigmoid_exps(sh, x, biases, gain, N, neg_z, exp_neg_z)
        with sh.vector(SIMD):
            sh.rowwise(BT, lambda at: mix_token(exp_neg_z, out, pre_eps, at))

    @TK.prim_func
    def head_compute_mix_fwd_kernel(
        X: TK.Tensor((M, N), "float32"), SCALE: TK.Tensor((1,), "float32"), BASE: TK.Tensor((N,), "float32"),
        OUT: TK.Tensor((M, N), "float32"), pre_eps: TK.float32,
    ):
        with sh.persistent_kernel() as worker:
            gain = keep(SCALE[0])
            biases = sh.tile((LANES,), "float32")
            sh.copy(BASE[0], biases)
            for tile in sh.tiles([T.ceildiv(M, BT)], worker):
                token0 = T.alloc_var("int32")
                token0 = tile * BT
                x = sh.tile((BT, N), "float32")
                out = sh.tile((BT, N), "float32")
                neg_z = sh.tile((N, BT), "float32")
                exp_neg_z = sh.tile((N, BT), "float32")
                sh.buffer_versions({x: 2, out: 2})
                sh.copy(X[token0, 0], x)
                mix(x, biases, neg_z, exp_neg_z, out, gain, pre_eps)
                sh.copy(out, OUT[token0, 0])

    return head_compute_mix_fwd_kernel


def _accumulate_token_lanes(acc, row, at, value):
    """``acc[row, token] += value`` for the token(s) at ``at`` (one token per column: the vector
    form adds the register of token lanes whole)."""
    store_token_lanes(acc, row, at, load_token_lanes(acc, row, at) + value)


@kernel(simd_parallel=False)
def build_head_compute_mix_bwd(spec: HeadComputeMixSpec, target: str):
    """The backward kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    BT, N = TOKEN_BLOCK, spec.n
    M = TK.dynamic("M")
    P = TK.dynamic("P")

    def valid_token(at, num_valid):
        if at.vector:
            return keep(Vec.lane_index(0) < num_valid)
        return at.i < num_valid

    def backward_token(x, d_out, exp_neg_z, dx, acc, gain, num_valid, at):
        valid = valid_token(at, num_valid)
        # The token's Σ_j fl(gz · x), from +0.0 in increasing j.
        token_sum = LaneVar(at.vector, "float32", 0.0)
        with T.serial(N) as j:
            s = keep(sigmoid_of_exp(load_token_lanes(exp_neg_z, j, at), spec.flush_division, sh.in_simd))
            # Lanes past the last token hold zeros (cpu) or stale data (Ascend DMA): they add
            # exactly zero to the accumulators.
            gz = keep(select(valid, keep(keep(at.load(d_out, j) * s) * keep(1.0 - s)), T.float32(0)))
            at.store(dx, j, gz * gain)
            _accumulate_token_lanes(acc, j, at, gz)
            token_sum.set(token_sum.get() + select(valid, gz * at.load(x, j), T.float32(0)))
        _accumulate_token_lanes(acc, N, at, token_sum.get())

    @T.macro
    def backward_tile(x, d_out, biases, neg_z, exp_neg_z, dx, acc, gain, num_valid):
        _sigmoid_exps(sh, x, biases, gain, N, neg_z, exp_neg_z)
        with sh.vector(SIMD):
            sh.rowwise(BT, lambda at: backward_token(x, d_out, exp_neg_z, dx, acc, gain, num_valid, at))

    @TK.prim_func
    def head_compute_mix_bwd_kernel(
        DOUT: TK.Tensor((M, N), "float32"), X: TK.Tensor((M, N), "float32"), SCALE: TK.Tensor((1,), "float32"),
        BASE: TK.Tensor((N,), "float32"), DX: TK.Tensor((M, N), "float32"),
        SCALE_PART: TK.Tensor((P, 1), "float32"), BASE_PART: TK.Tensor((P, N), "float32"),
        first_row: TK.int32, tiles_per_row: TK.int32,
    ):
        with sh.persistent_kernel() as worker:
            gain = keep(SCALE[0])
            biases = sh.tile((LANES,), "float32")
            acc = sh.tile((N + 1, BT), "float32")
            sums = sh.tile((LANES,), "float32")
            sh.copy(BASE[0], biases)
            for row in sh.tiles([P], worker):
                tile0 = T.alloc_var("int32")
                num_tiles = T.alloc_var("int32")
                tile0 = (first_row + row) * tiles_per_row
                num_tiles = T.max(0, T.min(tiles_per_row, T.ceildiv(M, BT) - tile0))
                with sh.vector(SIMD):
                    sh.elementwise((N + 1, BT), zero, acc)
                    sh.elementwise((LANES,), zero, sums)
                for k in T.serial(num_tiles):
                    token0 = T.alloc_var("int32")
                    num_valid = T.alloc_var("int32")
                    token0 = (tile0 + k) * BT
                    num_valid = T.min(BT, M - token0)
                    x = sh.tile((BT, N), "float32")
                    d_out = sh.tile((BT, N), "float32")
                    dx = sh.tile((BT, N), "float32")
                    neg_z = sh.tile((N, BT), "float32")
                    exp_neg_z = sh.tile((N, BT), "float32")
                    sh.copy(X[token0, 0], x)
                    sh.copy(DOUT[token0, 0], d_out)
                    backward_tile(x, d_out, biases, neg_z, exp_neg_z, dx, acc, gain, num_valid)
                    sh.copy(dx, DX[token0, 0])
                # A row without tiles writes its zeroed sums: no fold, so on CUDA no shared tile of a
                # previous row's fold is rewritten on a path without a tile's barriers.
                if num_tiles > 0:
                    with sh.vector(SIMD):
                        sh.row_sum(sums, (N + 1, BT), lambda at: at.load(acc))
                # Single elements of the two partial rows: scalar stores from SIMT lanes.
                with sh.vector(SIMT):
                    for j in T.Parallel(LANES):
                        if j < N:
                            BASE_PART[row, j] = sums[j]
                        elif j == N:
                            SCALE_PART[row, 0] = sums[N]

    return head_compute_mix_bwd_kernel


def launch_fwd(call, target: str) -> None:
    """Run a validated forward call (``vmi_mhc.head_compute_mix.HeadComputeMixFwdCall``) on ``target``."""

    def run(kernel, start: int, stop: int) -> None:
        kernel(call.input_mix[start:stop], call.mhc_scale, call.mhc_base, call.output_mix[start:stop],
               call.mhc_pre_eps)

    build_head_compute_mix_fwd.launch_rows(call.spec, target, call.input_mix.shape[0], run, align=TOKEN_BLOCK)


def launch_bwd(call, target: str) -> None:
    """Run a validated backward call (``vmi_mhc.head_compute_mix.HeadComputeMixBwdCall``) on ``target``:
    on cpu, threads take disjoint ranges of partial rows (and so of tokens)."""
    num_rows = call.mhc_scale_grad_partial.shape[0]
    span = tiles_per_row(call.input_mix.shape[0], num_rows)

    def run(kernel, start: int, stop: int) -> None:
        kernel(call.output_mix_grad, call.input_mix, call.mhc_scale, call.mhc_base, call.input_mix_grad,
               call.mhc_scale_grad_partial[start:stop], call.mhc_base_grad_partial[start:stop], start, span)

    build_head_compute_mix_bwd.launch_rows(call.spec, target, num_rows, run, min_rows=1)
