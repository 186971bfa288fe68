"""Where the time of one cpu op call goes: ``vmi bench OP --overhead``.

A call of ``torch.ops.vmi.<op>`` through its public function passes these layers, each timed on its
own (best of several batches, one thread):

* ``call``: the whole call, as ``KernelOp.__call__`` makes it (the public functions call it);
* ``types``: its argument type checks (``call`` less ``dispatch``);
* ``dispatcher``: torch's dispatcher into vmi's registered kernel (``dispatch`` less ``run``);
* ``checks``: the op's validation, specialisation and output allocation (``run`` without a launch);
* ``launch``: kernel lookup, row splits, views and argument packing (``run`` less ``checks`` less
  ``kernels``);
* ``kernels``: the compiled C kernels alone, called through ctypes with the argument values the
  launch computed (recorded during one call, then replayed);
* ``overhead``: ``call`` less ``kernels``.
"""

from __future__ import annotations

import contextlib
import time

from ..cpu_kernel import CpuKernel
from ..library import KernelOp

MIN_BATCH_SECONDS = 0.02
COLUMNS = ("call", "types", "dispatcher", "checks", "launch", "kernels", "overhead")


def best_us(fn, batches: int = 5) -> float:
    """Microseconds per ``fn()``: the best of ``batches`` batches of calls lasting at least 20 ms."""
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    n = max(1, int(MIN_BATCH_SECONDS / once))
    best = float("inf")
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


@contextlib.contextmanager
def recorded_launches():
    """Yields a list of ``(kernel, argument values, arguments)`` for each cpu kernel launched while the
    block runs. The arguments are kept so that the memory the values point into (outputs, scratch
    tensors of the launch) stays allocated while the values are replayed."""
    calls: list = []
    launch = CpuKernel.__call__

    def record(kernel, *args):
        calls.append((kernel, kernel.values(args), args))
        return launch(kernel, *args)

    CpuKernel.__call__ = record
    try:
        yield calls
    finally:
        CpuKernel.__call__ = launch


def split(op: KernelOp, args: list, flavor: str | None) -> dict[str, float]:
    """The layers of one cpu call of ``op`` with positional ``args`` (see the module docstring), in µs."""
    filled = op._complete(tuple(args))
    with recorded_launches() as launches:
        op.run(*filled, out=None, target="cpu", flavor=flavor, launch=True)

    def kernels():
        for kernel, values, _ in launches:
            kernel.call_values(values)

    t = {"call": best_us(lambda: op(*args, target="cpu", flavor=flavor)),
         "dispatch": best_us(lambda: op.default(*args, target="cpu", flavor=flavor)),
         "run": best_us(lambda: op.run(*filled, out=None, target="cpu", flavor=flavor, launch=True)),
         "checks": best_us(lambda: op.run(*filled, out=None, target="cpu", flavor=flavor, launch=False)),
         "kernels": best_us(kernels) if launches else 0.0}
    return {"call": t["call"], "types": t["call"] - t["dispatch"], "dispatcher": t["dispatch"] - t["run"],
            "checks": t["checks"], "launch": t["run"] - t["checks"] - t["kernels"], "kernels": t["kernels"],
            "overhead": t["call"] - t["kernels"], "launches": len(launches)}
