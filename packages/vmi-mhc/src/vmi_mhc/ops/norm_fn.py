"""``norm_fn`` stages A, A', C and D: public dispatch (validation, allocation, backend choice).

``norm_fn`` maps the flattened residual ``x`` (``K = n·H`` values a token) to the mix vector
``(x · fn_effᵀ) · r``, ``r = (Σx² / K + eps)^−½`` (spec §3.4). The GEMM stages (B, E) produce and
consume split-K partials; this module has the stages around them:

* A  ``mhc_fn_normw_merge_fwd``: ``fn_eff = fn ⊙ normw``;
* A' ``mhc_fn_normw_merge_bwd``: ``fn_grad += g ⊙ normw``, ``normw_grad += Σ_rows g ⊙ fn``;
* C  ``mhc_reduce_partials_and_rmsnorm_fwd``: sum of the partials, RMS scale;
* D  ``mhc_reduce_partials_and_rmsnorm_bwd``: its backward.

Names and parameters follow TileKernels v2 (the kernel-level API writes the given outputs; the
functions also return them); ``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
Each function is one torch custom op (``torch.ops.vmi.<name>``; the ops with outputs also have an
``.out`` overload, and the ops allocate the outputs when called without them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_disjoint, check_in_place, check_int, check_kernel_extent, check_tensor, mark_written
from vmi_core.library import Command, KernelOp, Param, parallel_entry, support
from vmi_core.rstd import MAX_HIDDEN
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import generator

from ..inputs import check_rms_eps
from ..kernels import norm_fn as parallel
from ..reference import norm_fn as reference
from .demo import MIX, NORM_EPS, SPLITS_OPTIONS, group_size, partials


@dataclass
class MergeFwdCall:
    """A validated merge forward: the kernel specialisation and the tensors it reads and writes."""

    spec: parallel.MergeSpec
    fn: torch.Tensor
    normw: torch.Tensor
    out_fn: torch.Tensor


@dataclass
class MergeBwdCall:
    """A validated merge backward: the kernel specialisation and the tensors it reads and writes."""

    spec: parallel.MergeSpec
    fn: torch.Tensor
    normw: torch.Tensor
    out_fn_grad: torch.Tensor
    fn_grad: torch.Tensor
    normw_grad: torch.Tensor


@dataclass
class ReduceFwdCall:
    """A validated reduce forward: the kernel specialisation and the tensors it reads and writes."""

    spec: parallel.ReduceSpec
    out_mul_splitted: torch.Tensor
    sqrsum_splitted: torch.Tensor
    out_mul: torch.Tensor
    sqrsum: torch.Tensor
    out: torch.Tensor


@dataclass
class ReduceBwdCall:
    """A validated reduce backward: the kernel specialisation and the tensors it reads and writes."""

    spec: parallel.ReduceSpec
    out_grad: torch.Tensor
    out_mul: torch.Tensor
    sqrsum: torch.Tensor
    out_mul_grad: torch.Tensor
    sqrsum_grad: torch.Tensor


def _f32(t, name: str, shape: tuple, device=None) -> torch.Tensor:
    check_tensor(t, name, dtype=torch.float32, shape=shape, device=device, contiguous=True)
    return check_kernel_extent(t, name)


def _output(given, name: str, shape: tuple, device) -> torch.Tensor:
    if given is None:
        return torch.empty(shape, dtype=torch.float32, device=device)
    return _f32(given, name, shape, device)


def _check_fn(fn, name: str = "fn") -> tuple[int, int]:
    _f32(fn, name, (None, None))
    rows, cols = fn.shape
    if not 1 <= rows <= parallel.MAX_MIX:
        raise ValueError(f"{name} must have 1 to {parallel.MAX_MIX} rows (n3 = n·(n+2) mix entries), got {rows}")
    return rows, cols


def _check_group(rms_group_size, rms_eps) -> tuple[int, float]:
    group_size = check_int(rms_group_size, "rms_group_size", 1, MAX_HIDDEN)
    return group_size, check_rms_eps(rms_eps)


def _check_mix(mix: int, name: str) -> int:
    if not 1 <= mix <= parallel.MAX_MIX:
        raise ValueError(f"{name} must have 1 to {parallel.MAX_MIX} mix entries (n3) in its last dimension, "
                         f"got {mix}")
    return mix


def _check_single_group(groups: int, name: str) -> None:
    if groups != 1:
        raise ValueError(f"{name}: only one RMS group per token is supported (n_rms_group = 1), got {groups}")


# --- A: merge forward ---

def _run_merge_fwd(fn, normw, *, out, target, flavor, launch):
    rows, cols = _check_fn(fn)
    device = fn.device
    _f32(normw, "normw", (cols,), device)
    target = resolve_target(fn, target)
    resolve_flavor(target, flavor)
    given = out and out[0]
    out_fn = _output(given, "out_fn", (rows, cols), device)
    check_disjoint({"out_fn": given}, {"fn": fn, "normw": normw})
    if launch and target == "torch":
        out_fn.copy_(reference.fn_normw_merge_fwd(fn, normw))
    elif launch and cols:
        parallel.launch_merge_fwd(MergeFwdCall(parallel.MergeSpec(rows), fn, normw, out_fn), target)
    return out_fn


# The merge stages use the hidden size only (fn is (24, K)); the reduce stages take (tokens, hidden).
_MERGE_SHAPES = ((1, 1280), (1, 4096), (1, 7168))
_DEFAULT_SHAPE = (4096, 4096)
_BENCH_SHAPES = ((8192, 4096), (8192, 7168), (4096, 1280), (16, 7168))


def _merge_inputs(shape, options, seed):
    g = generator(seed)
    k = group_size(shape)
    return {"fn": torch.randn(MIX, k, generator=g) * 1e-4, "normw": torch.randn(k, generator=g) * 0.1 + 1,
            "out_fn_grad": torch.randn(MIX, k, generator=g), "fn_grad": torch.randn(MIX, k, generator=g),
            "normw_grad": torch.randn(k, generator=g)}


def _merge_fwd_inputs(shape, options, seed):
    inputs = _merge_inputs(shape, options, seed)
    return {"fn": inputs["fn"], "normw": inputs["normw"]}


MHC_FN_NORMW_MERGE_FWD = KernelOp(
    "mhc_fn_normw_merge_fwd", (Param("fn", "Tensor"), Param("normw", "Tensor")), ("out_fn",), _run_merge_fwd,
    outs=("out_fn",),
    command=Command(
        summary="norm_fn stage A: merge the RMSNorm weight into the mix projection, fn · normw",
        support=support(), default_shape=(1, 7168), bench_shapes=_MERGE_SHAPES, make_inputs=_merge_fwd_inputs,
        kernels=lambda options, target, flavor: [(parallel.build_merge_fwd, parallel.MergeSpec(MIX))]))


def mhc_fn_normw_merge_fwd(fn: torch.Tensor, normw: torch.Tensor, out_fn: torch.Tensor | None, *,
                           target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """Merge the RMSNorm weight into the mix projection: ``out_fn[j, k] = fn[j, k] · normw[k]``.

    One fp32 multiplication per element (correctly rounded, so every target gives the same
    bits). Non-finite values propagate as IEEE multiplication does (``0 · inf`` is NaN).

    Args:
        fn: fp32 ``(m, K)`` contiguous, ``1 <= m <= 32`` (``m = n3``; any ``K``).
        normw: fp32 ``(K,)`` contiguous, on fn's device.
        out_fn: fp32 ``(m, K)`` contiguous output on fn's device, sharing no memory with the
            inputs; None allocates it.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``fn``.
        flavor: Bit conventions (see ``vmi_core.targets``); the result does not depend on it.

    Returns:
        out_fn, written.

    Raises:
        TypeError: A tensor argument is not a tensor or not fp32.
        ValueError: A tensor has the wrong shape, is not contiguous, is on another device or is too
            large for 32-bit kernel offsets; ``fn`` has more than 32 rows; ``out_fn`` shares memory
            with an input; ``target`` or ``flavor`` is unknown or does not fit the device.
    """
    return MHC_FN_NORMW_MERGE_FWD(fn, normw, out=(out_fn,), target=target, flavor=flavor)


mhc_fn_normw_merge_fwd_parallel = parallel_entry(mhc_fn_normw_merge_fwd, "fn")


# --- A': merge backward ---

def _run_merge_bwd(fn, normw, out_fn_grad, fn_grad, normw_grad, *, out, target, flavor, launch):
    rows, cols = _check_fn(fn)
    device = fn.device
    _f32(normw, "normw", (cols,), device)
    _f32(out_fn_grad, "out_fn_grad", (rows, cols), device)
    _f32(fn_grad, "fn_grad", (rows, cols), device)
    _f32(normw_grad, "normw_grad", (cols,), device)
    check_disjoint({"fn_grad": fn_grad, "normw_grad": normw_grad},
                   {"fn": fn, "normw": normw, "out_fn_grad": out_fn_grad})
    check_in_place(fn_grad, "fn_grad", "mhc_fn_normw_merge_bwd")
    check_in_place(normw_grad, "normw_grad", "mhc_fn_normw_merge_bwd")
    target = resolve_target(fn, target)
    resolve_flavor(target, flavor)
    if launch and target == "torch":
        new_fn_grad, new_normw_grad = reference.fn_normw_merge_bwd(fn, normw, out_fn_grad, fn_grad, normw_grad)
        fn_grad.copy_(new_fn_grad)
        normw_grad.copy_(new_normw_grad)
    elif launch and cols:
        call = MergeBwdCall(parallel.MergeSpec(rows), fn, normw, out_fn_grad, fn_grad, normw_grad)
        parallel.launch_merge_bwd(call, target)
        mark_written(fn_grad)
        mark_written(normw_grad)


MHC_FN_NORMW_MERGE_BWD = KernelOp(
    "mhc_fn_normw_merge_bwd",
    (Param("fn", "Tensor"), Param("normw", "Tensor"), Param("out_fn_grad", "Tensor"),
     Param("fn_grad", "Tensor", mutable=True), Param("normw_grad", "Tensor", mutable=True)),
    (), _run_merge_bwd,
    command=Command(
        summary="norm_fn stage A': merge backward, accumulated into fn_grad and normw_grad (column-owned, "
                "fused multiply-adds in row order)",
        support=support(), default_shape=(1, 7168), bench_shapes=_MERGE_SHAPES, make_inputs=_merge_inputs,
        kernels=lambda options, target, flavor: [(parallel.build_merge_bwd, parallel.MergeSpec(MIX))]))


def mhc_fn_normw_merge_bwd(fn: torch.Tensor, normw: torch.Tensor, out_fn_grad: torch.Tensor, fn_grad: torch.Tensor,
                           normw_grad: torch.Tensor, *, target: str | None = None,
                           flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of the merge, accumulated into ``fn_grad`` and ``normw_grad`` in place.

    With ``g = out_fn_grad``: ``fn_grad[j, k] = fma(g[j, k], normw[k], fn_grad[j, k])`` and
    ``normw_grad[k] = fma(g[j, k], fn[j, k], normw_grad[k])`` chained over ``j = 0 .. m-1`` in
    order, starting from the incoming ``normw_grad`` (each product added with one rounding; a
    column belongs to one worker, so every target and worker count gives the same bits).
    ``fn`` is the merge forward's un-merged input. Non-finite values propagate as IEEE fused
    multiply-adds do.

    Args:
        fn: fp32 ``(m, K)`` contiguous, ``1 <= m <= 32``.
        normw: fp32 ``(K,)`` contiguous.
        out_fn_grad: fp32 ``(m, K)`` contiguous: the gradient of ``out_fn``.
        fn_grad: fp32 ``(m, K)`` contiguous accumulation buffer, updated in place.
        normw_grad: fp32 ``(K,)`` contiguous accumulation buffer, updated in place.
        target: As for ``mhc_fn_normw_merge_fwd``.
        flavor: As for ``mhc_fn_normw_merge_fwd``; the result does not depend on it.

    Returns:
        ``(fn_grad, normw_grad)``, updated.

    Raises:
        TypeError: A tensor argument is not a tensor or not fp32.
        ValueError: A tensor has the wrong shape, is not contiguous, is on another device or is too
            large for 32-bit kernel offsets; ``fn`` has more than 32 rows; ``fn_grad`` or
            ``normw_grad`` shares memory with the other or with an input; ``target`` or ``flavor``
            is unknown or does not fit the device.
        RuntimeError: Grad mode is on and ``fn_grad`` or ``normw_grad`` requires grad.
    """
    MHC_FN_NORMW_MERGE_BWD(fn, normw, out_fn_grad, fn_grad, normw_grad, target=target, flavor=flavor)
    return fn_grad, normw_grad


