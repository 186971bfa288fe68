"""A DeepSeek-V4-style block across the three families, forward and backward.

One description, three implementations of its stages:

* ``Kernels(target, flavor)``: the packages' public functions on a kernel target (``"cpu"``);
* ``Kernels("torch", flavor)``: the same public functions on the reference pseudo-target;
* ``Float64``: the exact formulas in float64, differentiated by torch autograd.

The block (one MoE sublayer between mHC's pre and post, then mHC's LM-head mix)::

    x (T, H) bf16 ─ expand_to_mhc ─ R (T, n, H)
    mhc_pre(R) ─ layer_input (T, H), post_mix, comb_mix
    RMSNorm + per-token E4M3 cast (RMSNormFunction with NormCastOptions) ─ u (bf16), (data, sf)
    gate GEMM (torch stand-in): logits = u · W_gate^T ─ moe_topk_gate_autograd ─ topk_idx, topk_weights
    get_fused_mapping, group_count ─ the fused expert layout (expert ranges, pairs in token order)
    expand_to_fused(dequant(data, sf)) ─ rows; expert up GEMM (torch stand-in): h = rows · W_up[e]^T
    swiglu_forward_and_per_token_cast(h, the rows' weights: expand_to_fused too) ─ E4M3 activation
    expert down GEMM (torch stand-in): y = dequant(act) · W_down[e]^T
    reduce_fused: out[t] = Σ_k y[row of (t, k)], slots in order ─ layer_output (T, H) bf16
    mhc_post(layer_output, R, post_mix, comb_mix) ─ R' (T, n, H)
    mhc_head(R') ─ (T, H) bf16;  loss = Σ head · probe + the sequence-level balance loss

The routing weights multiply the SwiGLU output inside its kernel (TileKernels' ``topk_weights``),
so the combine is a plain per-token sum of the weighted expert rows. Dispatch and combine are each
other's gradient: the backward of ``expand_to_fused`` is an unweighted ``reduce_fused`` and that of
``reduce_fused`` an ``expand_to_fused``. The FP8 casts are quantized
forward and straight-through backward: the gradient of the dequantized tensor is taken as the
gradient of the tensor that was cast (the bf16 norm output; the SwiGLU activation, whose gradient
``swiglu_backward`` takes). ``Float64`` quantizes to E4M3 the same way (scales from its own amax),
and takes the routing (which experts, a discrete choice) from the run it is compared with.

The sequence-level balance loss (DeepSeek-V3's): per sequence ``α Σ_e f_e · P_e``, averaged over the
sequences, ``f_e`` the expert's routing frequency (vmi-moe's ``aux_fi``: ``count · E / (L · K)``) and
``P_e`` the sequence's mean of ``u / Σ u``, which the gate returns summed per sequence (its
``scores_sum``); its gradient goes through the gate's backward kernel (the auxiliary term).

``run_block`` takes a placement: ``SingleProcess`` (every token and expert here), or the
expert-parallel one of ``block_ep``, which gives a rank a range of the tokens and a share of the
experts and replaces the expert section and the sums over tokens with their exchanges.
"""

from __future__ import annotations

import gc
import itertools
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

import vmi_mhc
import vmi_moe
import vmi_quant
from vmi_mhc.reference.post import post_fwd_exact
from vmi_mhc.reference.pre_apply_mix import mhc_pre_apply_mix_fwd_exact
from vmi_mhc.reference.pre_split_mixes import pre_split_mixes_fwd_exact
from vmi_mhc.reference.sinkhorn import sinkhorn_forward_float64
from vmi_moe.reference.counts import frequencies
from vmi_quant import NormCastOptions, RMSNormFunction

E4M3_MAX = 448.0
CAST = NormCastOptions(fmt="e4m3", num_per_channels=32)


