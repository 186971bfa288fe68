"""``moe_topk_gate_backward`` as one parallel-style TileLang kernel for ascend, cuda and cpu.

Work tiles of ``block_m`` tokens go round-robin to persistent workers. Per tile:

1. DMA the score rows, the routed expert pairs, weights and weight gradients on chip;
   with the auxiliary term, also the rows of ``grad_scores_sum`` of the sequences the
   tile touches: from ``seq_first = first token // tokens_per_seq`` on (a tile may
   span sequences);
2. one lane per token: the route term of each valid slot,
   ``(s * g_j - <g, w>) / D`` with ``D = sum(u_sel) + 1e-20``; with the auxiliary term,
   the token's own sequence row of ``h`` (``token // tokens_per_seq``, int32),
   ``U = sum(u)``, ``<h, u>`` and ``inv = mask ? 1 / U : 0``;
3. per (token, expert): the route terms of the slots holding the expert, summed in
   slot order (duplicates of fixed routing add up; -1 slots contribute nothing);
4. one lane per (token, expert): plus ``(h - <h, u> inv) inv`` (cuda flavor) or
   ``h inv - <h, u> inv inv`` (ascend flavor), times ``d sqrt(softplus) / dx`` from ``u``
   (flavor's formula; exactly +0.0 at u = 0, so padded tokens give +0.0 everywhere); a
   non-finite score raises the status flag;
5. DMA the gradient rows out.

On Ascend step 3 (the one-hot sum) runs as explicit vector code, one token per lane
(``Shell.rowwise``); steps 2 and 4 run in SIMT regions: per-token loops with global
status stores, gathers by expert index, and the derivative's ``exp`` (the correctly
rounded ``exp`` of ``vmi_core.tl.elementary``, scalar code). No lane stores
where another lane reads within a pass, so the only barriers are between passes. The
token count, the sequence count and the tokens per sequence are runtime values.
"""


from dataclasses import dataclass

import torch

from vmi_core.kernel import kernel
from vmi_core.targets import get_flavor
from vmi_core.tl.formats import f32_const
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMD, SIMT, Shell
from vmi_core.tl.simd import LaneVar, select
from vmi_moe.tl.softplus import sqrt_softplus_backward

from .common import (
    DENOM_EPS,
    STATUS_BAD_INDEX,
    STATUS_NONFINITE,
    STATUS_WORDS,
    clamp,
    is_nonfinite,
    padded,
    row_bytes,
    row_chunks,
    tile_rows,
)


@dataclass(frozen=True)
class GateBackwardSpec:
    """Everything a gate backward kernel is specialised on."""

    num_experts: int
    num_topk: int
    flavor: str
    has_aux: bool = False

    @property
    def block_m(self) -> int:
        """Tokens per work tile (scores, gradient, index pairs, weights, weight gradients, slot
        experts and route terms; with the auxiliary term sequence rows and three per-token values)."""
        E, K = self.num_experts, self.num_topk
        return tile_rows(row_bytes(E, E, 2 * K, K, K, K, K, *((E, 1, 1, 1) if self.has_aux else ())))


