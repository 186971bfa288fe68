"""The prenorm GEMM of ``norm_fn`` (spec §3.4, stages B and E): public dispatch of its forward
and backward (validation, allocation, backend choice).

TileKernels v2 has no kernel for this stage (CUDA calls DeepGEMM's ``tf32_hc_prenorm_gemm(x, fn,
out_partials, sqrsum_partials, num_splits)``, Ascend an unpublished "HC prenorm GEMM"); v1 had the
TileLang kernels ``_mhc_pre_norm_fn_fwd_mul`` / ``_mhc_pre_norm_fn_bwd_mul``. The names here are
vmi's; the forward's arguments are DeepGEMM's (``out_partials`` = ``out_mul_splitted``,
``sqrsum_partials`` = ``sqrsum_splitted``, ``num_splits`` = ``n_splits``), its outputs the inputs
of ``mhc_reduce_partials_and_rmsnorm_fwd`` (which takes them with or without the ``G = 1`` axis);
the backward's are v1's, and it takes the reduction backward's outputs as they come.
``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_disjoint, check_in_place, check_int, check_kernel_extent, check_tensor, mark_written
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import compare_named, randn

from ..inputs import MHC_MULT, mix_width
from ..kernels import pre_norm_fn_gemm as parallel
from ..reference import pre_norm_fn_gemm as reference
from .demo import SOURCE_HIDDEN

MAX_MIX = parallel.N_PAD
SPLIT_ALIGN = 64
BWD_ALIGN = parallel.BLOCK_K


@dataclass
class GemmFwdCall:
    """A validated forward call: the kernel's specialisation and its tensors."""

    spec: parallel.GemmSpec
    x: torch.Tensor
    fn: torch.Tensor
    out_mul: torch.Tensor
    sqrsum: torch.Tensor


@dataclass
class GemmBwdCall:
    """A validated backward call: the kernel's specialisation and its tensors."""

    spec: parallel.GemmSpec
    out_mul_grad: torch.Tensor
    sqrsum_grad: torch.Tensor
    x: torch.Tensor
    fn: torch.Tensor
    x_grad: torch.Tensor
    fn_grad: torch.Tensor


def _check_x_and_fn(x, fn) -> tuple[int, int, int]:
    check_tensor(x, "x", dtype=torch.bfloat16, dim=2, contiguous=True)
    num_tokens, hidden = x.shape
    check_tensor(fn, "fn", dtype=torch.float32, dim=2, device=x.device, contiguous=True)
    mix = fn.shape[0]
    if not 0 < mix <= MAX_MIX:
        raise ValueError(f"fn must have between 1 and {MAX_MIX} rows (n3 = n·(n+2) mix entries), got {mix}")
    if fn.shape[1] != hidden:
        raise ValueError(f"fn must have x's {hidden} columns (K = n·H), got {fn.shape[1]}")
    check_kernel_extent(x, "x")
    check_kernel_extent(fn, "fn")
    return num_tokens, hidden, mix


def _check_out(t, name: str, shape: tuple, device) -> torch.Tensor:
    return check_tensor(t, name, dtype=torch.float32, shape=shape, device=device, contiguous=True)


