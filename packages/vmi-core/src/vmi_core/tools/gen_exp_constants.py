"""Writes ``vmi_core/tl/exp_constants.py``: every constant of the correctly rounded exp
(``vmi_core.tl.exp``), derived from first principles with mpmath at 300 bits and rounded once to
binary32. ``python -m vmi_core.tools.gen_exp_constants`` rewrites the file; the tests check that the
committed file is this module's output.
"""

from __future__ import annotations

import struct
from pathlib import Path

import mpmath as mp

TARGET = Path(__file__).resolve().parent.parent / "tl" / "exp_constants.py"


def _f32(v) -> float:
    """``v`` rounded to the nearest binary32 (normal range, ties to even)."""
    v = mp.mpf(v)
    if v == 0:
        return 0.0
    m, e = mp.frexp(v)
    return float(mp.ldexp(mp.nint(mp.ldexp(m, 24)), e - 24))


def _bits(f: float) -> int:
    return struct.unpack("<I", struct.pack("<f", f))[0]


def _significant_bits(f: float) -> int:
    b = (_bits(f) & 0x7FFFFF) | 0x800000
    return 24 - ((b & -b).bit_length() - 1)


def _rounded_to_bits(v, nbits: int) -> float:
    m, e = mp.frexp(v)
    return float(mp.ldexp(mp.nint(mp.ldexp(m, nbits)), e - nbits))


def _below(v) -> float:
    """The largest binary32 below ``v`` (``v`` itself not a binary32)."""
    f = _f32(v)
    if mp.mpf(f) < v:
        return f
    b = _bits(f)
    return struct.unpack("<f", struct.pack("<I", b - 1 if f > 0 else b + 1))[0]


def _reduction(n: int) -> dict:
    """``n/ln2`` and ``ln2/n = L1 + L2 + L3 + L4``: L1 of at most 21 bits and L2 of 9 make
    ``x - k·L1`` and ``k·L2`` exact for ``|k| < 2^15``."""
    c = mp.log(2) / n
    l1 = _f32(c)
    assert _significant_bits(l1) <= 21
    l2 = _rounded_to_bits(c - l1, 9)
    l3 = _f32(c - l1 - l2)
    l4 = _f32(c - l1 - l2 - l3)
    return {"INV": _f32(n / mp.log(2)), "L1": l1, "L2": l2, "L3": l3, "L4": l4}


def _table(n: int, terms: int) -> list[tuple[float, ...]]:
    """``2^(j/n)`` as ``terms`` binary32 values, each the rounding of what the previous leave."""
    rows = []
    for j in range(n):
        rest, row = mp.power(2, mp.mpf(j) / n), []
        for _ in range(terms):
            row.append(_f32(rest))
            rest -= row[-1]
        rows.append(tuple(row))
    return rows


def constants() -> dict:
    mp.mp.prec = 300
    ln2 = mp.log(2)
    out = {
        # The largest x whose e^x rounds to a finite binary32, and the largest with e^x < 2^-126.
        "XMAX": _below(mp.log(mp.mpf(2) ** 128 - mp.mpf(2) ** 103)),
        "XSUB": _below(-126 * ln2),
    }
    for k in range(3, 8):
        c = 1 / mp.factorial(k)
        out[f"C{k}"] = _f32(c)
        if k in (3, 4):
            out[f"C{k}L"] = _f32(c - out[f"C{k}"])
    for n in (16, 32):
        for name, value in _reduction(n).items():
            out[f"{name}_{n}"] = value
    out["T16"] = _table(16, 2)
    out["T32"] = _table(32, 3)
    return out


def render() -> str:
    lines = ['"""Constants of ``vmi_core.tl.exp``, written by ``vmi_core.tools.gen_exp_constants`` (mpmath,',
             'one rounding to binary32 each): do not edit."""', "", "_f = float.fromhex", ""]
    for name, value in constants().items():
        if isinstance(value, list):
            rows = ",\n    ".join("(" + ", ".join(f'_f("{v.hex()}")' for v in row) + ")" for row in value)
            lines.append(f"{name} = (\n    {rows},\n)")
        else:
            lines.append(f'{name} = _f("{value.hex()}")')
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    TARGET.write_text(render())
