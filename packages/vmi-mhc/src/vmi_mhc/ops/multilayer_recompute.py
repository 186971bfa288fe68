"""``mhc_multilayer_recompute``: public dispatch of ``multilayer_recompute`` (spec mhc §3.3), which
rebuilds the layer inputs and carried residuals of a run of layers for activation recomputation:
validation, backend choice.

Names and parameters follow TileKernels v2's kernel-level function; ``target`` and ``flavor`` are
vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_disjoint, check_in_place, check_kernel_extent, check_tensor, mark_written
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import compare_named, randn

from ..inputs import MHC_MULT
from ..kernels import multilayer_recompute as parallel
from ..kernels import pre_apply_mix as pre_apply_mix_kernel
from ..reference import multilayer_recompute as reference
from .demo import RESIDUAL_SHAPES, SOURCE_HIDDEN
from .post import SUPPORT
from .pre_apply_mix import PreApplyMixFwdCall

OP = "mhc_multilayer_recompute"


@dataclass
class MultilayerRecomputeCall:
    """A validated call: the kernel's specialisation and the tensors it reads and writes."""

    spec: parallel.MultilayerRecomputeSpec
    num_tokens: int
    initial_residual: torch.Tensor
    pre_mix_list: list[torch.Tensor]
    layer_output_list: list[torch.Tensor]
    post_mix_list: list[torch.Tensor]
    comb_mix_list: list[torch.Tensor]
    layer_input_list: list[torch.Tensor]
    residual_list: list[torch.Tensor]


def _check_lengths(pre_mix_list, layer_output_list, post_mix_list, comb_mix_list, layer_input_list,
                   residual_list) -> tuple[int, int]:
    """``(L, L_post)`` of the six lists."""
    num_layers = len(pre_mix_list)
    if not 1 <= num_layers <= parallel.MAX_LAYERS:
        raise ValueError(f"{OP}: pre_mix_list must hold between 1 and {parallel.MAX_LAYERS} tensors (one per "
                         f"layer), got {num_layers}")
    if len(layer_input_list) != num_layers:
        raise ValueError(f"{OP}: layer_input_list must hold one tensor per layer like pre_mix_list "
                         f"({num_layers}), got {len(layer_input_list)}")
    num_post = len(layer_output_list)
    if num_post not in (num_layers - 1, num_layers):
        raise ValueError(f"{OP}: layer_output_list must hold num_layers - 1 or num_layers tensors (num_layers = "
                         f"{num_layers}, the length of pre_mix_list), got {num_post}")
    for name, tensors in (("post_mix_list", post_mix_list), ("comb_mix_list", comb_mix_list),
                          ("residual_list", residual_list)):
        if len(tensors) != num_post:
            raise ValueError(f"{OP}: {name} must hold one tensor per post layer like layer_output_list "
                             f"({num_post}), got {len(tensors)}")
    return num_layers, num_post


def _check_list(tensors, name: str, dtype, shapes: tuple[tuple, ...], device) -> None:
    """Every tensor of ``tensors`` contiguous, of ``dtype`` and one of ``shapes``, on ``device``."""
    for layer, t in enumerate(tensors):
        item = f"{name}[{layer}]"
        check_tensor(t, item, dtype=dtype, device=device, contiguous=True)
        if tuple(t.shape) not in shapes:
            wanted = " or ".join(str(s) for s in shapes)
            raise ValueError(f"{OP}: {item} must have shape {wanted}, got {tuple(t.shape)}")
        check_kernel_extent(t, item)


