"""Importing vmi's packages imports no TileLang (seconds of TVM): the first kernel build does.

Each check runs in a fresh interpreter, since this one imported TileLang long ago.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

PACKAGES = ("vmi_core", "vmi_quant", "vmi_mhc", "vmi_moe")


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


@pytest.mark.parametrize("package", PACKAGES)
def test_importing_a_package_imports_no_tilelang(package):
    assert _run(f"import sys, {package}; print(sorted({{'tilelang', 'tvm'}} & set(sys.modules)))") == "[]"


def test_the_first_op_call_imports_tilelang():
    assert _run("""
import sys, torch, vmi_moe
before = "tilelang" in sys.modules
vmi_moe.topk_gate(torch.randn(16, 8, generator=torch.Generator().manual_seed(0)), 2, target="cpu")
print(before, "tilelang" in sys.modules)
""") == "False True"
