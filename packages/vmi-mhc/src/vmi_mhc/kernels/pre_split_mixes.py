"""``pre_split_mixes`` forward and backward as parallel-style TileLang kernels for ascend, cuda and cpu.

The token axis is cut into *token tiles* of ``TOKEN_BLOCK`` consecutive tokens, which go round-robin
to persistent workers; a tile's token ``t`` is lane ``t`` of one 64-lane register on Ascend
(``Shell.rowwise``: the tile's columns gathered and scattered in UB), a parallel lane elsewhere.
Every worker reads the 3 gains once as scalars and the 24 biases once into an on-chip table (an
entry's bias reaches the lanes by a register gather). Per tile:

**Forward.** DMA the ``(64, 24)`` mixes in; per entry ``i`` (gain ``c = min(2, i div 4)``)
``z = fl(fl(x · scale[c]) + base[i])``; the pre and post entries' ``exp(-z)`` over a ``(64, 8)`` tile
(``Shell.exp``); ``pre = σ(z) + pre_eps``, ``post = σ(z) · post_mult``, ``comb = z`` (``σ``:
``vmi_mhc.tl.sigmoid``); DMA the three outputs out (tails clamped).

**Backward.** DMA the three output gradients, the mixes and the saved post mix in; per entry the
logit gradient ``gz`` (``σ`` recomputed for pre, its exps over a ``(64, 4)`` tile; the saved post
mix for post; the comb gradient as is), zero in the lanes past the last token;
``input_mixes_grad = fl(gz · scale[c])`` (DMA out);
``gz`` goes to row ``i`` of a ``(27, 64)`` term tile (one token per column), and each token's
``Σ_{i in c} fl(gz · x)`` (entries in increasing order) to row ``24 + c``. ``Shell.row_sum``
folds each term row over the tile's tokens in vmi's fixed lane order, and the 27 sums (then
+0.0) are the tile's row of a ``(ceil(T / 64), 64)`` fp32 workspace (every tile writes its row).

**Reduction.** One worker adds the workspace rows in order ``0, 1, ...`` from +0.0 (a register
per row) and writes ``mhc_base_grad`` (columns 0-23) and ``mhc_scale_grad`` (24-26).

Every product and sum is one rounded fp32 operation (no FMA), and the parameter gradients' order
depends on ``T`` only: every target, worker count and thread count gives the reference's bits.
On Ascend every phase runs as explicit vector code (SIMD regions) except the reduction's final
stores, single global-memory elements written from a SIMT region. The token count is a runtime
value: one compiled kernel per flavor.
"""

from dataclasses import dataclass

import torch

from vmi_core.cpu_parallel import launch_rows
from vmi_core.kernel import kernel
from vmi_core.targets import get_flavor
from vmi_core.tl.formats import flavor_quotient
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, SIMT, Shell
from vmi_core.tl.simd import LANES, LaneVar, Vec, keep, select

from ..inputs import MHC_MULT, mix_width
from ..tl.lanes import BiasTable, store_token_lanes, zero
from ..tl.sigmoid import sigmoid_of_exp
from ..tl.split_mixes import logit, post_mix, pre_mix

N = MHC_MULT
N3 = mix_width(MHC_MULT)
NUM_GAINS = 3
# Tokens per tile and per partial row of the parameter gradients: one register of token lanes.
TOKEN_BLOCK = LANES
# Partial sums per token tile: one per bias, then one per gain.
NUM_PARTIALS = N3 + NUM_GAINS
# Width of a workspace row: one register (the columns past the partial sums hold +0.0).
PARTIAL_WIDTH = LANES
# Workspace rows per on-chip tile of the reduction.
REDUCE_ROWS = 64
# (gain, first entry, entries) of the pre, post and comb entries.
GROUPS = ((0, 0, N), (1, N, N), (2, 2 * N, N * N))


