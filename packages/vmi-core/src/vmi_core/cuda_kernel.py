"""The launch path of compiled cuda kernels: every tensor's base address checked before the launch.

TileLang's CUDA code moves global memory in vectors of up to 16 bytes (``*(float4*)``, ``int2``) and
through TMA descriptors, at offsets that are multiples of the vector width from each tensor's first
element: the generated code is right only if that first element is 16-byte aligned. The dispatch
checks dtypes, shapes, strides and contiguity, but a contiguous view can start anywhere (a slice of a
flat buffer, ``x.view(-1)[1:]``), and such a pointer would fault (misaligned address) or move the
wrong bytes. So it is refused here, before anything runs, naming the kernel parameter; a copy
(``.clone()``) is aligned. Every allocation torch's CUDA allocator makes is.
"""

from __future__ import annotations

import torch

CUDA_ALIGNMENT = 16


class CudaKernel:
    """A compiled cuda kernel (TileLang's ``JITKernel``), called with the prim_func's parameters in
    order; its other attributes (``get_kernel_source``, ...) are the ``JITKernel``'s."""

    def __init__(self, jit_kernel):
        self._kernel = jit_kernel

    def __getattr__(self, name):
        return getattr(self._kernel, name)

    def __call__(self, *args):
        for position, arg in enumerate(args):
            if isinstance(arg, torch.Tensor) and arg.data_ptr() % CUDA_ALIGNMENT:
                raise ValueError(misaligned_message(self._kernel.prim_func, position, arg))
        return self._kernel(*args)


def misaligned_message(func, position: int, tensor: torch.Tensor) -> str:
    param = func.params[position]
    buffer = func.buffer_map.get(param)
    name = buffer.name if buffer is not None else param.name
    kernel = func.attrs["global_symbol"] if func.attrs and "global_symbol" in func.attrs else "the kernel"
    return (f"{kernel}: tensor {name} starts {tensor.data_ptr() % CUDA_ALIGNMENT} bytes past a "
            f"{CUDA_ALIGNMENT}-byte boundary (storage offset {tensor.storage_offset()}); the cuda kernels move "
            f"global memory in {CUDA_ALIGNMENT}-byte vectors from a tensor's first element: pass a copy "
            f"(.clone()), which is aligned")
