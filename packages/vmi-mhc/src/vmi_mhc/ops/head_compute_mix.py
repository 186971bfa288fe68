"""``head_compute_mix``: public dispatch of the LM head's pre mix and of its backward (validation,
allocation, backend choice).

Names and parameters follow TileKernels v2 (the kernel-level API: the outputs are arguments, and
are written); ``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_disjoint, check_int, check_kernel_extent, check_tensor
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry, support
from vmi_core.targets import Flavor, resolve_flavor, resolve_target
from vmi_core.tools.testing import generator

from ..inputs import MAX_STREAMS, MHC_MULT, check_streams, finite_fp32
from ..kernels import head_compute_mix as parallel
from ..reference import head_compute_mix as reference
from .demo import MIX_SHAPES, PRE_EPS

# Partial rows a backward call may ask for: far more than any machine has workers, and small
# enough that the (P, n) partial buffers stay within the kernels' 32-bit offsets.
MAX_PARTIAL_ROWS = 1 << 20


@dataclass
class HeadComputeMixFwdCall:
    """A validated forward call: the kernel specialisation and the tensors it reads and writes."""

    spec: parallel.HeadComputeMixSpec
    flavor: Flavor
    input_mix: torch.Tensor
    mhc_scale: torch.Tensor
    mhc_base: torch.Tensor
    output_mix: torch.Tensor
    mhc_pre_eps: float


@dataclass
class HeadComputeMixBwdCall:
    """A validated backward call: the kernel specialisation and the tensors it reads and writes."""

    spec: parallel.HeadComputeMixSpec
    flavor: Flavor
    output_mix_grad: torch.Tensor
    input_mix: torch.Tensor
    mhc_scale: torch.Tensor
    mhc_base: torch.Tensor
    input_mix_grad: torch.Tensor
    mhc_scale_grad_partial: torch.Tensor
    mhc_base_grad_partial: torch.Tensor


def _check_input_mix(input_mix) -> tuple[int, int, torch.device]:
    check_tensor(input_mix, "input_mix", dtype=torch.float32, dim=2, contiguous=True)
    num_tokens, n = input_mix.shape
    check_streams(n, "input_mix.size(1) (the number of streams n)")
    check_kernel_extent(input_mix, "input_mix")
    return num_tokens, n, input_mix.device


def _check_parameters(mhc_scale, mhc_base, n: int, device) -> None:
    check_tensor(mhc_scale, "mhc_scale", dtype=torch.float32, shape=(1,), device=device, contiguous=True)
    check_tensor(mhc_base, "mhc_base", dtype=torch.float32, shape=(n,), device=device, contiguous=True)


def _token_block_size(value) -> int:
    """TileKernels' block-size hint: an int >= 0 (0: automatic). vmi's kernels use fixed tiles."""
    return check_int(value, "token_block_size", 0)


def _output(t, name: str, shape: tuple, device) -> torch.Tensor:
    if t is None:
        return torch.empty(shape, dtype=torch.float32, device=device)
    check_tensor(t, name, dtype=torch.float32, shape=shape, device=device, contiguous=True)
    check_kernel_extent(t, name)
    return t


def _run_fwd(input_mix, mhc_scale, mhc_base, mhc_pre_eps, token_block_size=0, *, out, target, flavor, launch):
    num_tokens, n, device = _check_input_mix(input_mix)
    _check_parameters(mhc_scale, mhc_base, n, device)
    pre_eps = finite_fp32(mhc_pre_eps, "mhc_pre_eps")
    _token_block_size(token_block_size)
    given = out[0] if out is not None else None
    output_mix = _output(given, "output_mix", (num_tokens, n), device)
    if given is not None:
        check_disjoint({"output_mix": output_mix},
                       {"input_mix": input_mix, "mhc_scale": mhc_scale, "mhc_base": mhc_base})
    target = resolve_target(input_mix, target)
    flavor = resolve_flavor(target, flavor)
    if launch and target == "torch":
        output_mix.copy_(reference.head_compute_mix_fwd(input_mix, mhc_scale, mhc_base, pre_eps, flavor))
    elif launch and num_tokens:
        parallel.launch_fwd(HeadComputeMixFwdCall(parallel.HeadComputeMixSpec(n, flavor.name), flavor, input_mix,
                                                  mhc_scale, mhc_base, output_mix, pre_eps), target)
    return output_mix


def _run_bwd(output_mix_grad, input_mix, mhc_scale, mhc_base, num_sms, token_block_size=0, *, out, target, flavor,
             launch):
    num_tokens, n, device = _check_input_mix(input_mix)
    check_tensor(output_mix_grad, "output_mix_grad", dtype=torch.float32, shape=(num_tokens, n), device=device,
                 contiguous=True)
    _check_parameters(mhc_scale, mhc_base, n, device)
    num_rows = check_int(num_sms, "num_sms", 1, MAX_PARTIAL_ROWS)
    _token_block_size(token_block_size)
    dx, scale_rows, base_rows = out if out is not None else (None, None, None)
    dx = _output(dx, "input_mix_grad", (num_tokens, n), device)
    scale_rows = _output(scale_rows, "mhc_scale_grad_partial", (num_rows, 1), device)
    base_rows = _output(base_rows, "mhc_base_grad_partial", (num_rows, n), device)
    if out is not None:
        check_disjoint({"input_mix_grad": dx, "mhc_scale_grad_partial": scale_rows,
                        "mhc_base_grad_partial": base_rows},
                       {"output_mix_grad": output_mix_grad, "input_mix": input_mix, "mhc_scale": mhc_scale,
                        "mhc_base": mhc_base})
    target = resolve_target(input_mix, target)
    flavor = resolve_flavor(target, flavor)
    if launch and target == "torch":
        for given, expected in zip((dx, scale_rows, base_rows), reference.head_compute_mix_bwd(
                output_mix_grad, input_mix, mhc_scale, mhc_base, num_rows, flavor), strict=True):
            given.copy_(expected)
    elif launch and num_tokens == 0:
        scale_rows.zero_()
        base_rows.zero_()
    elif launch:
        parallel.launch_bwd(HeadComputeMixBwdCall(parallel.HeadComputeMixSpec(n, flavor.name), flavor,
                                                  output_mix_grad, input_mix, mhc_scale, mhc_base, dx, scale_rows,
                                                  base_rows), target)
    return dx, scale_rows, base_rows


def _given(*outputs):
    """The outputs for the op's ``out``: None when none is given (the op allocates them all, and new
    tensors need no overlap check)."""
    return None if all(t is None for t in outputs) else outputs


_OPTIONS = (Option("mhc_mult", MHC_MULT, tuple(range(1, MAX_STREAMS + 1)), "residual streams n"),)
_SUPPORT = support("SIMD vector regions; SIMT for the backward's final stores")


def _inputs(shape, options, seed):
    # TileKernels' test data: normal input, gain, biases and output gradient.
    g = generator(seed)
    num_tokens, n = shape[0], options["mhc_mult"]
    return {"input_mix": torch.randn(num_tokens, n, generator=g), "mhc_scale": torch.randn(1, generator=g),
            "mhc_base": torch.randn(n, generator=g), "output_mix_grad": torch.randn(num_tokens, n, generator=g)}


def _fwd_inputs(shape, options, seed):
    inputs = _inputs(shape, options, seed)
    del inputs["output_mix_grad"]
    return inputs


def _kernels(build):
    return lambda options, target, flavor: [(build, parallel.HeadComputeMixSpec(options["mhc_mult"], flavor))]


MHC_HEAD_COMPUTE_MIX_FWD = KernelOp(
    "mhc_head_compute_mix_fwd",
    (Param("input_mix", "Tensor"), Param("mhc_scale", "Tensor"), Param("mhc_base", "Tensor"),
     Param("mhc_pre_eps", "float"), Param("token_block_size", "int", default=0)),
    ("output_mix",), _run_fwd, outs=("output_mix",),
    command=Command(
        summary="LM-head pre mix: sigmoid of the n mixes with one gain, plus pre_eps",
        support=_SUPPORT, default_shape=(8192,), bench_shapes=MIX_SHAPES, options=_OPTIONS,
        make_inputs=_fwd_inputs, kernels=_kernels(parallel.build_head_compute_mix_fwd),
        arguments=lambda inputs, options, flavor: {"mhc_pre_eps": PRE_EPS}))

MHC_HEAD_COMPUTE_MIX_BWD = KernelOp(
    "mhc_head_compute_mix_bwd",
    (Param("output_mix_grad", "Tensor"), Param("input_mix", "Tensor"), Param("mhc_scale", "Tensor"),
     Param("mhc_base", "Tensor"), Param("num_sms", "int"), Param("token_block_size", "int", default=0)),
    ("input_mix_grad", "mhc_scale_grad_partial", "mhc_base_grad_partial"), _run_bwd,
    outs=("input_mix_grad", "mhc_scale_grad_partial", "mhc_base_grad_partial"),
    command=Command(
        summary="gradient of head_compute_mix w.r.t. the mixes, and P partial rows of the gain's and biases' "
                "(fixed-order sums)",
        support=_SUPPORT, default_shape=(8192,), bench_shapes=MIX_SHAPES,
        options=(*_OPTIONS, Option("num_sms", 64, help="partial rows P of the parameter gradients (Ascend 950: 64 "
                                                       "vector cores)")),
        make_inputs=_inputs, kernels=_kernels(parallel.build_head_compute_mix_bwd)))


def mhc_head_compute_mix_fwd(input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                             output_mix: torch.Tensor | None, mhc_pre_eps: float, token_block_size: int = 0, *,
                             target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """The LM head's pre mix: ``σ(x · scale + base) + pre_eps`` per token and stream.

    ``pre_split_mixes``' pre formula with one gain for all ``n`` streams. Per token ``t`` and stream
    ``j``, every step one fp32 operation rounded to nearest even (no fused multiply-add):
    ``z = fl(fl(x[t, j] · mhc_scale[0]) + mhc_base[j])``; ``σ(z) = fl(1 / fl(exp(-z) + 1))`` with
    the correctly rounded exp; ``output_mix[t, j] = fl(σ(z) + f32(mhc_pre_eps))``. Every target
    gives the reference's bits for its flavor.

    Non-finite values propagate as in IEEE arithmetic, per element: a NaN in ``x``, the gain or a
    bias gives NaN; ``z = +inf`` gives ``σ = 1``, ``z = -inf`` gives ``σ = 0``. The sign and
    payload of a NaN output are not specified.

    Args:
        input_mix: fp32 ``(T, n)``, contiguous, ``1 <= n <= 16`` (``T`` may be 0). (TileKernels'
            Ascend kernel takes ``n = 4`` only; vmi's kernels take every ``n`` on every target.)
        mhc_scale: fp32 ``(1,)``: the gain, contiguous, on input_mix's device.
        mhc_base: fp32 ``(n,)`` biases, contiguous, on input_mix's device.
        output_mix: Output, fp32 ``(T, n)`` contiguous, written; None allocates it. It must not
            share memory with an input.
        mhc_pre_eps: The floor added to the sigmoid, finite as fp32, used as ``f32(mhc_pre_eps)``.
        token_block_size: TileKernels' tokens per block (0: its automatic choice); an int >= 0.
            vmi's kernels work on fixed 64-token tiles, so the value does not change the result
            or the launch.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            input_mix.
        flavor: Bit conventions (see ``vmi_core.targets``). The flavor gives the division of the sigmoid:
            subnormal quotients flushed to zero (ascend) or kept (cuda).

    Returns:
        ``output_mix``: the given output, written (or a new one where None was given).

    Raises:
        TypeError: A tensor argument is not a tensor or not fp32; ``mhc_pre_eps`` is not a real
            number; ``token_block_size`` is not an int.
        ValueError: Before any kernel: ``input_mix`` is not 2-D, not contiguous, has fewer than 1
            or more than 16 columns, or is too large for 32-bit kernel offsets; another tensor has
            the wrong shape, strides or device; ``output_mix`` shares memory with an input;
            ``mhc_pre_eps`` is not finite as fp32; ``token_block_size`` is negative.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return MHC_HEAD_COMPUTE_MIX_FWD(input_mix, mhc_scale, mhc_base, mhc_pre_eps, token_block_size,
                                    out=_given(output_mix), target=target, flavor=flavor)


mhc_head_compute_mix_fwd_parallel = parallel_entry(mhc_head_compute_mix_fwd, "input_mix")


def mhc_head_compute_mix_bwd(output_mix_grad: torch.Tensor, input_mix: torch.Tensor, mhc_scale: torch.Tensor,
                             mhc_base: torch.Tensor, input_mix_grad: torch.Tensor | None,
                             mhc_scale_grad_partial: torch.Tensor | None, mhc_base_grad_partial: torch.Tensor | None,
                             num_sms: int, token_block_size: int = 0, *, target: str | None = None,
                             flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of ``mhc_head_compute_mix_fwd``: with respect to ``input_mix``, and ``num_sms``
    partial rows of those with respect to ``mhc_scale`` and ``mhc_base``.

    Per token and stream, every step one fp32 operation (the chain of ``pre_split_mixes``' pre
    entries): ``s = σ(z)`` recomputed from ``input_mix`` exactly as the forward computes it,
    ``gz = fl(fl(d_out · s) · fl(1 - s))``, ``input_mix_grad = fl(gz · mhc_scale[0])``.

    The caller sums the ``P = num_sms`` partial rows (``scale_grad = partial.sum(0)``, as in
    TileKernels). The rows are deterministic: cut the tokens into tiles of 64 and give each row
    ``K = max(1, ceil(ceil(T / 64) / P))`` consecutive tiles, row ``p`` the tokens
    ``[64·K·p, 64·K·(p + 1))``. Row ``p`` of ``mhc_base_grad_partial`` is, per stream ``j``, the
    sum of ``gz[:, j]`` over its tokens in vmi's lane order (``vmi_core.sums.lane_sum``: 64
    partial sums, lane ``l`` adding tokens ``l, l + 64, ...`` from +0.0, then six pairwise folds),
    and row ``p`` of ``mhc_scale_grad_partial`` the same sum of each token's
    ``Σ_j fl(gz · input_mix)`` (from +0.0, ``j`` increasing). Every row is written; a row without
    tokens (all rows when ``T = 0``) is +0.0. The bits depend on the inputs and ``P`` only, never
    on the target, the worker count or the thread count.

    Non-finite values propagate as in IEEE arithmetic: a NaN or infinity in a token's inputs makes
    that token's gradients NaN or infinite where they enter, and reaches the partial rows of the
    streams they enter. The sign and payload of a NaN are not specified.

    Args:
        output_mix_grad: fp32 ``(T, n)``, contiguous: the gradient of ``output_mix``.
        input_mix: The forward's fp32 ``(T, n)`` input, contiguous, ``1 <= n <= 16``.
        mhc_scale: The forward's fp32 ``(1,)`` gain.
        mhc_base: The forward's fp32 ``(n,)`` biases.
        input_mix_grad: Output, fp32 ``(T, n)`` contiguous, written; None allocates it.
        mhc_scale_grad_partial: Output, fp32 ``(P, 1)`` contiguous, every row written; None
            allocates it.
        mhc_base_grad_partial: Output, fp32 ``(P, n)`` contiguous, every row written; None
            allocates it. The outputs must not share memory with each other or with an input.
        num_sms: ``P``, the number of partial rows, in ``[1, 2^20]``.
        token_block_size: TileKernels' tokens per block (0: its automatic choice); an int >= 0.
            vmi's kernels work on fixed 64-token tiles, so the value does not change the result
            or the launch.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            input_mix.
        flavor: Bit conventions (see ``vmi_core.targets``). The flavor gives the division of the recomputed
            sigmoid: subnormal quotients flushed to zero (ascend) or kept (cuda).

    Returns:
        ``(input_mix_grad, mhc_scale_grad_partial, mhc_base_grad_partial)``: the given outputs,
        written (or new ones where None was given).

    Raises:
        TypeError: A tensor argument is not a tensor or not fp32; ``num_sms`` or
            ``token_block_size`` is not an int.
        ValueError: Before any kernel: ``input_mix`` is not 2-D, not contiguous, has fewer than 1
            or more than 16 columns, or is too large for 32-bit kernel offsets; another tensor has
            the wrong shape, strides or device; an output shares memory with an input or another
            output; ``num_sms`` is outside ``[1, 2^20]``; ``token_block_size`` is negative.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return MHC_HEAD_COMPUTE_MIX_BWD(output_mix_grad, input_mix, mhc_scale, mhc_base, num_sms, token_block_size,
                                    out=_given(input_mix_grad, mhc_scale_grad_partial, mhc_base_grad_partial),
                                    target=target, flavor=flavor)


mhc_head_compute_mix_bwd_parallel = parallel_entry(mhc_head_compute_mix_bwd, "input_mix")
