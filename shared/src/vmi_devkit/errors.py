"""The guard of the error tests: bad input must raise before any kernel is built or launched.

``forbid_kernels(monkeypatch, *modules)`` replaces ``vmi_core.kernel.cached_kernel`` (every kernel
is compiled or loaded through it) and every ``launch*`` function the named kernel modules define
with one that fails the test ("a kernel was built/launched for bad input"), so bad input that
reaches a kernel fails even when the kernel was compiled earlier in the process.
``no_kernel_fixture(*modules)`` wraps it as a pytest fixture named ``no_kernel`` (autouse unless
asked otherwise) that an error test module assigns to a module-level name:
``no_kernel = no_kernel_fixture("vmi_quant.kernels.cast")``.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

KERNEL_ENTRY = "vmi_core.kernel.cached_kernel"


def launchers(module_name: str) -> list[str]:
    """The ``launch*`` functions that the kernel module ``module_name`` defines (not the ones it imports)."""
    module = importlib.import_module(module_name)
    names = [name for name, value in vars(module).items()
             if name.startswith("launch") and inspect.isfunction(value) and value.__module__ == module.__name__]
    assert names, f"{module_name} defines no launch* function"
    return names


def forbid_kernels(monkeypatch: pytest.MonkeyPatch, *modules: str, why: str = "bad input") -> None:
    """Fail the test if a kernel is built (``cached_kernel``) or launched (the ``launch*`` functions of
    ``modules``, kernel module names such as ``"vmi_mhc.kernels.expand"``) while the patch lasts."""

    def refuse(verb: str):
        def fail(*args, **kwargs):
            raise AssertionError(f"a kernel was {verb} for {why}")
        return fail

    monkeypatch.setattr(KERNEL_ENTRY, refuse("built"))
    for name in modules:
        module = importlib.import_module(name)
        for launcher in launchers(name):
            monkeypatch.setattr(module, launcher, refuse("launched"))


def no_kernel_fixture(*modules: str, autouse: bool = True, why: str = "bad input"):
    """A fixture named ``no_kernel`` that applies ``forbid_kernels(monkeypatch, *modules, why=why)``."""

    @pytest.fixture(autouse=autouse, name="no_kernel")
    def no_kernel(monkeypatch):
        forbid_kernels(monkeypatch, *modules, why=why)

    return no_kernel
