"""Lane-generic kernel arithmetic: one source for scalar lanes and Ascend vector registers.

A kernel body computes on *lane values*. On cpu, cuda and in Ascend SIMT regions a lane value
is a scalar TIR expression (one element per parallel iteration); in Ascend SIMD regions it is
a ``Vec``, a 256-byte vector register of ``LANES`` 32-bit lanes (explicit ``T.simd`` code).
``Vec`` has the operators of a scalar expression, and the functions below (``keep``,
``select``, ``bitcast``, ``cast``, ``minimum``, ``maximum``) accept either kind, so the number
formats (``vmi_core.tl.formats``) and the scale rules are written once and serve both.

Every vector value lives in 32-bit lanes: narrow data (bf16, E4M3, UE8M0 and FP4 bytes) is
widened by the load and narrowed again by the store (``vmi_core.tl.vector``), so a narrowing
``cast`` of a ``Vec`` only masks the lane to the narrow width, exactly like the scalar cast.

Scalar intermediates that are used more than once are kept in ``T.alloc_var`` scalars
(TileLang inlines let bindings, which would repeat their expressions at every use); vector
intermediates are bound once as registers.
"""

from __future__ import annotations

from .lazy import T, tirx

LANES = 64
_WIDTH_MASK = {"uint8": 0xFF, "uint16": 0xFFFF}
_CMP = {"__lt__": "lt", "__le__": "le", "__gt__": "gt", "__ge__": "ge", "__eq__": "eq", "__ne__": "ne"}


def simd():
    """TileLang's ``T.simd`` namespace (importing it registers the Ascend backend)."""
    import tilelang.ascend.language as TA

    return TA.simd


def _bind(expr):
    from tvm.tirx.script.builder.ir import bind

    return bind(expr)


def _vec_dtype(elem: str) -> str:
    return f"{elem}x{LANES}"


def _scalar(value, dtype: str):
    """A Python number or scalar expression as a ``dtype`` scalar operand of a vector op."""
    if isinstance(value, tirx.PrimExpr):
        return value if str(value.dtype) == dtype else T.Cast(dtype, value)
    return tirx.const(value, dtype)


class Pred:
    """A predicate register: one bit per lane of a 32-bit-lane ``Vec``."""

    __slots__ = ("expr",)

    def __init__(self, expr):
        self.expr = expr

    def __and__(self, other):
        return Pred(simd().pand(self.expr, other.expr, all_lanes()))

    def __or__(self, other):
        return Pred(simd().por(self.expr, other.expr, all_lanes()))

    def __invert__(self):
        return Pred(simd().pnot(self.expr, all_lanes()))


def all_lanes():
    """The all-lanes predicate of 32-bit lanes (bound once per scope by TileLang)."""
    from tilelang.ascend.language.simd import _default_mask_bits

    return _default_mask_bits(32)


