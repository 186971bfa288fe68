"""``pre_big_fuse`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

Token blocks of ``TOKEN_BLOCK`` consecutive tokens go round-robin to persistent workers. Every
worker reads the 3 gains once as scalars and the 24 biases once into an on-chip table. Per block:

1. **Reduce.** The ``(block, 24)`` accumulators and the block's square sums start at +0.0; per
   split ``s`` (ascending) the partial slabs are DMA'd in and added element-wise
   (``vmi_mhc.tl.rms.split_sum``), as the reduce forward kernel does.
2. **Mixes, one lane per token** (``Shell.rowwise``; on Ascend explicit vector code, 64 tokens a
   register, the columns gathered and scattered in UB): ``r = rms_scale(sq)``, per entry the mix
   ``out_mul · r`` and its logit (``vmi_mhc.tl.split_mixes.logit``); the exps' arguments (``-z``
   of the pre and post entries, the comb logits' ``softmax_shift``) go to a tile, their exps to
   another (``Shell.exp``, a SIMT region on Ascend); then the pre mix (``pre_mix`` of the
   sigmoid) goes to an on-chip table, the post mix (``post_mix``) to the post tile, and the comb
   exps into the Sinkhorn chain (``vmi_mhc.tl.sinkhorn.sinkhorn_of_exps``, as the sinkhorn
   kernel runs it) whose result goes to the comb tile. Post and comb are DMA'd out.
3. **Apply.** For each of the block's tokens, its hidden tiles of ``BLOCK_H`` columns: DMA the
   ``(n, BLOCK_H)`` residual slice in, per column the stream mix of ``vmi_mhc.tl.mix`` with the
   token's pre weights read from the on-chip table (broadcast to the lanes by a register gather
   on Ascend), rounded to bf16 once; DMA it out.

Every stage calls the ``vmi_mhc.tl`` function its unfused kernel calls, in the same order with
the same roundings, so the outputs equal the unfused chain's bit for bit on every target and
flavor (spec §5.1); the pre mix never leaves the chip. Tails of the token and hidden axes are
clamped by the DMA. On Ascend every phase but the exps is explicit vector code (SIMD regions). One compiled
kernel per ``(n·H, rms_eps, flavor)`` (the RMS scale's constants, as the reduce kernel's); the
token and split counts, the epsilons, the post multiplier and the repeat are runtime values.
"""

from dataclasses import dataclass

from vmi_core.formats import bit_view
from vmi_core.kernel import kernel
from vmi_core.targets import get_flavor
from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import LANES, keep
from vmi_core.tl.vector import ChunkAt

from ..inputs import MHC_MULT, mix_width
from ..tl.lanes import BiasTable, zero
from ..tl.mix import row_at, stream_mix
from ..tl.rms import rms_scale, split_sum
from ..tl.sigmoid import sigmoid_of_exp
from ..tl.sinkhorn import ENTRIES, sinkhorn_of_exps, softmax_shift
from ..tl.split_mixes import logit, post_mix, pre_mix
from .norm_fn import padded_mix, row_value

N = MHC_MULT
N3 = mix_width(MHC_MULT)
NUM_GAINS = 3
# Tokens per block: one per vector lane.
TOKEN_BLOCK = LANES
# Hidden columns per apply tile (as pre_apply_mix's forward).
BLOCK_H = 512


@dataclass(frozen=True)
class PreBigFuseSpec:
    """Everything the kernel is specialised on: the RMS group size ``K = n·H``, the RMS epsilon
    and the flavor (the RMS scale's constants, as the reduce kernel is specialised on them)."""

    group_size: int
    rms_eps: float
    flavor: str

    @property
    def hidden(self) -> int:
        return self.group_size // N

    @property
    def flush_division(self) -> bool:
        """The ascend flavor's division: subnormal operands and quotients flushed to zero."""
        return get_flavor(self.flavor).name == "ascend"


def _pre_weight(pre, row, stream: int, at):
    """The pre weight of stream ``stream`` of the block's token ``row`` in every lane of ``at`` (vector
    code gathers it from the table row, which ``Shell.group_tile`` pads for the register load)."""
    if at.vector:
        return ChunkAt((), stream * LANES).group(pre, LANES, row=row)
    return pre[row, stream]


