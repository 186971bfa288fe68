"""``pre_big_fuse``: public dispatch of the inference fusion of ``pre`` (validation, allocation,
backend choice).

One call replaces the chain ``mhc_reduce_partials_and_rmsnorm_fwd`` → ``mhc_pre_split_mixes_fwd`` →
``mhc_sinkhorn_fwd`` → ``mhc_pre_apply_mix_fwd`` of a sublayer's ``pre`` when no gradient is needed
(spec §3.7): from the prenorm GEMM's split-K partials and the residual it writes the post mix, the
Sinkhorn-normalised comb mix and the sublayer input; the pre mix stays on chip. Names and parameters
follow TileKernels v2's kernel level; ``target`` and ``flavor`` are vmi's additions (see
vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import INT32_MAX, check_disjoint, check_in_place, check_int, check_kernel_extent, check_tensor
from vmi_core.library import Command, KernelOp, Param, parallel_entry, support
from vmi_core.rstd import MAX_HIDDEN
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import generator

from ..inputs import MHC_MULT, check_mhc_mult, check_rms_eps, finite_fp32, mix_width, post_mult_fp32
from ..kernels import pre_big_fuse as parallel
from ..kernels.norm_fn import MAX_SPLITS
from ..reference import pre_big_fuse as reference
from .demo import MIX, NORM_EPS, POST_MULT, SOURCE_HIDDEN, SPLITS_OPTIONS, partials, streams

_OP = "mhc_pre_big_fuse_fwd"


@dataclass
class PreBigFuseCall:
    """A validated call: the kernel specialisation, the tensors it reads and writes and the runtime
    scalars (fp32 values)."""

    spec: parallel.PreBigFuseSpec
    gemm_out_mul: torch.Tensor
    gemm_out_sqrsum: torch.Tensor
    mhc_scale: torch.Tensor
    mhc_base: torch.Tensor
    residual: torch.Tensor
    post_mix: torch.Tensor
    comb_mix: torch.Tensor
    layer_input: torch.Tensor
    mhc_pre_eps: float
    mhc_sinkhorn_eps: float
    mhc_post_mult_value: float
    sinkhorn_repeat: int


def _check_residual(residual) -> tuple[int, int, int]:
    check_tensor(residual, "residual", dtype=torch.bfloat16, dim=3)
    num_tokens, n, hidden = residual.shape
    check_mhc_mult(n, "residual.size(1) (n)", _OP)
    if not 1 <= n * hidden <= MAX_HIDDEN:
        raise ValueError(f"residual must have 1 <= n·H <= {MAX_HIDDEN} values a token (the RMS group), got "
                         f"shape {tuple(residual.shape)}")
    check_tensor(residual, "residual", contiguous=True)
    check_kernel_extent(residual, "residual")
    return num_tokens, n, hidden


def _check_partials(gemm_out_mul, gemm_out_sqrsum, n_splits, num_tokens: int, n: int, device) -> int:
    splits = check_int(n_splits, "n_splits", 1, MAX_SPLITS)
    check_tensor(gemm_out_mul, "gemm_out_mul", dtype=torch.float32, shape=(None, num_tokens, mix_width(n)),
                 device=device, contiguous=True)
    if gemm_out_mul.shape[0] != splits:
        raise ValueError(f"gemm_out_mul must hold n_splits = {splits} partials, got {gemm_out_mul.shape[0]}")
    check_kernel_extent(gemm_out_mul, "gemm_out_mul")
    check_tensor(gemm_out_sqrsum, "gemm_out_sqrsum", dtype=torch.float32, shape=(splits, num_tokens), device=device,
                 contiguous=True)
    return splits


def _output(t, name: str, shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    if t is None:
        return torch.empty(shape, dtype=dtype, device=device)
    check_tensor(t, name, dtype=dtype, shape=shape, device=device, contiguous=True)
    return check_in_place(t, name, _OP)


def _run(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, rms_eps, mhc_pre_eps, mhc_sinkhorn_eps,
         mhc_post_mult_value, sinkhorn_repeat, n_splits, *, out, target, flavor, launch):
    num_tokens, n, hidden = _check_residual(residual)
    device = residual.device
    _check_partials(gemm_out_mul, gemm_out_sqrsum, n_splits, num_tokens, n, device)
    check_tensor(mhc_scale, "mhc_scale", dtype=torch.float32, shape=(3,), device=device, contiguous=True)
    check_tensor(mhc_base, "mhc_base", dtype=torch.float32, shape=(mix_width(n),), device=device, contiguous=True)
    rms_eps = check_rms_eps(rms_eps)
    pre_eps = finite_fp32(mhc_pre_eps, "mhc_pre_eps")
    sinkhorn_eps = finite_fp32(mhc_sinkhorn_eps, "mhc_sinkhorn_eps", non_negative=True)
    post_mult = post_mult_fp32(mhc_post_mult_value)
    repeat = check_int(sinkhorn_repeat, "sinkhorn_repeat", 1, INT32_MAX)
    given = out or (None, None, None)
    post_mix = _output(given[0], "post_mix", (num_tokens, n), torch.float32, device)
    comb_mix = _output(given[1], "comb_mix", (num_tokens, n * n), torch.float32, device)
    layer_input = _output(given[2], "layer_input", (num_tokens, hidden), torch.bfloat16, device)
    check_disjoint({"post_mix": given[0], "comb_mix": given[1], "layer_input": given[2]},
                   {"gemm_out_mul": gemm_out_mul, "gemm_out_sqrsum": gemm_out_sqrsum, "mhc_scale": mhc_scale,
                    "mhc_base": mhc_base, "residual": residual})
    target = resolve_target(residual, target)
    flavor = resolve_flavor(target, flavor)
    if launch and target == "torch":
        expected = reference.pre_big_fuse_fwd(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, rms_eps,
                                              pre_eps, sinkhorn_eps, post_mult, repeat, flavor)
        for dst, src in zip((post_mix, comb_mix, layer_input), expected, strict=True):
            dst.copy_(src)
    elif launch and num_tokens:
        spec = parallel.PreBigFuseSpec(n * hidden, rms_eps, flavor.name)
        parallel.launch(PreBigFuseCall(spec, gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post_mix,
                                       comb_mix, layer_input, pre_eps, sinkhorn_eps, post_mult, repeat), target)
    return post_mix, comb_mix, layer_input


# TileKernels' benchmark sizes, and a decode-size batch (shape: tokens, hidden H; 4 streams).
_SHAPES = ((8192, 4096), (8192, 7168), (512, 4096), (16, 4096))


def _inputs(shape, options, seed):
    out_mul, sqrsums = partials(shape, options["n_splits"], seed)
    g = generator(seed + 1)
    return {"gemm_out_mul": out_mul[:, :, 0], "gemm_out_sqrsum": sqrsums[:, :, 0],
            "mhc_scale": torch.randn(3, generator=g) * 0.1, "mhc_base": torch.randn(MIX, generator=g) * 0.1,
            "residual": streams(shape, MHC_MULT, seed + 2)}


def _arguments(inputs, options, flavor):
    # TileKernels' test values (v1 test_pre_big_fuse; the post multiplier of the split tests).
    return {"rms_eps": NORM_EPS, "mhc_pre_eps": 1e-6, "mhc_sinkhorn_eps": 1e-6, "mhc_post_mult_value": POST_MULT,
            "sinkhorn_repeat": 10}


MHC_PRE_BIG_FUSE_FWD = KernelOp(
    _OP,
    (Param("gemm_out_mul", "Tensor"), Param("gemm_out_sqrsum", "Tensor"), Param("mhc_scale", "Tensor"),
     Param("mhc_base", "Tensor"), Param("residual", "Tensor"), Param("rms_eps", "float"),
     Param("mhc_pre_eps", "float"), Param("mhc_sinkhorn_eps", "float"), Param("mhc_post_mult_value", "float"),
     Param("sinkhorn_repeat", "int"), Param("n_splits", "int", default=16)),
    ("post_mix", "comb_mix", "layer_input"), _run, outs=("post_mix", "comb_mix", "layer_input"),
    command=Command(
        summary="inference pre in one kernel: reduce + RMS, split, Sinkhorn, pre mix applied (the pre mix "
                "stays on chip; bit-exact to the unfused chain)",
        support=support(cpu="bit-exact against the reference (= the unfused chain) in both flavors"),
        default_shape=(4096, 4096), bench_shapes=_SHAPES, options=SPLITS_OPTIONS, make_inputs=_inputs,
        kernels=lambda options, target, flavor: [
            (parallel.build_pre_big_fuse, parallel.PreBigFuseSpec(MHC_MULT * SOURCE_HIDDEN, NORM_EPS, flavor))],
        arguments=_arguments))


def _given(*outputs):
    """The outputs for the op's ``out``: None when none is given (the op allocates them all)."""
    return None if all(t is None for t in outputs) else outputs


