"""TileLang and its TVM, imported at their first use: importing vmi's ops does not import them.

Importing TileLang takes seconds (TVM and its native libraries), and an op needs it only to build
a kernel, at its first call per specialisation. Kernel code imports

    from vmi_core.tl.lazy import T, tirx

``T`` stands for ``tilelang.language`` and ``tirx`` for ``tvm.tirx`` (``tilelang`` and ``tvm``
likewise): the first attribute read imports the module, and every attribute read is the module's
own object. TileLang's builder evaluates a kernel's decorators, annotations and calls in the kernel
module's globals, so it sees exactly what ``import tilelang.language as T`` gives it.

``T.macro`` is the one difference. A macro declared at module level (a function without a closure)
would import TileLang when its module is imported: it becomes TileLang's macro at its first
expansion, inside a kernel build. A macro with a closure becomes one at once, as TileLang binds the
closure's values when it makes the macro.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable


def import_tilelang(name: str = "tilelang"):
    """The module ``name`` of TileLang or its TVM, imported if it is not yet (TileLang first: it
    puts its TVM on the import path)."""
    import tilelang  # noqa: F401

    return importlib.import_module(name)


class LazyModule:
    """The module ``name``, imported at the first attribute read."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        value = getattr(import_tilelang(self._name), attr)
        setattr(self, attr, value)  # later reads are plain attribute reads
        return value

    def __repr__(self) -> str:
        return f"<{self._name}, imported at first use>"


class DeferredMacro:
    """A module-level ``T.macro``: TileLang's macro of the function, made at its first expansion."""

    def __init__(self, func: Callable):
        functools.update_wrapper(self, func)
        self._macro = None

    def __call__(self, *args, **kwargs):
        if self._macro is None:
            self._macro = import_tilelang("tilelang.language").macro(self.__wrapped__)
        return self._macro(*args, **kwargs)


class _Language(LazyModule):
    def macro(self, func: Callable):
        """``tilelang.language.macro``, deferred for a function without a closure (see the module)."""
        if func.__closure__ is None:
            return DeferredMacro(func)
        return import_tilelang("tilelang.language").macro(func)


T = _Language("tilelang.language")
tilelang = LazyModule("tilelang")
tirx = LazyModule("tvm.tirx")
tvm = LazyModule("tvm")