@kernel(simd_parallel=False)
def build_pre_big_fuse(spec: PreBigFuseSpec, target: str):
    """The kernel's TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    BT, BH, H = TOKEN_BLOCK, BLOCK_H, spec.hidden
    NP = padded_mix(sh, N3)
    S = TK.dynamic("S")
    M = TK.dynamic("M")
    p_stride = TK.dynamic("p_stride")
    q_stride = TK.dynamic("q_stride")

    def exp_arguments(acc, sq, biases, gains, args, at):
        """The exps' arguments of the token(s) at ``at``: ``-z`` of the pre and post entries, then the
        comb logits' ``softmax_shift``."""
        r = keep(rms_scale(row_value(sq, at), spec.group_size, spec.rms_eps, spec.flavor))
        bias = BiasTable(biases, at)

        def z(i, gain: int):
            return logit(keep(at.load(acc, i) * r), gains[gain], bias[i])

        # Loops rather than unrolled entries, as the split kernel has them.
        for c in range(2):
            with T.serial(N) as m:
                at.store(args, c * N + m, -z(c * N + m, c))
        for e, v in enumerate(softmax_shift([z(2 * N + e, 2) for e in range(ENTRIES)])):
            at.store(args, 2 * N + e, v)

    def mix_token(exps, pre, post, comb, scalars, at):
        pre_eps, post_mult, sinkhorn_eps, repeat = scalars

        def sigma(m):
            return sigmoid_of_exp(at.load(exps, m), spec.flush_division, sh.in_simd)

        with T.serial(N) as m:
            at.store(pre, m, pre_mix(sigma(m), pre_eps))
        with T.serial(N) as m:
            at.store(post, m, post_mix(sigma(N + m), post_mult))
        projected = sinkhorn_of_exps([at.load(exps, 2 * N + e) for e in range(ENTRIES)], repeat, sinkhorn_eps,
                                     spec.flavor)
        for e, v in enumerate(projected):
            at.store(comb, e, v)

    def mixed(x, pre, row, at):
        weights = [_pre_weight(pre, row, m, at) for m in range(N)]
        streams = [F.bf16_to_f32(row_at(at, m).load(x)) for m in range(N)]
        return F.f32_to_bf16(stream_mix(spec.flavor, weights, streams))

    @T.macro
    def add_split(acc, p, sq, q):
        sh.elementwise((BT, NP), lambda at: split_sum(at.load(acc), at.load(p)), acc)
        sh.elementwise((BT,), lambda at: split_sum(at.load(sq), at.load(q)), sq)

    @T.macro
    def mixes(acc, sq, biases, args, exps, pre, post, comb, gains, pre_eps, post_mult, sinkhorn_eps, repeat,
              num_valid):
        # Rows past the token count are skipped where a row is a loop iteration (a decode call mixes
        # its tokens, not the tile); their exps are of stale arguments and never read.
        scalars = (pre_eps, post_mult, sinkhorn_eps, repeat)
        with sh.vector(SIMD):
            sh.rowwise(BT, lambda at: exp_arguments(acc, sq, biases, gains, args, at), num_valid)
        sh.exp((BT, N3), args, exps)
        with sh.vector(SIMD):
            sh.rowwise(BT, lambda at: mix_token(exps, pre, post, comb, scalars, at), num_valid)

    @T.macro
    def apply_mix(x, pre, row, o):
        sh.elementwise((BH,), lambda at: mixed(x, pre, row, at), o)

    @TK.prim_func
    def pre_big_fuse_fwd_kernel(
        P: TK.StridedTensor((S, M, N3), (p_stride, N3, 1), "float32"),
        Q: TK.StridedTensor((S, M), (q_stride, 1), "float32"),
        SCALE: TK.Tensor((NUM_GAINS,), "float32"), BASE: TK.Tensor((N3,), "float32"),
        X: TK.Tensor((M, N, H), "uint16"), POST: TK.Tensor((M, N), "float32"),
        COMB: TK.Tensor((M, ENTRIES), "float32"), LI: TK.Tensor((M, H), "uint16"),
        pre_eps: TK.float32, post_mult: TK.float32, sinkhorn_eps: TK.float32, repeat: TK.int32,
        p_stride: TK.int32, q_stride: TK.int32,
    ):
        with sh.persistent_kernel() as worker:
            gains = [keep(SCALE[c]) for c in range(NUM_GAINS)]
            biases = sh.tile((LANES,), "float32")
            sh.copy(BASE[0], biases)
            for tb in sh.tiles([T.ceildiv(M, BT)], worker):
                t0 = T.alloc_var("int32")
                num_valid = T.alloc_var("int32")
                t0 = tb * BT
                num_valid = T.min(BT, M - t0)
                p = sh.tile((BT, NP), "float32")
                q = sh.tile((BT,), "float32")
                acc = sh.tile((BT, NP), "float32")
                sq = sh.tile((BT,), "float32")
                pre = sh.group_tile(BT, N, "float32")
                post = sh.tile((BT, N), "float32")
                comb = sh.tile((BT, ENTRIES), "float32")
                args = sh.tile((BT, N3), "float32")
                exps = sh.tile((BT, N3), "float32")
                x = sh.tile((N, BH), "uint16")
                o = sh.tile((BH,), "uint16")
                sh.buffer_versions({p: 2, q: 2, x: 2, o: 2})
                with sh.vector(SIMD):
                    sh.elementwise((BT, NP), zero, acc)
                    sh.elementwise((BT,), zero, sq)
                for s in T.serial(S):
                    sh.copy(P[s, t0, 0], p)
                    sh.copy(Q[s, t0], q)
                    with sh.vector(SIMD):
                        add_split(acc, p, sq, q)
                mixes(acc, sq, biases, args, exps, pre, post, comb, gains, pre_eps, post_mult, sinkhorn_eps, repeat,
                      num_valid)
                sh.copy(post, POST[t0, 0])
                sh.copy(comb, COMB[t0, 0])
                for row in T.serial(num_valid):
                    for th in T.serial(T.ceildiv(H, BH)):
                        h0 = T.alloc_var("int32")
                        h0 = th * BH
                        sh.copy(X[t0 + row, 0, h0], x)
                        with sh.vector(SIMD):
                            apply_mix(x, pre, row, o)
                        sh.copy(o, LI[t0 + row, h0])

    return pre_big_fuse_fwd_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_mhc.pre_big_fuse.PreBigFuseCall``) on ``target``."""
    partials, partial_sqrsums = call.gemm_out_mul, call.gemm_out_sqrsum
    residual, layer_input = bit_view(call.residual), bit_view(call.layer_input)

    def run(kernel, start: int, stop: int) -> None:
        rows = slice(start, stop)
        kernel(partials[:, rows], partial_sqrsums[:, rows], call.mhc_scale, call.mhc_base, residual[rows],
               call.post_mix[rows], call.comb_mix[rows], layer_input[rows], call.mhc_pre_eps,
               call.mhc_post_mult_value, call.mhc_sinkhorn_eps, call.sinkhorn_repeat, partials.stride(0),
               partial_sqrsums.stride(0))

    build_pre_big_fuse.launch_rows(call.spec, target, residual.shape[0], run, align=TOKEN_BLOCK)
