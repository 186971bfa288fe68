"""A kernel body declared once: ``@kernel`` turns a TileLang builder into a ``Kernel``.

A builder ``build_x(spec, target)`` returns the prim_func of one specialisation (``spec``: a
hashable value, usually a frozen dataclass) for one target. Declared with ``@kernel``, the name
``build_x`` is its ``Kernel``: still callable as the builder, and it gives everything else:

* ``compiled(spec, target)``: the callable kernel, built once per process and cached on disk
  (``vmi_core.compile.cached_kernel``; ``ascend-sim`` runs what ``ascend`` emits); on ``cuda``
  only a kernel whose source passed on a GPU (``vmi_core.cuda_record``);
* ``source(spec, target)``: the generated source, no hardware needed (the Ascend lowering cached);
* ``ascend_lowering(spec)``: the Ascend source with its launch shape and UB use;
* ``launch_rows(spec, target, num_rows, run)``: the compiled kernel run over row ranges (threads
  on ``cpu``), nothing at all for zero rows;
* ``build_x(spec, target)``: the prim_func itself.

The lowering configuration (``vmi_core.compile.pass_configs``) is declared with the kernel, so a
caller never repeats it: ``simd_parallel=False`` for kernels whose SIMD regions are explicit
vector code, ``simt_8bit=True`` for an Ascend SIMT region that touches 8-bit data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .compile import AscendLowering, cached_kernel, kernel_source, lower_ascend
from .cpu_parallel import launch_rows
from .cuda_record import require_verified


@dataclass(frozen=True)
class Kernel:
    """One kernel body and its lowering configuration (see the module docstring): a dict, or a
    function of the spec for a kernel whose configuration depends on its specialisation."""

    build: Callable
    config: dict | Callable = field(default_factory=dict, hash=False)

    def config_of(self, spec) -> dict:
        return self.config(spec) if callable(self.config) else self.config

    @property
    def name(self) -> str:
        """The kernel's name: its builder's, less ``build_``."""
        return self.build.__name__.removeprefix("build_")

    def __call__(self, spec, target: str):
        return self.build(spec, target)

    def compiled(self, spec, target: str):
        compiled = cached_kernel(self.build, spec, target, **self.config_of(spec))
        if target == "cuda":
            require_verified(self.build, spec, compiled.get_kernel_source)
        return compiled

    def source(self, spec, target: str) -> str:
        return kernel_source(self.build, spec, target, **self.config_of(spec))

    def launch_rows(self, spec, target: str, num_rows: int, run: Callable, **split) -> None:
        """``run(kernel, start, stop)`` over ``num_rows`` rows with the compiled kernel: split across
        threads on ``cpu`` (``split``: ``align``, ``min_rows`` of ``vmi_core.cpu_parallel.run_rows``),
        one call elsewhere; with no rows nothing is compiled or run."""
        if num_rows == 0:
            return
        compiled = self.compiled(spec, target)
        launch_rows(target, lambda start, stop: run(compiled, start, stop), num_rows, **split)

    def ascend_lowering(self, spec) -> AscendLowering:
        return lower_ascend(self.build(spec, "ascend"), "ascend", **self.config_of(spec))


def kernel(build: Callable | None = None, *, simd_parallel: bool = True, simt_8bit: bool = False,
           config: Callable | None = None):
    """Declare a kernel builder: ``@kernel``, ``@kernel(simd_parallel=False, simt_8bit=True)``, or
    ``@kernel(config=f)`` where ``f(spec)`` gives the configuration of each specialisation."""
    if config is None:
        config = {}
        if not simd_parallel:
            config["simd_parallel"] = False
        if simt_8bit:
            config["simt_8bit"] = True

    def declare(builder: Callable) -> Kernel:
        return Kernel(builder, config)

    return declare if build is None else declare(build)
