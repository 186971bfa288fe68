"""Writes ``vmi_core/tl/exp_constants.py`` and ``vmi_core/tl/log1p_constants.py``: every constant of
the correctly rounded exp (``vmi_core.tl.exp``) and log1p (``vmi_core.tl.log1p``), derived from first
principles with mpmath at 300 bits and rounded once to binary32. ``python -m
vmi_core.tools.gen_constants`` rewrites both files; the tests check that the committed files are
this module's output.
"""

from __future__ import annotations

import struct
from pathlib import Path

import mpmath as mp

TARGET = Path(__file__).resolve().parent.parent / "tl" / "exp_constants.py"
LOG1P_TARGET = TARGET.with_name("log1p_constants.py")
# log1p: 1 + x = 2^E·z with z in [Z0, 2·Z0), Z0 = 0.703125 (these bits); the low 18 bits are zero, so
# the 32 subintervals i = ((bits(1 + x) - OFF) >> 18) & 31 are aligned and 1.0 is a boundary.
LOG1P_OFF = 0x3F340000


def _f32(v) -> float:
    """``v`` rounded to the nearest binary32 (normal range, ties to even)."""
    v = mp.mpf(v)
    if v == 0:
        return 0.0
    m, e = mp.frexp(v)
    return float(mp.ldexp(mp.nint(mp.ldexp(m, 24)), e - 24))


def _bits(f: float) -> int:
    return struct.unpack("<I", struct.pack("<f", f))[0]


def _from_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


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


def log1p_constants() -> dict:
    """``ln2 = LN1 + LN2 + LN3 + LN4`` (LN1, LN2 of 16 bits: ``E·LN1``, ``E·LN2`` exact for
    ``|E| <= 2^8``); the series coefficients ``G{n} = (-1)^(n+1)/n``, n = 3..13, with remainders
    ``G{n}L`` for n <= 7; and the tables ``C``, ``LH``, ``LM``, ``LL`` over the subintervals
    ``[lo, hi)`` of ``[Z0, 2·Z0)``: ``C = RN(2 / (lo + hi))`` and ``-log C = LH + LM + LL``."""
    mp.mp.prec = 300
    ln2 = mp.log(2)
    out = {}
    l1 = _rounded_to_bits(ln2, 16)
    l2 = _rounded_to_bits(ln2 - l1, 16)
    l3 = _f32(ln2 - l1 - l2)
    l4 = _f32(ln2 - l1 - l2 - l3)
    assert abs(ln2 - l1 - l2 - l3 - l4) < mp.mpf(2) ** -86
    out.update(LN1=l1, LN2=l2, LN3=l3, LN4=l4)
    for n in range(3, 14):
        c = mp.mpf((-1) ** (n + 1)) / n
        out[f"G{n}"] = _f32(c)
        if n <= 7:
            out[f"G{n}L"] = _f32(c - out[f"G{n}"])
    columns = {name: [] for name in ("C", "LH", "LM", "LL")}
    for i in range(32):
        lo, hi = (mp.mpf(_from_bits(LOG1P_OFF + (j << 18))) for j in (i, i + 1))
        c = _f32(2 / (lo + hi))
        assert max(abs(lo * c - 1), abs(hi * c - 1)) < mp.mpf(2) ** -6
        v = -mp.log(mp.mpf(c))
        h = _f32(v)
        m = _f32(v - h)
        low = _f32(v - h - m)
        assert v == 0 or abs(v - h - m - low) < abs(v) * mp.mpf(2) ** -75
        for column, value in zip(columns.values(), (c, h, m, low), strict=True):
            column.append(value)
    out.update(columns)
    return out


def _render(module: str, values: dict, preamble: tuple[str, ...] = ()) -> str:
    lines = [f'"""Constants of ``vmi_core.tl.{module}``, written by ``vmi_core.tools.gen_constants`` (mpmath,',
             'one rounding to binary32 each): do not edit."""', "", *preamble, "_f = float.fromhex", ""]
    for name, value in values.items():
        if isinstance(value, list) and not isinstance(value[0], tuple):  # a table, as many entries a line as fit
            rows = [""]
            for v in value:
                entry = f'_f("{v.hex()}"),'
                if rows[-1] and len(rows[-1]) + len(entry) > 115:
                    rows.append("")
                rows[-1] += f" {entry}" if rows[-1] else entry
            lines.append(f"{name} = (\n" + "".join(f"    {row}\n" for row in rows) + ")")
        elif isinstance(value, list):
            rows = ",\n    ".join("(" + ", ".join(f'_f("{v.hex()}")' for v in row) + ")" for row in value)
            lines.append(f"{name} = (\n    {rows},\n)")
        else:
            lines.append(f'{name} = _f("{value.hex()}")')
    return "\n".join(lines) + "\n"


def render() -> str:
    return _render("exp", constants())


def render_log1p() -> str:
    off = f"OFF = 0x{LOG1P_OFF:08X}  # bits of Z0 = {_from_bits(LOG1P_OFF)}: 1 + x = 2^E·z, z in [Z0, 2·Z0)"
    return _render("log1p", log1p_constants(), (off, ""))


if __name__ == "__main__":
    TARGET.write_text(render())
    LOG1P_TARGET.write_text(render_log1p())