class Vec:
    """A vector register of ``LANES`` 32-bit lanes (``uint32``, ``int32`` or ``float32``)."""

    __slots__ = ("expr",)

    def __init__(self, expr):
        self.expr = expr

    @property
    def dtype(self) -> str:
        return str(self.expr.dtype).split("x", 1)[0]

    @staticmethod
    def splat(value, dtype: str) -> Vec:
        """Every lane ``value`` (a Python number or a scalar expression)."""
        return Vec(simd().vdup(_scalar(value, dtype), dtype))

    @staticmethod
    def lane_index(start=0) -> Vec:
        """``start + lane`` in every lane (int32)."""
        return Vec(simd().vci(_scalar(start, "int32"), "int32"))

    def _operand(self, other) -> Vec:
        return other if isinstance(other, Vec) else Vec.splat(other, self.dtype)

    def _binary(self, other, vector_op: str, scalar_op: str | None = None) -> Vec:
        S = simd()
        if not isinstance(other, Vec) and scalar_op is not None:
            return Vec(getattr(S, scalar_op)(self.expr, _scalar(other, self.dtype)))
        return Vec(getattr(S, vector_op)(self.expr, self._operand(other).expr))

    def _reversed(self, other, vector_op: str) -> Vec:
        return Vec(getattr(simd(), vector_op)(self._operand(other).expr, self.expr))

    def __add__(self, other):
        return self._binary(other, "vadd", "vadds")

    def __radd__(self, other):
        return self._binary(other, "vadd", "vadds")

    def __sub__(self, other):
        return self._binary(other, "vsub")

    def __rsub__(self, other):
        return self._reversed(other, "vsub")

    def __mul__(self, other):
        return self._binary(other, "vmul", "vmuls")

    def __rmul__(self, other):
        return self._binary(other, "vmul", "vmuls")

    def __truediv__(self, other):
        return self._binary(other, "vdiv")

    def __rtruediv__(self, other):
        return self._reversed(other, "vdiv")

    def __and__(self, other):
        return self._binary(other, "vand")

    def __rand__(self, other):
        return self._binary(other, "vand")

    def __or__(self, other):
        return self._binary(other, "vor")

    def __ror__(self, other):
        return self._binary(other, "vor")

    def __xor__(self, other):
        return self._binary(other, "vxor")

    # A register of shift amounts is signed (asc_shiftleft/asc_shiftright, arch 3510): uint32
    # amounts go as int32, the same value for every amount below 2^31 (a negative one is undefined).
    def __lshift__(self, other):
        return self._binary(_shift_amount(other), "vshl", "vshls")

    def __rlshift__(self, other):
        return self._operand(other)._binary(_shift_amount(self), "vshl")

    def __rshift__(self, other):
        # Logical for uint32 lanes, arithmetic for int32, as the scalar ``>>``.
        return self._binary(_shift_amount(other), "vshr", "vshrs")

    def __neg__(self):
        return Vec(simd().vneg(self.expr))

    def _compare(self, other, op: str) -> Pred:
        S = simd()
        if isinstance(other, Vec):
            return Pred(S.vcmp(self.expr, other.expr, op=op))
        return Pred(S.vcmps(self.expr, _scalar(other, self.dtype), op=op))

    def __lt__(self, other):
        return self._compare(other, "lt")

    def __le__(self, other):
        return self._compare(other, "le")

    def __gt__(self, other):
        return self._compare(other, "gt")

    def __ge__(self, other):
        return self._compare(other, "ge")

    def __eq__(self, other):  # noqa: D105  (lane-wise, like a scalar expression)
        return self._compare(other, "eq")

    def __ne__(self, other):
        return self._compare(other, "ne")

    __hash__ = None


def _shift_amount(amount):
    return bitcast(amount, "int32") if isinstance(amount, Vec) and amount.dtype == "uint32" else amount


def _is_vec(*values) -> bool:
    return any(isinstance(v, (Vec, Pred)) for v in values)


def keep(value):
    """``value`` computed once: a scalar in a ``T.alloc_var``, a vector bound as a register."""
    if isinstance(value, Vec):
        return Vec(_bind(value.expr))
    if isinstance(value, Pred):
        return Pred(_bind(value.expr))
    if hasattr(value, "asobject"):  # a scalar ``==`` / ``!=``: TVM defers it as a Python comparison
        value = value.asobject()
    var = T.alloc_var(str(value.dtype))
    T.buffer_store(var, value, [0])
    return var[0]


def select(cond, then_value, else_value):
    """``cond ? then_value : else_value`` per lane."""
    if isinstance(cond, Pred):
        dtype = next(v.dtype for v in (then_value, else_value) if isinstance(v, Vec)) \
            if _is_vec(then_value, else_value) else str(then_value.dtype)
        a = then_value if isinstance(then_value, Vec) else Vec.splat(then_value, dtype)
        b = else_value if isinstance(else_value, Vec) else Vec.splat(else_value, dtype)
        return Vec(simd().vsel(a.expr, b.expr, cond.expr))
    return T.Select(cond, then_value, else_value)


