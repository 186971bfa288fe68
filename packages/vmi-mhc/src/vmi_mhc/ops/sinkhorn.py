"""``sinkhorn``: public dispatch of the comb-mix Sinkhorn projection, forward and backward
(validation, backend choice).

Per token, the ``n x n`` comb logits become a (near) doubly-stochastic matrix: a softmax over
each row, ``+ eps``, a column normalisation, then ``repeat - 1`` row and column normalisations
(spec §3.9). The backward recomputes the forward from the logits. Names and parameters follow
TileKernels v2's kernel level; ``target`` and ``flavor`` are vmi's additions (see
vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core import fp32
from vmi_core.checks import INT32_MAX, check_disjoint, check_float, check_int, check_kernel_extent, check_tensor
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry, support
from vmi_core.targets import Flavor, resolve_flavor, resolve_target
from vmi_core.tools.testing import generator

from ..inputs import MHC_MULT, check_mhc_mult
from ..kernels import sinkhorn as parallel
from ..reference import sinkhorn as reference


@dataclass
class SinkhornForwardCall:
    """A validated forward call: the kernel specialisation and the tensors it reads and writes."""

    spec: parallel.SinkhornSpec
    comb_res_mix: torch.Tensor
    comb_res_mix_out: torch.Tensor
    repeat: int
    eps: float
    flavor: Flavor


@dataclass
class SinkhornBackwardCall:
    """A validated backward call: the kernel specialisation and the tensors it reads and writes."""

    spec: parallel.SinkhornSpec
    grad_output: torch.Tensor
    x: torch.Tensor
    grad_input: torch.Tensor
    repeat: int
    eps: float
    flavor: Flavor


def _check_matrices(t, name: str, op: str) -> int:
    """The token count of ``t``: contiguous fp32 ``(T, 4, 4)``."""
    check_tensor(t, name, dtype=torch.float32, dim=3)
    if t.shape[1] != t.shape[2]:
        raise ValueError(f"{name} must have shape (T, n, n), got {tuple(t.shape)}")
    check_mhc_mult(t.shape[1], f"{name}.size(1) (n)", op)
    check_tensor(t, name, contiguous=True)
    check_kernel_extent(t, name)
    return t.shape[0]


def _check_like(t, name: str, like: torch.Tensor, like_name: str) -> None:
    check_tensor(t, name, dtype=torch.float32, shape=tuple(like.shape), contiguous=True)
    if t.device != like.device:
        raise ValueError(f"{name} must be on {like_name}'s device {like.device}, got {t.device}")


def _check_eps(eps) -> float:
    """``eps`` as the fp32 value the kernels add: a finite real number >= 0 whose fp32 rounding is finite."""
    eps = check_float(eps, "eps", finite=True)
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    eps32 = fp32.value(eps)
    if eps32 == float("inf"):
        raise ValueError(f"eps must be at most the largest fp32 value, got {eps}")
    return eps32


def _prepare_forward(comb_res_mix, repeat, eps, out, target, flavor) -> tuple[str, SinkhornForwardCall]:
    op = "mhc_sinkhorn_fwd"
    _check_matrices(comb_res_mix, "comb_res_mix", op)
    repeat = check_int(repeat, "repeat", 1, INT32_MAX)
    eps = _check_eps(eps)
    target = resolve_target(comb_res_mix, target)
    flavor = resolve_flavor(target, flavor)
    if out is not None:
        _check_like(out, "comb_res_mix_out", comb_res_mix, "comb_res_mix")
        check_disjoint({"comb_res_mix_out": out}, {"comb_res_mix": comb_res_mix})
    else:
        out = torch.empty_like(comb_res_mix, memory_format=torch.contiguous_format)
    call = SinkhornForwardCall(parallel.SinkhornSpec(flavor.name), comb_res_mix, out, repeat, eps, flavor)
    return target, call


def _run_forward(comb_res_mix, repeat, eps, *, out, target, flavor, launch):
    target, call = _prepare_forward(comb_res_mix, repeat, eps, out and out[0], target, flavor)
    if launch and target == "torch":
        call.comb_res_mix_out.copy_(reference.sinkhorn_forward(call.comb_res_mix, call.repeat, call.eps, call.flavor))
    elif launch and comb_res_mix.shape[0]:
        parallel.launch_forward(call, target)
    return call.comb_res_mix_out


def _prepare_backward(grad_output, x, repeat, eps, out, target, flavor) -> tuple[str, SinkhornBackwardCall]:
    op = "mhc_sinkhorn_bwd"
    _check_matrices(x, "x", op)
    _check_like(grad_output, "grad_output", x, "x")
    repeat = check_int(repeat, "repeat", 1, parallel.MAX_BACKWARD_REPEAT)
    eps = _check_eps(eps)
    target = resolve_target(x, target)
    flavor = resolve_flavor(target, flavor)
    if out is not None:
        _check_like(out, "grad_input", x, "x")
        check_disjoint({"grad_input": out}, {"grad_output": grad_output, "x": x})
    else:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    call = SinkhornBackwardCall(parallel.SinkhornSpec(flavor.name), grad_output, x, out, repeat, eps, flavor)
    return target, call


def _run_backward(grad_output, x, repeat, eps, *, out, target, flavor, launch):
    target, call = _prepare_backward(grad_output, x, repeat, eps, out and out[0], target, flavor)
    if launch and target == "torch":
        call.grad_input.copy_(reference.sinkhorn_backward(call.grad_output, call.x, call.repeat, call.eps,
                                                          call.flavor))
    elif launch and x.shape[0]:
        parallel.launch_backward(call, target)
    return call.grad_input


_OPTIONS = (
    Option("repeat", 10, help="Sinkhorn iterations (the backward takes 1 to 16)"),
    Option("eps", "1e-6", help="added after the softmax and to every denominator"),
)
# Prefill sizes (throughput) and decode sizes (1, 4, 16 tokens: microseconds per call).
_SHAPES = ((65536,), (8192,), (512,), (1,), (4,), (16,))


def _arguments(inputs, options, flavor):
    return {"eps": float(options["eps"])}


def _kernels(build):
    return lambda options, target, flavor: [(build, parallel.SinkhornSpec(flavor))]


def _forward_inputs(shape, options, seed):
    return {"comb_res_mix": torch.randn(shape[0], MHC_MULT, MHC_MULT, generator=generator(seed))}


MHC_SINKHORN_FWD = KernelOp(
    "mhc_sinkhorn_fwd", (Param("comb_res_mix", "Tensor"), Param("repeat", "int"), Param("eps", "float")),
    ("comb_res_mix_out",), _run_forward, outs=("comb_res_mix_out",),
    command=Command(
        summary="Sinkhorn projection of the 4x4 comb logits onto (near) doubly-stochastic matrices",
        support=support(), default_shape=(8192,), bench_shapes=_SHAPES, options=_OPTIONS,
        make_inputs=_forward_inputs, kernels=_kernels(parallel.build_sinkhorn_forward), arguments=_arguments))


def _backward_inputs(shape, options, seed):
    g = generator(seed)
    return {"grad_output": torch.randn(shape[0], MHC_MULT, MHC_MULT, generator=g),
            "x": torch.randn(shape[0], MHC_MULT, MHC_MULT, generator=g)}


MHC_SINKHORN_BWD = KernelOp(
    "mhc_sinkhorn_bwd",
    (Param("grad_output", "Tensor"), Param("x", "Tensor"), Param("repeat", "int"), Param("eps", "float")),
    ("grad_input",), _run_backward, outs=("grad_input",),
    command=Command(
        summary="gradient of the Sinkhorn projection w.r.t. the comb logits, by recomputing the forward",
        support=support(), default_shape=(8192,), bench_shapes=_SHAPES, options=_OPTIONS,
        make_inputs=_backward_inputs, kernels=_kernels(parallel.build_sinkhorn_backward), arguments=_arguments))


def mhc_sinkhorn_fwd(comb_res_mix: torch.Tensor, comb_res_mix_out: torch.Tensor | None, repeat: int, eps: float, *,
                     target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """Project each token's ``4 x 4`` comb logits onto a (near) doubly-stochastic matrix.

    Per token, rows along the last axis: ``P = softmax over each row``, ``X = P + eps``,
    ``X = X / (colsum(X) + eps)``, then ``repeat - 1`` times ``X = X / (rowsum(X) + eps)`` and
    ``X = X / (colsum(X) + eps)``; the result ends with a column normalisation (column sums
    ``c / (c + eps)``, row sums only near 1). ``eps`` is added, never a clamp.

    Arithmetic (every step one fp32 operation rounded to nearest even, no fused multiply-add;
    ``eps`` is used as ``fp32(eps)``): the sums of the 4 entries of a row or column are pairwise
    ``(a0 + a1) + (a2 + a3)`` in the ``ascend`` flavor (the vector unit's group add) and left to
    right ``((a0 + a1) + a2) + a3`` in the ``cuda`` flavor; ``exp(x - rowmax)`` is correctly
    rounded; divisions are IEEE (``cuda``) or the Ascend vector division (``ascend``: subnormal
    operands and quotients flushed to signed zero, and TileLang's residual check, which moves a
    quotient below about 2^-100 by an ulp where the residuals underflow).

    Non-finite logits propagate as in IEEE arithmetic: a ``-inf`` logit gets probability 0 (unless
    its whole row is ``-inf``); a NaN, a ``+inf`` or a row of ``-inf`` makes the token's whole
    matrix NaN (every later step mixes all rows and columns). The sign and payload of a NaN output
    are not specified.

    Args:
        comb_res_mix: The logits, contiguous fp32 ``(T, n, n)`` with ``n == 4`` (the kernels
            are specialised on 4 streams).
        comb_res_mix_out: Where the result goes: contiguous fp32 of comb_res_mix's shape and
            device, not overlapping it; None allocates it.
        repeat: Sinkhorn iterations, an int ``>= 1`` (``2 * repeat - 1`` sum normalisations).
        eps: A finite real number ``>= 0`` (at most the largest fp32 value).
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            comb_res_mix.
        flavor: Bit conventions (see ``vmi_core.targets``). The flavor gives the summation order and the
            division.

    Returns:
        ``comb_res_mix_out``, written (empty when ``T == 0``: no kernel runs).

    Raises:
        TypeError: A tensor argument is not a tensor or not fp32; ``repeat`` is not an int;
            ``eps`` is not a real number.
        ValueError: ``comb_res_mix`` is not 3-D, not ``(T, n, n)``, has ``n != 4``, is not
            contiguous or is too large for 32-bit kernel offsets; ``comb_res_mix_out`` has
            another shape or device, is not contiguous or overlaps ``comb_res_mix``;
            ``repeat < 1``; ``eps`` is negative or not finite (in fp32).
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return MHC_SINKHORN_FWD(comb_res_mix, repeat, eps, out=(comb_res_mix_out,), target=target, flavor=flavor)


mhc_sinkhorn_fwd_parallel = parallel_entry(mhc_sinkhorn_fwd, "comb_res_mix")


def mhc_sinkhorn_bwd(grad_output: torch.Tensor, x: torch.Tensor, grad_input: torch.Tensor | None, repeat: int,
                     eps: float, *, target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """The gradient of ``mhc_sinkhorn_fwd``'s logits, by recomputing the forward from them.

    Per token, the forward is replayed (the same bits as ``mhc_sinkhorn_fwd`` of the same flavor),
    recording each normalisation step's input ``a`` and denominator ``d = sum(a) + eps``; then,
    from ``g = grad_output``, for each step from the last back to the first,
    ``u = sum(g * a) / d`` and ``g = (g - u) / d`` (per row or column, broadcast along it), and
    last the softmax's ``grad_input = (g - sum_row(g * P)) * P`` (``+ eps`` has derivative 1).

    Arithmetic (every step one fp32 operation rounded to nearest even, no fused multiply-add;
    ``eps`` is used as ``fp32(eps)``): the sums of the 4 entries of a row or column are pairwise
    ``(a0 + a1) + (a2 + a3)`` in the ``ascend`` flavor (the vector unit's group add) and left to
    right ``((a0 + a1) + a2) + a3`` in the ``cuda`` flavor; ``exp(x - rowmax)`` is correctly
    rounded; divisions are IEEE (``cuda``) or the Ascend vector division (``ascend``: subnormal
    operands and quotients flushed to signed zero, and TileLang's residual check, which moves a
    quotient below about 2^-100 by an ulp where the residuals underflow).

    Non-finite values propagate as in IEEE arithmetic: a token whose forward is NaN (see
    ``mhc_sinkhorn_fwd``) or whose ``grad_output`` holds a NaN or an infinity gets NaN or
    infinite gradients. The sign and payload of a NaN output are not specified.

    Args:
        grad_output: The gradient of the forward's output, contiguous fp32 of x's shape and device.
        x: The forward's input (the logits), contiguous fp32 ``(T, n, n)`` with ``n == 4``.
        grad_input: Where the gradient goes: contiguous fp32 of x's shape and device, not
            overlapping an input; None allocates it.
        repeat: The forward's ``repeat``: an int in ``[1, 16]`` (the kernel keeps the ``2 *
            repeat`` replayed steps of 64 tokens on chip).
        eps: The forward's ``eps``: a finite real number ``>= 0``.
        target: As for ``mhc_sinkhorn_fwd`` (the default from x's device).
        flavor: As for ``mhc_sinkhorn_fwd``.

    Returns:
        ``grad_input``, written (empty when ``T == 0``: no kernel runs).

    Raises:
        TypeError: A tensor argument is not a tensor or not fp32; ``repeat`` is not an int;
            ``eps`` is not a real number.
        ValueError: ``x`` is not 3-D, not ``(T, n, n)``, has ``n != 4``, is not contiguous or is
            too large for 32-bit kernel offsets; ``grad_output`` or ``grad_input`` has another
            shape or device or is not contiguous; ``grad_input`` overlaps an input; ``repeat``
            is outside ``[1, 16]``; ``eps`` is negative or not finite (in fp32).
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return MHC_SINKHORN_BWD(grad_output, x, repeat, eps, out=(grad_input,), target=target, flavor=flavor)


mhc_sinkhorn_bwd_parallel = parallel_entry(mhc_sinkhorn_bwd, "x")