mhc_fn_normw_merge_bwd_parallel = parallel_entry(mhc_fn_normw_merge_bwd, "fn")


# --- C: reduce the split-K partials and RMS-normalise ---

def _run_reduce_fwd(out_mul_splitted, sqrsum_splitted, rms_group_size, rms_eps, n_splits, *, out, target, flavor,
                    launch):
    # mhc_pre_norm_fn_gemm_fwd writes the partials without the group axis (DeepGEMM's shapes): G = 1.
    if isinstance(out_mul_splitted, torch.Tensor) and out_mul_splitted.dim() == 3:
        out_mul_splitted = out_mul_splitted.unsqueeze(2)
    if isinstance(sqrsum_splitted, torch.Tensor) and sqrsum_splitted.dim() == 2:
        sqrsum_splitted = sqrsum_splitted.unsqueeze(2)
    _f32(out_mul_splitted, "out_mul_splitted", (None, None, None, None))
    splits, tokens, groups, mix = out_mul_splitted.shape
    _check_single_group(groups, "out_mul_splitted")
    _check_mix(mix, "out_mul_splitted")
    device = out_mul_splitted.device
    n_splits = check_int(n_splits, "n_splits", 1, parallel.MAX_SPLITS)
    if splits != n_splits:
        raise ValueError(f"out_mul_splitted must hold n_splits = {n_splits} partials, got {splits}")
    _f32(sqrsum_splitted, "sqrsum_splitted", (splits, tokens, 1), device)
    group_size, eps = _check_group(rms_group_size, rms_eps)
    target = resolve_target(out_mul_splitted, target)
    flavor = resolve_flavor(target, flavor)
    given = out or (None, None, None)
    out_mul = _output(given[0], "out_mul", (tokens, 1, mix), device)
    sqrsum = _output(given[1], "sqrsum", (tokens, 1), device)
    out_t = _output(given[2], "out", (tokens, mix), device)
    check_disjoint({"out_mul": given[0], "sqrsum": given[1], "out": given[2]},
                   {"out_mul_splitted": out_mul_splitted, "sqrsum_splitted": sqrsum_splitted})
    if launch and target == "torch":
        results = reference.reduce_partials_and_rmsnorm_fwd(out_mul_splitted, sqrsum_splitted, group_size, eps,
                                                            flavor)
        for dst, src in zip((out_mul, sqrsum, out_t), results, strict=True):
            dst.copy_(src)
    elif launch and tokens:
        spec = parallel.ReduceSpec(mix, group_size, eps, flavor.name)
        call = ReduceFwdCall(spec, out_mul_splitted, sqrsum_splitted, out_mul, sqrsum, out_t)
        parallel.launch_reduce_fwd(call, target)
    return out_mul, sqrsum, out_t