@dataclass(frozen=True)
class BlockConfig:
    """Sizes and constants of the block (small: with the kernels compiled, a forward and backward
    take tens of milliseconds on cpu)."""

    num_sequences: int = 2
    sequence_length: int = 32
    hidden: int = 256
    mhc_mult: int = 4
    num_experts: int = 8
    num_topk: int = 2
    expert_hidden: int = 128
    routed_scaling_factor: float = 1.5
    norm_eps: float = 1e-6
    post_mult_value: float = 2.0
    pre_eps: float = 1e-6
    sinkhorn_eps: float = 1e-6
    sinkhorn_repeat: int = 10
    n_splits: int = 16
    # α of the balance loss: about a fifth of the logits' gradient here, where the task loss sums all
    # T·H outputs, so that every comparison sees it (models use about 1e-4 against a per-token mean).
    balance_alpha: float = 1024.0

    @property
    def num_tokens(self) -> int:
        return self.num_sequences * self.sequence_length


@dataclass
class BlockParams:
    """The block's input and parameters; every floating tensor but ``probe`` and ``gate_bias`` is
    differentiated."""

    x: torch.Tensor
    mhc_fn: torch.Tensor
    mhc_scale: torch.Tensor
    mhc_base: torch.Tensor
    norm_weight: torch.Tensor
    gate_weight: torch.Tensor
    gate_bias: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    head_fn: torch.Tensor
    head_scale: torch.Tensor
    head_base: torch.Tensor
    probe: torch.Tensor

    GRADIENTS = ("x", "mhc_fn", "mhc_scale", "mhc_base", "norm_weight", "gate_weight", "w_up", "w_down",
                 "head_fn", "head_scale", "head_base")

    def fresh(self, dtype_map: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> BlockParams:
        """A copy whose differentiated tensors are new leaves (``dtype_map`` applied) requiring grad."""
        values = {}
        for name, value in vars(self).items():
            copied = dtype_map(value.detach()).clone()
            values[name] = copied.requires_grad_(name in self.GRADIENTS)
        return BlockParams(**values)

    def grads(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name).grad for name in self.GRADIENTS}


def make_params(config: BlockConfig, seed: int = 0) -> BlockParams:
    """Random parameters scaled so that every stage sees values of order one."""
    gen = torch.Generator().manual_seed(seed)
    c = config
    n, h, k = c.mhc_mult, c.hidden, c.mhc_mult * c.hidden
    n3 = n * (n + 2)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen) * std

    return BlockParams(
        x=randn(c.num_tokens, h).to(torch.bfloat16),
        mhc_fn=randn(n3, k, std=k ** -0.5),
        mhc_scale=1.0 + 0.1 * randn(3),
        mhc_base=0.1 * randn(n3),
        norm_weight=(1.0 + 0.1 * randn(h)).to(torch.bfloat16),
        gate_weight=randn(c.num_experts, h, std=h ** -0.5),
        gate_bias=0.1 * randn(c.num_experts),
        w_up=randn(c.num_experts, 2 * c.expert_hidden, h, std=h ** -0.5),
        w_down=randn(c.num_experts, h, c.expert_hidden, std=c.expert_hidden ** -0.5),
        head_fn=randn(n, k, std=k ** -0.5),
        head_scale=1.0 + 0.1 * randn(1),
        head_base=0.1 * randn(n),
        probe=randn(c.num_tokens, h),
    )


# --- the expert layout: the routing's fused layout, shared by every implementation ---

