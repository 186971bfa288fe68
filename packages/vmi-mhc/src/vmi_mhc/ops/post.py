"""``mhc_post_fwd`` / ``mhc_post_bwd``: public dispatch of ``post`` (spec mhc §3.5), which writes a
sublayer's output back into the widened residual: validation, allocation, backend choice.

Names and parameters follow TileKernels v2's kernel-level functions; ``target`` and ``flavor``
are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_disjoint, check_int, check_kernel_extent, check_tensor
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry, support
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import randn

from ..inputs import MHC_MULT, check_mhc_mult
from ..kernels import post as parallel
from ..reference import post as reference
from .demo import RESIDUAL_SHAPES, SOURCE_HIDDEN


@dataclass
class PostForwardCall:
    """A validated forward call: the kernel's specialisation and the tensors it reads and writes."""

    spec: parallel.PostForwardSpec
    num_tokens: int
    x: torch.Tensor
    residual: torch.Tensor
    post_layer_mix: torch.Tensor
    comb_res_mix: torch.Tensor
    out: torch.Tensor


@dataclass
class PostBackwardCall:
    """A validated backward call: the kernel's specialisation and the tensors it reads and writes."""

    spec: parallel.PostBackwardSpec
    num_tokens: int
    x: torch.Tensor
    residual: torch.Tensor
    post_layer_mix: torch.Tensor
    comb_res_mix: torch.Tensor
    d_o: torch.Tensor
    d_x: torch.Tensor
    d_residual: torch.Tensor
    d_post_layer_mix: torch.Tensor
    d_comb_res_mix: torch.Tensor


def _check_streams(residual) -> tuple[int, int, int, int]:
    """``(B, S, n, H)`` of a bf16 4-D ``residual`` with ``H >= 1``."""
    check_tensor(residual, "residual", dtype=torch.bfloat16, dim=4)
    batch, seq, n, hidden = residual.shape
    check_int(n, "residual.size(2) (the stream count n)", 1)
    check_int(hidden, "residual.size(3) (the hidden size H)", 1)
    return batch, seq, n, hidden


def _check_mixes(x, residual, post_layer_mix, comb_res_mix) -> None:
    batch, seq, n, hidden = residual.shape
    device = residual.device
    check_tensor(x, "x", dtype=torch.bfloat16, shape=(batch, seq, hidden), device=device, contiguous=True)
    check_tensor(post_layer_mix, "post_layer_mix", dtype=torch.float32, shape=(batch, seq, n, 1), device=device,
                 contiguous=True)
    check_tensor(comb_res_mix, "comb_res_mix", dtype=torch.float32, shape=(batch, seq, n, n), device=device,
                 contiguous=True)
    check_kernel_extent(residual, "residual")


def _prepare_fwd(x, residual, post_layer_mix, comb_res_mix, out, target, flavor) -> tuple[str, PostForwardCall]:
    batch, seq, n, hidden = _check_streams(residual)
    if n > parallel.MAX_FORWARD_MHC_MULT:
        raise ValueError(f"mhc_post_fwd: residual.size(2) (the stream count n) must be at most "
                         f"{parallel.MAX_FORWARD_MHC_MULT}, got {n}")
    _check_mixes(x, residual, post_layer_mix, comb_res_mix)
    target = resolve_target(residual, target)
    resolve_flavor(target, flavor)
    inputs = {"x": x, "residual": residual, "post_layer_mix": post_layer_mix, "comb_res_mix": comb_res_mix}
    if out is not None:
        check_tensor(out, "out", dtype=torch.bfloat16, shape=tuple(residual.shape), device=residual.device,
                     contiguous=True)
        check_disjoint({"out": out}, inputs)
    else:
        out = torch.empty(residual.shape, dtype=torch.bfloat16, device=residual.device)
    spec = parallel.PostForwardSpec(n, hidden)
    return target, PostForwardCall(spec, batch * seq, x, residual.contiguous(), post_layer_mix, comb_res_mix, out)


def _run_fwd(x, residual, post_layer_mix, comb_res_mix, *, out, target, flavor, launch):
    target, call = _prepare_fwd(x, residual, post_layer_mix, comb_res_mix, out and out[0], target, flavor)
    if launch and target == "torch":
        call.out.copy_(reference.mhc_post_fwd(call.x, call.residual, call.post_layer_mix, call.comb_res_mix))
    elif launch:
        parallel.launch_fwd(call, target)
    return call.out


