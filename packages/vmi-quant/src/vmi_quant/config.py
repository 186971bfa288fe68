"""Runtime configuration of the quantization ops: the amax clamp table.

Every block amax is clamped from below before its scale is computed, so that an
all-zero block still gets a finite, non-zero scale. The clamp is part of each
kernel's compile-time specialisation: changing it builds a new kernel.
"""

from __future__ import annotations

FORMATS = ("e4m3", "e2m1")

_DEFAULT_AMAX_CLAMP = {
    ("e4m3", False): 1e-4,
    ("e4m3", True): 448.0 * 2.0**-9,
    ("e2m1", False): 6.0 * 2.0**-126,
    ("e2m1", True): 6.0 * 2.0**-9,
}
_amax_clamp = dict(_DEFAULT_AMAX_CLAMP)


def validate_quant_fmt(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")


def get_amax_clamp_for_quant(fmt: str, use_e4m3_sf: bool = False) -> float:
    """The lower clamp applied to every block amax of ``fmt`` (a Python float; used as fp32)."""
    validate_quant_fmt(fmt)
    return _amax_clamp[(fmt, bool(use_e4m3_sf))]


def set_amax_clamp_for_quant(fmt: str, use_e4m3_sf: bool, value: float) -> None:
    validate_quant_fmt(fmt)
    value = float(value)
    if not value > 0.0:
        raise ValueError(f"value must be a positive amax clamp, got {value!r}")
    _amax_clamp[(fmt, bool(use_e4m3_sf))] = value


def reset_runtime_config() -> None:
    """Restore every runtime setting of vmi-quant to its default."""
    _amax_clamp.clear()
    _amax_clamp.update(_DEFAULT_AMAX_CLAMP)