def _reduce_fwd_inputs(shape, options, seed):
    out_mul, sqrsums = partials(shape, options["n_splits"], seed)
    # The hidden size is not in the partials' shapes: the group size comes with them.
    return {"out_mul_splitted": out_mul, "sqrsum_splitted": sqrsums, "rms_group_size": group_size(shape)}


def _reduce_kernels(build):
    """The kernel ``build`` specialised on the default shape's group size."""
    return lambda options, target, flavor: [
        (build, parallel.ReduceSpec(MIX, group_size(_DEFAULT_SHAPE), NORM_EPS, flavor))]


MHC_REDUCE_PARTIALS_AND_RMSNORM_FWD = KernelOp(
    "mhc_reduce_partials_and_rmsnorm_fwd",
    (Param("out_mul_splitted", "Tensor"), Param("sqrsum_splitted", "Tensor"), Param("rms_group_size", "int"),
     Param("rms_eps", "float"), Param("n_splits", "int")),
    ("out_mul", "sqrsum", "out"), _run_reduce_fwd, outs=("out_mul", "sqrsum", "out"),
    command=Command(
        summary="norm_fn stage C: sum the split-K partials of the prenorm GEMM, RMS scale (per-flavor rsqrt)",
        support=support(), default_shape=_DEFAULT_SHAPE, bench_shapes=_BENCH_SHAPES, options=SPLITS_OPTIONS,
        make_inputs=_reduce_fwd_inputs, kernels=_reduce_kernels(parallel.build_reduce_fwd),
        arguments=lambda inputs, options, flavor: {"rms_eps": NORM_EPS}))