@dataclass(frozen=True)
class ExpertLayout:
    """A routing's fused expert layout (``vmi_moe.get_fused_mapping``): expert ``e`` owns a range of
    rows rounded up to the alignment, its (token, slot) pairs first in (token, slot) order, the rest
    padding. ``psum`` (each expert's end of pairs) is TileKernels' psum layout, which the SwiGLU
    kernels read: expert ``e``'s rows are ``[align(psum[e-1], A), psum[e])``."""

    token_topk_to_pos: torch.Tensor  # int32 (T, K): each pair's row
    pos_to_expert: torch.Tensor      # int32 (N,): each row's expert, -1 for padding
    psum: torch.Tensor               # int32 (E,)
    pair_rows: tuple[tuple[int, int], ...]  # per expert, its pairs' rows [start, end)

    @staticmethod
    def build(topk_idx: torch.Tensor, num_experts: int, alignment: int, target: str,
              flavor: str | None = None) -> ExpertLayout:
        """The layout of ``topk_idx`` from vmi-moe's ``get_fused_mapping`` and ``group_count`` on ``target``."""
        pos_to_expert, _, _, token_topk_to_pos, start, _, _, _ = vmi_moe.get_fused_mapping(
            topk_idx, num_experts, 0, alignment, target=target, flavor=flavor)
        psum = start + vmi_moe.group_count(topk_idx, num_experts, target=target, flavor=flavor)
        return ExpertLayout(token_topk_to_pos, pos_to_expert, psum,
                            tuple(zip(start.tolist(), psum.tolist(), strict=True)))

    @property
    def num_rows(self) -> int:
        return self.pos_to_expert.shape[0]

    def valid_rows(self) -> torch.Tensor:
        return self.pos_to_expert >= 0

    def slots(self) -> ExpertLayout:
        """The layout with one pair per row of ``token_topk_to_pos`` (``(T * K, 1)``): for per-slot values."""
        return ExpertLayout(self.token_topk_to_pos.reshape(-1, 1), self.pos_to_expert, self.psum, self.pair_rows)


# --- stand-ins and helpers written once, in torch, for every implementation ---

def dequantize(data: torch.Tensor, sf: torch.Tensor, num_per_channels: int = CAST.num_per_channels) -> torch.Tensor:
    """fp32 ``data · sf`` of a per-token E4M3 tensor with fp32 scales."""
    return data.float() * sf.repeat_interleave(num_per_channels, dim=-1)


class StraightThrough(torch.autograd.Function):
    """``quantized`` forward (a dequantized FP8 tensor), identity gradient to ``source`` (the tensor
    that was cast), in ``source``'s dtype."""

    @staticmethod
    def forward(ctx, source, quantized):
        ctx.dtype = source.dtype
        return quantized.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype), None


def expert_gemm(rows: torch.Tensor, weight: torch.Tensor, layout: ExpertLayout) -> torch.Tensor:
    """``rows[start:end] · weight[e]^T`` over each expert's pairs in ``weight``'s dtype, padding rows 0:
    the expert GEMM stand-in (torch), reading the fused layout's rows."""
    parts, done = [], 0
    for e, (start, end) in enumerate(layout.pair_rows):
        parts += [weight.new_zeros(start - done, weight.shape[1]), rows[start:end].to(weight.dtype) @ weight[e].t()]
        done = end
    return torch.cat([*parts, weight.new_zeros(layout.num_rows - done, weight.shape[1])])


class StageTimer:
    """Forward and backward seconds per stage of one block run.

    The forward of a stage is timed around its call; its backward is the time autograd spends in
    the graph nodes that the stage created (found from its outputs, stopping at nodes of earlier
    stages), measured by node pre- and post-hooks: the cpu autograd engine runs nodes one at a time.
    """

    def __init__(self):
        self.forward: dict[str, float] = defaultdict(float)
        self.backward: dict[str, float] = defaultdict(float)
        self.order: list[str] = []
        self._claimed: set = set()

    def run(self, name: str, fn: Callable, *args):
        if name not in self.order:
            self.order.append(name)
        start = time.perf_counter()
        result = fn(*args)
        self.forward[name] += time.perf_counter() - start
        pending = [t.grad_fn for t in _tensors((result,))]
        while pending:
            node = pending.pop()
            if node is None or node in self._claimed:
                continue
            self._claimed.add(node)
            self._hook(name, node)
            pending.extend(next_node for next_node, _ in node.next_functions)
        return result

    def _hook(self, name: str, node) -> None:
        started = []

        def before(_grad_outputs):
            started.append(time.perf_counter())

        def after(_grad_inputs, _grad_outputs):
            self.backward[name] += time.perf_counter() - started.pop()

        node.register_prehook(before)
        node.register_hook(after)