def _prepare(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list, layer_input_list,
             residual_list, target, flavor) -> tuple[str, str, MultilayerRecomputeCall]:
    check_tensor(initial_residual, "initial_residual", dtype=torch.bfloat16, contiguous=True)
    if initial_residual.dim() < 2:
        raise ValueError(f"{OP}: initial_residual must be (..., n, H), got shape {tuple(initial_residual.shape)}")
    *lead, n, hidden = initial_residual.shape
    lead = tuple(lead)
    if not 1 <= n <= parallel.MAX_MHC_MULT:
        raise ValueError(f"{OP}: initial_residual.size(-2) (the stream count n) must be in "
                         f"[1, {parallel.MAX_MHC_MULT}], got {n}")
    if hidden == 0:
        raise ValueError(f"{OP}: initial_residual must have a hidden size of at least 1, got shape "
                         f"{tuple(initial_residual.shape)}")
    check_kernel_extent(initial_residual, "initial_residual")
    lists = (pre_mix_list, layer_output_list, post_mix_list, comb_mix_list, layer_input_list, residual_list)
    num_layers, num_post = _check_lengths(*lists)
    device = initial_residual.device
    mix_shapes = ((*lead, n, 1), (*lead, n))
    _check_list(pre_mix_list, "pre_mix_list", torch.float32, mix_shapes, device)
    _check_list(layer_output_list, "layer_output_list", torch.bfloat16, ((*lead, hidden),), device)
    _check_list(post_mix_list, "post_mix_list", torch.float32, mix_shapes, device)
    _check_list(comb_mix_list, "comb_mix_list", torch.float32, ((*lead, n, n),), device)
    _check_list(layer_input_list, "layer_input_list", torch.bfloat16, ((*lead, hidden),), device)
    _check_list(residual_list, "residual_list", torch.bfloat16, ((*lead, n, hidden),), device)
    inputs = {"initial_residual": initial_residual}
    for name, tensors in zip(("pre_mix_list", "layer_output_list", "post_mix_list", "comb_mix_list"), lists[:4],
                             strict=True):
        inputs.update({f"{name}[{layer}]": t for layer, t in enumerate(tensors)})
    outputs = {f"layer_input_list[{layer}]": t for layer, t in enumerate(layer_input_list)}
    outputs.update({f"residual_list[{layer}]": t for layer, t in enumerate(residual_list)})
    for name, t in outputs.items():
        check_in_place(t, name, OP)
    check_disjoint(outputs, inputs)
    target = resolve_target(initial_residual, target)
    flavor = resolve_flavor(target, flavor).name
    num_tokens = initial_residual.numel() // (n * hidden)
    spec = parallel.MultilayerRecomputeSpec(n, hidden, num_layers, num_post, flavor)
    call = MultilayerRecomputeCall(spec, num_tokens, initial_residual, *(list(t) for t in lists))
    return target, flavor, call


def _launch(call: MultilayerRecomputeCall, target: str) -> None:
    spec = call.spec
    if spec.num_post_layers == 0:
        # One layer without a post update is exactly one pre_apply_mix: its kernel runs.
        n, hidden = spec.mhc_mult, spec.hidden
        pre_spec = pre_apply_mix_kernel.PreApplyMixFwdSpec(n, spec.flavor)
        x = call.initial_residual.view(call.num_tokens, n, hidden)
        mix = call.pre_mix_list[0].view(call.num_tokens, n)
        o = call.layer_input_list[0].view(call.num_tokens, hidden)
        pre_apply_mix_kernel.launch_fwd(PreApplyMixFwdCall(pre_spec, x, mix, o), target)
    else:
        parallel.launch(call, target)


def _run(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list, layer_input_list,
         residual_list, *, out, target, flavor, launch):
    target, flavor, call = _prepare(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list,
                                    layer_input_list, residual_list, target, flavor)
    if launch and target == "torch":
        layer_inputs, residuals = reference.mhc_multilayer_recompute(
            call.initial_residual, call.pre_mix_list, call.layer_output_list, call.post_mix_list,
            call.comb_mix_list, flavor)
        for buffer, value in zip(call.layer_input_list + call.residual_list, layer_inputs + residuals, strict=True):
            buffer.copy_(value)
    elif launch and call.num_tokens:
        _launch(call, target)
        for t in call.layer_input_list + call.residual_list:
            mark_written(t)


