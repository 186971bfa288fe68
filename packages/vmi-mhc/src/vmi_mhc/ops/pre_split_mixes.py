"""``pre_split_mixes``: public dispatch of the split of the mix vector into the pre, post and comb
mixes and of its backward (validation, allocation, backend choice).

Names and parameters follow TileKernels v2 (the kernel-level API: the outputs are arguments, and
are written); ``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_disjoint, check_kernel_extent, check_tensor
from vmi_core.library import Command, KernelOp, Param, parallel_entry, support
from vmi_core.targets import Flavor, resolve_flavor, resolve_target
from vmi_core.tools.testing import generator

from ..inputs import MHC_MULT, check_mhc_mult, finite_fp32, mix_width, post_mult_fp32
from ..kernels import pre_split_mixes as parallel
from ..reference import pre_split_mixes as reference
from .demo import MIX_SHAPES, POST_MULT, PRE_EPS

_OP = "mhc_pre_split_mixes"


@dataclass
class PreSplitMixesFwdCall:
    """A validated forward call: the kernel specialisation and the tensors it reads and writes."""

    spec: parallel.PreSplitMixesSpec
    flavor: Flavor
    input_mixes: torch.Tensor
    mhc_scale: torch.Tensor
    mhc_base: torch.Tensor
    pre_layer_mix: torch.Tensor
    post_layer_mix: torch.Tensor
    comb_res_mix: torch.Tensor
    mhc_post_mult_value: float
    mhc_pre_eps: float


@dataclass
class PreSplitMixesBwdCall:
    """A validated backward call: the kernel specialisation and the tensors the kernels read and write."""

    spec: parallel.PreSplitMixesSpec
    flavor: Flavor
    pre_layer_mix_grad: torch.Tensor
    post_layer_mix_grad: torch.Tensor
    comb_res_mix_grad: torch.Tensor
    input_mixes: torch.Tensor
    post_layer_mix: torch.Tensor
    mhc_scale: torch.Tensor
    mhc_base: torch.Tensor
    input_mixes_grad: torch.Tensor
    mhc_scale_grad: torch.Tensor
    mhc_base_grad: torch.Tensor
    mhc_post_mult_value: float


def _check_input_mixes(input_mixes) -> tuple[int, torch.device]:
    check_tensor(input_mixes, "input_mixes", dtype=torch.float32, shape=(None, None), contiguous=True)
    check_kernel_extent(input_mixes, "input_mixes")
    return input_mixes.shape[0], input_mixes.device


def _check_mult(mhc_mult: int, name: str, input_mixes: torch.Tensor) -> None:
    check_mhc_mult(mhc_mult, name, _OP)
    if input_mixes.shape[1] != mix_width(mhc_mult):
        raise ValueError(f"{_OP}: input_mixes must have n·(n+2) = {mix_width(mhc_mult)} columns for "
                         f"n = {mhc_mult} streams, got {input_mixes.shape[1]}")


def _check_parameters(mhc_scale, mhc_base, device) -> None:
    check_tensor(mhc_scale, "mhc_scale", dtype=torch.float32, shape=(3,), device=device, contiguous=True)
    check_tensor(mhc_base, "mhc_base", dtype=torch.float32, shape=(parallel.N3,), device=device, contiguous=True)


def _check_mix(t, name: str, num_tokens: int, width: int, device) -> None:
    check_tensor(t, name, dtype=torch.float32, shape=(num_tokens, width), device=device, contiguous=True)


def _output(t, name: str, num_tokens: int, width: int, device) -> torch.Tensor:
    if t is None:
        return torch.empty((num_tokens, width), dtype=torch.float32, device=device)
    _check_mix(t, name, num_tokens, width, device)
    return t


def _run_fwd(input_mixes, mhc_scale, mhc_base, mhc_post_mult_value, mhc_pre_eps, *, out, target, flavor, launch):
    num_tokens, device = _check_input_mixes(input_mixes)
    pre, post, comb = out if out is not None else (None, None, None)
    n = pre.shape[1] if isinstance(pre, torch.Tensor) and pre.dim() == 2 else parallel.N
    _check_mult(n, "pre_layer_mix.size(1) (n)", input_mixes)
    _check_parameters(mhc_scale, mhc_base, device)
    post_mult = post_mult_fp32(mhc_post_mult_value)
    pre_eps = finite_fp32(mhc_pre_eps, "mhc_pre_eps")
    pre = _output(pre, "pre_layer_mix", num_tokens, n, device)
    post = _output(post, "post_layer_mix", num_tokens, n, device)
    comb = _output(comb, "comb_res_mix", num_tokens, n * n, device)
    if out is not None:
        check_disjoint({"pre_layer_mix": pre, "post_layer_mix": post, "comb_res_mix": comb},
                       {"input_mixes": input_mixes, "mhc_scale": mhc_scale, "mhc_base": mhc_base})
    target = resolve_target(input_mixes, target)
    flavor = resolve_flavor(target, flavor)
    if launch and target == "torch":
        for given, expected in zip((pre, post, comb), reference.pre_split_mixes_fwd(
                input_mixes, mhc_scale, mhc_base, post_mult, pre_eps, flavor), strict=True):
            given.copy_(expected)
    elif launch and num_tokens:
        parallel.launch_fwd(PreSplitMixesFwdCall(parallel.PreSplitMixesSpec(flavor.name), flavor, input_mixes,
                                                 mhc_scale, mhc_base, pre, post, comb, post_mult, pre_eps), target)
    return pre, post, comb


def _run_bwd(pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes, post_layer_mix, mhc_scale,
             mhc_base, mhc_post_mult_value, *, out, target, flavor, launch):
    num_tokens, device = _check_input_mixes(input_mixes)
    check_tensor(pre_layer_mix_grad, "pre_layer_mix_grad", dtype=torch.float32, dim=2)
    n = pre_layer_mix_grad.shape[1]
    _check_mult(n, "pre_layer_mix_grad.size(1) (n)", input_mixes)
    _check_mix(pre_layer_mix_grad, "pre_layer_mix_grad", num_tokens, n, device)
    _check_mix(post_layer_mix_grad, "post_layer_mix_grad", num_tokens, n, device)
    _check_mix(comb_res_mix_grad, "comb_res_mix_grad", num_tokens, n * n, device)
    _check_mix(post_layer_mix, "post_layer_mix", num_tokens, n, device)
    _check_parameters(mhc_scale, mhc_base, device)
    post_mult = post_mult_fp32(mhc_post_mult_value)
    dx, scale_grad, base_grad = out if out is not None else (None, None, None)
    dx = _output(dx, "input_mixes_grad", num_tokens, mix_width(n), device)
    if scale_grad is None:
        scale_grad = torch.empty(3, dtype=torch.float32, device=device)
    check_tensor(scale_grad, "mhc_scale_grad", dtype=torch.float32, shape=(3,), device=device, contiguous=True)
    if base_grad is None:
        base_grad = torch.empty(mix_width(n), dtype=torch.float32, device=device)
    check_tensor(base_grad, "mhc_base_grad", dtype=torch.float32, shape=(mix_width(n),), device=device,
                 contiguous=True)
    if out is not None:
        check_disjoint({"input_mixes_grad": dx, "mhc_scale_grad": scale_grad, "mhc_base_grad": base_grad},
                       {"pre_layer_mix_grad": pre_layer_mix_grad, "post_layer_mix_grad": post_layer_mix_grad,
                        "comb_res_mix_grad": comb_res_mix_grad, "input_mixes": input_mixes,
                        "post_layer_mix": post_layer_mix, "mhc_scale": mhc_scale, "mhc_base": mhc_base})
    target = resolve_target(input_mixes, target)
    flavor = resolve_flavor(target, flavor)
    if launch and target == "torch":
        for given, expected in zip((dx, scale_grad, base_grad), reference.pre_split_mixes_bwd(
                pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes, post_layer_mix, mhc_scale,
                mhc_base, post_mult, flavor), strict=True):
            given.copy_(expected)
    elif launch and num_tokens == 0:
        scale_grad.zero_()
        base_grad.zero_()
    elif launch:
        parallel.launch_bwd(PreSplitMixesBwdCall(
            parallel.PreSplitMixesSpec(flavor.name), flavor, pre_layer_mix_grad, post_layer_mix_grad,
            comb_res_mix_grad, input_mixes, post_layer_mix, mhc_scale, mhc_base, dx, scale_grad, base_grad,
            post_mult), target)
    return dx, scale_grad, base_grad


def _given(*outputs):
    """The outputs for the op's ``out``: None when none is given (the op allocates them all, and new
    tensors need no overlap check)."""
    return None if all(t is None for t in outputs) else outputs


_SUPPORT = support("SIMD vector regions; SIMT for the backward's final stores")


def _parameters(g):
    return {"mhc_scale": torch.randn(3, generator=g), "mhc_base": torch.randn(mix_width(MHC_MULT), generator=g)}


def _fwd_inputs(shape, options, seed):
    g = generator(seed)
    return {"input_mixes": torch.randn(shape[0], mix_width(MHC_MULT), generator=g), **_parameters(g)}


MHC_PRE_SPLIT_MIXES_FWD = KernelOp(
    "mhc_pre_split_mixes_fwd",
    (Param("input_mixes", "Tensor"), Param("mhc_scale", "Tensor"), Param("mhc_base", "Tensor"),
     Param("mhc_post_mult_value", "float"), Param("mhc_pre_eps", "float")),
    ("pre_layer_mix", "post_layer_mix", "comb_res_mix"), _run_fwd,
    outs=("pre_layer_mix", "post_layer_mix", "comb_res_mix"),
    command=Command(
        summary="split the mix vector into the pre and post mixes (sigmoid) and the comb logits",
        support=_SUPPORT, default_shape=(8192,), bench_shapes=MIX_SHAPES, make_inputs=_fwd_inputs,
        kernels=lambda options, target, flavor: [(parallel.build_pre_split_mixes_fwd,
                                                  parallel.PreSplitMixesSpec(flavor))],
        arguments=lambda inputs, options, flavor: {"mhc_post_mult_value": POST_MULT, "mhc_pre_eps": PRE_EPS}))


def _bwd_inputs(shape, options, seed):
    g = generator(seed)
    num_tokens, n = shape[0], MHC_MULT
    inputs = {"input_mixes": torch.randn(num_tokens, mix_width(n), generator=g), **_parameters(g),
              "pre_layer_mix_grad": torch.randn(num_tokens, n, generator=g),
              "post_layer_mix_grad": torch.randn(num_tokens, n, generator=g),
              "comb_res_mix_grad": torch.randn(num_tokens, n * n, generator=g)}
    _, inputs["post_layer_mix"], _ = reference.pre_split_mixes_fwd(
        inputs["input_mixes"], inputs["mhc_scale"], inputs["mhc_base"], POST_MULT, PRE_EPS)
    return inputs


def _bwd_kernels(options, target, flavor):
    # The tile kernel, then the reduction of its partial rows.
    return [(parallel.build_pre_split_mixes_bwd, parallel.PreSplitMixesSpec(flavor)),
            (parallel.build_pre_split_mixes_bwd_reduce, parallel.REDUCE_SPEC)]


MHC_PRE_SPLIT_MIXES_BWD = KernelOp(
    "mhc_pre_split_mixes_bwd",
    (Param("pre_layer_mix_grad", "Tensor"), Param("post_layer_mix_grad", "Tensor"),
     Param("comb_res_mix_grad", "Tensor"), Param("input_mixes", "Tensor"), Param("post_layer_mix", "Tensor"),
     Param("mhc_scale", "Tensor"), Param("mhc_base", "Tensor"), Param("mhc_post_mult_value", "float")),
    ("input_mixes_grad", "mhc_scale_grad", "mhc_base_grad"), _run_bwd,
    outs=("input_mixes_grad", "mhc_scale_grad", "mhc_base_grad"),
    command=Command(
        summary="gradient of pre_split_mixes w.r.t. the mix vector, the gains and the biases (fixed-order sums)",
        support=_SUPPORT, default_shape=(8192,), bench_shapes=MIX_SHAPES, make_inputs=_bwd_inputs,
        kernels=_bwd_kernels, arguments=lambda inputs, options, flavor: {"mhc_post_mult_value": POST_MULT}))


def mhc_pre_split_mixes_fwd(input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                            pre_layer_mix: torch.Tensor | None, post_layer_mix: torch.Tensor | None,
                            comb_res_mix: torch.Tensor | None, mhc_post_mult_value: float, mhc_pre_eps: float, *,
                            target: str | None = None, flavor: str | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the per-token mix vector into the pre mix, the post mix and the comb logits.

    For entry ``i`` of a token's mix vector ``x`` (``n = 4`` streams, ``n·(n+2) = 24`` entries:
    4 pre, 4 post, 16 comb) with gain ``g = mhc_scale[min(2, i div n)]``, every step one fp32
    operation rounded to nearest even (no fused multiply-add):
    ``z = fl(fl(x · g) + mhc_base[i])``; ``σ(z) = fl(1 / fl(exp(-z) + 1))`` with the correctly
    rounded exp; ``pre_layer_mix[t, m] = fl(σ(z[m]) + f32(mhc_pre_eps))``,
    ``post_layer_mix[t, m] = fl(σ(z[n + m]) · f32(mhc_post_mult_value))``,
    ``comb_res_mix[t, j·n + k] = z[2n + j·n + k]`` (logits, row-major ``(j, k)``). Every target
    gives the reference's bits for its flavor.

    Non-finite values propagate as in IEEE arithmetic, per element: a NaN in ``x``, a gain or
    a bias gives NaN; ``z = +inf`` gives ``σ = 1``, ``z = -inf`` gives ``σ = 0`` (comb keeps the
    infinity). The sign and payload of a NaN output are not specified.

    Args:
        input_mixes: fp32 ``(T, 24)``, contiguous (``T`` may be 0).
        mhc_scale: fp32 ``(3,)`` gains (pre, post, comb), contiguous, input_mixes's device.
        mhc_base: fp32 ``(24,)`` biases, contiguous, input_mixes's device.
        pre_layer_mix: Output, fp32 ``(T, n)`` contiguous, written; ``n`` must be 4 (the kernels
            are specialised on 4 streams). None allocates it.
        post_layer_mix: Output, fp32 ``(T, n)`` contiguous, written; None allocates it.
        comb_res_mix: Output, fp32 ``(T, n²)`` contiguous, written; None allocates it. The
            outputs must not share memory with each other or with an input.
        mhc_post_mult_value: The post multiplier (``m``): finite as fp32, 0 or a normal fp32
            number (the backward divides by it), used as ``f32(m)``.
        mhc_pre_eps: The pre floor, finite as fp32, used as ``f32(mhc_pre_eps)``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            input_mixes.
        flavor: Bit conventions (see ``vmi_core.targets``). The flavor gives the division of the sigmoid (and
            of the backward's post quotient): subnormal quotients flushed to zero (ascend) or kept (cuda).

    Returns:
        ``(pre_layer_mix, post_layer_mix, comb_res_mix)``: the given outputs, written (or new
        ones where None was given).

    Raises:
        TypeError: A tensor argument is not a tensor or not fp32; ``mhc_post_mult_value`` or
            ``mhc_pre_eps`` is not a real number.
        ValueError: Before any kernel: ``pre_layer_mix.size(1)`` is not 4; ``input_mixes`` does
            not have 24 columns, is not 2-D or not contiguous, or is too large for 32-bit kernel
            offsets; another tensor has the wrong shape, strides or device; an output shares
            memory with an input or another output; ``mhc_post_mult_value`` or ``mhc_pre_eps``
            is not finite as fp32, or ``mhc_post_mult_value`` is a nonzero value below 2^-126
            in magnitude.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return MHC_PRE_SPLIT_MIXES_FWD(input_mixes, mhc_scale, mhc_base, mhc_post_mult_value, mhc_pre_eps,
                                   out=_given(pre_layer_mix, post_layer_mix, comb_res_mix), target=target,
                                   flavor=flavor)


mhc_pre_split_mixes_fwd_parallel = parallel_entry(mhc_pre_split_mixes_fwd, "input_mixes")


def mhc_pre_split_mixes_bwd(pre_layer_mix_grad: torch.Tensor, post_layer_mix_grad: torch.Tensor,
                            comb_res_mix_grad: torch.Tensor, input_mixes: torch.Tensor, post_layer_mix: torch.Tensor,
                            mhc_scale: torch.Tensor, mhc_base: torch.Tensor, input_mixes_grad: torch.Tensor | None,
                            mhc_scale_grad: torch.Tensor | None, mhc_base_grad: torch.Tensor | None,
                            mhc_post_mult_value: float, *, target: str | None = None, flavor: str | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of ``mhc_pre_split_mixes_fwd`` with respect to ``input_mixes``, ``mhc_scale`` and
    ``mhc_base``.

    Per token and entry ``i`` (gain ``c = min(2, i div n)``), every step one fp32 operation:
    the logit gradient ``gz`` is ``fl(fl(d_pre · s) · fl(1 - s))`` for pre entries, with
    ``s = σ(z)`` recomputed from ``input_mixes`` exactly as the forward computes it;
    ``fl(fl(d_post · p) · fl(1 - fl(p / f32(m))))`` for post entries, with ``p`` the saved
    ``post_layer_mix`` (``= m·σ(z)``; the flavor's division); the comb gradient itself for comb
    entries. ``input_mixes_grad = fl(gz · mhc_scale[c])``.

    ``mhc_post_mult_value = 0``: the post mix ``0 · σ(z)`` does not depend on ``z``, and the
    quotient ``p / m`` is taken as ``p / +inf`` (0 for a finite ``p``) instead of TileKernels'
    division by zero (NaN): the post gradient is then ``d_post · p``, ±0 for the forward's
    ``p = 0`` (NaN only where ``d_post`` is infinite or NaN).

    The parameter gradients are sums over tokens in an order that depends on ``T`` only, so every
    target, worker count and thread count gives the same bits: per tile of 64 consecutive tokens,
    ``mhc_base_grad[i]``'s partial is the lane-order sum (``vmi_core.sums.lane_sum``) of the
    tile's ``gz[:, i]``, and ``mhc_scale_grad[c]``'s the lane-order sum of each token's
    ``Σ_{i in c} fl(gz · input_mixes)`` (from +0.0, ``i`` increasing); the partials are added in
    tile order from +0.0. As in TileKernels, ``mhc_scale_grad`` and ``mhc_base_grad`` are
    overwritten (not accumulated into); ``T = 0`` gives zeros.

    Non-finite values propagate as in IEEE arithmetic: a NaN or infinity in a token's inputs
    makes that token's gradients NaN or infinite where they enter, and reaches the parameter
    gradients of the entries they enter. The sign and payload of a NaN are not specified.

    Args:
        pre_layer_mix_grad: fp32 ``(T, n)``, contiguous; ``n`` must be 4.
        post_layer_mix_grad: fp32 ``(T, n)``, contiguous.
        comb_res_mix_grad: fp32 ``(T, n²)``, contiguous.
        input_mixes: The forward's fp32 ``(T, 24)`` input, contiguous.
        post_layer_mix: The forward's fp32 ``(T, n)`` post mix output, contiguous.
        mhc_scale: The forward's fp32 ``(3,)`` gains.
        mhc_base: The forward's fp32 ``(24,)`` biases.
        input_mixes_grad: Output, fp32 ``(T, 24)`` contiguous, written; None allocates it.
        mhc_scale_grad: Output, fp32 ``(3,)`` contiguous, overwritten; None allocates it.
        mhc_base_grad: Output, fp32 ``(24,)`` contiguous, overwritten; None allocates it. The
            outputs must not share memory with each other or with an input.
        mhc_post_mult_value: The forward's post multiplier (as for the forward).
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            input_mixes.
        flavor: Bit conventions (see ``vmi_core.targets``). The flavor gives the division of the sigmoid (and
            of the backward's post quotient): subnormal quotients flushed to zero (ascend) or kept (cuda).

    Returns:
        ``(input_mixes_grad, mhc_scale_grad, mhc_base_grad)``: the given outputs, written (or
        new ones where None was given).

    Raises:
        TypeError: A tensor argument is not a tensor or not fp32; ``mhc_post_mult_value`` is not
            a real number.
        ValueError: Before any kernel: ``pre_layer_mix_grad`` is not 2-D or its ``size(1)`` is
            not 4; ``input_mixes`` does not have 24 columns, is not 2-D or not contiguous, or is
            too large for 32-bit kernel offsets; another tensor has the wrong shape, strides or
            device; an output shares memory with an input or another output;
            ``mhc_post_mult_value`` is not finite as fp32, or a nonzero value below 2^-126 in
            magnitude.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return MHC_PRE_SPLIT_MIXES_BWD(pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes,
                                   post_layer_mix, mhc_scale, mhc_base, mhc_post_mult_value,
                                   out=_given(input_mixes_grad, mhc_scale_grad, mhc_base_grad), target=target,
                                   flavor=flavor)


mhc_pre_split_mixes_bwd_parallel = parallel_entry(mhc_pre_split_mixes_bwd, "input_mixes")

