"""TileLang imported at first use (``vmi_core.tl.lazy``): the names are TileLang's own, and a
module-level macro, made at its first expansion, builds what TileLang's macro builds."""

from __future__ import annotations

import tilelang.language as TL
import tvm

from vmi_core.tl.lazy import DeferredMacro, T, tirx


def double(x, y):
    for i in TL.serial(4):
        y[i] = x[i] * 2.0


def _kernel(macro):
    @TL.prim_func
    def kernel(X: TL.Tensor((4,), "float32"), Y: TL.Tensor((4,), "float32")):
        with TL.Kernel(1):
            macro(X, Y)

    return kernel


def test_names_are_the_modules_own():
    assert T.prim_func is TL.prim_func and T.Tensor is TL.Tensor and T.float32 is TL.float32
    assert tirx.IntImm is tvm.tirx.IntImm


def test_a_module_level_macro_is_deferred_and_builds_the_same_kernel():
    deferred = T.macro(double)
    assert isinstance(deferred, DeferredMacro) and deferred.__name__ == "double"
    assert _kernel(deferred).script() == _kernel(TL.macro(double)).script()


def test_a_macro_with_a_closure_is_made_at_once():
    scale = 2.0

    def scaled(x, y):
        for i in TL.serial(4):
            y[i] = x[i] * scale

    assert not isinstance(T.macro(scaled), DeferredMacro)
