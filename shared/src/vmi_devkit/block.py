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
    dispatch into the psum layout (expert-sorted rows, token order inside an expert)
    expert up GEMM (torch stand-in): h = dequant(data, sf)[token] · W_up[e]^T (bf16 rows)
    swiglu_forward_and_per_token_cast(h, weights of the rows) ─ E4M3 activation
    expert down GEMM (torch stand-in): y = dequant(act) · W_down[e]^T
    combine: out[t] = Σ_k y[row of (t, k)], slots in order ─ layer_output (T, H) bf16
    mhc_post(layer_output, R, post_mix, comb_mix) ─ R' (T, n, H)
    mhc_head(R') ─ (T, H) bf16;  loss = Σ head · probe

The routing weights multiply the SwiGLU output inside its kernel (TileKernels' ``topk_weights``),
so the combine is a plain per-token sum of the weighted expert rows. The FP8 casts are quantized
forward and straight-through backward: the gradient of the dequantized tensor is taken as the
gradient of the tensor that was cast (the bf16 norm output; the SwiGLU activation, whose gradient
``swiglu_backward`` takes). ``Float64`` quantizes to E4M3 the same way (scales from its own amax),
and takes the routing (which experts, a discrete choice) from the run it is compared with.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

import vmi_mhc
import vmi_moe
import vmi_quant
from vmi_mhc.reference.post import post_fwd_exact
from vmi_mhc.reference.pre_apply_mix import mhc_pre_apply_mix_fwd_exact
from vmi_mhc.reference.pre_split_mixes import pre_split_mixes_fwd_exact
from vmi_mhc.reference.sinkhorn import sinkhorn_forward_float64
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


# --- the expert layout: index bookkeeping shared by every implementation ---

@dataclass(frozen=True)
class ExpertLayout:
    """The routed (token, slot) pairs of a routing, sorted by expert (then token, slot), and their
    rows in TileKernels' psum layout: expert ``e`` owns rows ``[align(psum[e-1], A), psum[e])``, the
    other rows are padding."""

    psum: torch.Tensor        # int32 (E,)
    num_rows: int
    pair_slot: torch.Tensor   # int64 (P,): token * K + slot of each pair, in expert order
    pair_row: torch.Tensor    # int64 (P,): its row in the psum layout
    pair_ranges: tuple[tuple[int, int], ...]  # per expert, its pairs [start, end)
    num_topk: int

    @property
    def pair_token(self) -> torch.Tensor:
        return self.pair_slot // self.num_topk

    @staticmethod
    def build(topk_idx: torch.Tensor, num_experts: int, alignment: int) -> ExpertLayout:
        num_topk = topk_idx.shape[1]
        flat = topk_idx.reshape(-1)
        pair_slot = torch.sort(flat, stable=True).indices
        counts = torch.bincount(flat, minlength=num_experts).tolist()
        ends, pair_ranges, rows, row, first = [], [], [], 0, 0
        for count in counts:
            rows.append(torch.arange(row, row + count))
            pair_ranges.append((first, first + count))
            ends.append(row + count)
            row = -(-(row + count) // alignment) * alignment
            first += count
        return ExpertLayout(torch.tensor(ends, dtype=torch.int32), row, pair_slot, torch.cat(rows),
                            tuple(pair_ranges), num_topk)

    def to_rows(self, pairs: torch.Tensor) -> torch.Tensor:
        """The psum layout's rows from per-pair rows (expert order); padding rows are zero."""
        return pairs.new_zeros(self.num_rows, *pairs.shape[1:]).index_copy(0, self.pair_row, pairs)

    def valid_rows(self) -> torch.Tensor:
        return torch.zeros(self.num_rows, dtype=torch.bool).index_fill(0, self.pair_row, True)


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


def expert_gemm(pairs: torch.Tensor, weight: torch.Tensor, layout: ExpertLayout) -> torch.Tensor:
    """``pairs[start:end] · weight[e]^T`` per expert in ``weight``'s dtype: the attention/expert GEMM
    stand-in (torch), over the routed pairs in expert order."""
    parts = [pairs[start:end].to(weight.dtype) @ weight[e].t() for e, (start, end) in enumerate(layout.pair_ranges)]
    return torch.cat(parts)


def combine(pairs: torch.Tensor, layout: ExpertLayout, num_tokens: int) -> torch.Tensor:
    """Per token, the sum of its slots' expert outputs (``pairs`` in expert order), slot 0 first."""
    by_slot = pairs.new_zeros(num_tokens * layout.num_topk, pairs.shape[1]).index_copy(0, layout.pair_slot, pairs)
    return sum_slots(by_slot, layout.num_topk)


def sum_slots(by_slot: torch.Tensor, num_topk: int) -> torch.Tensor:
    """``(T * K, H)`` rows in (token, slot) order summed per token, slot 0 first."""
    by_slot = by_slot.view(-1, num_topk, by_slot.shape[-1])
    total = by_slot[:, 0]
    for k in range(1, num_topk):
        total = total + by_slot[:, k]
    return total


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


class _Untimed:
    @staticmethod
    def run(name, fn, *args):
        return fn(*args)


@dataclass
class BlockRun:
    """The results of one forward of the block (``loss.backward()`` runs its backward)."""

    loss: torch.Tensor
    head: torch.Tensor
    layer_output: torch.Tensor
    topk_idx: torch.Tensor
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

    def gate(self, logits, p: BlockParams, c: BlockConfig):
        return vmi_moe.moe_topk_gate_autograd(logits, c.num_topk, False, 0, c.routed_scaling_factor, 0,
                                              bias=p.gate_bias, **self._where())

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

    def gate(self, logits, p: BlockParams, c: BlockConfig):
        chosen = torch.sqrt(torch.nn.functional.softplus(logits)).gather(1, self.routing)
        return self.routing, chosen / (chosen.sum(dim=1, keepdim=True) + 1e-20) * c.routed_scaling_factor

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


def run_block(ops, p: BlockParams, c: BlockConfig, timer: StageTimer | None = None) -> BlockRun:
    """One forward of the block with ``ops``'s stages (``Kernels`` or ``Float64``); ``p`` holds
    the tensors of ``ops``'s dtypes (``BlockParams.fresh``)."""
    t = timer or _Untimed()
    act_dtype = ops.activation_dtype
    residual = t.run("expand_to_mhc", ops.expand, p.x, c)
    layer_input, (post_mix, comb_mix) = t.run("mhc_pre", ops.pre, residual, p, c)
    normed, quantized = t.run("RMSNorm + E4M3 cast", ops.norm_cast, layer_input, p, c)
    logits = t.run("gate GEMM (torch)", lambda u: u.to(p.gate_weight.dtype) @ p.gate_weight.t(), normed)
    topk_idx, topk_weights = t.run("moe_topk_gate", ops.gate, logits, p, c)
    layout = t.run("routing layout (torch)", lambda idx: ExpertLayout.build(idx, c.num_experts, token_alignment()),
                   topk_idx.detach())

    def up_gemm(normed, quantized):
        x_in = StraightThrough.apply(normed, ops.dequantize(quantized))
        return layout.to_rows(expert_gemm(x_in[layout.pair_token], p.w_up, layout).to(act_dtype))

    h = t.run("expert up GEMM (torch)", up_gemm, normed, quantized)
    row_weights = t.run("routing layout (torch)", lambda w: layout.to_rows(w.reshape(-1)[layout.pair_slot]),
                        topk_weights)
    act = t.run("SwiGLU + E4M3 cast", ops.swiglu, h, row_weights, layout)
    pairs = t.run("expert down GEMM (torch)", lambda a: expert_gemm(a[layout.pair_row], p.w_down, layout), act)
    layer_output = t.run("combine (torch)", lambda y: combine(y, layout, c.num_tokens).to(act_dtype), pairs)
    new_residual = t.run("mhc_post", ops.post, layer_output, residual, post_mix, comb_mix)
    head = t.run("mhc_head", ops.head, new_residual, p, c)
    loss = t.run("loss (torch)", lambda y: (y.to(p.probe.dtype) * p.probe).sum(), head)
    stages = {"residual": residual, "layer_input": layer_input, "post_mix": post_mix, "comb_mix": comb_mix,
              "normed": normed, "logits": logits, "act": act, "new_residual": new_residual}
    return BlockRun(loss, head, layer_output, topk_idx, topk_weights, stages)


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
