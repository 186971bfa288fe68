"""Importing vmi's packages imports no TileLang (seconds of TVM): the first kernel build does.

One fresh interpreter (this one imported TileLang long ago) imports every package, then runs an op.
"""

from __future__ import annotations

import subprocess
import sys

PACKAGES = ("vmi_core", "vmi_quant", "vmi_mhc", "vmi_moe", "vmi")


def test_packages_import_no_tilelang_until_the_first_op_call():
    code = f"""
import sys, torch
import {", ".join(PACKAGES)}
print(sorted({{"tilelang", "tvm"}} & set(sys.modules)))
vmi_moe.topk_gate(torch.randn(16, 8, generator=torch.Generator().manual_seed(0)), 2, target="cpu")
print("tilelang" in sys.modules)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["[]", "True"]