def _tensors(values) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, tuple | list):
            yield from _tensors(value)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's garbage collector run, then paused for the block (as ``timeit`` times): a collection
    inside a timed run would count against it."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Untimed:
    @staticmethod
    def run(name, fn, *args):
        return fn(*args)


@dataclass
class BlockRun:
    """The results of one forward of the block (``loss.backward()`` runs its backward)."""

    loss: torch.Tensor           # the block's: the task loss summed over every rank's tokens, plus balance_loss
    balance_loss: torch.Tensor
    head: torch.Tensor
    layer_output: torch.Tensor
    topk_idx: torch.Tensor       # the gate's experts (physical where the placement maps them)
    topk_weights: torch.Tensor
    stages: dict[str, torch.Tensor]


# --- the packages' implementation: kernels, or their references on the target "torch" ---

class ExpertSwiGLU(torch.autograd.Function):
    """``swiglu_forward_and_per_token_cast`` forward, returned dequantized (the down GEMM's input),
    and ``swiglu_backward`` on the activation gradient: the FP8 forward has no differentiable output."""

    @staticmethod
    def forward(ctx, h, row_weights, psum, valid, target, flavor):
        data, sf = vmi_quant.swiglu_forward_and_per_token_cast(h, "e4m3", CAST.num_per_channels, psum, row_weights,
                                                               target=target, flavor=flavor)
        ctx.save_for_backward(h, row_weights, psum)
        ctx.target, ctx.flavor = target, flavor
        # The kernel leaves padding rows unwritten; no GEMM reads them, zeros keep them finite.
        return torch.where(valid[:, None], dequantize(data, sf), 0.0)

    @staticmethod
    def backward(ctx, act_grad):
        h, row_weights, psum = ctx.saved_tensors
        h_grad, weight_grad = vmi_quant.swiglu_backward(h, act_grad.to(h.dtype).contiguous(), "bf16", psum,
                                                        row_weights, target=ctx.target, flavor=ctx.flavor)
        return h_grad, weight_grad, None, None, None, None


class DispatchRows(torch.autograd.Function):
    """``expand_to_fused`` forward (each pair's token row copied to the pair's row, padding rows 0);
    backward: each token's gradient the sum of its rows' (``reduce_fused``, no weights)."""

    @staticmethod
    def forward(ctx, x, layout, target, flavor):
        ctx.layout, ctx.where = layout, {"target": target, "flavor": flavor}
        return vmi_moe.expand_to_fused(x.contiguous(), layout.token_topk_to_pos, layout.pos_to_expert,
                                       target=target, flavor=flavor)

    @staticmethod
    def backward(ctx, grad_rows):
        return vmi_moe.reduce_fused(grad_rows.contiguous(), None, ctx.layout.token_topk_to_pos, **ctx.where), \
            None, None, None


class CombineRows(torch.autograd.Function):
    """``reduce_fused`` forward (each token the sum of its pairs' rows, slot 0 first); backward: each
    row's gradient its token's (``expand_to_fused``)."""

    @staticmethod
    def forward(ctx, rows, layout, target, flavor):
        ctx.layout, ctx.where = layout, {"target": target, "flavor": flavor}
        return vmi_moe.reduce_fused(rows.contiguous(), None, layout.token_topk_to_pos, target=target, flavor=flavor)

    @staticmethod
    def backward(ctx, grad):
        return vmi_moe.expand_to_fused(grad.contiguous(), ctx.layout.token_topk_to_pos, ctx.layout.pos_to_expert,
                                       **ctx.where), None, None, None