def mhc_reduce_partials_and_rmsnorm_fwd(out_mul_splitted: torch.Tensor, sqrsum_splitted: torch.Tensor,
                                        out_mul: torch.Tensor | None, sqrsum: torch.Tensor | None,
                                        out: torch.Tensor | None, rms_group_size: int, rms_eps: float,
                                        n_splits: int, *, target: str | None = None, flavor: str | None = None
                                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sum the split-K partials of the prenorm GEMM and RMS-normalise (stage C).

    Per token ``t`` (fp32, every step one rounding):

    * ``out_mul[t, 0, j] = Σ_s out_mul_splitted[s, t, 0, j]`` and
      ``sqrsum[t, 0] = Σ_s sqrsum_splitted[s, t, 0]``, plain additions over ``s = 0 .. S-1`` in
      order, starting from +0.0;
    * ``r = 1 / sqrt(f32(f32(sqrsum · f32(1/K)) + f32(eps)))`` (``ascend`` flavor) or
      ``1 / sqrt(f32(f32(sqrsum / K) + f32(eps)))`` (``cuda`` flavor: TileKernels' CUDA kernel
      uses ``rsqrtf``, which is not correctly rounded; vmi takes the correctly rounded square root
      and division on every target, as ``vmi_core.rstd``'s cuda flavor does off the GPU),
      ``K = rms_group_size``;
    * ``out[t, j] = out_mul[t, 0, j] · r``.

    Non-finite partials propagate as IEEE arithmetic does; ``rms_eps = 0`` with a zero square
    sum gives ``r = inf`` and ``out`` NaN (``0 · inf``) or ``±inf``.

    Assumptions (the spec leaves them open): one RMS group per token (``n_rms_group = 1``, what the
    library uses); any mix width ``n3 <= 32`` (the kernel does not depend on ``n = 4``);
    ``1 <= n_splits <= 64``; ``eps`` is rounded to fp32 once.

    Args:
        out_mul_splitted: fp32 ``(S, T, 1, n3)`` contiguous partial products, ``1 <= n3 <= 32``,
            or ``(S, T, n3)`` as ``mhc_pre_norm_fn_gemm_fwd`` writes them.
        sqrsum_splitted: fp32 ``(S, T, 1)`` contiguous partial square sums, or ``(S, T)``.
        out_mul: fp32 ``(T, 1, n3)`` contiguous output (None allocates it).
        sqrsum: fp32 ``(T, 1)`` contiguous output (None allocates it).
        out: fp32 ``(T, n3)`` contiguous output, the mixes (None allocates it).
        rms_group_size: ``K = n·H``, the values each square sum has, ``1 <= K <= 2^24``.
        rms_eps: The epsilon added to the mean square, finite and ``>= 0``.
        n_splits: ``S``, ``1 <= S <= 64``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of the
            op's leading tensor.
        flavor: ``"ascend"`` or ``"cuda"``: the RMS scale's mean (see above). Only choosable on
            ``cpu`` and ``torch``; ``ascend``, ``ascend-sim`` and ``cuda`` use their own.

    Returns:
        ``(out_mul, sqrsum, out)``, written. ``T = 0``: nothing runs.

    Raises:
        TypeError: A tensor argument is not a tensor or not fp32; ``rms_group_size`` or ``n_splits``
            is not an int, ``rms_eps`` not a real number.
        ValueError: A tensor has the wrong shape, is not contiguous, is on another device or is too
            large for 32-bit kernel offsets; more than one RMS group; ``n3`` outside ``[1, 32]``;
            ``n_splits`` outside ``[1, 64]`` or not the partials' count; ``rms_group_size`` outside
            ``[1, 2^24]``; ``rms_eps`` negative or not finite; an output shares memory with another
            output or an input; ``target`` or ``flavor`` is unknown or does not fit the device.
    """
    return MHC_REDUCE_PARTIALS_AND_RMSNORM_FWD(out_mul_splitted, sqrsum_splitted, rms_group_size, rms_eps, n_splits,
                                               out=(out_mul, sqrsum, out), target=target, flavor=flavor)


mhc_reduce_partials_and_rmsnorm_fwd_parallel = parallel_entry(mhc_reduce_partials_and_rmsnorm_fwd, "out_mul_splitted")


# --- D: its backward ---

def _run_reduce_bwd(out_grad, out_mul, sqrsum, rms_group_size, rms_eps, *, out, target, flavor, launch):
    _f32(out_grad, "out_grad", (None, None))
    tokens, mix = out_grad.shape
    _check_mix(mix, "out_grad")
    device = out_grad.device
    _f32(out_mul, "out_mul", (tokens, None, mix), device)
    _check_single_group(out_mul.shape[1], "out_mul")
    _f32(sqrsum, "sqrsum", (tokens, 1), device)
    group_size, eps = _check_group(rms_group_size, rms_eps)
    target = resolve_target(out_grad, target)
    flavor = resolve_flavor(target, flavor)
    given = out or (None, None)
    out_mul_grad = _output(given[0], "out_mul_grad", (tokens, 1, mix), device)
    sqrsum_grad = _output(given[1], "sqrsum_grad", (tokens, 1), device)
    check_disjoint({"out_mul_grad": given[0], "sqrsum_grad": given[1]},
                   {"out_grad": out_grad, "out_mul": out_mul, "sqrsum": sqrsum})
    if launch and target == "torch":
        d_out_mul, d_sqrsum = reference.reduce_partials_and_rmsnorm_bwd(out_grad, out_mul, sqrsum, group_size, eps,
                                                                        flavor)
        out_mul_grad.copy_(d_out_mul)
        sqrsum_grad.copy_(d_sqrsum)
    elif launch and tokens:
        spec = parallel.ReduceSpec(mix, group_size, eps, flavor.name)
        call = ReduceBwdCall(spec, out_grad, out_mul, sqrsum, out_mul_grad, sqrsum_grad)
        parallel.launch_reduce_bwd(call, target)
    return out_mul_grad, sqrsum_grad


def _reduce_bwd_inputs(shape, options, seed):
    out_mul, sqrsums = partials(shape, 1, seed)
    return {"out_grad": torch.randn(shape[0], MIX, generator=generator(seed + 1)), "out_mul": out_mul[0],
            "sqrsum": sqrsums[0], "rms_group_size": group_size(shape)}


MHC_REDUCE_PARTIALS_AND_RMSNORM_BWD = KernelOp(
    "mhc_reduce_partials_and_rmsnorm_bwd",
    (Param("out_grad", "Tensor"), Param("out_mul", "Tensor"), Param("sqrsum", "Tensor"),
     Param("rms_group_size", "int"), Param("rms_eps", "float")),
    ("out_mul_grad", "sqrsum_grad"), _run_reduce_bwd, outs=("out_mul_grad", "sqrsum_grad"),
    command=Command(
        summary="norm_fn stage D: gradients of the reduced products and square sum from the mixes' gradient",
        support=support(), default_shape=_DEFAULT_SHAPE, bench_shapes=_BENCH_SHAPES,
        make_inputs=_reduce_bwd_inputs, kernels=_reduce_kernels(parallel.build_reduce_bwd),
        arguments=lambda inputs, options, flavor: {"rms_eps": NORM_EPS}))


def mhc_reduce_partials_and_rmsnorm_bwd(out_grad: torch.Tensor, out_mul: torch.Tensor, sqrsum: torch.Tensor,
                                        out_mul_grad: torch.Tensor | None, sqrsum_grad: torch.Tensor | None,
                                        rms_group_size: int, rms_eps: float, *, target: str | None = None,
                                        flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of stage C (stage D): the gradients of the reduced sums from the mixes' gradient.

    Per token, with ``g = out_grad[t]`` and ``r`` recomputed exactly as the forward computes it
    (same flavor, same bits):

    * ``out_mul_grad[t, 0, j] = g[j] · r``;
    * ``dot = fma(g[j], out_mul[t, 0, j], dot)`` over ``j = 0 .. n3-1`` in order from +0.0;
    * ``sqrsum_grad[t, 0] = ((dot · r) / (sqrsum + f32(eps·K))) / (−2)``, each step one fp32
      operation (``= −½ · r³ / K · dot``); the ``ascend`` flavor's divisions flush subnormal
      operands and quotients to signed zero, as the Ascend vector unit divides, the ``cuda``
      flavor's are IEEE.

    Non-finite inputs propagate as IEEE arithmetic does (a NaN or inf in a token's ``g`` or
    ``out_mul`` reaches its ``sqrsum_grad``).

    Assumptions: as for ``mhc_reduce_partials_and_rmsnorm_fwd``; ``eps·K`` is the Python product
    rounded to fp32 once.

    Args:
        out_grad: fp32 ``(T, n3)`` contiguous gradient of ``out``, ``1 <= n3 <= 32``.
        out_mul: fp32 ``(T, 1, n3)`` contiguous, the forward's ``out_mul``.
        sqrsum: fp32 ``(T, 1)`` contiguous, the forward's ``sqrsum``.
        out_mul_grad: fp32 ``(T, 1, n3)`` contiguous output (None allocates it).
        sqrsum_grad: fp32 ``(T, 1)`` contiguous output (None allocates it).
        rms_group_size: ``K``, as in the forward.
        rms_eps: As in the forward.
        target: As for ``mhc_reduce_partials_and_rmsnorm_fwd``.
        flavor: As for ``mhc_reduce_partials_and_rmsnorm_fwd`` (the RMS scale and the divisions).

    Returns:
        ``(out_mul_grad, sqrsum_grad)``, written. ``T = 0``: nothing runs.

    Raises:
        TypeError: A tensor argument is not a tensor or not fp32; ``rms_group_size`` is not an
            int, ``rms_eps`` not a real number.
        ValueError: A tensor has the wrong shape, is not contiguous, is on another device or is too
            large for 32-bit kernel offsets; more than one RMS group; ``n3`` outside ``[1, 32]``;
            ``rms_group_size`` or ``rms_eps`` out of range; an output shares memory with another
            output or an input; ``target`` or ``flavor`` is unknown or does not fit the device.
    """
    return MHC_REDUCE_PARTIALS_AND_RMSNORM_BWD(out_grad, out_mul, sqrsum, rms_group_size, rms_eps,
                                               out=(out_mul_grad, sqrsum_grad), target=target, flavor=flavor)


mhc_reduce_partials_and_rmsnorm_bwd_parallel = parallel_entry(mhc_reduce_partials_and_rmsnorm_bwd, "out_grad")
