"""The mHC layer functions (TileKernels v1's functional API, spec §4): the model's entry
(``expand_from_embedding``), one sublayer's pre stage (``mhc_pre``; the caller then runs the
sublayer and ``mhc_post``), the LM head's (``mhc_head``) and the inference fusion
(``mhc_pre_big_fuse``).

``mhc_pre`` takes the autograd chain ``mhc_pre_norm_fn → mhc_pre_split_mixes →
sinkhorn_normalize → mhc_pre_apply_mix`` when autograd records (grad mode on, not inference mode)
and one of its tensors requires grad; otherwise the norm weight is merged into ``fn`` (spec §6.2:
v1 forgot) and the prenorm GEMM's partials feed ``mhc_pre_big_fuse_fwd``, which keeps the pre mix on
chip and gives the same bits as the chain's forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vmi_core.checks import check_float, check_int, check_tensor

from .autograd import (
    check_norm_fn_options,
    expand_to_mhc,
    mhc_head_compute_mix,
    mhc_pre_apply_mix,
    mhc_pre_norm_fn,
    mhc_pre_split_mixes,
    sinkhorn_normalize,
)
from .inputs import check_mhc_mult, mix_width
from .kernels.sinkhorn import MAX_BACKWARD_REPEAT
from .ops.norm_fn import mhc_fn_normw_merge_fwd
from .ops.pre_big_fuse import mhc_pre_big_fuse_fwd
from .ops.pre_norm_fn_gemm import mhc_pre_norm_fn_gemm_fwd


def expand_from_embedding(x: torch.Tensor, mhc_mult: int = 4, *, target: str | None = None,
                          flavor: str | None = None) -> torch.Tensor:
    """The model's entry into the mHC residual: the embedding ``(..., H)`` copied into ``mhc_mult``
    streams ``(..., n, H)`` (``expand_to_mhc``, differentiable).

    Args:
        x: bf16 ``(..., H)``, contiguous.
        mhc_mult: The stream count ``n`` (4 is what the other mHC kernels take).
        target: As ``expand_to_mhc``.
        flavor: As ``expand_to_mhc``.

    Returns:
        bf16 ``(..., n, H)``.

    Raises:
        TypeError, ValueError: As ``expand_to_mhc``.
    """
    return expand_to_mhc(x, mhc_mult, target=target, flavor=flavor)


def _check_pre_inputs(residual, fn, scale, base, norm_weight, mhc_mult: int, fn_rows: int, scale_size: int,
                      base_size: int, op: str) -> None:
    check_int(mhc_mult, "mhc_mult")
    check_mhc_mult(mhc_mult, "mhc_mult", op)
    check_tensor(residual, "residual", dtype=torch.bfloat16)
    if residual.dim() < 2 or residual.shape[-2] != mhc_mult:
        raise ValueError(f"residual must have shape (..., {mhc_mult}, H), got {tuple(residual.shape)}")
    mhc_hidden = mhc_mult * residual.shape[-1]
    device = residual.device
    check_tensor(fn, "fn", dtype=torch.float32, shape=(fn_rows, mhc_hidden), device=device)
    check_tensor(scale, "scale", dtype=torch.float32, device=device)
    if scale.numel() != scale_size or scale.dim() > 1:
        raise ValueError(f"scale must have shape ({scale_size},), got {tuple(scale.shape)}")
    check_tensor(base, "base", dtype=torch.float32, shape=(base_size,), device=device)
    if norm_weight is not None:
        check_tensor(norm_weight, "norm_weight", dtype=torch.float32, shape=(mhc_hidden,), device=device)


def _check_mix_options(pre_eps, post_mult_value, sinkhorn_eps, sinkhorn_repeat, records: bool) -> None:
    """The scalar options of the split and Sinkhorn kernels, checked before the first kernel runs;
    when autograd records, ``sinkhorn_repeat`` also fits the Sinkhorn backward (at most 16)."""
    check_float(pre_eps, "pre_eps", finite=True)
    check_float(post_mult_value, "post_mult_value", finite=True)
    if check_float(sinkhorn_eps, "sinkhorn_eps", finite=True) < 0:
        raise ValueError(f"sinkhorn_eps must be >= 0, got {sinkhorn_eps}")
    check_int(sinkhorn_repeat, "sinkhorn_repeat", 1, MAX_BACKWARD_REPEAT if records else None)


def _records(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records a graph through these tensors."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def mhc_pre_big_fuse(residual: torch.Tensor, fn: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                     rms_eps: float, mhc_pre_eps: float, mhc_sinkhorn_eps: float, mhc_post_mult_value: float,
                     sinkhorn_repeat: int, n_splits: int = 16, *, target: str | None = None,
                     flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inference pre stage of one sublayer: the prenorm GEMM's split-K partials
    (``mhc_pre_norm_fn_gemm_fwd``), then ``mhc_pre_big_fuse_fwd`` (reduction, RMS scale, split,
    Sinkhorn and the pre mix applied, the pre mix kept on chip). No autograd: the outputs carry no
    gradient.

    ``fn`` is the merged projection: a norm weight must already be multiplied in (``mhc_pre``
    does). ``n_splits`` is honoured (``K / n_splits`` a multiple of 64).

    Args:
        residual: bf16 ``(..., 4, H)``; the leading dims are the tokens.
        fn: fp32 ``(24, 4·H)`` contiguous.
        mhc_scale: fp32 ``(3,)`` gains.
        mhc_base: fp32 ``(24,)`` biases.
        rms_eps: The RMS epsilon.
        mhc_pre_eps: The pre floor.
        mhc_sinkhorn_eps: The Sinkhorn epsilon.
        mhc_post_mult_value: The post multiplier.
        sinkhorn_repeat: Sinkhorn iterations, ``>= 1``.
        n_splits: The GEMM's split-K count.
        target: As ``expand_to_mhc``; passed to both kernels.
        flavor: As ``expand_to_mhc``; passed to both kernels.

    Returns:
        ``(post_mix (..., 4, 1), comb_mix (..., 4, 4), layer_input (..., H))``: fp32, fp32, bf16.

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype.
        ValueError: ``residual`` is not ``(..., 4, H)``; ``fn``, ``mhc_scale`` or ``mhc_base`` has
            the wrong shape or device; otherwise as the two kernels' entry points.
    """
    _check_pre_inputs(residual, fn, mhc_scale, mhc_base, None, 4, mix_width(4), 3, mix_width(4), "mhc_pre_big_fuse")
    check_norm_fn_options(fn.shape[1], rms_eps, "rms_eps", n_splits, False)
    _check_mix_options(mhc_pre_eps, mhc_post_mult_value, mhc_sinkhorn_eps, sinkhorn_repeat, False)
    lead = residual.shape[:-2]
    n, hidden = residual.shape[-2:]
    streams = residual.reshape(-1, n, hidden).contiguous()
    tokens = streams.shape[0]
    out_mul, sqrsum = mhc_pre_norm_fn_gemm_fwd(streams.view(tokens, n * hidden), fn, n_splits=n_splits,
                                               target=target, flavor=flavor)
    post_mix, comb_mix, layer_input = mhc_pre_big_fuse_fwd(
        out_mul, sqrsum, mhc_scale, mhc_base, streams, None, None, None, rms_eps, mhc_pre_eps, mhc_sinkhorn_eps,
        mhc_post_mult_value, sinkhorn_repeat, n_splits, target=target, flavor=flavor)
    return post_mix.view(*lead, n, 1), comb_mix.view(*lead, n, n), layer_input.view(*lead, hidden)


