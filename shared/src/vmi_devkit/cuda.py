"""The CUDA step of the lowering tests: every target lowers here, and what the ``cuda`` target
emits is checked for the shared-memory rules a GPU enforces (``source_checks.cuda_shared_memory_problems``),
then compiled where the CUDA toolkit is installed."""

from __future__ import annotations

import pytest

from vmi_core.tools.source_checks import cuda_shared_memory_problems, nvcc_compile, nvcc_path


def check_cuda_source(src: str, arch: str = "sm_90a") -> None:
    """No shared-memory problem in ``src``, then ``nvcc_compile(src, arch)`` (the test skips where
    nvcc is not installed)."""
    problems = cuda_shared_memory_problems(src)
    assert not problems, "\n".join(problems)
    if nvcc_path() is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed: the CUDA source is generated but cannot be compiled here")
    nvcc_compile(src, arch)
