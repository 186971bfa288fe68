"""The CUDA compile step of the lowering tests: every target lowers here, but only a machine with
the CUDA toolkit can compile what the ``cuda`` target emits."""

from __future__ import annotations

import pytest

from vmi_core.tools.source_checks import nvcc_compile, nvcc_path


def nvcc_compile_or_skip(src: str, arch: str = "sm_90a") -> None:
    """``nvcc_compile(src, arch)``, or skip the test where nvcc is not installed."""
    if nvcc_path() is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed: the CUDA source is generated but cannot be compiled here")
    nvcc_compile(src, arch)
