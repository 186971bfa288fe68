"""Argument checks shared by every op's dispatch.

Everything here runs before any kernel: bad input raises ``TypeError`` (wrong type or
dtype) or ``ValueError`` (wrong shape, stride, device, size, value or overlap) naming
the argument. Kernels take sizes and strides as int32, so a tensor a kernel reads or
writes must be addressable in int32 from its first element (``check_kernel_extent``);
outputs must not share memory with each other or with inputs (``check_disjoint``)
except where an op documents that it works in place; an op that rewrites a tensor in
place behaves like torch's own in-place ops (``check_in_place``, ``mark_written``).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping

import torch

from .cpu_kernel import LAUNCH_RECORDER

INT32_MAX = 2**31 - 1
# Above this many elements per tensor, two views whose memory ranges intersect are taken
# to overlap without checking element by element.
_EXACT_OVERLAP_LIMIT = 1 << 24


def _type_name(value) -> str:
    return type(value).__name__


def check_int(value, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` is an integer (not a bool, not a float such as ``128.0``) in ``[low, high]``."""
    if isinstance(value, torch.SymInt):
        pass  # a traced size: the bounds below become guards
    elif isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {_type_name(value)} {value!r}")
    else:
        value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bound = (f"in [{low}, {high}]" if low is not None and high is not None
                 else f">= {low}" if low is not None else f"<= {high}")
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def check_float(value, name: str, *, finite: bool = False) -> float:
    """``value`` is a real number (an int is accepted, a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {_type_name(value)} {value!r}")
    value = float(value)
    if finite and not abs(value) < float("inf"):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def check_bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {_type_name(value)} {value!r}")
    return value


def check_choice(value, name: str, choices: Iterable):
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_int_choice(value, name: str, choices: Iterable[int]) -> int:
    """``value`` is an integer (``check_int``: not a bool, not ``32.0``) and one of ``choices``."""
    choices = tuple(choices)
    if check_int(value, name) not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return int(value)


def check_tensor(t, name: str, *, dtype: torch.dtype | Iterable[torch.dtype] | None = None, dim: int | None = None,
                 shape: tuple | None = None, device: torch.device | None = None,
                 contiguous: bool = False) -> torch.Tensor:
    """``t`` is a tensor of ``dtype`` (one or any of several), ``dim`` dimensions, ``shape`` (``None``
    entries: any size), on ``device``, contiguous if asked."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {_type_name(t)}")
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if t.dtype not in allowed:
            wanted = allowed[0] if len(allowed) == 1 else " or ".join(map(str, allowed))
            raise TypeError(f"{name} must be {wanted}, got {t.dtype}")
    if shape is not None:
        if t.dim() != len(shape) or any(w is not None and g != w for g, w in zip(t.shape, shape, strict=True)):
            wanted = ", ".join("*" if s is None else str(s) for s in shape)
            raise ValueError(f"{name} must have shape ({wanted}), got {tuple(t.shape)}")
    elif dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {tuple(t.stride())}")
    return t


def max_offset(t: torch.Tensor) -> int:
    """The element offset of ``t``'s last element from its first (-1 when empty)."""
    if t.numel() == 0:
        return -1
    return sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))


def check_kernel_extent(t: torch.Tensor, name: str) -> torch.Tensor:
    """Every size and stride of ``t`` and the offset of its last element fit a kernel's int32."""
    too_big = [f"size {n}" for n in t.shape if n > INT32_MAX] + [f"stride {s}" for s in t.stride() if s > INT32_MAX]
    if not too_big and max_offset(t) > INT32_MAX:
        too_big = [f"last element at offset {max_offset(t)}"]
    if too_big:
        raise ValueError(f"{name} is too large for the kernels, which address a tensor with 32-bit offsets "
                         f"(at most {INT32_MAX} elements past its first): {', '.join(too_big)} "
                         f"(shape {tuple(t.shape)}, strides {tuple(t.stride())})")
    return t


