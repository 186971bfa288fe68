"""Targets, flavors and the choice between them.

A *target* is where a kernel runs: ``ascend`` (Ascend 950 vector cores),
``cuda`` (NVIDIA GPUs), ``cpu`` (TileLang's C backend) or ``ascend-sim`` (the
source the ``ascend`` target emits, run on CPU tensors against vmi-core's model of
the Ascend vector core: see ``vmi_core.ascend_sim``). ``torch`` is a pseudo-target
that runs the PyTorch reference instead of a kernel; it is never chosen by default.

A *flavor* is a set of bit conventions: where TileKernels gives different bits
per platform (packed UE8M0 word width, TMA column-major SF padding, the
multiplication order for pre-quantized inputs, the MoE gate's summation order and
quotient check, the gate backward's auxiliary-term order), an op follows the
flavor of its target. ``cpu`` defaults to the ``ascend`` flavor and can run the
``cuda`` one.

Every op takes them as the keyword-only ``target`` and ``flavor`` (its docstring refers here).
``target``: the argument, else ``$VMI_TARGET``, else the target of the op's leading tensor's device
(npu: ``ascend``, cuda: ``cuda``, cpu: ``cpu``); a kernel target must match that device
(``ascend-sim`` runs on cpu tensors; a meta tensor takes any target). ``flavor``: only choosable on
``cpu`` and ``torch`` (the argument, else ``$VMI_FLAVOR``, else ``ascend``); ``ascend``,
``ascend-sim`` and ``cuda`` always use their own. Errors, raised before any kernel runs:
``TypeError`` when either is neither a str nor None; ``ValueError`` when either is unknown, a
kernel target does not match the device, or ``flavor`` is not the own flavor of ``ascend``,
``ascend-sim`` or ``cuda``. vmi reads ``$VMI_TARGET`` and ``$VMI_FLAVOR`` once: after changing one in
a running process, call ``vmi_core.refresh_environment()`` (see ``vmi_core.environment``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .environment import FLAVOR_ENV as FLAVOR_ENV
from .environment import TARGET_ENV as TARGET_ENV
from .environment import environment

TARGETS = ("ascend", "cuda", "cpu", "ascend-sim")
PSEUDO_TARGETS = ("torch",)
FLAVORS = ("ascend", "cuda")

_DEVICE_TO_TARGET = {"npu": "ascend", "cuda": "cuda", "cpu": "cpu"}
_TARGET_TO_DEVICE = {"ascend": "npu", "cuda": "cuda", "cpu": "cpu", "ascend-sim": "cpu"}
# Targets that use their own flavor only.
_OWN_FLAVOR = {"ascend": "ascend", "ascend-sim": "ascend", "cuda": "cuda"}


@dataclass(frozen=True)
class Flavor:
    """Bit conventions of one platform."""

    name: str
    # Packed UE8M0: exponents per word and the torch dtype of a word.
    ue8m0_pack: int
    ue8m0_word_dtype: torch.dtype
    # TMA-aligned column-major SF: the storage row is padded to this many bytes.
    col_major_align_bytes: int
    # Re-quantizing a pre-quantized input: ``fl(fl(q * s_in) * sf_inv)`` when
    # True (Ascend), ``fl(q * fl(s_in * sf_inv))`` when False (CUDA).
    dequant_before_scale: bool
    # MoE gate: the order of the K-term denominator sums of ``normalize_weight`` and
    # the gate, "sequential" (left to right, one lane) or "butterfly" (32-lane xor
    # butterfly, as warp shuffles give it); and whether ``w / D`` is forced to the
    # correctly rounded quotient by a residual check (the device division is not).
    gate_sum_order: str = "sequential"
    gate_quotient_check: bool = False
    # MoE gate backward, auxiliary term: ``h*inv + (-(<h,u>*inv*inv))`` (expanded) or
    # ``(h - <h,u>*inv) * inv``.
    gate_aux_expanded: bool = False

    def col_major_align(self, elem_bytes: int) -> int:
        """Storage-row alignment of a column-major SF, in elements."""
        return max(1, self.col_major_align_bytes // elem_bytes)


ASCEND = Flavor("ascend", ue8m0_pack=2, ue8m0_word_dtype=torch.int16, col_major_align_bytes=1,
                dequant_before_scale=True, gate_sum_order="sequential", gate_quotient_check=True,
                gate_aux_expanded=True)
CUDA = Flavor("cuda", ue8m0_pack=4, ue8m0_word_dtype=torch.int32, col_major_align_bytes=16,
              dequant_before_scale=False, gate_sum_order="butterfly", gate_quotient_check=False)
_FLAVORS = {"ascend": ASCEND, "cuda": CUDA}


def get_flavor(name: str | Flavor) -> Flavor:
    if isinstance(name, Flavor):
        return name
    if name not in _FLAVORS:
        raise ValueError(f"flavor must be one of {FLAVORS}, got {name!r}")
    return _FLAVORS[name]


def target_of_device(device: torch.device) -> str:
    try:
        return _DEVICE_TO_TARGET[device.type]
    except KeyError:
        raise ValueError(f"tensors on device {device.type!r} are not supported; "
                         f"expected one of {tuple(_DEVICE_TO_TARGET)}") from None


def resolve_target(tensor: torch.Tensor, target: str | None = None) -> str:
    """The target an op runs on: the argument, else ``$VMI_TARGET``, else the device's.

    A kernel target must match the tensor's device (``torch`` runs anywhere; meta tensors,
    which only reach shape functions, take any target and default to ``torch``).
    """
    # Meta tensors only ever reach an op's shape function, which takes any target's layouts.
    device_target = "torch" if tensor.device.type == "meta" else target_of_device(tensor.device)
    chosen = target or environment().target or device_target
    if chosen not in TARGETS + PSEUDO_TARGETS:
        raise ValueError(f"target must be one of {TARGETS + PSEUDO_TARGETS}, got {chosen!r}")
    if chosen in TARGETS and tensor.device.type != "meta" and _TARGET_TO_DEVICE[chosen] != tensor.device.type:
        raise ValueError(f"target {chosen!r} runs on {_TARGET_TO_DEVICE[chosen]!r} tensors, "
                         f"but the input is on {tensor.device.type!r}")
    return chosen


def resolve_flavor(target: str, flavor: str | Flavor | None = None) -> Flavor:
    """The flavor for ``target``: the argument, else ``$VMI_FLAVOR`` (cpu/torch only).

    ``ascend``, ``ascend-sim`` and ``cuda`` always use their own flavor; ``cpu`` and
    ``torch`` default to ``ascend``.
    """
    if target in _OWN_FLAVOR:
        own = _FLAVORS[_OWN_FLAVOR[target]]
        if flavor is not None and get_flavor(flavor) is not own:
            raise ValueError(f"flavor {get_flavor(flavor).name!r} is not available on target "
                             f"{target!r}, which always uses its own flavor")
        return own
    if target not in ("cpu", "torch"):
        raise ValueError(f"target must be one of {TARGETS + PSEUDO_TARGETS}, got {target!r}")
    return get_flavor(flavor or environment().flavor or "ascend")


def device_of(target: str) -> str:
    """The torch device type a kernel target's tensors live on."""
    if target not in _TARGET_TO_DEVICE:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    return _TARGET_TO_DEVICE[target]


def lowering_target(target: str) -> str:
    """The target a kernel is lowered for: ``ascend-sim`` runs what ``ascend`` emits."""
    return "ascend" if target == "ascend-sim" else target


def flavor_argument(target: str, flavor: str | None) -> str | None:
    """``flavor`` where ``target`` lets the caller choose (cpu, torch), else None: the target's own."""
    return None if target in _OWN_FLAVOR else flavor


def require_kernel(op: str, x, target: str | None) -> None:
    """``*_parallel`` entry points always run the kernel: refuse the reference pseudo-target.

    ``x`` is the op's leading input: a tensor, or a tuple or list whose first entry is one (a
    quantized ``(data, sf)`` pair, a list of scales); without one (e.g. an empty sequence), only an
    explicit or ``$VMI_TARGET`` reference is refused, and the rest is left to the op's own checks."""
    tensor = x[0] if isinstance(x, (tuple, list)) and x else x
    if isinstance(tensor, torch.Tensor):
        chosen = resolve_target(tensor, target)
    else:
        chosen = target or environment().target
    if chosen == "torch":
        raise ValueError(f"{op} always runs the kernel; target 'torch' is the reference")