def _is_float(value) -> bool:
    return isinstance(value, float) or str(getattr(value, "dtype", "")).startswith("float")


def minimum(a, b):
    """``min(a, b)``. Scalar float lanes compare and select, ``a < b ? a : b`` (a NaN ``b`` is the
    result, a NaN ``a`` is not): the bits of the cpu's C on every target, where a ``min`` call would
    follow each target's own NaN rule (and the Ascend SIMT API declares integer ``min`` only)."""
    if isinstance(a, Vec):
        return a._binary(b, "vmin", "vmins")
    if isinstance(b, Vec):
        return b._binary(a, "vmin", "vmins")
    return select(a < b, a, b) if _is_float(a) or _is_float(b) else T.min(a, b)


def maximum(a, b):
    """``max(a, b)``; scalar float lanes ``a > b ? a : b``, as ``minimum``. Vector lanes (Ascend
    ``vmax``) differ on NaN: for floats, only for operands that are not NaN."""
    if isinstance(a, Vec):
        return a._binary(b, "vmax", "vmaxs")
    if isinstance(b, Vec):
        return b._binary(a, "vmax", "vmaxs")
    return select(a > b, a, b) if _is_float(a) or _is_float(b) else T.max(a, b)


def bitcast(value, dtype: str):
    """The same bits as another 32-bit type."""
    if isinstance(value, Vec):
        return Vec(T.reinterpret(value.expr, _vec_dtype(dtype)))
    return T.reinterpret(value, dtype)


def cast(value, dtype: str):
    """Value conversion: between integer types (truncating), int32/uint32 <-> float32 (RNE)."""
    if not isinstance(value, Vec):
        return T.Cast(dtype, value)
    src = value.dtype
    if dtype in _WIDTH_MASK:
        return bitcast(value, "uint32") & _WIDTH_MASK[dtype]
    if dtype == src:
        return value
    if dtype == "float32" or src == "float32":
        # Values that reach this conversion are small integers, exact in both types.
        return Vec(simd().vcvt(bitcast(value, "int32").expr if src == "uint32" else value.expr, dtype))
    return bitcast(value, dtype)


class LaneVar:
    """A mutable lane value (a scalar ``T.alloc_var`` or a vector register variable), for values
    that loops update: ``get()`` reads it, ``set(value)`` writes it."""

    def __init__(self, vector: bool, dtype: str, init):
        self.vector, self.dtype = vector, dtype
        self.buffer = simd().alloc_var(dtype) if vector else T.alloc_var(dtype)
        self.set(init)

    def get(self):
        return Vec(self.buffer[0]) if self.vector else self.buffer[0]

    def set(self, value) -> None:
        if self.vector:
            value = (value if isinstance(value, Vec) else Vec.splat(value, self.dtype)).expr
        T.buffer_store(self.buffer, value, [0])


def fma(a, b, c):
    """``a * b + c`` with one rounding (fp32): ``fmaf`` on scalars, ``vmula`` on vectors."""
    if not any(isinstance(v, Vec) for v in (a, b, c)):
        return T.call_pure_extern("float32", "fmaf", a, b, c)
    a, b, c = (v if isinstance(v, Vec) else Vec.splat(v, "float32") for v in (a, b, c))
    acc = simd().alloc_var("float32")
    T.buffer_store(acc, c.expr, [0])
    T.evaluate(simd().vmula(acc[0], a.expr, b.expr))
    return Vec(acc[0])


def sqrt(value):
    """The fp32 square root: ``sqrtf`` on scalars, the vector unit's ``vsqrt`` on vectors."""
    if isinstance(value, Vec):
        return Vec(simd().vsqrt(value.expr))
    return T.sqrt(value)


def absolute(value):
    """``|value|`` (float or signed integer lanes)."""
    if isinstance(value, Vec):
        return Vec(simd().vabs(value.expr))
    return T.abs(value)


def widen(value):
    """A narrow integer (uint8/uint16) as uint32; a ``Vec`` already holds 32-bit lanes."""
    return cast(value, "uint32")
