"""Scalar lane code printed as one C function, for a kernel to call instead of inlining it.

A correctly rounded ``exp`` is a few hundred TIR statements per call site. Inlined, TileLang's
passes walk every one of them at every call site, and the Ascend scheduler's cost grows with the
loop body it schedules (swiglu_forward's Ascend lowering: 292 s with the exp as inline SIMT lanes,
docs/core.md). Printed once as a function that the kernel calls, the body is one call statement
to the passes, and the C compiler inlines it again (GCC then vectorizes the calling loop as before).

``c_function`` traces the lane code on the function's parameters (a ``T.prim_func`` of one-element
buffers) and prints the statements it makes: declarations of its ``T.alloc_var`` scalars,
assignments, and the expression nodes fp32/int32 lane code is made of (arithmetic, compares,
selects, casts, bit casts, shifts, bit operations, ``fmaf``). Anything else is refused, so the
printed function computes exactly what the lane code would inline. Literals are printed exactly
(fp32 as hexadecimal floats), and a bit cast goes through a named operand as TileLang's own code
generators print it on every target.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .lazy import T, tirx

# What a function is declared as, per compiler: nvcc (cuda); AscendC's bisheng for the device
# (``__NPU_ARCH__``, a predefined macro, which ascend-sim's model defines too; a SIMT region may call
# only ``__simt_callee__`` functions); C++ elsewhere (cpu): C linkage, since TileLang's C code
# generator declares an extern call ``extern "C"``, and always inlined, since GCC vectorizes the
# calling loop only with the body inlined and its size limits would otherwise keep it a call.
QUALIFIER = "VMI_LANE_FUNCTION"
QUALIFIER_DEFINITION = f"""#ifndef {QUALIFIER}
#if defined(__CUDACC__)
#define {QUALIFIER} __device__ __forceinline__
#elif defined(__NPU_ARCH__)
#define {QUALIFIER} __simt_callee__ inline
#else
#define {QUALIFIER} extern "C" inline __attribute__((always_inline))
#endif
#endif
"""

# Built-in types: the text may come before any header (nvcc's source starts with it); ``int`` is
# 32 bits on every target.
_C_TYPES = {"float32": "float", "int32": "int", "uint32": "unsigned int", "bool": "bool"}
_BIT_CALLS = {"tirx.shift_left": "<<", "tirx.shift_right": ">>", "tirx.bitwise_and": "&",
              "tirx.bitwise_or": "|", "tirx.bitwise_xor": "^"}
_EXTERNS = {"fmaf"}


@functools.cache
def _binary_operators() -> dict:
    """The C operator of each binary expression node (a function: TVM is imported at the first trace)."""
    return {
        tirx.Add: "+", tirx.Sub: "-", tirx.Mul: "*",
        tirx.EQ: "==", tirx.NE: "!=", tirx.LT: "<", tirx.LE: "<=", tirx.GT: ">", tirx.GE: ">=",
        tirx.And: "&&", tirx.Or: "||",
    }


def _c_type(dtype) -> str:
    name = str(dtype)
    if name not in _C_TYPES:
        raise TypeError(f"lane functions take and make float32, int32, uint32 or bool values, not {name}")
    return _C_TYPES[name]


def _trace(body: Callable, params: tuple[str, ...], result: str):
    """The prim_func ``R[0] = body(P0[0], P1[0], ...)``: the lane code's statements over its parameters.

    Traced in a thread of its own: TileLang's builder is per thread, and a kernel's build (the
    first call of a function) may be under way in this one."""
    buffers = [tirx.decl_buffer((1,), dtype, name=f"p{i}") for i, dtype in enumerate(params)]
    out = tirx.decl_buffer((1,), result, name="r")

    def build():
        @T.prim_func
        def traced():
            T.buffer_store(out, body(*[b[0] for b in buffers]), [0])

        return traced

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(build).result(), buffers, out


class _Printer:
    def __init__(self, params: list, out, callable_names: frozenset):
        self.names: dict = {buffer.data: f"x{i}" for i, buffer in enumerate(params)}
        self.out = out
        self.callable_names = callable_names
        self.lines: list[str] = []
        self.temps = 0

    def name(self, buffer) -> str:
        if buffer.data not in self.names:
            self.names[buffer.data] = f"v{len(self.names)}"
        return self.names[buffer.data]

    def stmt(self, node) -> None:
        if isinstance(node, tirx.SeqStmt):
            for child in node.seq:
                self.stmt(child)
        elif isinstance(node, tirx.SBlockRealize):
            self.stmt(node.block)
        elif isinstance(node, tirx.SBlock):
            for buffer in node.alloc_buffers:
                if buffer.scope() != "local.var":
                    raise TypeError(f"lane functions use scalar variables only, not {buffer.scope()} buffers")
                self.lines.append(f"{_c_type(buffer.dtype)} {self.name(buffer)};")
            self.stmt(node.body)
        elif isinstance(node, tirx.BufferStore):
            value = self.expr(node.value)
            if node.buffer.same_as(self.out):
                self.lines.append(f"return {value};")
            else:
                self.lines.append(f"{self.name(node.buffer)} = {value};")
        else:
            raise TypeError(f"lane functions cannot print a {type(node).__name__} statement")

    def bound(self, node) -> str:
        """``node`` in a named temporary: an operand whose address a bit cast takes."""
        if isinstance(node, tirx.BufferLoad):
            return self.expr(node)
        self.temps += 1
        name = f"t{self.temps}"
        self.lines.append(f"{_c_type(node.dtype)} {name} = {self.expr(node)};")
        return name

    def expr(self, node) -> str:
        if isinstance(node, tirx.BufferLoad):
            return self.names.get(node.buffer.data) or self.name(node.buffer)
        if isinstance(node, tirx.FloatImm):
            if str(node.dtype) != "float32" or not math.isfinite(node.value):
                raise TypeError(f"lane functions take finite float32 literals, not {node.dtype} {node.value}")
            return f"{float(node.value).hex()}f"
        if isinstance(node, tirx.IntImm):
            if str(node.dtype) == "bool":
                return "true" if node.value else "false"
            return f"(({_c_type(node.dtype)}){node.value}{'U' if str(node.dtype) == 'uint32' else ''})"
        operator = _binary_operators().get(type(node))
        if operator is not None:
            return f"({self.expr(node.a)} {operator} {self.expr(node.b)})"
        if isinstance(node, tirx.Not):
            return f"(!{self.expr(node.a)})"
        if isinstance(node, tirx.Select):
            return f"({self.expr(node.condition)} ? {self.expr(node.true_value)} : {self.expr(node.false_value)})"
        if isinstance(node, tirx.Cast):
            return f"(({_c_type(node.dtype)}){self.expr(node.value)})"
        if isinstance(node, tirx.Call):
            op = node.op.name
            if op in _BIT_CALLS:
                return f"({self.expr(node.args[0])} {_BIT_CALLS[op]} {self.expr(node.args[1])})"
            if op == "tirx.reinterpret":
                return f"(*({_c_type(node.dtype)} *)(&({self.bound(node.args[0])})))"
            callee = node.args[0].value if op in ("tirx.call_pure_extern", "tirx.call_extern") else None
            if callee in _EXTERNS or callee in self.callable_names:
                return f"{callee}({', '.join(self.expr(a) for a in node.args[1:])})"
            raise TypeError(f"lane functions cannot print a call of {op}")
        raise TypeError(f"lane functions cannot print a {type(node).__name__} expression")


def c_function(name: str, body: Callable, params: tuple[str, ...], result: str,
               callable_names: frozenset = frozenset()) -> str:
    """The C definition of ``name(x0, x1, ...)`` returning ``body(x0, x1, ...)``; ``params`` and
    ``result`` are the dtypes (float32, int32, uint32, bool). The body may call ``fmaf`` and the
    functions named in ``callable_names`` (defined before it). Needs ``QUALIFIER_DEFINITION`` first."""
    traced, buffers, out = _trace(body, params, result)
    printer = _Printer(buffers, out, callable_names)
    printer.stmt(traced.body)
    args = ", ".join(f"{_c_type(dtype)} x{i}" for i, dtype in enumerate(params))
    lines = "\n".join(f"  {line}" for line in printer.lines)
    return f"{QUALIFIER} {_c_type(result)} {name}({args}) {{\n{lines}\n}}\n"