def num_token_tiles(num_tokens: int) -> int:
    """Token tiles (workspace rows) of ``num_tokens`` tokens."""
    return -(-num_tokens // TOKEN_BLOCK)


@dataclass(frozen=True)
class PreSplitMixesSpec:
    """Everything the forward and backward kernels are specialised on (the token count, the
    post multiplier and the pre epsilon are runtime values)."""

    flavor: str

    @property
    def flush_division(self) -> bool:
        """The ascend flavor's division: subnormal operands and quotients flushed to zero."""
        return get_flavor(self.flavor).name == "ascend"


def _gains(SCALE):
    """The three gains as scalars (read once per worker; vector code broadcasts them)."""
    return [keep(SCALE[c]) for c in range(NUM_GAINS)]


class _Entries:
    """Reads entry ``i`` (a loop variable) of the token(s) at ``at``: its bias and its logit."""

    def __init__(self, at, x, biases, gains):
        self.at, self.x, self.gains = at, x, gains
        self.bias = BiasTable(biases, at)

    def logit(self, i, c: int):
        """The logit of entry ``i`` with gain ``c`` (``vmi_mhc.tl.split_mixes.logit``)."""
        return logit(self.at.load(self.x, i), self.gains[c], self.bias[i])


def _store_negated_logits(x, biases, gains, groups: int, neg_z, at):
    """``-z`` of the token(s) at ``at`` for the first ``groups`` gains' entries (the pre entries, then
    the post ones: the sigmoids' exp arguments), into the columns of ``neg_z``."""
    entries = _Entries(at, x, biases, gains)
    for c in range(groups):
        with T.serial(N) as m:
            at.store(neg_z, c * N + m, -entries.logit(c * N + m, c))


def _sigmoid_exps(sh: Shell, x, biases, gains, groups: int, neg_z, exp_neg_z):
    """``exp(-z)`` of a token tile's sigmoid entries, a ``(64, groups · n)`` tile at a time (``Shell.exp``)."""
    with sh.vector(SIMD):
        sh.rowwise(TOKEN_BLOCK, lambda at: _store_negated_logits(x, biases, gains, groups, neg_z, at))
    sh.exp((TOKEN_BLOCK, groups * N), neg_z, exp_neg_z)


@kernel(simd_parallel=False)
def build_pre_split_mixes_fwd(spec: PreSplitMixesSpec, target: str):
    """The forward kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    BT = TOKEN_BLOCK
    M = TK.dynamic("M")

    def split_token(x, biases, exp_neg_z, pre, post, comb, gains, post_mult, pre_eps, at):
        entries = _Entries(at, x, biases, gains)

        def sigma(m):
            return sigmoid_of_exp(at.load(exp_neg_z, m), spec.flush_division, sh.in_simd)

        with T.serial(N) as m:
            at.store(pre, m, pre_mix(sigma(m), pre_eps))
        with T.serial(N) as m:
            at.store(post, m, post_mix(sigma(N + m), post_mult))
        with T.serial(N * N) as q:
            at.store(comb, q, entries.logit(2 * N + q, 2))

    @T.macro
    def split(x, biases, neg_z, exp_neg_z, pre, post, comb, gains, post_mult, pre_eps):
        _sigmoid_exps(sh, x, biases, gains, 2, neg_z, exp_neg_z)
        with sh.vector(SIMD):
            sh.rowwise(BT, lambda at: split_token(x, biases, exp_neg_z, pre, post, comb, gains, post_mult, pre_eps,
                                                  at))

    @TK.prim_func
    def pre_split_mixes_fwd_kernel(
        X: TK.Tensor((M, N3), "float32"), SCALE: TK.Tensor((NUM_GAINS,), "float32"),
        BASE: TK.Tensor((N3,), "float32"), PRE: TK.Tensor((M, N), "float32"), POST: TK.Tensor((M, N), "float32"),
        COMB: TK.Tensor((M, N * N), "float32"), post_mult: TK.float32, pre_eps: TK.float32,
    ):
        with sh.persistent_kernel() as worker:
            gains = _gains(SCALE)
            biases = sh.tile((LANES,), "float32")
            sh.copy(BASE[0], biases)
            for tile in sh.tiles([T.ceildiv(M, BT)], worker):
                token0 = T.alloc_var("int32")
                token0 = tile * BT
                x = sh.tile((BT, N3), "float32")
                pre = sh.tile((BT, N), "float32")
                post = sh.tile((BT, N), "float32")
                comb = sh.tile((BT, N * N), "float32")
                neg_z = sh.tile((BT, 2 * N), "float32")
                exp_neg_z = sh.tile((BT, 2 * N), "float32")
                sh.buffer_versions({x: 2, pre: 2, post: 2, comb: 2})
                sh.copy(X[token0, 0], x)
                split(x, biases, neg_z, exp_neg_z, pre, post, comb, gains, post_mult, pre_eps)
                sh.copy(pre, PRE[token0, 0])
                sh.copy(post, POST[token0, 0])
                sh.copy(comb, COMB[token0, 0])

    return pre_split_mixes_fwd_kernel


@kernel(simd_parallel=False)
def build_pre_split_mixes_bwd(spec: PreSplitMixesSpec, target: str):
    """The backward tile kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    BT = TOKEN_BLOCK
    M = TK.dynamic("M")
    NB = TK.dynamic("NB")

    def valid_token(at, num_valid):
        if at.vector:
            return keep(Vec.lane_index(0) < num_valid)
        return at.i < num_valid

    def post_ratio(p, post_divisor):
        return flavor_quotient(p, post_divisor, spec.flush_division, sh.in_simd)

    def pre_grad(tiles, entries, m, post_divisor, at):
        s = keep(sigmoid_of_exp(at.load(tiles["exp_neg_z"], m), spec.flush_division, sh.in_simd))
        return keep(keep(at.load(tiles["d_pre"], m) * s) * keep(1.0 - s))

    def post_grad(tiles, entries, m, post_divisor, at):
        p = keep(at.load(tiles["post"], m))
        return keep(keep(at.load(tiles["d_post"], m) * p) * keep(1.0 - post_ratio(p, post_divisor)))

    def comb_grad(tiles, entries, q, post_divisor, at):
        return at.load(tiles["d_comb"], q)

    def backward_token(tiles, biases, dx, terms, gains, post_divisor, num_valid, at):
        x = tiles["x"]
        entries = _Entries(at, x, biases, gains)
        valid = valid_token(at, num_valid)
        for (c, first, count), grad in zip(GROUPS, (pre_grad, post_grad, comb_grad), strict=True):
            # The token's sum of gz · x over the gain's entries, from +0.0 in increasing order.
            group_sum = LaneVar(at.vector, "float32", 0.0)
            with T.serial(count) as k:
                # Lanes past the last token hold zeros (cpu) or stale data (Ascend DMA): they add
                # exactly zero to the partial sums.
                gz = keep(select(valid, grad(tiles, entries, k, post_divisor, at), T.float32(0)))
                at.store(dx, first + k, gz * gains[c])
                store_token_lanes(terms, first + k, at, gz)
                group_sum.set(group_sum.get() + select(valid, gz * at.load(x, first + k), T.float32(0)))
            store_token_lanes(terms, N3 + c, at, group_sum.get())

    @T.macro
    def backward_tile(tiles, biases, dx, terms, partial, gains, post_divisor, num_valid):
        sh.rowwise(BT, lambda at: backward_token(tiles, biases, dx, terms, gains, post_divisor, num_valid, at))
        sh.row_sum(partial, (NUM_PARTIALS, BT), lambda at: at.load(terms))

    @TK.prim_func
    def pre_split_mixes_bwd_kernel(
        DPRE: TK.Tensor((M, N), "float32"), DPOST: TK.Tensor((M, N), "float32"),
        DCOMB: TK.Tensor((M, N * N), "float32"), X: TK.Tensor((M, N3), "float32"),
        POST: TK.Tensor((M, N), "float32"), SCALE: TK.Tensor((NUM_GAINS,), "float32"),
        BASE: TK.Tensor((N3,), "float32"), DX: TK.Tensor((M, N3), "float32"),
        WS: TK.Tensor((NB, PARTIAL_WIDTH), "float32"), post_divisor: TK.float32,
    ):
        with sh.persistent_kernel() as worker:
            gains = _gains(SCALE)
            biases = sh.tile((LANES,), "float32")
            terms = sh.tile((NUM_PARTIALS, BT), "float32")
            partial = sh.tile((PARTIAL_WIDTH,), "float32")
            sh.copy(BASE[0], biases)
            # The row sums write the first NUM_PARTIALS columns; the rest stay +0.0.
            with sh.vector(SIMD):
                sh.elementwise((PARTIAL_WIDTH,), zero, partial)
            for tile in sh.tiles([T.ceildiv(M, BT)], worker):
                token0 = T.alloc_var("int32")
                num_valid = T.alloc_var("int32")
                token0 = tile * BT
                num_valid = T.min(BT, M - token0)
                x = sh.tile((BT, N3), "float32")
                d_pre = sh.tile((BT, N), "float32")
                d_post = sh.tile((BT, N), "float32")
                d_comb = sh.tile((BT, N * N), "float32")
                post = sh.tile((BT, N), "float32")
                dx = sh.tile((BT, N3), "float32")
                neg_z = sh.tile((BT, N), "float32")
                exp_neg_z = sh.tile((BT, N), "float32")
                sh.buffer_versions({x: 2, d_pre: 2, d_post: 2, d_comb: 2, post: 2, dx: 2})
                sh.copy(X[token0, 0], x)
                sh.copy(DPRE[token0, 0], d_pre)
                sh.copy(DPOST[token0, 0], d_post)
                sh.copy(DCOMB[token0, 0], d_comb)
                sh.copy(POST[token0, 0], post)
                _sigmoid_exps(sh, x, biases, gains, 1, neg_z, exp_neg_z)
                with sh.vector(SIMD):
                    backward_tile({"x": x, "d_pre": d_pre, "d_post": d_post, "d_comb": d_comb, "post": post,
                                   "exp_neg_z": exp_neg_z}, biases, dx, terms, partial, gains, post_divisor, num_valid)
                sh.copy(dx, DX[token0, 0])
                sh.copy(partial, WS[tile, 0])

    return pre_split_mixes_bwd_kernel


@kernel(simd_parallel=False)
def build_pre_split_mixes_bwd_reduce(spec: PreSplitMixesSpec, target: str):
    """The reduction kernel's TileLang prim_func (the same for every flavor: ``spec`` is the cache key)."""
    sh = Shell(target)
    TK = sh.T
    PR, W = REDUCE_ROWS, PARTIAL_WIDTH
    NB = TK.dynamic("NB")

    @TK.prim_func
    def pre_split_mixes_bwd_reduce_kernel(WS: TK.Tensor((NB, PARTIAL_WIDTH), "float32"),
                                          SCALE_GRAD: TK.Tensor((NUM_GAINS,), "float32"),
                                          BASE_GRAD: TK.Tensor((N3,), "float32")):
        with sh.persistent_kernel() as worker:
            for _ in sh.tiles([1], worker):
                parts = sh.tile((PR, W), "float32")
                total = sh.tile((W,), "float32")
                with sh.vector(SIMD):
                    sh.elementwise((W,), zero, total)
                # The partial rows in order, PR at a time (one register per row).
                for chunk in T.serial(T.ceildiv(NB, PR)):
                    num_rows = T.alloc_var("int32")
                    num_rows = T.min(PR, NB - chunk * PR)
                    sh.copy(WS[chunk * PR, 0], parts)
                    with sh.vector(SIMD):
                        sh.accumulate_rows(parts, total, num_rows, W)
                # Single elements of two gradients: scalar stores from SIMT lanes.
                with sh.vector(SIMT):
                    for j in T.Parallel(W):
                        if j < N3:
                            BASE_GRAD[j] = total[j]
                        elif j < NUM_PARTIALS:
                            SCALE_GRAD[j - N3] = total[j]

    return pre_split_mixes_bwd_reduce_kernel


# The reduction's spec: it does not depend on the flavor.
REDUCE_SPEC = PreSplitMixesSpec("ascend")


def post_divisor(mhc_post_mult_value: float) -> float:
    """The divisor of the post term's quotient ``p / m``: ``m``, or +inf for ``m = 0`` (the
    quotient is then 0 for a finite ``p``: the derivative of ``0 · σ`` is 0)."""
    return mhc_post_mult_value if mhc_post_mult_value != 0 else float("inf")


def launch_fwd(call, target: str) -> None:
    """Run a validated forward call (``vmi_mhc.pre_split_mixes.PreSplitMixesFwdCall``) on ``target``."""

    def run(kernel, start: int, stop: int) -> None:
        kernel(call.input_mixes[start:stop], call.mhc_scale, call.mhc_base, call.pre_layer_mix[start:stop],
               call.post_layer_mix[start:stop], call.comb_res_mix[start:stop], call.mhc_post_mult_value,
               call.mhc_pre_eps)

    build_pre_split_mixes_fwd.launch_rows(call.spec, target, call.input_mixes.shape[0], run, align=TOKEN_BLOCK)


def launch_bwd(call, target: str) -> None:
    """Run a validated backward call (``vmi_mhc.pre_split_mixes.PreSplitMixesBwdCall``) on ``target``:
    the tile kernel fills a workspace of partial rows, the reduction sums them in order."""
    kernel = build_pre_split_mixes_bwd.compiled(call.spec, target)
    reduce = build_pre_split_mixes_bwd_reduce.compiled(REDUCE_SPEC, target)
    num_tokens = call.input_mixes.shape[0]
    workspace = torch.empty((num_token_tiles(num_tokens), PARTIAL_WIDTH), dtype=torch.float32,
                            device=call.input_mixes.device)
    divisor = post_divisor(call.mhc_post_mult_value)

    def run(start: int, stop: int) -> None:
        rows = slice(start, stop)
        kernel(call.pre_layer_mix_grad[rows], call.post_layer_mix_grad[rows], call.comb_res_mix_grad[rows],
               call.input_mixes[rows], call.post_layer_mix[rows], call.mhc_scale, call.mhc_base,
               call.input_mixes_grad[rows], workspace[start // TOKEN_BLOCK:num_token_tiles(stop)], divisor)

    launch_rows(target, run, num_tokens, align=TOKEN_BLOCK)
    reduce(workspace, call.mhc_scale_grad, call.mhc_base_grad)