def has_internal_overlap(t: torch.Tensor) -> bool:
    """Whether two indices of ``t`` may address the same memory.

    Sufficient test: ordered by stride, each dimension of size > 1 steps past everything
    the smaller-stride dimensions span. Views it cannot prove disjoint count as overlapping.
    """
    dims = sorted((s, n) for n, s in zip(t.shape, t.stride(), strict=True) if n > 1)
    reach = 0  # elements spanned by the dims so far, minus one
    for stride, size in dims:
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def check_no_internal_overlap(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.numel() > 1 and has_internal_overlap(t):
        raise ValueError(f"{name} has elements that share memory (shape {tuple(t.shape)}, strides "
                         f"{tuple(t.stride())}, e.g. an expand()ed view); an output needs its own memory per element")
    return t


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + (max_offset(t) + 1) * t.element_size()


def _bytes_of(t: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Absolute addresses of ``t``'s bytes that lie in ``[lo, hi)``."""
    offsets = torch.zeros((), dtype=torch.int64)
    for n, s in zip(t.shape, t.stride(), strict=True):
        offsets = offsets.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * s
    addresses = t.data_ptr() + offsets.reshape(-1, 1) * t.element_size() + torch.arange(t.element_size())
    addresses = addresses.reshape(-1)
    return addresses[(addresses >= lo) & (addresses < hi)]


def is_traced(t: torch.Tensor) -> bool:
    """Whether ``t`` has no real memory (a fake or meta tensor, as ``torch.compile`` traces with)."""
    return t.device.type == "meta" or torch._subclasses.fake_tensor.is_fake(t)


def tensors_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share any byte of memory (exact for views of moderate size).

    Traced tensors have no addresses: the check happens when the op really runs."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device or is_traced(a) or is_traced(b):
        return False
    (a_lo, a_hi), (b_lo, b_hi) = _byte_range(a), _byte_range(b)
    lo, hi = max(a_lo, b_lo), min(a_hi, b_hi)
    if lo >= hi:
        return False
    if max(a.numel(), b.numel()) > _EXACT_OVERLAP_LIMIT:
        return True
    return bool(torch.isin(_bytes_of(a, lo, hi), _bytes_of(b, lo, hi)).any())


def check_disjoint(outputs: Mapping[str, torch.Tensor | None], inputs: Mapping[str, torch.Tensor | None] = (),
                   *, in_place: Iterable[tuple[str, str]] = ()) -> None:
    """No output overlaps itself, another output, or an input (except the ``(output, input)``
    pairs an op documents as in place)."""
    outs = [(n, t) for n, t in outputs.items() if t is not None]
    ins = [(n, t) for n, t in dict(inputs).items() if t is not None]
    allowed = {frozenset(pair) for pair in in_place}
    for i, (name, out) in enumerate(outs):
        check_no_internal_overlap(out, name)
        for other, t in outs[i + 1:] + ins:
            if frozenset((name, other)) in allowed:
                continue
            if tensors_overlap(out, t):
                raise ValueError(f"{name} shares memory with {other}; outputs must not overlap each other "
                                 f"or the inputs")


def check_in_place(t: torch.Tensor, name: str, op: str) -> torch.Tensor:
    """``op`` rewrites ``t`` in place and defines no derivative: with grad mode on, a tensor that
    requires grad is refused (a leaf with torch's own message), so autograd never sees stale values."""
    if torch.is_grad_enabled() and t.requires_grad:
        if t.is_leaf:
            raise RuntimeError(f"{op}: a leaf Variable that requires grad is being used in an in-place operation "
                               f"({name})")
        raise RuntimeError(f"{op} rewrites {name} in place and has no derivative; call it under torch.no_grad() "
                           f"or on a tensor that does not require grad")
    return t


def mark_written(t: torch.Tensor) -> None:
    """Bump ``t``'s version counter after a kernel wrote it in place, as torch's in-place ops do, so a
    backward that saved ``t`` raises instead of silently using the new values; a launch plan repeats it."""
    torch.autograd.graph.increment_version(t)
    recorder = LAUNCH_RECORDER.get()
    if recorder is not None:
        recorder.mark_written(t)
