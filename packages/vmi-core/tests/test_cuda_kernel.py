"""The cuda launch path refuses a tensor whose first element is not 16-byte aligned (vmi_core.cuda_kernel).

No GPU here: the compiled kernel is stood in for by an object with the real prim_func that records
its launches; the tensors are cpu tensors, whose addresses the check reads the same way.
"""

from __future__ import annotations

import pytest
import tilelang.language as T
import torch

from vmi_core.cuda_kernel import CUDA_ALIGNMENT, CudaKernel


@T.prim_func
def scale_kernel(X: T.Tensor((64,), "float32"), Y: T.Tensor((64,), "float32"), factor: T.float32):
    with T.Kernel(1, threads=64):
        for i in T.Parallel(64):
            Y[i] = X[i] * factor


class _Compiled:
    """A stand-in for TileLang's compiled kernel: its prim_func, its source and a launch record."""

    prim_func = scale_kernel

    def __init__(self):
        self.launches = []

    def __call__(self, *args):
        self.launches.append(args)

    def get_kernel_source(self) -> str:
        return "// source"


def _at_offset(offset_bytes: int) -> torch.Tensor:
    """A contiguous fp32 (64,) view whose first element is ``offset_bytes`` past a 16-byte boundary."""
    flat = torch.zeros(128)
    start = (-flat.data_ptr() % CUDA_ALIGNMENT + offset_bytes) // 4
    return flat[start:start + 64]


def test_aligned_tensors_launch() -> None:
    compiled = _Compiled()
    x, y = _at_offset(0), _at_offset(0)
    CudaKernel(compiled)(x, y, 2.0)
    assert compiled.launches == [(x, y, 2.0)]


@pytest.mark.parametrize("offset", [4, 8, 12])
def test_a_misaligned_tensor_is_refused_by_name_before_the_launch(offset: int) -> None:
    compiled = _Compiled()
    with pytest.raises(ValueError, match=rf"tensor Y starts {offset} bytes past a 16-byte boundary.*\.clone\(\)"):
        CudaKernel(compiled)(_at_offset(0), _at_offset(offset), 2.0)
    assert compiled.launches == []


def test_the_compiled_kernel_is_otherwise_unchanged() -> None:
    assert CudaKernel(_Compiled()).get_kernel_source() == "// source"