_OPTIONS = (
    Option("mhc_mult", MHC_MULT, tuple(range(1, parallel.MAX_MHC_MULT + 1)), "residual streams n"),
    Option("num_layers", 4, tuple(range(1, parallel.MAX_LAYERS + 1)), "layers L"),
    Option("last_post", True, (True, False), "whether the last layer has a post update (L_post = L, else L - 1)"),
)


def _post_layers(options) -> int:
    return options["num_layers"] - (0 if options["last_post"] else 1)


def _inputs(shape, options, seed):
    # Unnormalised randn mixes, as TileKernels' test draws them; each input list is one buffer's
    # layers (the layout a caller that saves them for recomputation keeps), the outputs too.
    tokens, hidden = shape
    n, layers, post_layers = options["mhc_mult"], options["num_layers"], _post_layers(options)
    return {
        "initial_residual": randn((tokens, n, hidden), seed, torch.bfloat16),
        "pre_mix_list": list(randn((layers, tokens, n, 1), seed + 1).unbind(0)),
        "layer_output_list": list(randn((post_layers, tokens, hidden), seed + 2, torch.bfloat16).unbind(0)),
        "post_mix_list": list(randn((post_layers, tokens, n, 1), seed + 3).unbind(0)),
        "comb_mix_list": list(randn((post_layers, tokens, n, n), seed + 4).unbind(0)),
        "layer_input_list": list(torch.zeros(layers, tokens, hidden, dtype=torch.bfloat16).unbind(0)),
        "residual_list": list(torch.zeros(post_layers, tokens, n, hidden, dtype=torch.bfloat16).unbind(0)),
    }


def _check(outputs, expected) -> list[str]:
    # The written lists, layer inputs then residuals, each tensor bit for bit.
    names = [f"output {k}" for k in range(len(expected))]
    if len(outputs) != len(expected):
        return [f"  {len(outputs)} outputs vs {len(expected)} expected"]
    return compare_named(names)(outputs, expected)


def _kernels(options, target, flavor):
    n, post_layers = options["mhc_mult"], _post_layers(options)
    if not post_layers:
        # One layer without a post update runs pre_apply_mix's kernel.
        return [(pre_apply_mix_kernel.build_pre_apply_mix_fwd, pre_apply_mix_kernel.PreApplyMixFwdSpec(n, flavor))]
    spec = parallel.MultilayerRecomputeSpec(n, SOURCE_HIDDEN, options["num_layers"], post_layers, flavor)
    return [(parallel.build_multilayer_recompute, spec)]


MHC_MULTILAYER_RECOMPUTE = KernelOp(
    OP,
    (Param("initial_residual", "Tensor"), Param("pre_mix_list", "Tensor[]"), Param("layer_output_list", "Tensor[]"),
     Param("post_mix_list", "Tensor[]"), Param("comb_mix_list", "Tensor[]"),
     Param("layer_input_list", "Tensor[]", mutable=True), Param("residual_list", "Tensor[]", mutable=True)),
    (), _run,
    command=Command(
        summary="rebuild a run of layers' inputs and residuals from R_0: pre_apply_mix then post per layer, "
                "bit for bit, in one kernel",
        support=SUPPORT, default_shape=(1024, 4096), bench_shapes=RESIDUAL_SHAPES, options=_OPTIONS,
        make_inputs=_inputs, kernels=_kernels, check=_check))