class Kernels:
    """The stages as the packages' public functions on ``target``: a kernel target (``"cpu"``), or
    ``"torch"`` for their references."""

    activation_dtype = torch.bfloat16

    def __init__(self, target: str = "cpu", flavor: str | None = None):
        self.target, self.flavor = target, flavor
        self.name = "reference" if target == "torch" else f"kernels ({target})"

    def _where(self) -> dict:
        return {"target": self.target, "flavor": self.flavor}

    def expand(self, x, c: BlockConfig):
        return vmi_mhc.expand_to_mhc(x, c.mhc_mult, **self._where())

    def pre(self, residual, p: BlockParams, c: BlockConfig):
        return vmi_mhc.mhc_pre(residual, p.mhc_fn, p.mhc_scale, p.mhc_base, norm_eps=c.norm_eps, mhc_mult=c.mhc_mult,
                               post_mult_value=c.post_mult_value, pre_eps=c.pre_eps, sinkhorn_eps=c.sinkhorn_eps,
                               sinkhorn_repeat=c.sinkhorn_repeat, n_splits=c.n_splits, **self._where())

    def norm_cast(self, layer_input, p: BlockParams, c: BlockConfig):
        """``(normed, (data, sf))``: the differentiable bf16 norm output and its E4M3 cast."""
        normed, _, data, sf = RMSNormFunction.apply(layer_input, p.norm_weight, None, c.norm_eps, 1.0, CAST,
                                                    self.target, self.flavor)
        return normed, (data, sf)

    @staticmethod
    def dequantize(quantized):
        return dequantize(*quantized)

    def gate(self, logits, p: BlockParams, c: BlockConfig, num_sequences: int, ep_rank: int = 0,
             replicas: tuple[torch.Tensor, torch.Tensor] | None = None):
        """``(topk_idx, logical_topk_idx, topk_weights, scores_sum)``: the experts (physical ones
        with ``replicas``, the gate's ``(to_physical_map, logical_count)``), the logical ones, their
        weights, and per run of ``T / num_sequences`` tokens the sum of ``u / Σ u``."""
        to_physical_map, logical_count = replicas or (None, None)
        logical = torch.empty(logits.shape[0], c.num_topk, dtype=torch.int64)
        topk_idx, topk_weights, scores_sum = vmi_moe.moe_topk_gate_autograd(
            logits, c.num_topk, False, 0, c.routed_scaling_factor, ep_rank, bias=p.gate_bias,
            to_physical_map=to_physical_map, logical_count=logical_count, unmapped_topk_idx=logical,
            num_sequences=num_sequences, **self._where())
        return topk_idx, logical, topk_weights, scores_sum

    def count(self, ids, num_ids: int) -> torch.Tensor:
        return vmi_moe.group_count(ids, num_ids, **self._where())

    def layout(self, topk_idx, num_experts: int) -> ExpertLayout:
        return ExpertLayout.build(topk_idx, num_experts, token_alignment(), **self._where())

    def dispatch(self, x, layout: ExpertLayout):
        return DispatchRows.apply(x, layout, self.target, self.flavor)

    def combine(self, rows, layout: ExpertLayout):
        return CombineRows.apply(rows, layout, self.target, self.flavor)

    def swiglu(self, h, row_weights, layout: ExpertLayout):
        return ExpertSwiGLU.apply(h, row_weights, layout.psum, layout.valid_rows(), self.target, self.flavor)

    def post(self, layer_output, residual, post_mix, comb_mix):
        return vmi_mhc.mhc_post(layer_output, residual, post_mix, comb_mix, **self._where())

    def head(self, residual, p: BlockParams, c: BlockConfig):
        return vmi_mhc.mhc_head(residual, p.head_fn, p.head_scale, p.head_base, norm_eps=c.norm_eps,
                                mhc_mult=c.mhc_mult, pre_eps=c.pre_eps, n_splits=c.n_splits, **self._where())


# --- the exact formulas in float64 ---

def quantize_e4m3_float64(y: torch.Tensor, num_per_channels: int = CAST.num_per_channels) -> torch.Tensor:
    """Per-token E4M3 quantization of a float64 tensor, dequantized: per group of channels
    ``sf = max(amax, clamp) / 448`` (the packages' amax clamp) and the code nearest to ``y / sf``."""
    groups = y.detach().reshape(*y.shape[:-1], -1, num_per_channels)
    amax = groups.abs().amax(dim=-1, keepdim=True).clamp_min(vmi_quant.get_amax_clamp_for_quant("e4m3"))
    sf = amax / E4M3_MAX
    codes = (groups / sf).to(torch.float8_e4m3fn).double()
    return (codes * sf).reshape(y.shape)