def mhc_pre(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
            norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6, mhc_mult: int = 4,
            post_mult_value: float = 1.0, pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6,
            sinkhorn_repeat: int = 10, n_splits: int = 16, target: str | None = None, flavor: str | None = None
            ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The mHC pre stage of one sublayer: the sublayer's input and the mixes ``mhc_post`` takes.

    ``mixes = norm_fn(residual)``; ``pre, post, comb_logits = split(mixes)``;
    ``comb = Sinkhorn(comb_logits)``; ``layer_input = Σ_m pre[m] · residual[m]`` (spec §1.2). When
    autograd records and one of ``residual``, ``fn``, ``scale``, ``base``, ``norm_weight`` requires
    grad, this is the differentiable chain of ``vmi_mhc.autograd`` (the residual's gradient
    accumulated in one buffer with the ``mhc_post`` and the prenorm backward of the same residual);
    otherwise (``torch.no_grad``, ``torch.inference_mode``, or nothing requires grad) the norm weight
    is merged into ``fn`` and ``mhc_pre_big_fuse`` computes the three outputs with the same bits as
    the chain's forward (the pre mix is not materialised).

    Args:
        residual: bf16 ``(..., n, H)``; the leading dims are the tokens.
        fn: fp32 ``(n·(n+2), n·H)`` contiguous projection.
        scale: fp32 ``(3,)`` gains (pre, post, comb).
        base: fp32 ``(n·(n+2),)`` biases.
        norm_weight: Optional fp32 ``(n·H,)`` RMSNorm weight.
        norm_eps: The RMS epsilon.
        mhc_mult: ``n``; must be 4.
        post_mult_value: The post multiplier.
        pre_eps: The pre floor.
        sinkhorn_eps: The Sinkhorn epsilon.
        sinkhorn_repeat: Sinkhorn iterations, ``>= 1``; at most 16 when autograd records (the
            Sinkhorn backward keeps every step on chip).
        n_splits: The prenorm GEMM's split-K count (``n·H / n_splits`` a multiple of 64).
        target: As ``expand_to_mhc``; passed to every kernel.
        flavor: As ``expand_to_mhc``; passed to every kernel.

    Returns:
        ``(layer_input (..., H) bf16, (post_mix (..., n, 1), comb_mix (..., n, n)) fp32)``.

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype; ``mhc_mult`` is not an
            int.
        ValueError: ``mhc_mult`` is not 4; ``residual`` is not ``(..., n, H)``; ``fn``, ``scale``,
            ``base`` or ``norm_weight`` has the wrong shape or device; a scalar option is out of
            range (``n_splits``, the epsilons, ``sinkhorn_repeat``; checked before any kernel);
            otherwise as the kernels' entry points.
    """
    _check_pre_inputs(residual, fn, scale, base, norm_weight, mhc_mult, mix_width(mhc_mult), 3, mix_width(mhc_mult),
                      "mhc_pre")
    records = _records(residual, fn, scale, base, norm_weight)
    check_norm_fn_options(fn.shape[1], norm_eps, "norm_eps", n_splits, records)
    _check_mix_options(pre_eps, post_mult_value, sinkhorn_eps, sinkhorn_repeat, records)
    if not records:
        if norm_weight is not None:
            fn = mhc_fn_normw_merge_fwd(fn, norm_weight, None, target=target, flavor=flavor)
        post_mix, comb_mix, layer_input = mhc_pre_big_fuse(
            residual, fn, scale, base, norm_eps, pre_eps, sinkhorn_eps, post_mult_value, sinkhorn_repeat, n_splits,
            target=target, flavor=flavor)
        return layer_input, (post_mix, comb_mix)
    mixes = mhc_pre_norm_fn(residual, fn, norm_weight, norm_eps, n_splits=n_splits, target=target, flavor=flavor)
    pre_mix, post_mix, comb_logits = mhc_pre_split_mixes(mixes, scale, base, mhc_mult, post_mult_value, pre_eps,
                                                         target=target, flavor=flavor)
    comb_mix = sinkhorn_normalize(comb_logits, repeat=sinkhorn_repeat, eps=sinkhorn_eps, target=target,
                                  flavor=flavor)
    layer_input = mhc_pre_apply_mix(residual, pre_mix, target=target, flavor=flavor)
    return layer_input, (post_mix, comb_mix)


def mhc_head(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
             norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6, mhc_mult: int = 4,
             pre_eps: float = 1e-6, n_splits: int = 16, target: str | None = None, flavor: str | None = None
             ) -> torch.Tensor:
    """The LM head's input: the streams of the last residual mixed by ``σ(mix · g + b) + pre_eps``.

    ``fn`` is zero-padded from ``n`` to ``n·(n+2)`` rows (so the prenorm GEMM's tile is reused; the
    RMS statistic still covers the whole residual), ``mhc_pre_norm_fn`` gives the mixes, the first
    ``n`` feed ``mhc_head_compute_mix`` (one gain) and ``mhc_pre_apply_mix`` applies them.
    Differentiable; there is no fused path. In training no ``mhc_post`` consumes the last residual:
    its gradient starts in the pre_apply_mix backward (spec §6.3: v1 fails there).

    Args:
        residual: bf16 ``(..., n, H)``.
        fn: fp32 ``(n, n·H)`` (or already padded to ``(n·(n+2), n·H)``).
        scale: fp32 gain, one element (``(1,)`` or 0-D).
        base: fp32 ``(n,)`` biases.
        norm_weight: Optional fp32 ``(n·H,)`` RMSNorm weight.
        norm_eps: The RMS epsilon.
        mhc_mult: ``n``; must be 4.
        pre_eps: The floor added to the sigmoid.
        n_splits: The prenorm GEMM's split-K count.
        target: As ``expand_to_mhc``; passed to every kernel.
        flavor: As ``expand_to_mhc``; passed to every kernel.

    Returns:
        bf16 ``(..., H)``.

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype; ``mhc_mult`` is not an
            int.
        ValueError: ``mhc_mult`` is not 4; a tensor has the wrong shape or device; otherwise as
            the kernels' entry points.
    """
    check_int(mhc_mult, "mhc_mult")
    mix = mix_width(mhc_mult)
    rows = mix if isinstance(fn, torch.Tensor) and fn.dim() == 2 and fn.shape[0] == mix else mhc_mult
    _check_pre_inputs(residual, fn, scale, base, norm_weight, mhc_mult, rows, 1, mhc_mult, "mhc_head")
    check_norm_fn_options(fn.shape[1], norm_eps, "norm_eps", n_splits,
                          _records(residual, fn, scale, base, norm_weight))
    check_float(pre_eps, "pre_eps", finite=True)
    if rows < mix:
        fn = F.pad(fn, (0, 0, 0, mix - rows))
    mixes = mhc_pre_norm_fn(residual, fn, norm_weight, norm_eps, n_splits=n_splits, target=target, flavor=flavor)
    pre_mix = mhc_head_compute_mix(mixes[..., :mhc_mult], scale.reshape(1), base, pre_eps, target=target,
                                   flavor=flavor)
    return mhc_pre_apply_mix(residual, pre_mix.unsqueeze(-1), target=target, flavor=flavor)