@kernel(simd_parallel=False)
def build_moe_topk_gate_backward(spec: GateBackwardSpec, target: str):
    """The TileLang prim_func of ``spec`` for ``target``."""
    sh = Shell(target)
    TK = sh.T
    E, K = spec.num_experts, spec.num_topk
    BM = spec.block_m
    flavor = get_flavor(spec.flavor)
    M = TK.dynamic("M")
    NSEQ = TK.dynamic("NSEQ")

    def route_row(expert, delta, grad, at):
        with T.serial(E) as e:
            route = LaneVar(at.vector, "float32", f32_const(0.0))
            for j in range(K):
                route.set(route.get() + select(at.load(expert, j) == e, at.load(delta, j), f32_const(0.0)))
            at.store(grad, e, route.get())

    @T.macro
    def route_terms(expert, delta, grad):
        sh.rowwise(BM, lambda at: route_row(expert, delta, grad, at))

    @T.macro
    def body(SCORES, IDX, W, GW, MASK, H, OUT, STATUS, scale, row_base, tokens_per_seq):
        with sh.persistent_kernel() as worker:
            for tm in sh.tiles([T.ceildiv(M, BM)], worker):
                row0 = T.alloc_var("int32")
                seq_first = T.alloc_var("int32")
                row0 = tm * BM
                u = sh.tile((BM, padded(E)), "float32")
                ix = sh.tile((BM, padded(2 * K)), "int32")
                w = sh.tile((BM, padded(K)), "float32")
                g = sh.tile((BM, padded(K)), "float32")
                grad = sh.tile((BM, padded(E)), "float32")
                expert = sh.tile((BM, padded(K)), "int32")
                delta = sh.tile((BM, padded(K)), "float32")
                sh.buffer_versions({u: 2, ix: 2, w: 2, g: 2, grad: 2})
                h = sh.tile((BM, padded(E)), "float32") if spec.has_aux else None
                hrow = sh.tile((BM,), "int32") if spec.has_aux else None
                inv_t = sh.tile((BM,), "float32") if spec.has_aux else None
                shift_t = sh.tile((BM,), "float32") if spec.has_aux else None
                sh.copy(SCORES[row0, 0], u)
                sh.copy(IDX[row0, 0], ix)
                sh.copy(W[row0, 0], w)
                sh.copy(GW[row0, 0], g)
                if spec.has_aux:
                    # int32 division before any address arithmetic: a tile's rows span at most BM sequences.
                    seq_first = (row_base + row0) // tokens_per_seq
                    sh.copy(H[seq_first, 0], h)
                with sh.vector(SIMT):
                    # Per token: the route term of each slot and the token's auxiliary statistics.
                    for i in T.Parallel(BM):
                        row = T.alloc_var("int32")
                        valid = T.alloc_var("int32")
                        sel_sum = T.alloc_var("float32")
                        gw_dot = T.alloc_var("float32")
                        gw = T.alloc_var("float32")
                        d = T.alloc_var("float32")
                        row = T.min(row0 + i, M - 1)
                        sel_sum = f32_const(0.0)
                        gw_dot = f32_const(0.0)
                        for j in T.serial(K):
                            valid = T.Cast("int32", ix[i, 2 * j + 1] == 0 and ix[i, 2 * j] >= 0 and ix[i, 2 * j] < E)
                            # Only -1 marks an unused slot; anything else outside [0, E) is bad input.
                            if valid == 0 and (ix[i, 2 * j] != -1 or ix[i, 2 * j + 1] != -1) and row0 + i < M:
                                STATUS[STATUS_BAD_INDEX] = 1
                            expert[i, j] = T.Select(valid > 0, ix[i, 2 * j], -1)
                            sel_sum = sel_sum + T.Select(valid > 0, u[i, clamp(ix[i, 2 * j], 0, E - 1)], f32_const(0.0))
                            gw = g[i, j] * w[i, j]
                            gw_dot = gw_dot + T.Select(valid > 0, gw, f32_const(0.0))
                        d = sel_sum + f32_const(DENOM_EPS)
                        for j in T.serial(K):
                            delta[i, j] = (scale * g[i, j] - gw_dot) / d
                        if spec.has_aux:
                            total = T.alloc_var("float32")
                            hu = T.alloc_var("float32")
                            prod = T.alloc_var("float32")
                            inv = T.alloc_var("float32")
                            seq_row = T.alloc_var("int32")
                            seq_row = (row_base + row) // tokens_per_seq - seq_first
                            hrow[i] = seq_row
                            total = f32_const(0.0)
                            hu = f32_const(0.0)
                            for e in T.serial(E):
                                total = total + u[i, e]
                                prod = h[clamp(seq_row, 0, BM - 1), e] * u[i, e]
                                hu = hu + prod
                            inv = T.Select(MASK[row] != 0, f32_const(1.0) / total, f32_const(0.0))
                            inv_t[i] = inv
                            shift_t[i] = -((hu * inv) * inv) if flavor.gate_aux_expanded else hu * inv

                # Per (token, expert): the route term summed over the slots holding the expert, in
                # slot order (fixed-routing duplicates add up), into the gradient tile; vector code,
                # one token per lane.
                with sh.vector(SIMD):
                    route_terms(expert, delta, grad)
                with sh.vector(SIMT):
                    # Per (token, expert): the auxiliary term and the derivative.
                    for i, e in T.Parallel(BM, E):
                        route = T.alloc_var("float32")
                        if row0 + i < M and is_nonfinite(u[i, e]):
                            STATUS[STATUS_NONFINITE] = 1
                        route = grad[i, e]
                        if spec.has_aux:
                            aux = T.alloc_var("float32")
                            if flavor.gate_aux_expanded:
                                aux = h[clamp(hrow[i], 0, BM - 1), e] * inv_t[i]
                                aux = aux + shift_t[i]
                            else:
                                aux = (h[clamp(hrow[i], 0, BM - 1), e] - shift_t[i]) * inv_t[i]
                            route = route + aux
                        grad[i, e] = sqrt_softplus_backward(u[i, e], flavor) * route
                sh.copy(grad, OUT[row0, 0])

    @TK.prim_func
    def moe_topk_gate_backward_kernel(
        SCORES: TK.Tensor((M, E), "float32"),
        IDX: TK.Tensor((M, 2 * K), "int32"),
        W: TK.Tensor((M, K), "float32"),
        GW: TK.Tensor((M, K), "float32"),
        MASK: TK.Tensor((M if spec.has_aux else 1,), "uint8"),
        H: TK.Tensor((NSEQ, E), "float32"),
        OUT: TK.Tensor((M, E), "float32"),
        STATUS: TK.Tensor((STATUS_WORDS,), "int32"),
        scale: TK.float32,
        row_base: TK.int32,
        tokens_per_seq: TK.int32,
    ):
        body(SCORES, IDX, W, GW, MASK, H, OUT, STATUS, scale, row_base, tokens_per_seq)

    return moe_topk_gate_backward_kernel


def launch(call, target: str) -> None:
    """Run a validated call (``vmi_moe.moe_topk_gate_backward.GateBackwardCall``) on ``target``."""
    spec = call.spec
    device = call.scores.device
    idx = call.topk_idx.view(torch.int32)
    if spec.has_aux:
        mask, h, tokens_per_seq = call.mask.view(torch.uint8), call.grad_scores_sum, call.tokens_per_seq
    else:
        mask = torch.zeros(1, dtype=torch.uint8, device=device)
        h = torch.zeros(1, spec.num_experts, dtype=torch.float32, device=device)
        tokens_per_seq = 1

    def run(kernel, start: int, stop: int) -> None:
        for lo, hi in row_chunks(start, stop, spec.num_experts):
            kernel(call.scores[lo:hi], idx[lo:hi], call.topk_weights[lo:hi], call.grad_topk_weights[lo:hi],
                   mask[lo:hi] if spec.has_aux else mask, h, call.grad_logits[lo:hi], call.status,
                   call.routed_scaling_factor, lo, tokens_per_seq)

    build_moe_topk_gate_backward.launch_rows(spec, target, call.scores.shape[0], run, align=spec.block_m)