def _rms_mixes(residual: torch.Tensor, fn: torch.Tensor, eps: float) -> torch.Tensor:
    """``(flat(R) · fn^T) · (mean(flat(R)^2) + eps)^-1/2`` per token (norm_fn without a norm weight)."""
    flat = residual.reshape(residual.shape[0], -1)
    return (flat @ fn.t()) * torch.rsqrt((flat * flat).mean(dim=-1, keepdim=True) + eps)


class Float64:
    """The stages' exact formulas in float64, for torch autograd; the routing (the experts of each
    token) is given: the one of the run compared with."""

    activation_dtype = torch.float64
    name = "float64"

    def __init__(self, routing: torch.Tensor):
        self.routing = routing

    def expand(self, x, c: BlockConfig):
        return x.unsqueeze(-2).expand(x.shape[0], c.mhc_mult, x.shape[-1])

    def pre(self, residual, p: BlockParams, c: BlockConfig):
        n = c.mhc_mult
        mixes = _rms_mixes(residual, p.mhc_fn, c.norm_eps)
        pre, post, comb_logits = pre_split_mixes_fwd_exact(mixes, p.mhc_scale, p.mhc_base, c.post_mult_value,
                                                           c.pre_eps, n)
        comb = sinkhorn_forward_float64(comb_logits.reshape(-1, n, n), c.sinkhorn_repeat, c.sinkhorn_eps)
        return mhc_pre_apply_mix_fwd_exact(residual, pre), (post.unsqueeze(-1), comb)

    def norm_cast(self, layer_input, p: BlockParams, c: BlockConfig):
        normed = layer_input * torch.rsqrt((layer_input * layer_input).mean(-1, keepdim=True) + c.norm_eps)
        normed = normed * p.norm_weight
        return normed, quantize_e4m3_float64(normed)

    @staticmethod
    def dequantize(quantized):
        return quantized

    def gate(self, logits, p: BlockParams, c: BlockConfig, num_sequences: int):
        scores = torch.sqrt(torch.nn.functional.softplus(logits))
        chosen = scores.gather(1, self.routing)
        weights = chosen / (chosen.sum(dim=1, keepdim=True) + 1e-20) * c.routed_scaling_factor
        shares = scores / scores.sum(dim=1, keepdim=True)
        return self.routing, self.routing, weights, shares.reshape(num_sequences, -1, c.num_experts).sum(dim=1)

    @staticmethod
    def count(ids, num_ids: int) -> torch.Tensor:
        return vmi_moe.group_count(ids, num_ids, target="torch")

    @staticmethod
    def layout(topk_idx, num_experts: int) -> ExpertLayout:
        return ExpertLayout.build(topk_idx, num_experts, token_alignment(), "torch")

    @staticmethod
    def dispatch(x, layout: ExpertLayout):
        pos = layout.token_topk_to_pos.reshape(-1).long()
        pairs = x.repeat_interleave(layout.token_topk_to_pos.shape[1], dim=0)[pos >= 0]
        return x.new_zeros(layout.num_rows, x.shape[1]).index_copy(0, pos[pos >= 0], pairs)

    @staticmethod
    def combine(rows, layout: ExpertLayout):
        pos = layout.token_topk_to_pos.long()
        return torch.where((pos >= 0)[..., None], rows[pos.clamp(min=0)], 0.0).sum(dim=1)

    def swiglu(self, h, row_weights, layout: ExpertLayout):
        gate, up = h.chunk(2, dim=-1)
        act = torch.nn.functional.silu(gate) * up * row_weights[:, None]
        return StraightThrough.apply(act, quantize_e4m3_float64(act))

    def post(self, layer_output, residual, post_mix, comb_mix):
        return post_fwd_exact(layer_output, residual, post_mix, comb_mix)

    def head(self, residual, p: BlockParams, c: BlockConfig):
        mixes = _rms_mixes(residual, p.head_fn, c.norm_eps)
        pre = torch.sigmoid(mixes * p.head_scale + p.head_base) + c.pre_eps
        return mhc_pre_apply_mix_fwd_exact(residual, pre)


