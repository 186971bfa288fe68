"""Lane code printed as a C function (``vmi_core.tl.lane_c``): what it prints and what it refuses.

The functions the kernels call are checked bit for bit through kernels (test_exp, test_log1p); these
tests pin the printer's own rules on small bodies, without compiling anything.
"""

from __future__ import annotations

import pytest
import tilelang.language as T

from vmi_core.tl.formats import f32_bits, f32_const, u32
from vmi_core.tl.lane_c import QUALIFIER, c_function
from vmi_core.tl.simd import fma, keep, select


def body(x, y):
    t = keep(fma(x, f32_const(0.1), y))
    return select(x < f32_const(0.0), f32_bits(t) >> u32(3), u32(7))


def test_statements_literals_and_bit_casts():
    text = c_function("f", body, ("float32", "float32"), "uint32")
    assert text.startswith(f"{QUALIFIER} unsigned int f(float x0, float x1) {{\n")
    lines = text.splitlines()
    # The bound value, a named operand for the bit cast, then the result.
    assert lines[1:3] == ["  float v2;", "  v2 = fmaf(x0, 0x1.99999a0000000p-4f, x1);"]
    assert "(*(unsigned int *)(&(v2)))" in text
    assert lines[-2] == "  return ((x0 < 0x0.0p+0f) ? ((*(unsigned int *)(&(v2))) >> ((unsigned int)3U)) : " \
                        "((unsigned int)7U));"


def test_a_call_of_an_earlier_function():
    def twice(x):
        return T.call_extern("float32", "g", x) + T.call_extern("float32", "g", x)

    assert "return (g(x0) + g(x0));" in c_function("h", twice, ("float32",), "float32", frozenset({"g"}))
    with pytest.raises(TypeError, match="call of tirx.call_extern"):
        c_function("h", twice, ("float32",), "float32")


@pytest.mark.parametrize(("lane_code", "message"), [
    (lambda x: x / f32_const(3.0), "Div expression"),
    (lambda x: x + T.float32(float("inf")), "finite float32 literals"),
    (lambda x: T.Cast("float16", x), "not float16"),
])
def test_what_it_cannot_print_is_refused(lane_code, message):
    with pytest.raises(TypeError, match=message):
        c_function("f", lane_code, ("float32",), "float32")
