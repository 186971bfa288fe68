"""The mHC ops with autograd: one ``torch.autograd.Function`` per op, pairing a forward kernel with
its backward kernel (TileKernels v1's functional names and parameters, on the v2 kernel entry
points).

* ``expand_to_mhc``: ``expand_to_mhc_fwd`` / ``expand_to_mhc_bwd``;
* ``mhc_pre_norm_fn``: the weight merge (``mhc_fn_normw_merge_fwd`` / ``_bwd``, when a norm weight
  is given), the prenorm GEMM (``mhc_pre_norm_fn_gemm_fwd`` / ``_bwd``) and the split reduction
  with the RMS scale (``mhc_reduce_partials_and_rmsnorm_fwd`` / ``_bwd``);
* ``mhc_pre_split_mixes``, ``sinkhorn_normalize``, ``mhc_pre_apply_mix``, ``mhc_post``,
  ``mhc_head_compute_mix``: their ops' ``_fwd`` / ``_bwd``.

Arbitrary leading dimensions are flattened to the kernels' token axis ``T``. Every function takes
vmi's keyword-only ``target=`` and ``flavor=`` and passes them to each kernel it runs, forward and
backward. The backward kernels recompute what they need from the saved inputs (Sinkhorn from its
logits, the sigmoids from the mixes), as TileKernels' do; none of these functions is
differentiable twice (``vmi_core.autograd.first_order``: a second derivative raises).

**The residual gradient (spec §1.3).** The gradient of a residual ``R`` has up to three
contributions, from ``mhc_post`` (through ``Σ_i comb[i, o]·R[i]``), ``mhc_pre_apply_mix`` and
``mhc_pre_norm_fn``. They are accumulated in place into one bf16 buffer, with the bf16 rounding of
each kernel's own accumulate step and no other residual-sized tensor: ``buffer = d_post`` (the post
backward's fresh result), then ``bf16(buffer + d_apply)`` by the pre_apply_mix backward kernel,
then ``bf16(buffer + d_norm)`` by the prenorm GEMM backward kernel.

vmi passes the buffer through a slot that the norm_fn node owns, not through an attribute of the
residual's storage as v1 does. A fused ``mhc_pre_norm_fn`` (``fuse_grad_acc=True``) creates the
slot for its residual (storage, offset, shape and strides). ``mhc_post`` and ``mhc_pre_apply_mix``
join it when the residual they take is that same view and their mixes derive from that norm_fn
node (a short walk up the mixes' autograd graph finds it): then autograd must run their backward
before the norm_fn's, because the norm_fn's input gradient (the mixes') needs theirs. The first of
them to run puts its residual gradient into the slot and returns None for the residual; the next
one accumulates into it and returns None; the norm_fn backward accumulates its own term, empties
the slot and returns the buffer as the residual's gradient. Hence:

* the buffer reaches autograd once, complete: no other consumer of the residual (an auxiliary
  loss, another layer) can have summed it before the in-place additions;
* with a post but no pre_apply_mix, or a pre_apply_mix but no post (``mhc_head``), the first
  contribution that runs starts the buffer; a norm_fn without any starts from zeros (spec §6.3:
  no failure); a post or pre_apply_mix whose mixes do not come from a fused norm_fn returns its own
  gradient (autograd adds the contributions);
* the slot belongs to one backward pass (autograd's graph task): a buffer left by an earlier or
  partial pass is never reused, so ``retain_graph=True`` gives the same gradients every time;
* under ``torch.no_grad`` or ``torch.inference_mode`` nothing is recorded and no slot exists;
* ``fuse_grad_acc=False``: the norm_fn backward accumulates into zeros and returns its own
  gradient, as in v1.
"""

from __future__ import annotations

import math

import torch

from vmi_core.autograd import first_order
from vmi_core.checks import check_float, check_int, check_tensor

from .inputs import mix_width
from .ops.expand import expand_to_mhc_bwd, expand_to_mhc_fwd
from .ops.head_compute_mix import mhc_head_compute_mix_bwd, mhc_head_compute_mix_fwd
from .ops.norm_fn import (
    mhc_fn_normw_merge_bwd,
    mhc_fn_normw_merge_fwd,
    mhc_reduce_partials_and_rmsnorm_bwd,
    mhc_reduce_partials_and_rmsnorm_fwd,
)
from .ops.post import mhc_post_bwd, mhc_post_fwd
from .ops.pre_apply_mix import mhc_pre_apply_mix_bwd, mhc_pre_apply_mix_fwd
from .ops.pre_norm_fn_gemm import BWD_ALIGN, SPLIT_ALIGN, mhc_pre_norm_fn_gemm_bwd, mhc_pre_norm_fn_gemm_fwd
from .ops.pre_split_mixes import mhc_pre_split_mixes_bwd, mhc_pre_split_mixes_fwd
from .ops.sinkhorn import mhc_sinkhorn_bwd, mhc_sinkhorn_fwd

