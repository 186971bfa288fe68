"""Validation of the MoE ops' arguments.

Everything here runs before any kernel: bad input raises ``TypeError`` (wrong type
or dtype) or ``ValueError`` (wrong shape, stride, device, size or option) naming
the argument, and no output is written.
"""

from __future__ import annotations

import numbers

import torch

from .kernel_common import STATUS_BAD_COUNT, STATUS_BAD_INDEX, STATUS_NONFINITE, STATUS_WORDS

SCORING_FUNCS = ("sqrtsoftplus",)
MAX_TOPK = 32


def check_tensor(t, name: str, dtype: torch.dtype, shape: tuple, device: torch.device | None = None,
                 contiguous: bool = True) -> torch.Tensor:
    """``t`` is a tensor of ``dtype`` and ``shape`` (``None`` entries: any size) on ``device``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if t.dim() != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape, strict=True)):
        want = tuple("*" if s is None else s for s in shape)
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {tuple(t.stride())}")
    return t


def check_int(value, name: str, low: int, high: int | None = None) -> int:
    """``value`` is an int in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return int(value)


def check_float(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    return float(value)


def check_bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_scoring_func(op: str, scoring_func) -> None:
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f"{op}: scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")


def check_topk(num_topk, num_experts: int, name: str = "num_topk") -> int:
    num_topk = check_int(num_topk, name, 1, MAX_TOPK)
    if num_topk > num_experts:
        raise ValueError(f"{name} ({num_topk}) must not exceed the number of experts ({num_experts})")
    return num_topk


def new_status(device: torch.device) -> torch.Tensor:
    """The status words a kernel raises flags in (see ``kernel_common``)."""
    return torch.zeros(STATUS_WORDS, dtype=torch.int32, device=device)


def raise_status(status: torch.Tensor, op: str, values: str, indices: str = "") -> None:
    """Raise ``ValueError`` naming the arguments for every flag the kernel raised (one device sync).

    ``values``: the argument whose non-finite entries the kernel flags; ``indices``: the
    argument whose expert ids it flags.
    """
    words = status.tolist()
    errors = []
    if words[STATUS_NONFINITE]:
        errors.append(f"{values} contains non-finite values (NaN or +-inf) where {op} reads them")
    if words[STATUS_BAD_INDEX]:
        errors.append(f"{indices} holds expert ids outside [0, num_experts) (-1 marks an unused slot)"
                      if op == "moe_topk_gate_backward" else
                      f"{indices} holds fixed-routing experts outside [0, num_experts)")
    if words[STATUS_BAD_COUNT]:
        errors.append("logical_count holds replica counts outside [1, to_physical_map.size(1)], or force-random "
                      "routing has fewer physical experts than slots")
    if errors:
        raise ValueError(f"{op}: " + "; ".join(errors))
