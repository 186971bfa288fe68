"""Scaling-factor (SF) layouts: shapes, strides, allocation and addressing.

An SF tensor describes a logical ``nbm x nbk`` grid of block scales. It is
stored as fp32, as E4M3 bytes, or as packed UE8M0 exponents (``P`` bytes per
int16/int32 word, packed along K, or along M for per-channel blocks with
``bk == 1``), row-major or TMA-aligned column-major.

Kernels see every layout the same way: a flat storage buffer (bytes for packed
and E4M3, fp32 otherwise) and two strides, so one kernel body reads or writes
any layout, including user-provided tensors with padded rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import INT32_MAX, check_no_internal_overlap, max_offset
from vmi_core.targets import Flavor


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    return ceil_div(x, y) * y


@dataclass(frozen=True)
class SFLayout:
    """How an SF grid is stored.

    ``kind``: ``"fp32"``, ``"e4m3"`` or ``"ue8m0"`` (packed exponents).
    ``pack``: exponents per word (1 unless ``kind == "ue8m0"``).
    ``pack_along_m``: packed words group ``pack`` consecutive block rows.
    ``col_major``: TMA-aligned column-major (the logical tensor is a transposed view).
    """

    kind: str
    pack: int = 1
    pack_along_m: bool = False
    col_major: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("fp32", "e4m3", "ue8m0"):
            raise ValueError(f"SF kind must be 'fp32', 'e4m3' or 'ue8m0', got {self.kind!r}")
        if (self.kind == "ue8m0") != (self.pack > 1):
            raise ValueError("only ue8m0 SF is packed, and it always packs more than one exponent per word")
        if self.pack_along_m and self.col_major:
            raise ValueError("an SF packed along M cannot be column-major")

    @staticmethod
    def of(flavor: Flavor, *, packed: bool, e4m3: bool = False, col_major: bool = False,
           block_k: int = 0) -> SFLayout:
        """The layout an op produces for ``flavor`` (packing along M iff ``block_k == 1``)."""
        if packed:
            return SFLayout("ue8m0", flavor.ue8m0_pack, pack_along_m=block_k == 1, col_major=col_major)
        return SFLayout("e4m3" if e4m3 else "fp32", col_major=col_major)

    @property
    def storage_dtype(self) -> torch.dtype:
        """dtype of the flat buffer a kernel addresses."""
        return torch.float32 if self.kind == "fp32" else torch.uint8

    def word_dtype(self) -> torch.dtype:
        """dtype of the user-visible tensor."""
        if self.kind == "fp32":
            return torch.float32
        if self.kind == "e4m3":
            return torch.float8_e4m3fn
        return {2: torch.int16, 4: torch.int32}[self.pack]

    def logical_shape(self, nbm: int, nbk: int) -> tuple[int, int]:
        """Shape of the user-visible tensor for an ``nbm x nbk`` grid."""
        if self.pack_along_m:
            return (ceil_div(nbm, self.pack), nbk)
        return (nbm, ceil_div(nbk, self.pack))

    def allocate(self, nbm: int, nbk: int, flavor: Flavor, device: torch.device | str = "cpu") -> torch.Tensor:
        """A zero-filled SF tensor in this layout (padding included, as ``flavor`` pads it)."""
        rows, cols = self.logical_shape(nbm, nbk)
        dtype = self.word_dtype()
        if not self.col_major:
            return torch.zeros((rows, cols), dtype=dtype, device=device)
        elem_bytes = torch.empty((), dtype=dtype).element_size()
        padded_rows = align(rows, flavor.col_major_align(elem_bytes))
        storage = torch.zeros((cols, padded_rows), dtype=dtype, device=device)
        view = storage[:, :rows].t()
        if rows == 0 or cols == 0:
            view = torch.as_strided(storage, (rows, cols), (1, max(padded_rows, 1)))
        return view

    def check(self, sf: torch.Tensor, nbm: int, nbk: int, name: str, *, writable: bool = False) -> None:
        """Raise unless ``sf`` can hold an ``nbm x nbk`` grid in this layout (and, ``writable``, receive
        one: no two blocks share memory); kernels address it with int32 offsets in storage units."""
        if not isinstance(sf, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(sf).__name__}")
        if sf.dtype != self.word_dtype():
            raise TypeError(f"{name} must have dtype {self.word_dtype()}, got {sf.dtype}")
        expected = self.logical_shape(nbm, nbk)
        if tuple(sf.shape) != expected:
            raise ValueError(f"{name} must have shape {expected}, got {tuple(sf.shape)}")
        if sf.numel() > 1 and not (sf.stride(1) == 1 or sf.stride(0) == 1):
            raise ValueError(f"{name} must be row-major or column-major (one unit stride), "
                             f"got strides {tuple(sf.stride())}")
        if writable:
            check_no_internal_overlap(sf, name)
        unit = 1 if self.kind == "fp32" else sf.element_size()
        if max_offset(sf) * unit > INT32_MAX:
            raise ValueError(f"{name} is too large for the kernels, which address it with 32-bit offsets "
                             f"(shape {tuple(sf.shape)}, strides {tuple(sf.stride())})")

    def kernel_view(self, sf: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        """``(flat storage, stride_m, stride_k)`` for ``sf_address``.

        The flat buffer starts at ``sf[0, 0]`` and covers every addressed element;
        strides are in storage elements (bytes for packed and E4M3 SF).
        """
        word_bytes = sf.element_size()
        unit = 1 if self.kind == "fp32" else word_bytes
        s0, s1 = sf.stride()
        span = 1 + sum((n - 1) * s for n, s in zip(sf.shape, sf.stride(), strict=True)) if sf.numel() else 0
        # An empty SF addresses nothing (and may have no storage): hand out a one-element dummy.
        flat = torch.as_strided(sf, (span,), (1,)) if span else sf.new_zeros(1)
        if self.kind != "fp32":
            flat = flat.view(torch.uint8)
        return flat, s0 * unit, s1 * unit


def sf_address(m, k, stride_m, stride_k, layout: SFLayout):
    """Flat storage address of SF block ``(m, k)``; works on ints and TileLang expressions.

    Packed words keep block ``P*w + j`` in byte ``j`` (little-endian) of word ``w``.
    """
    pack = layout.pack
    if pack == 1:
        return m * stride_m + k * stride_k
    if layout.pack_along_m:
        return (m // pack) * stride_m + k * stride_k + m % pack
    return m * stride_m + (k // pack) * stride_k + k % pack