_LINEAGE_NODES = 16
"""How many autograd nodes above a consumer's mixes are searched for the norm_fn node that owns the
residual's gradient slot, breadth first (``mhc_pre`` finds it within 3, ``mhc_head`` within 6)."""


# --- the residual-gradient slot ---

def _view_key(t: torch.Tensor) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


# The storage attribute through which v1's layer functions pass the residual gradient.
V1_GRAD_ATTRIBUTE = "grad_from_mhc_post"


class ResidualGradSlot:
    """The bf16 gradient buffer of one residual during one backward pass, owned by the fused
    norm_fn node of that residual (see the module docstring)."""

    def __init__(self, residual: torch.Tensor):
        self.key = _view_key(residual)
        self._task = None
        self._buffer = None

    def current(self) -> torch.Tensor | None:
        """The buffer of the running backward pass, or None (a buffer of another pass is dropped)."""
        task = torch._C._current_graph_task_id()
        if self._task != task:
            self._task, self._buffer = task, None
        return self._buffer

    def hold(self, buffer: torch.Tensor) -> None:
        """Keep ``buffer`` for the consumers that run later in this backward pass."""
        self.current()
        self._buffer = buffer

    def take(self) -> torch.Tensor | None:
        """The buffer of the running pass, and the slot emptied."""
        buffer = self.current()
        self._buffer = None
        return buffer


def _joined_slot(residual: torch.Tensor, *mixes: torch.Tensor) -> ResidualGradSlot | None:
    """The slot of the fused norm_fn node that ``mixes`` derive from, when it belongs to this very
    view of ``residual`` (only when autograd records and the residual needs a gradient)."""
    if not (torch.is_grad_enabled() and residual.requires_grad):
        return None
    key = _view_key(residual)
    pending = [m.grad_fn for m in mixes if m.grad_fn is not None]
    seen = set()
    while pending and len(seen) < _LINEAGE_NODES:
        node = pending.pop(0)
        if node in seen:
            continue
        seen.add(node)
        slot = getattr(node, "residual_grad_slot", None)
        if slot is not None and slot.key == key:
            return slot
        pending.extend(parent for parent, _ in node.next_functions if parent is not None)
    return None


def _deliver(slot: ResidualGradSlot | None, grad: torch.Tensor, fresh: bool) -> torch.Tensor | None:
    """What a post or pre_apply_mix backward returns for the residual: None when the slot carries
    its contribution to the norm_fn backward, else its own gradient."""
    if slot is None:
        return grad
    if fresh:
        if slot.current() is not None:
            return grad  # another consumer started the buffer first: autograd adds this one
        slot.hold(grad)
    return None


# --- validation of the public arguments ---