def _prepare_bwd(x, residual, post_layer_mix, comb_res_mix, d_o, target, flavor) -> tuple[str, PostBackwardCall]:
    batch, seq, n, hidden = _check_streams(residual)
    check_mhc_mult(n, "residual.size(2) (the stream count n)", "mhc_post_bwd")
    _check_mixes(x, residual, post_layer_mix, comb_res_mix)
    check_tensor(d_o, "d_o", dtype=torch.bfloat16, shape=tuple(residual.shape), device=residual.device)
    target = resolve_target(residual, target)
    resolve_flavor(target, flavor)
    device = residual.device
    call = PostBackwardCall(
        parallel.PostBackwardSpec(n, hidden), batch * seq, x, residual.contiguous(), post_layer_mix, comb_res_mix,
        d_o.contiguous(),
        d_x=torch.empty(x.shape, dtype=torch.bfloat16, device=device),
        d_residual=torch.empty(residual.shape, dtype=torch.bfloat16, device=device),
        d_post_layer_mix=torch.empty(post_layer_mix.shape, dtype=torch.float32, device=device),
        d_comb_res_mix=torch.empty(comb_res_mix.shape, dtype=torch.float32, device=device))
    return target, call


def _run_bwd(x, residual, post_layer_mix, comb_res_mix, d_o, *, out, target, flavor, launch):
    target, call = _prepare_bwd(x, residual, post_layer_mix, comb_res_mix, d_o, target, flavor)
    outputs = (call.d_x, call.d_residual, call.d_post_layer_mix, call.d_comb_res_mix)
    if launch and target == "torch":
        for buffer, value in zip(outputs, reference.mhc_post_bwd(call.x, call.residual, call.post_layer_mix,
                                                                 call.comb_res_mix, call.d_o), strict=True):
            buffer.copy_(value)
    elif launch:
        parallel.launch_bwd(call, target)
    return outputs


_MIXES = (Param("x", "Tensor"), Param("residual", "Tensor"), Param("post_layer_mix", "Tensor"),
          Param("comb_res_mix", "Tensor"))

# Also multilayer_recompute's (the post chain).
SUPPORT = support(ascend_sim="bit-exact against the reference")


def _inputs(shape, n: int, seed: int) -> dict:
    # Unnormalised randn mixes, as TileKernels' tests draw them; shape (B, S) = (tokens, 1).
    tokens, hidden = shape
    return {
        "x": randn((tokens, 1, hidden), seed, torch.bfloat16),
        "residual": randn((tokens, 1, n, hidden), seed + 1, torch.bfloat16),
        "post_layer_mix": randn((tokens, 1, n, 1), seed + 2),
        "comb_res_mix": randn((tokens, 1, n, n), seed + 3),
    }


MHC_POST_FWD = KernelOp(
    "mhc_post_fwd", _MIXES, ("out",), _run_fwd, outs=("out",),
    command=Command(
        summary="the next widened residual: post[o] * x + sum_i comb[i, o] * residual[i], bf16",
        support=SUPPORT, default_shape=(1024, 4096), bench_shapes=RESIDUAL_SHAPES,
        options=(Option("mhc_mult", MHC_MULT, tuple(range(1, 9)), "residual streams n"),),
        make_inputs=lambda shape, options, seed: _inputs(shape, options["mhc_mult"], seed),
        kernels=lambda options, target, flavor: [
            (parallel.build_post_fwd, parallel.PostForwardSpec(options["mhc_mult"], SOURCE_HIDDEN))]))


def _bwd_inputs(shape, options, seed):
    inputs = _inputs(shape, MHC_MULT, seed)
    inputs["d_o"] = randn(tuple(inputs["residual"].shape), seed + 4, torch.bfloat16)
    return inputs


MHC_POST_BWD = KernelOp(
    "mhc_post_bwd", (*_MIXES, Param("d_o", "Tensor")), ("d_x", "d_residual", "d_post_layer_mix", "d_comb_res_mix"),
    _run_bwd,
    command=Command(
        summary="gradients of mhc_post_fwd: d_x, d_residual (bf16), d_post_layer_mix, d_comb_res_mix (fp32)",
        support=SUPPORT, default_shape=(1024, 4096), bench_shapes=RESIDUAL_SHAPES, make_inputs=_bwd_inputs,
        kernels=lambda options, target, flavor: [
            (parallel.build_post_bwd, parallel.PostBackwardSpec(MHC_MULT, SOURCE_HIDDEN))]))


