"""Where the time of one cpu op call goes: ``vmi bench OP --overhead``.

A call of ``torch.ops.vmi.<op>`` through its public function passes these layers, each timed on its
own (best of several batches, one thread), once the signature's launch plan exists
(``vmi_core.plan``):

* ``call``: the whole call, as ``KernelOp.__call__`` makes it (the public functions call it);
* ``types``: its argument type checks (``call`` less ``dispatch``);
* ``dispatcher``: torch's dispatcher into vmi's registered kernel (``dispatch`` less ``planned``);
* ``plan``: the signature's lookup, the outputs' allocation and the kernels' pointers (``planned``
  less ``kernels``); for a signature without a plan, the op's validation and launch;
* ``kernels``: the compiled C kernels alone, called through ctypes with the plan's argument values;
* ``overhead``: ``call`` less ``kernels``;
* ``unplanned``: the whole call with the op's plans turned off: validation, allocation and launch
  on every call.
"""

from __future__ import annotations

import contextlib
import time

from ..cpu_kernel import LAUNCH_RECORDER, CpuKernel
from ..library import KernelOp
from ..plan import Plan

MIN_BATCH_SECONDS = 0.02
COLUMNS = ("call", "types", "dispatcher", "plan", "kernels", "overhead", "unplanned")


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


class _LaunchLog:
    """The launches of an op's ``run`` called directly (which no plan serves), through the hooks a
    plan's recorder uses (``vmi_core.cpu_kernel.LAUNCH_RECORDER``): ``calls`` holds ``(kernel,
    argument values, arguments)``, the arguments kept so the memory the values point into stays
    allocated while the values are replayed."""

    def __init__(self):
        self.calls: list = []

    def launch(self, kernel: CpuKernel, args: tuple) -> None:
        self.calls.append((kernel, kernel.values(args), args))

    def ranges(self, run, ranges) -> None:
        for start, stop in ranges:
            run(start, stop)

    def step(self, t, step, tensors) -> None:
        step(t.tolist(), *tensors)

    def mark_written(self, t) -> None:
        pass


@contextlib.contextmanager
def recorded_launches():
    """Yields the list of ``(kernel, argument values, arguments)`` of the cpu kernels launched while
    the block runs (``_LaunchLog``)."""
    log = _LaunchLog()
    token = LAUNCH_RECORDER.set(log)
    try:
        yield log.calls
    finally:
        LAUNCH_RECORDER.reset(token)


@contextlib.contextmanager
def plans_off(op: KernelOp):
    """``op`` without launch plans while the block runs."""
    plans, op.plans = op.plans, None
    try:
        yield
    finally:
        op.plans = plans


def split(op: KernelOp, args: list, flavor: str | None) -> dict[str, float]:
    """The layers of one cpu call of ``op`` with positional ``args`` (see the module docstring), in µs;
    ``planned``: "yes", or why the signature has no plan; ``launches``: the kernel launches of one call."""
    op(*args, target="cpu", flavor=flavor)
    plan = op.plan_of(*args, target="cpu", flavor=flavor)
    if isinstance(plan, Plan):
        dispatched = op.dispatcher_arguments(args)
        kernels, launches = plan.kernels(dispatched)
        planned = best_us(lambda: op.plans.call(dispatched, "cpu", flavor, None))
    else:
        filled = op._complete(tuple(args))
        with recorded_launches() as recorded:
            op.run(*filled, out=None, target="cpu", flavor=flavor, launch=True)
        launches = len(recorded)

        def kernels():
            for kernel, values, _ in recorded:
                kernel.call_values(values)

        planned = best_us(lambda: op.run(*filled, out=None, target="cpu", flavor=flavor, launch=True))
    t = {"call": best_us(lambda: op(*args, target="cpu", flavor=flavor)),
         "dispatch": best_us(lambda: op.default(*args, target="cpu", flavor=flavor)),
         "kernels": best_us(kernels) if launches else 0.0}
    with plans_off(op):
        unplanned = best_us(lambda: op(*args, target="cpu", flavor=flavor))
    return {"call": t["call"], "types": t["call"] - t["dispatch"], "dispatcher": t["dispatch"] - planned,
            "plan": planned - t["kernels"], "kernels": t["kernels"], "overhead": t["call"] - t["kernels"],
            "unplanned": unplanned, "planned": plan if isinstance(plan, str) else "yes", "launches": launches}
