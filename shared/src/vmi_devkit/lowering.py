"""The checks the lowering tests share: a generated Ascend kernel's signature, vector regions, DMA
counts and block index; a CUDA source's kernel and its nvcc compile; and the four tests of a
case-table lowering module (the ascend cases of the default run and the rest of the covering set
under ``slow``; the CUDA compiles, likewise split, marked ``cuda_compile``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from vmi_core.tools.source_checks import assert_vector_regions, dma_counts
from vmi_devkit.cuda import check_cuda_source


def assert_ascend_kernel(src: str, kernel: str, *, simd: int, simt: int, dma: tuple[int, int] | None = None,
                         block_idx: bool = True):
    """``src`` declares the vector kernel ``kernel`` with these SIMD/SIMT region counts (which also
    fails on a barrier inside a thread-guarded branch), ``dma`` (in, out) DMA counts where given, and
    reads ``block_idx`` where ``block_idx``. Returns ``assert_vector_regions``'s regions."""
    assert f"__global__ __vector__ void {kernel}" in src
    regions = assert_vector_regions(src, simd=simd, simt=simt)
    if dma is not None:
        assert dma_counts(src) == dma
    if block_idx:
        assert "block_idx" in src
    return regions


def assert_cuda_compiles(src: str, kernel: str, arch: str = "sm_90a") -> None:
    """``src`` declares a CUDA ``__global__`` kernel named ``kernel`` and compiles with nvcc (skipped
    where nvcc is missing)."""
    assert "__global__ void" in src and kernel in src
    check_cuda_source(src, arch)


def case_table_tests(check_ascend: Callable, check_cuda: Callable, *, covering: Sequence, lowering: Sequence,
                     cuda_lowering: Sequence, ids: Callable, cuda_slow: bool):
    """The four lowering tests of a case table, to assign to module-level ``test_*`` names:
    ``check_ascend`` over ``lowering`` and (slow) over the rest of ``covering``; ``check_cuda``
    (``cuda_compile``) over ``cuda_lowering`` (slow where ``cuda_slow``) and (slow) the rest."""

    @pytest.mark.parametrize("case", lowering, ids=ids)
    def ascend(case):
        check_ascend(case)

    @pytest.mark.slow
    @pytest.mark.parametrize("case", [c for c in covering if c not in lowering], ids=ids)
    def ascend_rest(case):
        check_ascend(case)

    @pytest.mark.cuda_compile
    @pytest.mark.parametrize("case", cuda_lowering, ids=ids)
    def cuda(case):
        check_cuda(case)

    @pytest.mark.slow
    @pytest.mark.cuda_compile
    @pytest.mark.parametrize("case", [c for c in covering if c not in cuda_lowering], ids=ids)
    def cuda_rest(case):
        check_cuda(case)

    if cuda_slow:
        cuda = pytest.mark.slow(cuda)
    return ascend, ascend_rest, cuda, cuda_rest