def mhc_pre_big_fuse_fwd(gemm_out_mul: torch.Tensor, gemm_out_sqrsum: torch.Tensor, mhc_scale: torch.Tensor,
                         mhc_base: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor | None,
                         comb_mix: torch.Tensor | None, layer_input: torch.Tensor | None, rms_eps: float,
                         mhc_pre_eps: float, mhc_sinkhorn_eps: float, mhc_post_mult_value: float,
                         sinkhorn_repeat: int, n_splits: int = 16, *, target: str | None = None,
                         flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inference ``pre`` of one sublayer from the prenorm GEMM's split-K partials, in one kernel.

    Per token ``t`` (``n = 4`` streams, ``K = n·H``), bit for bit the chain of the unfused ops on
    the same target and flavor (spec §5.1), each stage's arithmetic as its op documents it:

    * ``mhc_reduce_partials_and_rmsnorm_fwd`` with ``rms_group_size = K``: the partials summed
      over the splits in order from +0.0, ``mix = out_mul · r``, ``r = 1 / sqrt(sq · f32(1/K) +
      eps)`` (``ascend`` flavor) or ``1 / sqrt(sq / K + eps)`` (``cuda``);
    * ``mhc_pre_split_mixes_fwd``: ``z = fl(fl(mix · g) + b)``; ``pre = σ(z) + pre_eps``,
      ``post_mix = σ(z) · post_mult``, the comb logits ``z``;
    * ``mhc_sinkhorn_fwd``: ``comb_mix`` = the Sinkhorn projection of the 4x4 comb logits
      (softmax over rows, ``+ eps``, ``2·repeat - 1`` alternating column and row normalisations);
    * ``mhc_pre_apply_mix_fwd``: ``layer_input = bf16(Σ_m pre[m] · f32(residual[t, m]))``.

    The pre mix is not an output (it never leaves the chip). Non-finite values propagate as in
    those ops (IEEE arithmetic per stage); the sign and payload of a NaN output are not specified.
    There is no backward (inference only).

    Assumptions (the spec leaves them open): ``n_splits`` is the count of partials in
    ``gemm_out_mul`` and may be 1 to 64 on every target (TileKernels' Ascend kernel takes only 1);
    any ``H >= 1`` (tails handled in the kernel; TileKernels' Ascend kernel needs ``H % 64 == 0``)
    and any token count; the outputs may be None (allocated), as in vmi's unfused ops;
    ``mhc_scale`` holds the (pre, post, comb) gains and ``mhc_base`` the 24 biases.

    Args:
        gemm_out_mul: fp32 ``(S, T, 24)`` contiguous split-K partials of ``x · fn_effᵀ``.
        gemm_out_sqrsum: fp32 ``(S, T)`` contiguous split-K partials of ``Σ x²``.
        mhc_scale: fp32 ``(3,)`` contiguous gains.
        mhc_base: fp32 ``(24,)`` contiguous biases.
        residual: bf16 ``(T, n, H)`` contiguous residual streams; ``n`` must be 4 (the split and the
            Sinkhorn are specialised on 4 streams), ``1 <= n·H <= 2^24``.
        post_mix: Output, fp32 ``(T, n)`` contiguous, written; None allocates it.
        comb_mix: Output, fp32 ``(T, n²)`` contiguous (row-major ``n x n``), written; None
            allocates it.
        layer_input: Output, bf16 ``(T, H)`` contiguous, written; None allocates it. The outputs
            must not share memory with each other or with an input.
        rms_eps: The epsilon added to the mean square, finite and ``>= 0`` (rounded to fp32).
        mhc_pre_eps: The pre floor, finite as fp32.
        mhc_sinkhorn_eps: The Sinkhorn epsilon, ``>= 0`` and finite as fp32.
        mhc_post_mult_value: The post multiplier: 0 or a normal fp32 number, as
            ``mhc_pre_split_mixes_fwd`` takes it.
        sinkhorn_repeat: Sinkhorn iterations, ``>= 1``.
        n_splits: ``S``, ``1 <= S <= 64``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            residual.
        flavor: Bit conventions (see ``vmi_core.targets``).

    Returns:
        ``(post_mix, comb_mix, layer_input)``: the given outputs, written (or new ones where None
        was given). ``T = 0``: nothing runs.

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype; a scalar is not a
            real number (``sinkhorn_repeat``, ``n_splits``: not an int).
        ValueError: Before any kernel: ``residual`` is not 3-D or not contiguous, its ``size(1)``
            is not 4 or ``n·H`` is outside ``[1, 2^24]``; another tensor has the wrong shape,
            strides or device; ``gemm_out_mul`` does not hold ``n_splits`` partials; ``n_splits``
            outside ``[1, 64]``; ``sinkhorn_repeat < 1``; ``rms_eps`` or ``mhc_sinkhorn_eps``
            negative; a scalar not finite as fp32; ``mhc_post_mult_value`` a nonzero value below
            2^-126 in magnitude; an output shares memory with an input or another output; a tensor
            is too large for 32-bit kernel offsets.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        RuntimeError: Grad mode is on and a given output requires grad.
    """
    return MHC_PRE_BIG_FUSE_FWD(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, rms_eps, mhc_pre_eps,
                                mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat, n_splits,
                                out=_given(post_mix, comb_mix, layer_input), target=target, flavor=flavor)


mhc_pre_big_fuse_fwd_parallel = parallel_entry(mhc_pre_big_fuse_fwd, "residual")
