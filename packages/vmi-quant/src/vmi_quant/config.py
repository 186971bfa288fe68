"""Runtime configuration of the quantization ops: the amax clamp table and the token alignment.

Every block amax is clamped from below before its scale is computed, so that an
all-zero block still gets a finite, non-zero scale. The clamp is part of each
kernel's compile-time specialisation: changing it builds a new kernel.

The token alignment is the row alignment of the experts' row ranges in the "psum" layout of the
SwiGLU ops (each expert's rows start at a multiple of it; ``vmi_quant.inputs.expert_rows``).
"""

from __future__ import annotations

from vmi_core.checks import check_float, check_int
from vmi_core.plan import invalidate

FORMATS = ("e4m3", "e2m1")

_DEFAULT_AMAX_CLAMP = {
    ("e4m3", False): 1e-4,
    ("e4m3", True): 448.0 * 2.0**-9,
    ("e2m1", False): 6.0 * 2.0**-126,
    ("e2m1", True): 6.0 * 2.0**-9,
}
_amax_clamp = dict(_DEFAULT_AMAX_CLAMP)
_DEFAULT_TOKEN_ALIGNMENT = 128
_token_alignment = _DEFAULT_TOKEN_ALIGNMENT


def validate_quant_fmt(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")


def get_amax_clamp_for_quant(fmt: str, use_e4m3_sf: bool = False) -> float:
    """The lower clamp applied to every block amax of ``fmt`` (a Python float; used as fp32).

    Args:
        fmt: Output format of the quantization, ``"e4m3"`` or ``"e2m1"``.
        use_e4m3_sf: The clamp for E4M3 scaling factors (``use_e4m3_sf=True`` of the ops)
            rather than fp32 or power-of-two ones (taken as a truth value).

    Returns:
        The clamp currently set for ``(fmt, use_e4m3_sf)``.

    Raises:
        ValueError: ``fmt`` is not ``"e4m3"`` or ``"e2m1"``.
    """
    validate_quant_fmt(fmt)
    return _amax_clamp[(fmt, bool(use_e4m3_sf))]


def set_amax_clamp_for_quant(fmt: str, use_e4m3_sf: bool, clamp_min_value: float) -> None:
    """Set the lower clamp applied to every block amax of ``fmt`` (process-wide).

    Every later call of ``per_token_cast``, ``per_block_cast``, their variants and
    ``per_token_cast_and_cast_back`` with this format and SF kind reads the new value when it
    builds its kernel specialisation (a new value compiles a new kernel).
    ``reset_runtime_config`` restores the defaults. The parameter names are TileKernels'.

    Args:
        fmt: Output format of the quantization, ``"e4m3"`` or ``"e2m1"``.
        use_e4m3_sf: Set the clamp for E4M3 scaling factors (``use_e4m3_sf=True`` of the ops)
            rather than fp32 or power-of-two ones (taken as a truth value).
        clamp_min_value: The new clamp: a positive finite number (an int or a float; used as fp32).

    Raises:
        ValueError: ``fmt`` is not ``"e4m3"`` or ``"e2m1"``; ``clamp_min_value`` is not positive
            or not finite (NaN included).
        TypeError: ``clamp_min_value`` is not a number (a bool, a string, None).
    """
    validate_quant_fmt(fmt)
    value = check_float(clamp_min_value, "clamp_min_value", finite=True)
    if not value > 0.0:
        raise ValueError(f"clamp_min_value must be a positive amax clamp, got {value!r}")
    _amax_clamp[(fmt, bool(use_e4m3_sf))] = value
    invalidate()


def get_token_alignment() -> int:
    """The row alignment of the experts' row ranges in the psum layout (default 128).

    Returns:
        The alignment currently set: expert ``e`` owns rows ``[align(psum[e - 1]), psum[e])``.
    """
    return _token_alignment


def set_token_alignment(alignment: int) -> None:
    """Set the row alignment of the experts' row ranges in the psum layout (process-wide).

    Every later call of an op taking ``psum_num_tokens_per_expert`` reads it; the name is
    TileKernels'. ``reset_runtime_config`` restores the default, 128.

    Args:
        alignment: Rows per alignment unit, an int in ``[1, 2^20]``.

    Raises:
        TypeError: ``alignment`` is not an int.
        ValueError: ``alignment`` is outside ``[1, 2^20]``.
    """
    global _token_alignment
    _token_alignment = check_int(alignment, "alignment", 1, 1 << 20)
    invalidate()


def reset_runtime_config() -> None:
    """Restore every runtime setting of vmi-quant to its default."""
    global _token_alignment
    _amax_clamp.clear()
    _amax_clamp.update(_DEFAULT_AMAX_CLAMP)
    _token_alignment = _DEFAULT_TOKEN_ALIGNMENT
    invalidate()
