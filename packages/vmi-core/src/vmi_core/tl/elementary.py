"""The kernels' ``exp`` and ``log1p``: ``vmi_core.tl.exp`` and ``vmi_core.tl.log1p`` printed once as C
functions (``vmi_core.tl.lane_c``) that kernels call on scalar lanes (cpu, cuda, Ascend SIMT).

A call is one statement to TileLang's passes where the inlined lane code was hundreds; the C
compiler inlines the function again (on cpu GCC vectorizes the calling loop as before). The
functions, each the lane code of its module, so the same bits:

* ``vmi_exp_fast_or_mark(x)``: the fast path's ``e^x``, or -1.0 where it cannot decide the rounding
  (``exp_with_flag``; e^x is never negative);
* ``vmi_exp_exact(x)``: ``exp_exact``;
* ``vmi_exp(x)``: the fast path, then the exact one where it could not decide: a branch on SIMT
  lanes and on a GPU, both evaluations selected per lane in a vectorized cpu loop;
* ``vmi_log1p(x)``: ``log1p``.

Every kernel that calls one imports the whole library, one text, since TileLang merges identical
imports into a kernel and refuses different ones. There is no ``Vec`` form: the Ascend vector
unit has no call, and the vector form inlined costs TileLang's Ascend scheduler minutes per kernel,
so an exp on Ascend runs on SIMT lanes (``Shell.exp`` takes a tile of them there).
"""

from __future__ import annotations

import functools

from . import exp as E
from .exact import keep_flat
from .formats import f32_const
from .lane_c import QUALIFIER_DEFINITION, c_function
from .lazy import T
from .log1p import log1p as _log1p
from .simd import Vec, keep, select

# e^x is never negative, and a NaN compares false: the fast pass marks undecided lanes with it.
_HARD = -1.0


def _fast_or_mark(x):
    y, hard = E.exp_with_flag(keep_flat(x))
    return select(hard, f32_const(_HARD), y)


def _exp(x):
    y = keep(_call("vmi_exp_fast_or_mark", x))
    return select(y < f32_const(0.0), _call("vmi_exp_exact", x), y)


# name: (lane code, parameter dtypes, result dtype), each calling only those before it
FUNCTIONS = {
    "vmi_exp_fast_or_mark": (_fast_or_mark, ("float32",), "float32"),
    "vmi_exp_exact": (E.exp_exact, ("float32",), "float32"),
    "vmi_exp": (_exp, ("float32",), "float32"),
    "vmi_log1p": (_log1p, ("float32",), "float32"),
}


@functools.cache
def library() -> str:
    """The C text of every function of ``FUNCTIONS``."""
    texts, defined = [QUALIFIER_DEFINITION], []
    for name, (body, params, result) in FUNCTIONS.items():
        texts.append(c_function(name, body, params, result, frozenset(defined)))
        defined.append(name)
    return "".join(texts)


def _call(name: str, *args):
    return T.call_extern(FUNCTIONS[name][2], name, *args)


def call(name: str, *args):
    """The call ``name(*args)`` of a library function, the library imported into the kernel."""
    if any(isinstance(a, Vec) for a in args):
        raise TypeError(f"{name} takes scalar lanes (cpu, cuda, an Ascend SIMT region), not a vector register: "
                        "on Ascend run the phase in a SIMT region, or take a tile of exps with Shell.exp")
    T.import_source(library())
    return _call(name, *args)


def exp(x):
    """``e^x`` of an fp32 scalar lane value, correctly rounded (``vmi_exp``)."""
    return call("vmi_exp", x)


def log1p(x):
    """``log(1 + x)`` of an fp32 scalar lane value, correctly rounded (``vmi_log1p``)."""
    return call("vmi_log1p", x)


@T.macro
def exp_lanes(shape, src, dst):
    """``dst = e^src`` element-wise over a ``(rows, cols)`` tile domain, one ``exp`` per lane."""
    for i, j in T.Parallel(*shape):
        dst[i, j] = exp(src[i, j])


@T.macro
def exp_tile(shape, src, dst):
    """``dst = e^src`` element-wise over a ``(rows, cols)`` tile domain, in loops a cpu vectorizes.

    The fast evaluation of every element marks the few lanes it cannot decide (about one input in
    2^23) with a negative value; the marks are counted, and only a tile with one takes the exact
    evaluation of its marked lanes. (GCC vectorizes that pass too, masked, which evaluates the
    exact form on every lane: hence the count.) ``src`` and ``dst`` are distinct tiles.
    """
    rows, cols = shape
    for i, j in T.Parallel(rows, cols):
        dst[i, j] = call("vmi_exp_fast_or_mark", src[i, j])
    marked = T.alloc_var("int32")
    marked = 0
    for i, j in T.grid(rows, cols):
        marked = marked + T.Cast("int32", dst[i, j] < f32_const(0.0))
    if marked != 0:
        for i, j in T.Parallel(rows, cols):
            if dst[i, j] < f32_const(0.0):
                dst[i, j] = call("vmi_exp_exact", src[i, j])
