"""The launch path of compiled CPU kernels: straight into the kernel library through ctypes.

TileLang's call wrapper checks every tensor again and converts each runtime size on every
call (tens of microseconds, most of a decode-size call). vmi's dispatch has validated the
arguments before any kernel runs, so a launch here only reads pointers, sizes and strides
and calls the library's entry point, with the GIL released (``cpu_parallel`` runs row
ranges from several threads).
"""

from __future__ import annotations

import ctypes
from contextvars import ContextVar

import torch

_SCALAR_CTYPES = {"int32": ctypes.c_int32, "int64": ctypes.c_int64, "float32": ctypes.c_float,
                  "float64": ctypes.c_double, "bool": ctypes.c_bool}

# What watches this thread's launches, where something does: an object with ``launch(kernel, args)``
# (before each launch), ``ranges(run, ranges)`` (runs ``cpu_parallel.run_rows``'s ranges),
# ``step(t, step, tensors)`` (runs ``plan.with_values``'s steps) and ``mark_written(t)`` (after
# ``checks.mark_written`` bumped ``t``): a plan's recorder (``vmi_core.plan``), or the overhead
# tool's launch log.
LAUNCH_RECORDER: ContextVar = ContextVar("vmi_launch_recorder", default=None)


class CpuKernel:
    """A compiled CPU kernel, called with the prim_func's parameters in order (tensors or None
    for buffers, Python numbers for scalars); its runtime sizes are read from the tensors."""

    def __init__(self, jit_kernel):
        adapter = jit_kernel.adapter
        func = adapter.prim_func
        names = {param.name for param in func.params}
        argtypes = []
        for param in func.params:
            if param in func.buffer_map or str(param.dtype) == "handle":
                argtypes.append(ctypes.c_void_p)
            else:
                argtypes.append(_SCALAR_CTYPES[str(param.dtype)])
        # The entry point takes the runtime sizes after the parameters, in the adapter's order; each
        # is read from the first tensor that carries it (a buffer may be passed as None).
        sources = adapter.dynamic_symbolic_sources
        self._sizes = []
        for var in adapter.dynamic_symbolic_map:
            if var.name in names:
                continue
            self._sizes.append(tuple(sources[var.name]))
            argtypes.append(_SCALAR_CTYPES[str(var.dtype)])
        self._library = adapter.lib  # the function pointer below is only valid while the library is
        address = ctypes.cast(adapter.lib.call, ctypes.c_void_p).value
        self._call = ctypes.CFUNCTYPE(ctypes.c_int32, *argtypes)(address)

    def __call__(self, *args):
        recorder = LAUNCH_RECORDER.get()
        if recorder is not None:
            recorder.launch(self, args)
        self.call_values(self.values(args))

    def values(self, args) -> list:
        """The entry point's arguments for a call with ``args``: pointers, scalars, then runtime sizes."""
        values = [arg.data_ptr() if isinstance(arg, torch.Tensor) else arg for arg in args]
        for size_sources in self._sizes:
            value = 0
            for kind, index, dim, scale in size_sources:
                tensor = args[index]
                if tensor is not None:
                    value = tensor.shape[dim] if kind == 0 else tensor.stride(dim) * scale
                    break
            values.append(value)
        return values

    def call_values(self, values: list) -> None:
        status = self._call(*values)
        if status != 0:
            raise RuntimeError(f"cpu kernel failed: {self._library.get_last_error().decode(errors='replace')}")