def _prepare_fwd(x, fn, out_mul_splitted, sqrsum_splitted, n_splits, target, flavor) -> tuple[str, GemmFwdCall]:
    num_tokens, hidden, mix = _check_x_and_fn(x, fn)
    n_splits = check_int(n_splits, "n_splits", 1)
    if hidden % n_splits or (hidden // n_splits) % SPLIT_ALIGN:
        raise ValueError(f"n_splits must split K = {hidden} into equal slices of a multiple of {SPLIT_ALIGN} "
                         f"columns, got {n_splits}")
    target = resolve_target(x, target)
    resolve_flavor(target, flavor)
    shape = (n_splits, num_tokens, mix)
    if out_mul_splitted is None:
        out_mul_splitted = torch.empty(shape, dtype=torch.float32, device=x.device)
    else:
        _check_out(out_mul_splitted, "out_mul_splitted", shape, x.device)
    if sqrsum_splitted is None:
        sqrsum_splitted = torch.empty(shape[:2], dtype=torch.float32, device=x.device)
    else:
        _check_out(sqrsum_splitted, "sqrsum_splitted", shape[:2], x.device)
    check_disjoint({"out_mul_splitted": out_mul_splitted, "sqrsum_splitted": sqrsum_splitted},
                   {"x": x, "fn": fn})
    spec = parallel.GemmSpec(hidden, mix, n_splits)
    return target, GemmFwdCall(spec, x, fn, out_mul_splitted, sqrsum_splitted)


def _run_fwd(x, fn, n_splits, *, out, target, flavor, launch):
    out_mul_splitted, sqrsum_splitted = out if out is not None else (None, None)
    target, call = _prepare_fwd(x, fn, out_mul_splitted, sqrsum_splitted, n_splits, target, flavor)
    if launch and target == "torch":
        out_mul, sqrsum = reference.pre_norm_fn_gemm_fwd(call.x.cpu(), call.fn.cpu(), call.spec.n_splits)
        call.out_mul.copy_(out_mul)
        call.sqrsum.copy_(sqrsum)
    elif launch:
        parallel.launch_fwd(call, target)
    return call.out_mul, call.sqrsum


# The command's shapes are (tokens, hidden H), K = 4·H.
_OPTIONS = (
    Option("mix", mix_width(MHC_MULT), (mix_width(2), mix_width(MHC_MULT), 32), "rows n3 of fn (mix entries)"),
)
_FWD_OPTIONS = (*_OPTIONS, Option("n_splits", 16, (1, 2, 4, 16), "K slices (split-K partials)"))
_SUPPORT = {
    "cpu": "runs; bit-exact against the reference (its fixed summation order), both flavors alike",
    "ascend": "lowers to AscendC: T.gemm on the Cube unit, SIMD vector regions; runs on ascend-sim, not yet "
              "on an NPU; the Cube kernel does not compile against asc-devkit's declarations (TileLang 0.1.15 "
              "emits Cube calls the real API does not declare: scripts/ascend-api-check)",
    "ascend-sim": "runs the ascend source on the CPU model, Cube unit included: square sums and fn_grad bit-exact, "
                  "the Cube's sums within the stated bound of the reference",
}
_SHAPES = ((8192, 4096), (4096, 7168), (4096, 1280), (16, 4096))


def _within(name, actual, wanted, tolerance) -> list[str]:
    bad = (actual.float() - wanted.float()).abs() > tolerance
    if not bad.any():
        return []
    first = tuple(int(i) for i in bad.nonzero()[0])
    return [f"  {name}: {int(bad.sum())} values farther than the bound, first at {first}: "
            f"{actual[first].item()!r} vs {wanted[first].item()!r}"]


def _check(exact_names, summed):
    """Bit for bit on the outputs every target computes in one order (square sums, fn_grad, cpu's
    everything); the matrix units' sums (``summed``: name, position) within the docs page's bound."""
    bitwise = compare_named(exact_names)

    def check(outputs, expected):
        name, at = summed
        exact = [o for i, o in enumerate(outputs) if i != at]
        lines = bitwise(exact, [e for i, e in enumerate(expected) if i != at])
        actual, wanted = outputs[at].cpu(), expected[at].cpu()
        if wanted.dtype == torch.bfloat16:
            # One bf16 rounding step apart at most.
            tolerance = wanted.float().abs() * 2.0**-7 + 2.0**-126
        else:
            # (γ(K_s - 1) + γ(2 K_s - 1)) · Σ|p|: for the command's random inputs Σ|p| is about
            # sqrt(K_s) times a typical sum, so the bound is about 2^-9 of the largest sum.
            tolerance = wanted.abs().amax() * 2.0**-9
        return lines + _within(name, actual, wanted, tolerance)
    return check


def _fwd_inputs(shape, options, seed):
    tokens, hidden = shape
    return {"x": randn((tokens, MHC_MULT * hidden), seed, torch.bfloat16),
            "fn": randn((options["mix"], MHC_MULT * hidden), seed + 1) * 1e-2}


def _fwd_kernels(options, target, flavor):
    # The TF32 split of fn, then the GEMM.
    return [(parallel.build_tf32_split, parallel.Tf32SplitSpec()),
            (parallel.build_gemm_fwd, parallel.GemmSpec(MHC_MULT * SOURCE_HIDDEN, options["mix"], options["n_splits"]))]


MHC_PRE_NORM_FN_GEMM_FWD = KernelOp(
    "mhc_pre_norm_fn_gemm_fwd",
    (Param("x", "Tensor"), Param("fn", "Tensor"), Param("n_splits", "int", 1)),
    ("out_mul_splitted", "sqrsum_splitted"), _run_fwd, outs=("out_mul_splitted", "sqrsum_splitted"),
    command=Command(
        summary="norm_fn's prenorm GEMM: split-K partials of x · tf32(fn)ᵀ and of Σx² (DeepGEMM "
                "tf32_hc_prenorm_gemm)",
        support=_SUPPORT, default_shape=(4096, 4096), bench_shapes=_SHAPES, options=_FWD_OPTIONS,
        make_inputs=_fwd_inputs, kernels=_fwd_kernels,
        check=_check(["sqrsum_splitted"], ("out_mul_splitted", 0)),
        check_criterion="(square sums bit for bit; partial products within 2^-9 of the largest: the matrix "
                        "units' order; cpu is bit-exact)"))


def _prepare_bwd(out_mul_grad, sqrsum_grad, x, fn, x_grad, fn_grad, target, flavor) -> tuple[str, GemmBwdCall]:
    num_tokens, hidden, mix = _check_x_and_fn(x, fn)
    if hidden % BWD_ALIGN:
        raise ValueError(f"the backward needs K = n·H (x's columns) a multiple of {BWD_ALIGN}, got {hidden}")
    device = x.device
    # mhc_reduce_partials_and_rmsnorm_bwd gives them with the group axis (G = 1): (T, 1, n3), (T, 1).
    if isinstance(out_mul_grad, torch.Tensor) and out_mul_grad.dim() == 3 and out_mul_grad.shape[1] == 1:
        out_mul_grad = out_mul_grad[:, 0]
    if isinstance(sqrsum_grad, torch.Tensor) and sqrsum_grad.dim() == 2 and sqrsum_grad.shape[1] == 1:
        sqrsum_grad = sqrsum_grad[:, 0]
    check_tensor(out_mul_grad, "out_mul_grad", dtype=torch.float32, shape=(num_tokens, mix), device=device,
                 contiguous=True)
    check_tensor(sqrsum_grad, "sqrsum_grad", dtype=torch.float32, shape=(num_tokens,), device=device,
                 contiguous=True)
    check_tensor(x_grad, "x_grad", dtype=torch.bfloat16, shape=(num_tokens, hidden), device=device,
                 contiguous=True)
    check_in_place(x_grad, "x_grad", "mhc_pre_norm_fn_gemm_bwd")
    target = resolve_target(x, target)
    resolve_flavor(target, flavor)
    if fn_grad is None:
        fn_grad = torch.empty((mix, hidden), dtype=torch.float32, device=device)
    else:
        _check_out(fn_grad, "fn_grad", (mix, hidden), device)
    check_disjoint({"x_grad": x_grad, "fn_grad": fn_grad},
                   {"out_mul_grad": out_mul_grad, "sqrsum_grad": sqrsum_grad, "x": x, "fn": fn})
    spec = parallel.GemmSpec(hidden, mix)
    return target, GemmBwdCall(spec, out_mul_grad, sqrsum_grad, x, fn, x_grad, fn_grad)


def _run_bwd(out_mul_grad, sqrsum_grad, x, fn, x_grad, *, out, target, flavor, launch):
    target, call = _prepare_bwd(out_mul_grad, sqrsum_grad, x, fn, x_grad, out and out[0], target, flavor)
    if launch and target == "torch":
        new_x_grad, fn_grad = reference.pre_norm_fn_gemm_bwd(call.out_mul_grad.cpu(), call.sqrsum_grad.cpu(),
                                                             call.x.cpu(), call.fn.cpu(), call.x_grad.cpu())
        call.x_grad.copy_(new_x_grad)
        call.fn_grad.copy_(fn_grad)
    elif launch:
        parallel.launch_bwd(call, target)
    if launch and x.shape[0]:
        mark_written(call.x_grad)
    return call.fn_grad


def _bwd_inputs(shape, options, seed):
    tokens, hidden = shape
    mix = options["mix"]
    return {**_fwd_inputs(shape, options, seed),
            "out_mul_grad": randn((tokens, mix), seed + 2), "sqrsum_grad": randn((tokens,), seed + 3) * 1e-3,
            "x_grad": randn((tokens, MHC_MULT * hidden), seed + 4, torch.bfloat16)}


def _bwd_kernels(options, target, flavor):
    # The TF32 splits of fn and of the mixes' gradient, then the GEMMs.
    return [(parallel.build_tf32_split, parallel.Tf32SplitSpec()),
            (parallel.build_gemm_bwd, parallel.GemmSpec(MHC_MULT * SOURCE_HIDDEN, options["mix"]))]


MHC_PRE_NORM_FN_GEMM_BWD = KernelOp(
    "mhc_pre_norm_fn_gemm_bwd",
    (Param("out_mul_grad", "Tensor"), Param("sqrsum_grad", "Tensor"), Param("x", "Tensor"), Param("fn", "Tensor"),
     Param("x_grad", "Tensor", mutable=True)),
    ("fn_grad",), _run_bwd, outs=("fn_grad",),
    command=Command(
        summary="backward of norm_fn's prenorm GEMM: x_grad accumulated in place, fn_grad (column-owned, "
                "deterministic)",
        support=_SUPPORT, default_shape=(4096, 4096), bench_shapes=_SHAPES, options=_OPTIONS,
        make_inputs=_bwd_inputs, kernels=_bwd_kernels,
        check=_check(["fn_grad"], ("x_grad", 1)),
        check_criterion="(fn_grad bit for bit; x_grad within one bf16 step: the matrix units' order; cpu is "
                        "bit-exact)"))


def mhc_pre_norm_fn_gemm_fwd(x: torch.Tensor, fn: torch.Tensor, out_mul_splitted: torch.Tensor | None = None,
                             sqrsum_splitted: torch.Tensor | None = None, n_splits: int = 1, *,
                             target: str | None = None, flavor: str | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K partial products and square sums of the flattened residual (norm_fn stage B).

    With ``S = n_splits`` equal contiguous slices of ``K`` and ``v = tf32(fn)`` (fp32 rounded to
    10 mantissa bits, half away from zero: ``(bits + 0x1000) & ~0x1FFF``), for ``k`` in slice
    ``s``::

        out_mul_splitted[s, t, j] = Σ_k f32(x[t, k]) · v[j, k]
        sqrsum_splitted[s, t]     = Σ_k f32(x[t, k])²

    Every product is exact in fp32 (bf16 × TF32); only the accumulation order differs by
    target. ``cpu``: per output, ``k`` ascending from +0.0, one fp32 rounding per addition (the
    reference, bit for bit). ``ascend`` and ``cuda``: the matrix unit's order over the same
    products (``v`` enters as bf16 ``hi + lo``, two GEMMs into one fp32 accumulator); the
    difference is bounded by the docs page's formula. The square sums use one fixed order on
    every target: 64 lane partials over columns ``l, l + 64, ...`` of the slice, then six folds
    (``vmi_core.sums.lane_sum_fused``), so they are bitwise equal everywhere. Both flavors
    compute the same bits.

    Non-finite values propagate as in IEEE arithmetic through the exact products and the sums:
    a NaN or ±inf in a row of ``x`` or a row of ``fn`` makes the outputs it enters non-finite.
    Assumptions where the spec is open: ``fn`` magnitudes from ``(2 - 2^-11) · 2^127`` round to
    infinity (the TF32 bit rule); ``|tf32(fn)| < 2^-116`` loses the bits below bf16's subnormal
    range (``2^-133``) of its low part, on every target alike; on the matrix units an infinite
    ``x`` times an ``fn`` whose low part is zero gives NaN (``inf · 0``) where cpu gives ±inf.

    Args:
        x: bf16 ``(T, K)`` contiguous: the residual flattened over ``(n, H)``, ``K = n·H``.
        fn: fp32 ``(n3, K)`` contiguous, ``1 <= n3 <= 32``: ``fn_eff`` (the projection merged with
            the norm weight), rounded to TF32 here.
        out_mul_splitted: Optional fp32 ``(S, T, n3)`` contiguous output (allocated when None).
        sqrsum_splitted: Optional fp32 ``(S, T)`` contiguous output (allocated when None).
        n_splits: ``S``, the number of K slices: ``K / S`` must be a multiple of 64.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions (see ``vmi_core.targets``); both give the same bits.

    Returns:
        ``(out_mul_splitted, sqrsum_splitted)``: the given outputs, written, or new tensors.
        With ``T = 0`` nothing runs and they are empty.

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype; ``n_splits`` is not
            an int.
        ValueError: A tensor has the wrong shape, is not contiguous, is on another device than
            ``x`` or is too large for 32-bit kernel offsets; ``fn`` has no or more than 32 rows
            or not ``K`` columns; ``n_splits`` does not cut ``K`` into slices of a multiple of 64;
            an output overlaps an input or the other output.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        NotImplementedError: ``target`` is ``"ascend-sim"``: the simulator has no model of the
            Cube unit yet (the ascend lowering is checked on its source).
    """
    return MHC_PRE_NORM_FN_GEMM_FWD(x, fn, n_splits, out=(out_mul_splitted, sqrsum_splitted), target=target,
                                    flavor=flavor)


mhc_pre_norm_fn_gemm_fwd_parallel = parallel_entry(mhc_pre_norm_fn_gemm_fwd, "x")


def mhc_pre_norm_fn_gemm_bwd(out_mul_grad: torch.Tensor, sqrsum_grad: torch.Tensor, x: torch.Tensor,
                             fn: torch.Tensor, x_grad: torch.Tensor, fn_grad: torch.Tensor | None = None, *,
                             target: str | None = None, flavor: str | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of the prenorm GEMM (norm_fn stage E): accumulates the residual gradient into
    ``x_grad`` and writes the gradient of ``fn_eff``.

    With ``d = tf32(out_mul_grad)`` and ``v = tf32(fn)`` (the forward's rounding)::

        x_grad[t, k]  <- bf16( (f32(x_grad[t, k]) + Σ_j d[t, j] · v[j, k]) + (2 · f32(x[t, k])) · sqrsum_grad[t] )
        fn_grad[j, k]  = Σ_t d[t, j] · f32(x[t, k])

    The GEMM term is summed first from +0.0, then added to the incoming buffer, then the
    square-sum term (the order of spec §3.4.2), and the result rounded once to bf16 (RNE).
    ``fn_grad`` is **overwritten** (as v1's kernel writes it; ``T = 0`` gives zeros): adding
    it to a parameter's gradient buffer is the caller's (the merge backward's) step. The
    gradient with respect to the rounded ``fn_eff`` is passed through to ``fn_eff`` unchanged
    (straight-through, as the sources).

    Every product is exact in fp32. ``cpu`` sums ``j`` ascending (``x_grad``) and tokens
    ascending (``fn_grad``) from +0.0, one rounding per addition (the reference, bit for bit);
    ``ascend`` and ``cuda`` sum the same products in the matrix unit's order (docs page: the
    bound). The ``fn_grad`` sum over tokens is deterministic on every target: each worker owns
    whole columns and loops over all tokens in order; no atomics. Both flavors compute the same
    bits. Non-finite inputs propagate as in IEEE arithmetic (see the forward's assumptions).

    Args:
        out_mul_grad: fp32 ``(T, n3)`` contiguous: the gradient of the summed products (stage D);
            or ``(T, 1, n3)`` as ``mhc_reduce_partials_and_rmsnorm_bwd`` gives it.
        sqrsum_grad: fp32 ``(T,)`` contiguous: the gradient of the square sums (stage D); or
            ``(T, 1)``.
        x: The forward's bf16 ``(T, K)`` contiguous input; ``K`` a multiple of 256.
        fn: The forward's fp32 ``(n3, K)`` contiguous ``fn_eff`` (rounded to TF32 here again).
        x_grad: bf16 ``(T, K)`` contiguous accumulation buffer, updated in place; it must not
            share memory with another argument.
        fn_grad: Optional fp32 ``(n3, K)`` contiguous output (allocated when None).
        target: As for ``mhc_pre_norm_fn_gemm_fwd``.
        flavor: As for ``mhc_pre_norm_fn_gemm_fwd``.

    Returns:
        ``(x_grad, fn_grad)``: the updated buffer and the written (or new) ``fn_grad``.

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype.
        ValueError: A tensor has the wrong shape, is not contiguous, is on another device than
            ``x`` or is too large for 32-bit kernel offsets; ``fn`` has no or more than 32 rows
            or not ``K`` columns; ``K`` is not a multiple of 256; ``x_grad`` or ``fn_grad``
            overlaps another argument.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        RuntimeError: Grad mode is on and ``x_grad`` requires grad.
        NotImplementedError: ``target`` is ``"ascend-sim"`` (as the forward).
    """
    fn_grad = MHC_PRE_NORM_FN_GEMM_BWD(out_mul_grad, sqrsum_grad, x, fn, x_grad, out=(fn_grad,), target=target,
                                       flavor=flavor)
    return x_grad, fn_grad


mhc_pre_norm_fn_gemm_bwd_parallel = parallel_entry(mhc_pre_norm_fn_gemm_bwd, "x")