def mhc_multilayer_recompute(initial_residual: torch.Tensor, pre_mix_list: list[torch.Tensor],
                             layer_output_list: list[torch.Tensor], post_mix_list: list[torch.Tensor],
                             comb_mix_list: list[torch.Tensor], layer_input_list: list[torch.Tensor],
                             residual_list: list[torch.Tensor], *, target: str | None = None,
                             flavor: str | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Rebuild the layer inputs and carried residuals of a run of ``L`` layers from ``R_0``.

    With ``R = initial_residual``, for each layer ``l = 0 .. L - 1`` and every token:
    ``layer_input_list[l] = mhc_pre_apply_mix_fwd(R, pre_mix_list[l])`` and, for
    ``l < L_post``, ``R = residual_list[l] = mhc_post_fwd(layer_output_list[l], R, post_mix_list[l],
    comb_mix_list[l])``: the carried residual is rounded to bf16 between layers, as the unfused
    chain stores it. Every output is bit for bit (``torch.equal``) what that chain of vmi's kernels
    gives on the same target and flavor: the layer input in the flavor's stream-mix chain
    (``ascend``: ``pre[0] · R[0]``, then fused multiply-adds; ``cuda``: +0, then fused
    multiply-adds), the residual update ``post[o] · x`` then ``+ comb[i, o] · R[i]`` fused for
    ``i = 0 .. n - 1`` on every flavor, each rounded to bf16 once (nearest, ties to even).
    ``L_post = L - 1`` gives the last layer only its layer input; ``L = 1, L_post = 0`` is one
    ``pre_apply_mix`` (and runs its kernel). With no tokens nothing runs.

    Non-finite values propagate as in IEEE arithmetic and as in the unfused chain: a NaN or ±inf in
    a stream or a layer output reaches its column of the later layers' outputs, one in a mix
    weight whole rows of its token (``0 · inf`` is NaN). NaN signs and payloads are unspecified.

    Assumptions where TileKernels leaves it open: the leading dimensions ``(...)`` are any (the
    tokens are their product) and every list tensor has the same ones; every tensor is contiguous
    (no copy is made of a strided one); ``L <= 16``; the outputs must not share memory with an
    input or with each other. The list tensors are read and written where they are when each
    list's tensors are equally spaced views of one storage (``torch.empty(L, ...).unbind(0)``);
    otherwise the list is stacked into a temporary, which costs a copy of it (for an output list:
    a copy back after the kernel).

    Args:
        initial_residual: ``R_0``, bf16 ``(..., n, H)``, contiguous, ``1 <= n <= 8`` (the stream
            counts of ``mhc_post_fwd``), ``H >= 1``.
        pre_mix_list: ``L`` fp32 ``(..., n, 1)`` or ``(..., n)`` tensors, the pre mix per layer.
        layer_output_list: ``L_post`` bf16 ``(..., H)`` tensors, the sublayer outputs;
            ``L_post`` is ``L - 1`` or ``L``.
        post_mix_list: ``L_post`` fp32 ``(..., n, 1)`` or ``(..., n)`` tensors, the post mix.
        comb_mix_list: ``L_post`` fp32 ``(..., n, n)`` tensors, ``comb[i, o]`` (input stream ``i``,
            output stream ``o``).
        layer_input_list: ``L`` bf16 ``(..., H)`` outputs, overwritten.
        residual_list: ``L_post`` bf16 ``(..., n, H)`` outputs, overwritten: ``residual_list[l] =
            R_{l+1}``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            initial_residual.
        flavor: Bit conventions (see ``vmi_core.targets``). The flavor gives the first step of the layer
            input's chain (above).

    Returns:
        ``(layer_input_list, residual_list)``, the given lists, written.

    Raises:
        TypeError: ``initial_residual`` or a list element is not a tensor or has the wrong dtype
            (residuals, layer outputs and inputs bf16; mixes fp32), or a list is not a list of
            tensors.
        ValueError: ``initial_residual`` has fewer than 2 dimensions, ``n`` outside ``[1, 8]`` or
            ``H == 0``; the list lengths are not ``1 <= L <= 16`` and ``L_post`` in
            ``{L - 1, L}``; a list tensor has the wrong shape, is not contiguous or is on another
            device; an output shares memory with an input or another output; a tensor is too large
            for 32-bit kernel offsets.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        RuntimeError: Grad mode is on and an output requires grad.
    """
    MHC_MULTILAYER_RECOMPUTE(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list,
                             layer_input_list, residual_list, target=target, flavor=flavor)
    return layer_input_list, residual_list


mhc_multilayer_recompute_parallel = parallel_entry(mhc_multilayer_recompute, "initial_residual")