def mhc_post_fwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
                 out: torch.Tensor | None = None, *, target: str | None = None,
                 flavor: str | None = None) -> torch.Tensor:
    """The next layer's widened residual: ``out[o] = post[o] · x + Σ_i comb[i, o] · res[i]``.

    Per token and hidden column, with ``n`` streams (note the transposed use of ``comb``: the sum
    runs over its first index, the input stream ``i``; the second is the output stream ``o``):
    ``acc = post[o] · f32(x)`` (a rounded product), then ``acc = fma(comb[i, o], f32(res[i]), acc)``
    for ``i = 0, 1, ..., n - 1`` (one rounding each), and ``out[o] = bf16(acc)`` (round to nearest
    even). Both flavors and every target compute this same chain, so the kernels equal the
    reference bit for bit.

    Non-finite values propagate as in IEEE arithmetic, column by column: a NaN or ±inf in ``x`` or
    ``res[i]`` at column ``h`` reaches ``out[·, h]`` only, one in ``post[o]`` or ``comb[i, o]``
    reaches the whole row ``out[o]`` of its token (``0 · inf`` is NaN). A NaN output is a quiet
    NaN of unspecified sign and payload.

    Args:
        x: The sublayer output, bf16 ``(B, S, H)``, contiguous.
        residual: The widened residual stream, bf16 ``(B, S, n, H)`` (4-D), ``1 <= n <= 8``,
            ``H >= 1``, any strides (copied to contiguous when it is not).
        post_layer_mix: fp32 ``(B, S, n, 1)``, contiguous: the weight of ``x`` in each stream.
        comb_res_mix: fp32 ``(B, S, n, n)``, contiguous: ``comb[i, o]``, the weight of input stream
            ``i`` in output stream ``o``.
        out: Optional bf16 ``(B, S, n, H)`` contiguous output; must not share memory with an input.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``residual``.
        flavor: Bit conventions (see ``vmi_core.targets``). Both flavors give the same bits here.

    Returns:
        ``out``: the given tensor, written, or a new contiguous bf16 ``(B, S, n, H)`` tensor
        (empty when ``B · S == 0``: no kernel runs).

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype (``x``, ``residual``
            and ``out`` bf16; ``post_layer_mix`` and ``comb_res_mix`` fp32).
        ValueError: ``residual`` is not 4-D, has ``n`` outside ``[1, 8]`` or ``H == 0``, or is too
            large for 32-bit kernel offsets; another tensor has the wrong shape, is not contiguous
            or is on another device; ``out`` shares memory with an input.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return MHC_POST_FWD(x, residual, post_layer_mix, comb_res_mix, out=None if out is None else (out,),
                        target=target, flavor=flavor)


mhc_post_fwd_parallel = parallel_entry(mhc_post_fwd, "residual")


def mhc_post_bwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
                 d_o: torch.Tensor, *, target: str | None = None, flavor: str | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of ``mhc_post_fwd`` with respect to its four inputs, given ``d_o = ∂L/∂out``.

    Per token, with ``n = 4`` streams and every step one fp32 operation rounded to nearest even:

    * ``d_x = Σ_o post[o] · d_o[o]`` and ``d_res[i] = Σ_o comb[i, o] · d_o[o]``, per column: the
      product of the ``o = 0`` term, then a fused multiply-add per ``o = 1, 2, 3``; rounded to bf16;
    * ``d_post[o] = Σ_h d_o[o, h] · x[h]`` and ``d_comb[i, o] = Σ_h res[i, h] · d_o[o, h]``, fp32
      sums over the hidden columns in vmi's fixed 64-lane order with fused products
      (``vmi_core.sums.lane_sum_fused``): lane ``l`` adds columns ``l, l + 64, ...`` from +0.0,
      then the 64 partials are folded pairwise. A token's sums are made by one worker, so every
      target, worker and thread count gives the reference's bits.

    The gradients are those of the exact formula (not of the forward's bf16 rounding). Non-finite
    values propagate as in IEEE arithmetic: a NaN or ±inf in ``d_o[o]`` at column ``h`` reaches
    ``d_x`` and ``d_residual`` at column ``h`` and the token's ``d_post[o]`` and ``d_comb[·, o]``;
    one in ``x`` or ``res[i]`` reaches only ``d_post`` or ``d_comb[i, ·]`` of its token; one in a
    mix reaches whole rows of ``d_x`` or ``d_residual``. NaN signs and payloads are unspecified.

    Args:
        x: The forward's sublayer output, bf16 ``(B, S, H)``, contiguous.
        residual: The forward's residual, bf16 ``(B, S, 4, H)`` (4-D), ``H >= 1``, any strides.
        post_layer_mix: The forward's fp32 ``(B, S, 4, 1)``, contiguous.
        comb_res_mix: The forward's fp32 ``(B, S, 4, 4)``, contiguous.
        d_o: The gradient of the forward's output, bf16 ``(B, S, 4, H)``, any strides.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``residual``.
        flavor: Bit conventions (see ``vmi_core.targets``). Both flavors give the same bits here.

    Returns:
        d_x: New bf16 ``(B, S, H)``.
        d_residual: New bf16 ``(B, S, 4, H)``.
        d_post_layer_mix: New fp32 ``(B, S, 4, 1)``.
        d_comb_res_mix: New fp32 ``(B, S, 4, 4)``.
        All contiguous; empty when ``B · S == 0`` (no kernel runs).

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype (``x``, ``residual``
            and ``d_o`` bf16; ``post_layer_mix`` and ``comb_res_mix`` fp32).
        ValueError: ``residual`` is not 4-D, has ``n != 4`` (the kernel is specialised on 4
            streams) or ``H == 0``, or is too large for 32-bit kernel offsets; another tensor has
            the wrong shape, is not contiguous where required or is on another device.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return MHC_POST_BWD(x, residual, post_layer_mix, comb_res_mix, d_o, target=target, flavor=flavor)


mhc_post_bwd_parallel = parallel_entry(mhc_post_bwd, "residual")