def token_alignment() -> int:
    """The psum layout's row alignment: vmi-quant's (``set_token_alignment``)."""
    return vmi_quant.get_token_alignment()


def expert_frequencies(counts: torch.Tensor, c: BlockConfig) -> torch.Tensor:
    """``f_e`` per sequence: vmi-moe's ``aux_fi`` of each sequence from its counts, which ranks
    holding parts of a sequence add up before dividing."""
    return frequencies(counts, c.num_experts, c.sequence_length, c.num_topk)


def balance_loss(scores_sum: torch.Tensor, counts: torch.Tensor, c: BlockConfig) -> torch.Tensor:
    """``α / S · Σ_s Σ_e f_se · P_se``, ``P_se = scores_sum_se / L``: DeepSeek-V3's sequence-level
    balance loss averaged over the ``S`` sequences; ``f`` (the routing's) is a constant."""
    weights = expert_frequencies(counts, c) * (c.balance_alpha / c.num_tokens)
    return (scores_sum * weights.to(scores_sum.dtype)).sum()


def sequence_runs(tokens: range, sequence_length: int) -> tuple[int, torch.Tensor]:
    """``(length, sequence)``: the gate sums its balance statistic over runs of ``length``
    consecutive tokens (its ``num_sequences`` needs equal lengths): the longest that divides every
    part of a sequence within ``tokens`` (a range of the batch's tokens); ``sequence``: each run's."""
    cuts = sorted({tokens.start, tokens.stop, *range(-(-tokens.start // sequence_length) * sequence_length,
                                                    tokens.stop, sequence_length)})
    length = math.gcd(*(end - begin for begin, end in itertools.pairwise(cuts)))
    return length, torch.arange(tokens.start, tokens.stop, length) // sequence_length


class SingleProcess:
    """The block's placement on one process: every token and every expert. A placement says which
    tokens the process holds, how the gate maps experts, how a sum over every rank's share is taken,
    and runs the expert section (``block_ep.ExpertParallel`` is the other)."""

    gate_options: dict = {}  # ops.gate's keyword arguments

    def tokens(self, c: BlockConfig) -> range:
        return range(c.num_tokens)

    @staticmethod
    def sum_over_ranks(value: torch.Tensor) -> torch.Tensor:
        return value

    @staticmethod
    def experts(ops, p: BlockParams, c: BlockConfig, t, normed, quantized, topk_idx, topk_weights):
        """The expert section: dispatch into the fused layout, the experts, the combine: the layer output."""
        layout = t.run("routing layout", ops.layout, topk_idx.detach(), c.num_experts)
        rows = t.run("dispatch", lambda u, q: ops.dispatch(StraightThrough.apply(u, ops.dequantize(q)), layout),
                     normed, quantized)
        row_weights = t.run("dispatch", lambda w: ops.dispatch(w.reshape(-1, 1), layout.slots()).reshape(-1),
                            topk_weights)
        out_rows = expert_rows(ops, p, t, rows, row_weights, layout)
        return t.run("combine", lambda y: ops.combine(y, layout).to(ops.activation_dtype), out_rows)


def expert_rows(ops, p: BlockParams, t, rows, row_weights, layout: ExpertLayout) -> torch.Tensor:
    """The experts of ``p.w_up``/``p.w_down`` on the rows of ``layout``: up GEMM, SwiGLU (which applies
    the routing weights) + E4M3 cast, down GEMM; fp32 rows, padding 0."""
    h = t.run("expert up GEMM (torch)", lambda r: expert_gemm(r, p.w_up, layout).to(ops.activation_dtype), rows)
    act = t.run("SwiGLU + E4M3 cast", ops.swiglu, h, row_weights, layout)
    return t.run("expert down GEMM (torch)", lambda a: expert_gemm(a, p.w_down, layout), act)


def run_block(ops, p: BlockParams, c: BlockConfig, timer: StageTimer | None = None, placement=None) -> BlockRun:
    """One forward of the block with ``ops``'s stages (``Kernels`` or ``Float64``); ``p`` holds
    the tensors of ``ops``'s dtypes (``BlockParams.fresh``) of the placement's tokens and experts
    (default: ``SingleProcess``)."""
    t = timer or _Untimed()
    placement = placement or SingleProcess()
    residual = t.run("expand_to_mhc", ops.expand, p.x, c)
    layer_input, (post_mix, comb_mix) = t.run("mhc_pre", ops.pre, residual, p, c)
    normed, quantized = t.run("RMSNorm + E4M3 cast", ops.norm_cast, layer_input, p, c)
    logits = t.run("gate GEMM (torch)", lambda u: u.to(p.gate_weight.dtype) @ p.gate_weight.t(), normed)
    tokens = placement.tokens(c)
    run_length, run_sequence = sequence_runs(tokens, c.sequence_length)
    topk_idx, logical_idx, topk_weights, run_scores_sum = t.run(
        "moe_topk_gate", lambda z: ops.gate(z, p, c, len(tokens) // run_length, **placement.gate_options), logits)

    # The balance statistics per sequence, each the sum over the ranks holding parts of it: the
    # routing counts (one id per (sequence, expert)) and the sums of u / Σ u.
    token_sequence = run_sequence.repeat_interleave(run_length)[:, None]
    counts = t.run("balance statistics", lambda: placement.sum_over_ranks(ops.count(
        logical_idx + c.num_experts * token_sequence, c.num_sequences * c.num_experts).view(c.num_sequences, -1)))
    scores_sum = t.run("balance statistics", lambda s: placement.sum_over_ranks(
        s.new_zeros(c.num_sequences, c.num_experts).index_add(0, run_sequence, s)), run_scores_sum)
    balance = t.run("balance loss (torch)", balance_loss, scores_sum, counts, c)

    layer_output = placement.experts(ops, p, c, t, normed, quantized, topk_idx, topk_weights)
    new_residual = t.run("mhc_post", ops.post, layer_output, residual, post_mix, comb_mix)
    head = t.run("mhc_head", ops.head, new_residual, p, c)
    loss = t.run("loss (torch)", lambda y: placement.sum_over_ranks((y.to(p.probe.dtype) * p.probe).sum()) + balance,
                 head)
    stages = {"residual": residual, "layer_input": layer_input, "post_mix": post_mix, "comb_mix": comb_mix,
              "normed": normed, "logits": logits, "new_residual": new_residual,
              "counts": counts, "scores_sum": scores_sum}
    return BlockRun(loss, balance, head, layer_output, topk_idx, topk_weights, stages)


def relative_error(value: torch.Tensor, exact: torch.Tensor) -> float:
    """``max |value - exact| / max |exact|`` in float64 (normwise; 0 for two zero tensors)."""
    scale = exact.double().abs().max().item()
    diff = (value.double() - exact.double()).abs().max().item()
    return diff / scale if scale else diff


def float64_errors(run: BlockRun, p: BlockParams, c: BlockConfig) -> dict[str, float]:
    """The relative errors of ``run`` (its head output, then the gradients in ``p`` after
    ``run.loss.backward()``) against the float64 block with ``run``'s routing."""
    exact_params = p.fresh(lambda t: t.double() if t.is_floating_point() else t)
    exact = run_block(Float64(run.topk_idx.detach()), exact_params, c)
    exact.loss.backward()
    errors = {"head": relative_error(run.head, exact.head)}
    exact_grads = exact_params.grads()
    for name, grad in p.grads().items():
        errors[f"d {name}"] = relative_error(grad, exact_grads[name])
    return errors