def _check_streams(t, name: str, dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    check_tensor(t, name, dtype=dtype)
    if t.dim() < 2:
        raise ValueError(f"{name} must have shape (..., n, H), got {tuple(t.shape)}")
    return t.shape[-2], t.shape[-1]


def _check_same_device(t: torch.Tensor, name: str, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")


def _check_leading(t: torch.Tensor, name: str, lead: tuple, tail: tuple) -> None:
    wanted = (*lead, *tail)
    if tuple(t.shape) != wanted:
        raise ValueError(f"{name} must have shape {wanted}, got {tuple(t.shape)}")


def check_norm_fn_options(mhc_hidden: int, eps, eps_name: str, n_splits, records: bool) -> None:
    """The options of norm_fn's kernels, checked before the first of them runs: ``n_splits`` cuts
    ``K`` into slices of a multiple of 64 columns, ``eps >= 0``, and when autograd records, ``K`` is
    a multiple of 256 (the prenorm GEMM backward's block)."""
    if check_float(eps, eps_name, finite=True) < 0:
        raise ValueError(f"{eps_name} must be >= 0, got {eps}")
    check_int(n_splits, "n_splits", 1)
    if mhc_hidden % n_splits or (mhc_hidden // n_splits) % SPLIT_ALIGN:
        raise ValueError(f"n_splits must split K = n·H = {mhc_hidden} into equal slices of a multiple of "
                         f"{SPLIT_ALIGN} columns, got {n_splits}")
    if records and mhc_hidden % BWD_ALIGN:
        raise ValueError(f"residual: the backward of the prenorm GEMM needs n·H to be a multiple of "
                         f"{BWD_ALIGN}, got {mhc_hidden}")


def _refuse_v1_buffer(residual: torch.Tensor) -> None:
    """v1 code hands the residual gradient over in an attribute of the residual's storage, which vmi
    never fills: raise rather than leave the caller reading the zeros it put there."""
    if hasattr(residual.untyped_storage(), V1_GRAD_ATTRIBUTE):
        raise RuntimeError(f"the residual's storage has TileKernels v1's `{V1_GRAD_ATTRIBUTE}` buffer, which vmi "
                           f"does not fill: the residual gradient comes through autograd (`residual.grad`, or the "
                           f"result of torch.autograd.grad); delete the attribute")


def _dense(grad: torch.Tensor | None, like: torch.Tensor, shape: tuple) -> torch.Tensor:
    """A contiguous ``shape`` copy (or view) of an incoming gradient; zeros for an unused output."""
    if grad is None:
        return torch.zeros(shape, dtype=like.dtype, device=like.device)
    return grad.to(like.dtype).reshape(shape).contiguous()


# --- expand ---

class ExpandToMhc(torch.autograd.Function):
    """``expand_to_mhc_fwd`` forward, ``expand_to_mhc_bwd`` backward; saves nothing."""

    @staticmethod
    def forward(ctx, hidden, mhc_mult, out, target, flavor):
        hidden_size = hidden.shape[-1]
        tokens = math.prod(hidden.shape[:-1])
        o = out if out is not None else hidden.new_empty(*hidden.shape[:-1], mhc_mult, hidden_size)
        expand_to_mhc_fwd(hidden.view(tokens, hidden_size), o.view(tokens, mhc_mult, hidden_size), target=target,
                          flavor=flavor)
        ctx.hidden_shape, ctx.target, ctx.flavor = hidden.shape, target, flavor
        return o

    @staticmethod
    @first_order
    def backward(ctx, o_grad):
        hidden_size = ctx.hidden_shape[-1]
        tokens = math.prod(ctx.hidden_shape[:-1])
        mhc_mult = o_grad.shape[-2]
        x_grad = o_grad.new_empty(tokens, hidden_size)
        expand_to_mhc_bwd(_dense(o_grad, o_grad, (tokens, mhc_mult, hidden_size)), x_grad, target=ctx.target,
                          flavor=ctx.flavor)
        return x_grad.view(ctx.hidden_shape), None, None, None, None


def expand_to_mhc(hidden: torch.Tensor, mhc_mult: int, out: torch.Tensor | None = None, *,
                  target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """Widen a hidden state into ``mhc_mult`` residual streams: ``out[..., m, :] = hidden``.

    Differentiable in ``hidden``: the gradient is the fp32 sum of the streams' gradients rounded to
    bf16 once (``expand_to_mhc_bwd``).

    Args:
        hidden: bf16 ``(..., H)``, contiguous (at least 1-D; the leading dims are the tokens).
        mhc_mult: The stream count ``n``, ``1 <= n <= 16``.
        out: Optional bf16 ``(..., n, H)`` contiguous output, written and returned.
        target: Where the kernels run: ``"ascend"``, ``"cuda"``, ``"cpu"``, ``"ascend-sim"`` or the
            reference ``"torch"``; default ``$VMI_TARGET``, else the device's target.
        flavor: Bit conventions (see ``vmi_core.targets``).

    Returns:
        bf16 ``(..., n, H)``: ``out``'s memory when given.

    Raises:
        TypeError: ``hidden`` or ``out`` is not a bf16 tensor; ``mhc_mult`` is not an int.
        ValueError: ``hidden`` is 0-D or not contiguous; ``out`` has the wrong shape; otherwise as
            ``expand_to_mhc_fwd``.
    """
    check_tensor(hidden, "hidden", dtype=torch.bfloat16, contiguous=True)
    if hidden.dim() < 1:
        raise ValueError("hidden must have shape (..., H), got a 0-D tensor")
    check_int(mhc_mult, "mhc_mult", 1)
    if out is not None:
        check_tensor(out, "out", dtype=torch.bfloat16, contiguous=True)
        _check_leading(out, "out", tuple(hidden.shape[:-1]), (mhc_mult, hidden.shape[-1]))
    return ExpandToMhc.apply(hidden, mhc_mult, out, target, flavor)


# --- norm_fn ---

class FnNormwMerge(torch.autograd.Function):
    """``fn ⊙ norm_weight``: ``mhc_fn_normw_merge_fwd`` forward, ``mhc_fn_normw_merge_bwd`` (into
    zeros) backward."""

    @staticmethod
    def forward(ctx, fn, normw, target, flavor):
        ctx.save_for_backward(fn, normw)
        ctx.target, ctx.flavor = target, flavor
        return mhc_fn_normw_merge_fwd(fn, normw, None, target=target, flavor=flavor)

    @staticmethod
    @first_order
    def backward(ctx, out_fn_grad):
        fn, normw = ctx.saved_tensors
        fn_grad, normw_grad = torch.zeros_like(fn), torch.zeros_like(normw)
        mhc_fn_normw_merge_bwd(fn, normw, _dense(out_fn_grad, fn, fn.shape), fn_grad, normw_grad, target=ctx.target,
                               flavor=ctx.flavor)
        return fn_grad, normw_grad, None, None


class PreNormFn(torch.autograd.Function):
    """The mixes ``(x · fn_effᵀ) · r``: prenorm GEMM + reduction forward; their backward, the
    residual's term accumulated into the slot's buffer (``fuse_grad_acc``) or into zeros."""

    @staticmethod
    def forward(ctx, residual, fn, norm_eps, fuse_grad_acc, n_splits, target, flavor):
        mix, mhc_hidden = fn.shape
        lead = residual.shape[:-2]
        tokens = math.prod(lead)
        x = residual.reshape(tokens, mhc_hidden).contiguous()
        out_mul_splitted, sqrsum_splitted = mhc_pre_norm_fn_gemm_fwd(x, fn, n_splits=n_splits, target=target,
                                                                     flavor=flavor)
        out_mul, sqrsum, out = mhc_reduce_partials_and_rmsnorm_fwd(
            out_mul_splitted, sqrsum_splitted, None, None, None, mhc_hidden, norm_eps, n_splits, target=target,
            flavor=flavor)
        ctx.save_for_backward(residual, fn, out_mul, sqrsum)
        ctx.norm_eps, ctx.target, ctx.flavor = norm_eps, target, flavor
        ctx.residual_grad_slot = ResidualGradSlot(residual) if fuse_grad_acc and ctx.needs_input_grad[0] else None
        return out.view(*lead, mix)

    @staticmethod
    @first_order
    def backward(ctx, out_grad):
        residual, fn, out_mul, sqrsum = ctx.saved_tensors
        _refuse_v1_buffer(residual)
        mix, mhc_hidden = fn.shape
        tokens = math.prod(residual.shape[:-2])
        x = residual.reshape(tokens, mhc_hidden).contiguous()
        out_mul_grad, sqrsum_grad = mhc_reduce_partials_and_rmsnorm_bwd(
            _dense(out_grad, out_mul, (tokens, mix)), out_mul, sqrsum, None, None, mhc_hidden, ctx.norm_eps,
            target=ctx.target, flavor=ctx.flavor)
        slot = ctx.residual_grad_slot
        x_grad = slot.take() if slot is not None else None
        if x_grad is None:
            x_grad = torch.zeros(residual.shape, dtype=x.dtype, device=x.device)
        _, fn_grad = mhc_pre_norm_fn_gemm_bwd(out_mul_grad, sqrsum_grad, x, fn, x_grad.view(tokens, mhc_hidden),
                                              target=ctx.target, flavor=ctx.flavor)
        return (x_grad if ctx.needs_input_grad[0] else None, fn_grad if ctx.needs_input_grad[1] else None,
                None, None, None, None, None)


def mhc_pre_norm_fn(residual: torch.Tensor, mhc_fn: torch.Tensor, mhc_norm_weight: torch.Tensor | None,
                    mhc_norm_eps: float, fuse_grad_acc: bool = True, n_splits: int = 16, *,
                    target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """The mix vector of each token: ``(flat(R) · fn_effᵀ) · (Σ flat(R)² / K + eps)^-½``.

    ``fn_eff = mhc_fn ⊙ mhc_norm_weight`` (merge kernel) when a norm weight is given, else
    ``mhc_fn``; the prenorm GEMM rounds it to TF32 and produces ``n_splits`` split-K partials, which
    the reduction kernel sums in order and scales by the RMS factor (``K = n·H``). Differentiable in
    ``residual``, ``mhc_fn`` and ``mhc_norm_weight``; the residual's gradient follows the module's
    protocol (``fuse_grad_acc``). Non-finite values propagate as in the kernels.

    Assumption: ``n_splits`` is honoured (v1 forces 1 because its GEMM had no split-K; vmi's GEMM
    has), so ``K / n_splits`` must be a multiple of 64; the backward needs ``K % 256 == 0``.

    Args:
        residual: bf16 ``(..., n, H)``; the leading dims are the tokens.
        mhc_fn: fp32 ``(n3, n·H)`` contiguous, ``1 <= n3 <= 32``.
        mhc_norm_weight: fp32 ``(n·H,)`` contiguous, or None.
        mhc_norm_eps: The RMS epsilon, finite and ``>= 0``.
        fuse_grad_acc: Accumulate the residual's gradient into the buffer of the post and
            pre_apply_mix backward of the same residual (True), or return it on its own (False).
        n_splits: The GEMM's split-K count ``S``.
        target: As ``expand_to_mhc``; passed to every kernel.
        flavor: As ``expand_to_mhc``; passed to every kernel.

    Returns:
        fp32 ``(..., n3)``.

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype; ``fuse_grad_acc`` is
            not a bool; ``n_splits`` not an int; ``mhc_norm_eps`` not a real number.
        ValueError: ``residual`` is not at least 2-D, ``n·H`` is not ``mhc_fn``'s width or, when
            autograd records, not a multiple of 256; ``mhc_norm_weight`` has the wrong shape; a
            tensor is on another device; ``mhc_norm_eps`` is negative or not finite; ``n_splits``
            does not cut ``n·H`` into slices of a multiple of 64; otherwise as the kernels' entry
            points.
    """
    n, hidden = _check_streams(residual, "residual")
    check_tensor(mhc_fn, "mhc_fn", dtype=torch.float32, dim=2)
    if mhc_fn.shape[1] != n * hidden:
        raise ValueError(f"mhc_fn must have n·H = {n * hidden} columns for residual {tuple(residual.shape)}, "
                         f"got {tuple(mhc_fn.shape)}")
    _check_same_device(mhc_fn, "mhc_fn", residual.device)
    if mhc_norm_weight is not None:
        check_tensor(mhc_norm_weight, "mhc_norm_weight", dtype=torch.float32, shape=(n * hidden,))
        _check_same_device(mhc_norm_weight, "mhc_norm_weight", residual.device)
    if not isinstance(fuse_grad_acc, bool):
        raise TypeError(f"fuse_grad_acc must be a bool, got {type(fuse_grad_acc).__name__}")
    records = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (residual, mhc_fn, mhc_norm_weight))
    check_norm_fn_options(n * hidden, mhc_norm_eps, "mhc_norm_eps", n_splits, records)
    fn = mhc_fn if mhc_norm_weight is None else FnNormwMerge.apply(mhc_fn, mhc_norm_weight, target, flavor)
    return PreNormFn.apply(residual, fn, mhc_norm_eps, fuse_grad_acc, n_splits, target, flavor)


# --- pre_split_mixes ---

class PreSplitMixes(torch.autograd.Function):
    """``mhc_pre_split_mixes_fwd`` forward, ``mhc_pre_split_mixes_bwd`` backward (saves the mixes
    and the post mix, recomputes the pre sigmoid)."""

    @staticmethod
    def forward(ctx, input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps, target, flavor):
        lead = input_mixes.shape[:-1]
        mixes = input_mixes.reshape(math.prod(lead), input_mixes.shape[-1]).contiguous()
        pre, post, comb = mhc_pre_split_mixes_fwd(mixes, mhc_scale, mhc_base, None, None, None, mhc_post_mult_value,
                                                  mhc_pre_eps, target=target, flavor=flavor)
        ctx.save_for_backward(input_mixes, post, mhc_scale, mhc_base)
        ctx.post_mult, ctx.target, ctx.flavor = mhc_post_mult_value, target, flavor
        return (pre.view(*lead, mhc_mult, 1), post.view(*lead, mhc_mult, 1),
                comb.view(*lead, mhc_mult, mhc_mult))

    @staticmethod
    @first_order
    def backward(ctx, pre_grad, post_grad, comb_grad):
        input_mixes, post, mhc_scale, mhc_base = ctx.saved_tensors
        tokens, n = post.shape
        mixes = input_mixes.reshape(tokens, input_mixes.shape[-1]).contiguous()
        input_grad, scale_grad, base_grad = mhc_pre_split_mixes_bwd(
            _dense(pre_grad, post, (tokens, n)), _dense(post_grad, post, (tokens, n)),
            _dense(comb_grad, post, (tokens, n * n)), mixes, post, mhc_scale, mhc_base, None, None, None,
            ctx.post_mult, target=ctx.target, flavor=ctx.flavor)
        return input_grad.view(input_mixes.shape), scale_grad, base_grad, None, None, None, None, None


def mhc_pre_split_mixes(input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_mult: int,
                        mhc_post_mult_value: float, mhc_pre_eps: float, *, target: str | None = None,
                        flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the mix vector into the pre mix, the post mix and the comb logits (``z = x·g + b``):
    ``pre = σ(z) + pre_eps``, ``post = σ(z) · post_mult``, ``comb = z`` (``mhc_pre_split_mixes_fwd``).

    Differentiable in ``input_mixes``, ``mhc_scale`` and ``mhc_base``; the gain and bias gradients
    are sums over tokens in an order fixed by ``T`` (``mhc_pre_split_mixes_bwd``).

    Args:
        input_mixes: fp32 ``(..., n·(n+2))``; the leading dims are the tokens.
        mhc_scale: fp32 ``(3,)`` gains (pre, post, comb).
        mhc_base: fp32 ``(n·(n+2),)`` biases.
        mhc_mult: ``n``; must be 4 (the kernels are specialised on 4 streams).
        mhc_post_mult_value: The post multiplier (0 or a normal fp32 number).
        mhc_pre_eps: The pre floor.
        target: As ``expand_to_mhc``.
        flavor: As ``expand_to_mhc``.

    Returns:
        ``(pre (..., n, 1), post (..., n, 1), comb_logits (..., n, n))``, fp32.

    Raises:
        TypeError: ``input_mixes`` is not an fp32 tensor; ``mhc_mult`` not an int.
        ValueError: ``input_mixes`` is 0-D or its last dim is not ``n·(n+2)``; ``mhc_mult`` is not
            4; otherwise as ``mhc_pre_split_mixes_fwd``.
    """
    check_tensor(input_mixes, "input_mixes", dtype=torch.float32)
    check_int(mhc_mult, "mhc_mult")
    if mhc_mult != 4:
        raise ValueError(f"mhc_pre_split_mixes: mhc_mult must be 4 (the kernels are specialised on 4 streams), "
                         f"got {mhc_mult}")
    if input_mixes.dim() < 1 or input_mixes.shape[-1] != mix_width(mhc_mult):
        raise ValueError(f"input_mixes must have shape (..., {mix_width(mhc_mult)}), got {tuple(input_mixes.shape)}")
    return PreSplitMixes.apply(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps, target,
                               flavor)


# --- sinkhorn ---

class SinkhornNormalize(torch.autograd.Function):
    """``mhc_sinkhorn_fwd`` forward, ``mhc_sinkhorn_bwd`` backward (saves only the logits)."""

    @staticmethod
    def forward(ctx, x, repeat, eps, target, flavor):
        n = x.shape[-1]
        logits = x.reshape(-1, n, n).contiguous()
        out = mhc_sinkhorn_fwd(logits, None, repeat, eps, target=target, flavor=flavor)
        ctx.save_for_backward(x)
        ctx.repeat, ctx.eps, ctx.target, ctx.flavor = repeat, eps, target, flavor
        return out.view(x.shape)

    @staticmethod
    @first_order
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        n = x.shape[-1]
        logits = x.reshape(-1, n, n).contiguous()
        grad_input = mhc_sinkhorn_bwd(_dense(grad_output, logits, logits.shape), logits, None, ctx.repeat, ctx.eps,
                                      target=ctx.target, flavor=ctx.flavor)
        return grad_input.view(x.shape), None, None, None, None


def sinkhorn_normalize(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6, *, target: str | None = None,
                       flavor: str | None = None) -> torch.Tensor:
    """The Sinkhorn projection of each ``n x n`` comb-logit matrix (``mhc_sinkhorn_fwd``): a row
    softmax, ``+ eps``, then ``2·repeat - 1`` alternating column and row normalisations.

    Differentiable in ``x``; the backward replays the forward from the saved logits
    (``mhc_sinkhorn_bwd``).

    Args:
        x: fp32 ``(..., n, n)``, ``n = 4``; the leading dims are the tokens.
        repeat: Iterations, ``>= 1`` (the backward takes at most 16).
        eps: Added after the softmax and to every denominator, ``>= 0``.
        target: As ``expand_to_mhc``.
        flavor: As ``expand_to_mhc``.

    Returns:
        fp32 of x's shape.

    Raises:
        TypeError: ``x`` is not an fp32 tensor.
        ValueError: ``x`` is not ``(..., n, n)``; otherwise as ``mhc_sinkhorn_fwd``.
    """
    check_tensor(x, "x", dtype=torch.float32)
    if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"x must have shape (..., n, n), got {tuple(x.shape)}")
    return SinkhornNormalize.apply(x, repeat, eps, target, flavor)


# --- pre_apply_mix ---

class PreApplyMix(torch.autograd.Function):
    """``mhc_pre_apply_mix_fwd`` forward; ``mhc_pre_apply_mix_bwd`` backward, accumulating into the
    residual's slot buffer when it joined one."""

    @staticmethod
    def forward(ctx, x, mix, out, slot, target, flavor):
        n, hidden = x.shape[-2:]
        lead = x.shape[:-2]
        tokens = math.prod(lead)
        o = out if out is not None else x.new_empty(*lead, hidden)
        streams = x.reshape(tokens, n, hidden).contiguous()
        mhc_pre_apply_mix_fwd(streams, mix.reshape(tokens, n).contiguous(), o.view(tokens, hidden), target=target,
                              flavor=flavor)
        ctx.save_for_backward(x, mix)
        ctx.slot, ctx.target, ctx.flavor = slot, target, flavor
        return o

    @staticmethod
    @first_order
    def backward(ctx, o_grad):
        x, mix = ctx.saved_tensors
        _refuse_v1_buffer(x)
        n, hidden = x.shape[-2:]
        tokens = math.prod(x.shape[:-2])
        streams = x.reshape(tokens, n, hidden).contiguous()
        slot = ctx.slot
        x_grad = slot.current() if slot is not None else None
        fresh = x_grad is None
        if fresh:
            x_grad = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
        mix_grad = mhc_pre_apply_mix_bwd(_dense(o_grad, streams, (tokens, hidden)), streams,
                                         mix.reshape(tokens, n).contiguous(), x_grad.view(tokens, n, hidden),
                                         target=ctx.target, flavor=ctx.flavor)
        residual_grad = _deliver(slot, x_grad, fresh) if ctx.needs_input_grad[0] else None
        return residual_grad, mix_grad.view(mix.shape), None, None, None, None


def mhc_pre_apply_mix(x: torch.Tensor, mix: torch.Tensor, out: torch.Tensor | None = None, *,
                      target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """The sublayer input ``bf16(Σ_m mix[..., m] · x[..., m, :])`` (``mhc_pre_apply_mix_fwd``).

    Differentiable in ``x`` and ``mix``. The backward kernel accumulates ``x``'s gradient in place:
    into the residual's shared buffer when ``mix`` derives from a fused ``mhc_pre_norm_fn`` of the
    same ``x`` (module docstring), else into zeros.

    Args:
        x: bf16 ``(..., n, H)`` residual streams; the leading dims are the tokens.
        mix: fp32 ``(..., n, 1)``.
        out: Optional bf16 ``(..., H)`` contiguous output, written and returned.
        target: As ``expand_to_mhc``.
        flavor: As ``expand_to_mhc``.

    Returns:
        bf16 ``(..., H)``: ``out``'s memory when given.

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype.
        ValueError: ``x`` is not at least 2-D; ``mix`` or ``out`` has the wrong shape or device;
            otherwise as ``mhc_pre_apply_mix_fwd``.
    """
    n, hidden = _check_streams(x, "x")
    lead = tuple(x.shape[:-2])
    check_tensor(mix, "mix", dtype=torch.float32)
    _check_leading(mix, "mix", lead, (n, 1))
    _check_same_device(mix, "mix", x.device)
    if out is not None:
        check_tensor(out, "out", dtype=torch.bfloat16, contiguous=True)
        _check_leading(out, "out", lead, (hidden,))
    return PreApplyMix.apply(x, mix, out, _joined_slot(x, mix), target, flavor)


# --- post ---

class Post(torch.autograd.Function):
    """``mhc_post_fwd`` forward; ``mhc_post_bwd`` backward, its fresh residual gradient starting the
    residual's slot buffer when it joined one."""

    @staticmethod
    def kernel_inputs(x, residual, post_layer_mix, comb_res_mix):
        """The four inputs as the kernels take them: one batch of ``T`` tokens, dense."""
        n, hidden = residual.shape[-2:]
        tokens = math.prod(residual.shape[:-2])
        return (x.reshape(1, tokens, hidden).contiguous(), residual.reshape(1, tokens, n, hidden),
                post_layer_mix.reshape(1, tokens, n, 1).contiguous(),
                comb_res_mix.reshape(1, tokens, n, n).contiguous())

    @staticmethod
    def forward(ctx, x, residual, post_layer_mix, comb_res_mix, out, slot, target, flavor):
        inputs = Post.kernel_inputs(x, residual, post_layer_mix, comb_res_mix)
        o = out if out is not None else residual.new_empty(residual.shape)
        mhc_post_fwd(*inputs, o.view(inputs[1].shape), target=target, flavor=flavor)
        ctx.save_for_backward(x, residual, post_layer_mix, comb_res_mix)
        ctx.slot, ctx.target, ctx.flavor = slot, target, flavor
        return o

    @staticmethod
    @first_order
    def backward(ctx, d_o):
        saved = ctx.saved_tensors
        _refuse_v1_buffer(saved[1])
        inputs = Post.kernel_inputs(*saved)
        grads = mhc_post_bwd(*inputs, _dense(d_o, inputs[1], inputs[1].shape), target=ctx.target, flavor=ctx.flavor)
        d_x, d_residual, d_post, d_comb = (g.view(t.shape) for g, t in zip(grads, saved, strict=True))
        needs = ctx.needs_input_grad
        residual_grad = _deliver(ctx.slot, d_residual, True) if needs[1] else None
        return (d_x if needs[0] else None, residual_grad, d_post if needs[2] else None, d_comb if needs[3] else None,
                None, None, None, None)


def mhc_post(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
             out: torch.Tensor | None = None, *, target: str | None = None, flavor: str | None = None
             ) -> torch.Tensor:
    """The next residual ``out[o] = post[o] · x + Σ_i comb[i, o] · residual[i]`` (``mhc_post_fwd``).

    Differentiable in all four inputs (``mhc_post_bwd``). The residual's gradient starts the
    residual's shared buffer when the mixes derive from a fused ``mhc_pre_norm_fn`` of the same
    ``residual`` (module docstring); otherwise it is returned on its own.

    Args:
        x: bf16 ``(..., H)``, the sublayer output; the leading dims are the tokens.
        residual: bf16 ``(..., n, H)``.
        post_layer_mix: fp32 ``(..., n, 1)``.
        comb_res_mix: fp32 ``(..., n, n)``: ``comb[i, o]`` weighs input stream ``i`` in output
            stream ``o``.
        out: Optional bf16 ``(..., n, H)`` contiguous output, written and returned.
        target: As ``expand_to_mhc``.
        flavor: As ``expand_to_mhc``.

    Returns:
        bf16 ``(..., n, H)``: ``out``'s memory when given.

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype.
        ValueError: ``residual`` is not at least 2-D; another tensor has the wrong shape or device;
            otherwise as ``mhc_post_fwd`` / ``mhc_post_bwd`` (the backward needs ``n = 4``).
    """
    n, hidden = _check_streams(residual, "residual")
    lead = tuple(residual.shape[:-2])
    check_tensor(x, "x", dtype=torch.bfloat16)
    _check_leading(x, "x", lead, (hidden,))
    check_tensor(post_layer_mix, "post_layer_mix", dtype=torch.float32)
    _check_leading(post_layer_mix, "post_layer_mix", lead, (n, 1))
    check_tensor(comb_res_mix, "comb_res_mix", dtype=torch.float32)
    _check_leading(comb_res_mix, "comb_res_mix", lead, (n, n))
    for name, t in (("x", x), ("post_layer_mix", post_layer_mix), ("comb_res_mix", comb_res_mix)):
        _check_same_device(t, name, residual.device)
    if out is not None:
        check_tensor(out, "out", dtype=torch.bfloat16, contiguous=True)
        _check_leading(out, "out", lead, (n, hidden))
    slot = _joined_slot(residual, post_layer_mix, comb_res_mix)
    return Post.apply(x, residual, post_layer_mix, comb_res_mix, out, slot, target, flavor)


# --- head_compute_mix ---

HEAD_PARTIAL_ROWS = 64
"""At most this many partial rows of the head mix's gain and bias gradients (one per 64-token tile
below that); they are added in row order, so the gradients' bits depend on ``T`` only."""


def _ordered_row_sum(partial: torch.Tensor) -> torch.Tensor:
    total = torch.zeros_like(partial[0])
    for row in partial:
        total = total + row
    return total


class HeadComputeMix(torch.autograd.Function):
    """``mhc_head_compute_mix_fwd`` forward; ``mhc_head_compute_mix_bwd`` backward, its partial rows
    of the gain and bias gradients added in row order."""

    @staticmethod
    def forward(ctx, input_mix, mhc_scale, mhc_base, mhc_pre_eps, target, flavor):
        n = input_mix.shape[-1]
        mixes = input_mix.reshape(-1, n).contiguous()
        out = mhc_head_compute_mix_fwd(mixes, mhc_scale, mhc_base, None, mhc_pre_eps, target=target, flavor=flavor)
        ctx.save_for_backward(input_mix, mhc_scale, mhc_base)
        ctx.target, ctx.flavor = target, flavor
        return out.view(input_mix.shape)

    @staticmethod
    @first_order
    def backward(ctx, output_mix_grad):
        input_mix, mhc_scale, mhc_base = ctx.saved_tensors
        mixes = input_mix.reshape(-1, input_mix.shape[-1]).contiguous()
        rows = min(max(1, -(-mixes.shape[0] // 64)), HEAD_PARTIAL_ROWS)
        input_grad, scale_partial, base_partial = mhc_head_compute_mix_bwd(
            _dense(output_mix_grad, mixes, mixes.shape), mixes, mhc_scale, mhc_base, None, None, None, rows,
            target=ctx.target, flavor=ctx.flavor)
        return (input_grad.view(input_mix.shape), _ordered_row_sum(scale_partial).view(mhc_scale.shape),
                _ordered_row_sum(base_partial), None, None, None)


def mhc_head_compute_mix(input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                         mhc_pre_eps: float, *, target: str | None = None, flavor: str | None = None
                         ) -> torch.Tensor:
    """The LM head's pre mix ``σ(input_mix · mhc_scale[0] + mhc_base) + mhc_pre_eps``
    (``mhc_head_compute_mix_fwd``).

    Differentiable in all three tensors. The gain and bias gradients are the kernel's partial rows
    (one per 64-token tile, at most ``HEAD_PARTIAL_ROWS``) added in row order from +0.0, so their
    bits depend on ``T`` only. Unlike v1 (``(B, S, n)`` only), any leading dims.

    Args:
        input_mix: fp32 ``(..., n)``, ``1 <= n <= 16``; the leading dims are the tokens.
        mhc_scale: fp32 ``(1,)`` gain.
        mhc_base: fp32 ``(n,)`` biases.
        mhc_pre_eps: The floor added to the sigmoid.
        target: As ``expand_to_mhc``.
        flavor: As ``expand_to_mhc``.

    Returns:
        fp32 of input_mix's shape.

    Raises:
        TypeError: ``input_mix`` is not an fp32 tensor.
        ValueError: ``input_mix`` is 0-D; otherwise as ``mhc_head_compute_mix_fwd``.
    """
    check_tensor(input_mix, "input_mix", dtype=torch.float32)
    if input_mix.dim() < 1:
        raise ValueError("input_mix must have shape (..., n), got a 0-D tensor")
    return HeadComputeMix.apply(input_mix, mhc_scale, mhc_base, mhc_pre_eps, target, flavor)
