"""Launch plans: a repeat ``cpu`` call with the same signature goes straight to its kernels.

An op's ``run`` validates its arguments, allocates its outputs and launches its kernels; on a
decode-size call that Python work costs many times the kernels. Almost all of it depends only on
the call's *signature*: the dtypes, shapes and strides of the tensors, the other arguments, the
target, flavor, thread count and the runtime settings. So the first ``cpu`` call of a signature runs
as always while a recorder watches it, and what it saw becomes the signature's plan:

* the outputs' allocations (size, strides, dtype, fill value) and the views the op returns;
* every compiled kernel's launch, with its argument values, each pointer as an offset from an
  input or an allocation, and which launches ran as concurrent row ranges;
* fills of allocations, copies between allocations and the arguments the op writes (``clone``,
  ``copy_``), the version bumps of those arguments (``checks.mark_written``), and the steps that read
  values (``with_values``: checks of an input's values or of a kernel's status words, zeroing the
  rows a layout leaves out), in order.

A later call of that signature allocates, launches and runs those steps from the plan. A signature
whose first call did anything else gets no plan and always runs in full: a torch operation that
computes or writes (only allocations, views, fills of allocations and those copies are allowed), a
kernel argument in none or several of the inputs. A target other than ``cpu`` is never planned.

An argument the op writes in place (a mutable parameter, the preallocated outputs of ``.out``) is
an input of the plan like the others. What the op's validation found about it beyond its signature
is checked again on each planned call, which runs in full where it does not hold (and raises there
where the op refuses the call): it overlaps no other tensor argument, and it does not require grad
while grad mode is on. Its version counter moves as in a call without plans: replaying ``copy_``
moves it as the recorded one did, and each ``mark_written`` of the recorded call is repeated.

Ops read tensor values only through ``with_values`` (a test holds every package to that), so no
value a plan would skip is read unseen. Settings that validation reads (``vmi_quant``'s amax clamp
and token alignment) call ``invalidate`` when they change; the environment's are part of the
signature (``vmi_core.environment``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .cpu_kernel import LAUNCH_RECORDER, CpuKernel
from .cpu_parallel import run_concurrently
from .environment import environment

# Plans kept per op: a serving loop's token counts each make a signature.
MAX_PLANS_PER_OP = 256
_generation = 0
_aten = torch.ops.aten
# Allocations, by the fill value they start with (None: uninitialized; "value": their second argument).
_ALLOCATIONS = {_aten.empty.memory_format: None, _aten.empty_strided.default: None, _aten.empty_like.default: None,
                _aten.new_empty.default: None, _aten.zeros.default: 0, _aten.zeros_like.default: 0,
                _aten.new_zeros.default: 0, _aten.ones.default: 1.0, _aten.full.default: "value"}
_VIEWS = {_aten.view.default, _aten.view.dtype, _aten._unsafe_view.default, _aten.slice.Tensor, _aten.select.int,
          _aten.as_strided.default, _aten.detach.default, _aten.alias.default, _aten.t.default,
          _aten.transpose.int, _aten.permute.default, _aten.unsqueeze.default, _aten.squeeze.dim,
          _aten.squeeze.default, _aten.expand.default, _aten.unfold.default, _aten.split.Tensor,
          _aten.split_with_sizes.default, _aten.unbind.int, _aten.narrow.default, _aten.diagonal.default}
_FILLS = {_aten.zero_.default: 0, _aten.fill_.Scalar: "value"}


def invalidate() -> None:
    """Forget every plan: call after changing a setting that an op's validation reads."""
    global _generation
    _generation += 1


def with_values(t: torch.Tensor, step: Callable, *tensors: torch.Tensor | None) -> None:
    """``step(t.tolist(), *tensors)``: how an op reads a tensor's values, to check them (raising) or
    to write outputs by them; a planned call runs the step again with its own tensors. ``t`` is a
    tensor argument or (a view of) an allocation of the call, ``tensors`` allocations or None; the
    step uses nothing else that a call of the same signature could change, and launches no kernel."""
    recorder = LAUNCH_RECORDER.get()
    if recorder is None:
        step(t.tolist(), *tensors)
    else:
        recorder.step(t, step, tensors)


def _plain(t: torch.Tensor) -> bool:
    """A dense CPU tensor, not a subclass."""
    return t.is_cpu and t.layout is torch.strided and type(t) in (torch.Tensor, torch.nn.Parameter)


def _signature(args: tuple, target, flavor):
    """The signature of a call, or None where no plan applies (not ``cpu``, or a tensor that is
    not a plain CPU tensor)."""
    settings = environment()
    if (target or settings.target or "cpu") != "cpu":
        return None
    key = [_generation, flavor or settings.flavor, settings.cpu_threads]
    for arg in args:
        if isinstance(arg, torch.Tensor):
            if not _plain(arg):
                return None
            key.append((arg.dtype, arg.shape, arg.stride()))
        elif isinstance(arg, list):
            if arg and isinstance(arg[0], torch.Tensor):
                if not all(_plain(t) for t in arg):
                    return None
                key.append(tuple((t.dtype, t.shape, t.stride()) for t in arg))
            else:
                key.append(tuple(arg))
        elif isinstance(arg, float):
            key.append(arg.hex())  # -0.0 == 0.0, but a kernel may see the sign
        else:
            key.append((type(arg), arg))
    return tuple(key)


def _input_tensors(args: tuple) -> list[tuple[int, int | None, torch.Tensor]]:
    """``(argument index, list index or None, tensor)`` of every tensor argument."""
    found = []
    for i, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            found.append((i, None, arg))
        elif isinstance(arg, list):
            found.extend((i, j, t) for j, t in enumerate(arg) if isinstance(t, torch.Tensor))
    return found


def _storage_range(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _extent(t: torch.Tensor) -> int:
    """The bytes ``t`` spans from its first element (0 when empty)."""
    if not t.numel():
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1) * t.element_size()


@dataclass(frozen=True)
class _View:
    """A view of allocation ``source``: its dtype, shape, strides and storage offset."""

    source: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    def of(self, bases: list[torch.Tensor]) -> torch.Tensor:
        base = bases[self.source]
        if base.dtype != self.dtype:
            return torch.empty(0, dtype=self.dtype).set_(base.untyped_storage(), self.offset, self.shape, self.stride)
        if base.shape == self.shape and base.stride() == self.stride and not self.offset:
            return base
        return base.as_strided(self.shape, self.stride, self.offset)


@dataclass(frozen=True)
class _Allocation:
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    fill: object  # None: uninitialized
    contiguous: bool

    def make(self) -> torch.Tensor:
        if self.fill is None:
            return torch.empty_strided(self.size, self.stride, dtype=self.dtype)
        if self.fill == 0 and self.contiguous:
            return torch.zeros(self.size, dtype=self.dtype)
        return torch.empty_strided(self.size, self.stride, dtype=self.dtype).fill_(self.fill)


@dataclass(frozen=True)
class _Launch:
    """One kernel call: its argument values, with ``slots`` ``(position, pointer index, offset)``
    filled from the call's pointers."""

    kernel: CpuKernel
    values: tuple
    slots: tuple[tuple[int, int, int], ...]

    def __call__(self, pointers: list[int]) -> None:
        values = list(self.values)
        for position, pointer, offset in self.slots:
            values[position] = pointers[pointer] + offset
        self.kernel.call_values(values)


@dataclass(frozen=True)
class _LaunchGroup:
    """The launches of one ``run_rows``: one list per row range, the ranges run concurrently."""

    ranges: tuple[tuple[_Launch, ...], ...]

    def replay(self, args: tuple, pointers: list[int], bases: list[torch.Tensor]) -> None:
        if len(self.ranges) == 1:
            for launch in self.ranges[0]:
                launch(pointers)
            return
        run_concurrently([lambda launches=launches: [launch(pointers) for launch in launches]
                          for launches in self.ranges])


@dataclass(frozen=True)
class _Fill:
    view: _View
    value: object

    def replay(self, args: tuple, pointers: list[int], bases: list[torch.Tensor]) -> None:
        self.view.of(bases).fill_(self.value)


# Where a tensor of a call is: an argument path ``(argument index, list index or None)``, or a view
# of one of its allocations.
_Place = tuple[int, int | None] | _View


def _argument(args: tuple, path: tuple[int, int | None]) -> torch.Tensor:
    i, j = path
    return args[i] if j is None else args[i][j]


def _tensor(place: _Place, args: tuple, bases: list[torch.Tensor]) -> torch.Tensor:
    return place.of(bases) if isinstance(place, _View) else _argument(args, place)


@dataclass(frozen=True)
class _Step:
    """A ``with_values`` step: its values from ``source``, its tensors views of allocations (or None)."""

    step: Callable
    source: _Place
    tensors: tuple[_View | None, ...]

    def replay(self, args: tuple, pointers: list[int], bases: list[torch.Tensor]) -> None:
        self.step(_tensor(self.source, args, bases).tolist(),
                  *(None if view is None else view.of(bases) for view in self.tensors))


@dataclass(frozen=True)
class _Copy:
    """``copy_`` (or the copy of a ``clone``): into an allocation or an argument the op writes."""

    destination: _Place
    source: _Place

    def replay(self, args: tuple, pointers: list[int], bases: list[torch.Tensor]) -> None:
        _tensor(self.destination, args, bases).copy_(_tensor(self.source, args, bases))


@dataclass(frozen=True)
class _Mark:
    """``checks.mark_written``: a version bump."""

    tensor: _Place

    def replay(self, args: tuple, pointers: list[int], bases: list[torch.Tensor]) -> None:
        torch.autograd.graph.increment_version(_tensor(self.tensor, args, bases))


@dataclass(frozen=True)
class Plan:
    """What a call of one signature does (see the module docstring)."""

    inputs: tuple[tuple[int, int | None], ...]  # the tensor arguments, as pointers 0..
    extents: tuple[int, ...]  # the bytes each input spans from its pointer
    written: tuple[int, ...]  # the inputs the op writes in place
    allocations: tuple[_Allocation, ...]  # pointers len(inputs)..
    actions: tuple
    returns: _View | tuple[_View, ...] | None  # a tensor, a tuple of them, or nothing

    def pointers(self, args: tuple) -> list[int]:
        """The inputs' pointers in a call with ``args``."""
        return [_argument(args, path).data_ptr() for path in self.inputs]

    def applies(self, args: tuple, pointers: list[int]) -> bool:
        """Whether a call with ``args`` (its inputs at ``pointers``) may run from this plan: each input
        it writes overlaps no other input and, in grad mode, does not require grad."""
        if not self.written:
            return True
        if torch.is_grad_enabled() and any(_argument(args, self.inputs[w]).requires_grad for w in self.written):
            return False
        extents = self.extents
        for w in self.written:
            lo, hi = pointers[w], pointers[w] + extents[w]
            if lo < hi and any(k != w and extent and ptr < hi and lo < ptr + extent
                               for k, (ptr, extent) in enumerate(zip(pointers, extents, strict=True))):
                return False
        return True

    def execute(self, args: tuple, pointers: list[int]):
        pointers, bases = self._allocate(pointers)
        for action in self.actions:
            action.replay(args, pointers, bases)
        if type(self.returns) is tuple:
            return tuple(view.of(bases) for view in self.returns)
        return None if self.returns is None else self.returns.of(bases)

    def _allocate(self, pointers: list[int]) -> tuple[list[int], list[torch.Tensor]]:
        bases = [allocation.make() for allocation in self.allocations]
        return pointers + [base.data_ptr() for base in bases], bases

    def kernels(self, args: tuple) -> tuple[Callable[[], None], int]:
        """A function that runs only this plan's kernel launches for one call with ``args`` (its
        outputs allocated once, here), and the number of launches."""
        pointers, bases = self._allocate(self.pointers(args))
        groups = [action for action in self.actions if isinstance(action, _LaunchGroup)]

        def run() -> None:
            for group in groups:
                group.replay(args, pointers, bases)

        return run, sum(len(launches) for group in groups for launches in group.ranges)


class _Refused(Exception):
    pass


class _Recorder(TorchDispatchMode):
    """Watches one call (see the module docstring); ``plan(result)`` is its plan, or why it has none.
    ``written``: the positions of the arguments the op writes in place."""

    def __init__(self, args: tuple, written: frozenset[int]):
        super().__init__()
        self.inputs = _input_tensors(args)
        self.input_ranges = [_storage_range(t) for _, _, t in self.inputs]
        self.written_inputs = tuple(k for k, (i, _, _) in enumerate(self.inputs) if i in written)
        self.allocations: list[tuple[torch.Tensor, object]] = []
        self.actions: list = []
        self.group: list[list] | None = None
        self.in_step = False  # a with_values step runs: its torch operations are its own
        self.refusal: str | None = None

    def refuse(self, why: str) -> None:
        if self.refusal is None:
            self.refusal = why

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if self.in_step:
            return result
        try:
            if func in _ALLOCATIONS:
                fill = _ALLOCATIONS[func]
                self.allocations.append((result, args[1] if fill == "value" else fill))
            elif func in _FILLS:
                fill = _FILLS[func]
                self.actions.append(_Fill(self._view(args[0]), args[1] if fill == "value" else fill))
            elif func is _aten.clone.default:
                self.allocations.append((result, None))
                self.actions.append(_Copy(self._view(result), self._place(args[0])))
            elif func is _aten.copy_.default:
                self.actions.append(_Copy(self._place(args[0], writes=True), self._place(args[1])))
            elif func not in _VIEWS:
                self.refuse(f"it runs {func}")
        except _Refused as refused:
            self.refuse(str(refused))
        return result

    def _allocation_of(self, t: torch.Tensor) -> int:
        # By storage, not address: every empty storage is at address 0.
        for i, (allocation, _) in enumerate(self.allocations):
            if torch._C._is_alias_of(t, allocation):
                return i
        raise _Refused("a tensor it checks, fills, copies or returns is not one it allocated")

    def _view(self, t: torch.Tensor) -> _View:
        return _View(self._allocation_of(t), t.dtype, tuple(t.shape), t.stride(), t.storage_offset())

    def _place(self, t: torch.Tensor, writes: bool = False) -> _Place:
        """Where ``t`` is: an argument (with ``writes``, one the op writes), else a view of an allocation."""
        for k, (i, j, given) in enumerate(self.inputs):
            if given is t:
                if writes and k not in self.written_inputs:
                    raise _Refused("it writes an argument that the op does not declare written")
                return i, j
        return self._view(t)

    def step(self, t: torch.Tensor, step: Callable, tensors: tuple) -> None:
        """Run a ``with_values`` step unwatched, and record it."""
        try:
            self.actions.append(_Step(step, self._place(t), tuple(None if u is None else self._view(u)
                                                                  for u in tensors)))
        except _Refused as refused:
            self.refuse(str(refused))
        self.in_step = True
        try:
            step(t.tolist(), *tensors)
        finally:
            self.in_step = False

    def mark_written(self, t: torch.Tensor) -> None:
        """Record ``checks.mark_written(t)``."""
        try:
            self.actions.append(_Mark(self._place(t, writes=True)))
        except _Refused as refused:
            self.refuse(str(refused))

    def ranges(self, run: Callable[[int, int], None], ranges: list[tuple[int, int]]) -> None:
        """``run`` over ``ranges`` one after the other in this thread, recorded as one group."""
        outer, self.group = self.group, []
        try:
            for start, stop in ranges:
                self.group.append([])
                run(start, stop)
            self.actions.append(_LaunchGroup(tuple(tuple(r) for r in self.group)))
        finally:
            self.group = outer

    def launch(self, kernel: CpuKernel, args: tuple) -> None:
        if self.in_step:
            self.refuse("a with_values step launches a kernel")
            return
        values = kernel.values(args)
        slots = []
        for position, arg in enumerate(args):
            if isinstance(arg, torch.Tensor) and arg.numel():
                try:
                    slots.append((position, *self._pointer(arg.data_ptr())))
                except _Refused as refused:
                    self.refuse(str(refused))
                    return
        launch = _Launch(kernel, tuple(values), tuple(slots))
        if self.group is None:
            self.actions.append(_LaunchGroup(((launch,),)))
        else:
            self.group[-1].append(launch)

    def _pointer(self, ptr: int) -> tuple[int, int]:
        """``(pointer index, offset)`` of a kernel argument's address: in input ``k`` (index ``k``) or
        in allocation ``i`` (index ``len(inputs) + i``), as ``Plan`` lays its pointers out."""
        holders = [k for k, (lo, hi) in enumerate(self.input_ranges) if lo <= ptr < hi]
        if len(holders) > 1:
            raise _Refused("a kernel argument lies in several inputs")
        if holders:
            return holders[0], ptr - self.inputs[holders[0]][2].data_ptr()
        for i, (allocation, _) in enumerate(self.allocations):
            lo, hi = _storage_range(allocation)
            if lo <= ptr < hi:
                return len(self.inputs) + i, ptr - allocation.data_ptr()
        raise _Refused("a kernel argument lies in no input and no allocation")

    def plan(self, result) -> Plan | str:
        """The plan of the call that returned ``result``, or why it has none."""
        if self.refusal is not None:
            return self.refusal
        try:
            if result is None:
                returns = None
            elif isinstance(result, torch.Tensor):
                returns = self._view(result)
            elif isinstance(result, tuple) and all(isinstance(t, torch.Tensor) for t in result):
                returns = tuple(self._view(t) for t in result)
            else:
                return "it returns something other than tensors"
        except _Refused as refused:
            return str(refused)
        allocations = tuple(_Allocation(tuple(t.shape), t.stride(), t.dtype, fill, t.is_contiguous())
                            for t, fill in self.allocations)
        return Plan(tuple(path[:2] for path in self.inputs), tuple(_extent(t) for _, _, t in self.inputs),
                    self.written_inputs, allocations, tuple(self.actions), returns)


class PlanCache:
    """The plans of one op by signature (see the module docstring); ``written``: the positions of the
    arguments the op writes in place."""

    def __init__(self, written: tuple[int, ...] = ()):
        self._plans: dict = {}
        self._written = frozenset(written)

    def call(self, args: tuple, target: str | None, flavor: str | None, launch: Callable):
        """``launch(args, target, flavor)``'s result for a call with dispatcher arguments ``args``:
        from the signature's plan where it has one that applies, else by launching (and, the first
        time, recording) it."""
        key = _signature(args, target, flavor)
        plan = None if key is None else self._plans.get(key, _UNSEEN)
        if type(plan) is Plan:
            pointers = plan.pointers(args)
            if plan.applies(args, pointers):
                return plan.execute(args, pointers)
            return launch(args, target, flavor)
        if plan is not _UNSEEN:
            return launch(args, target, flavor)
        recorder = _Recorder(args, self._written)
        token = LAUNCH_RECORDER.set(recorder)
        try:
            with recorder:
                result = launch(args, target, flavor)
        finally:
            LAUNCH_RECORDER.reset(token)
        if len(self._plans) >= MAX_PLANS_PER_OP:
            del self._plans[next(iter(self._plans))]
        self._plans[key] = recorder.plan(result)
        return result

    def plan_of(self, args: tuple, target: str | None, flavor: str | None) -> Plan | str:
        """The plan of the signature of a call with dispatcher arguments ``args``, or why it has none."""
        key = _signature(args, target, flavor)
        if key is None:
            return "plans are made for plain cpu tensors on the cpu target"
        return self._plans.get(key, "no call of this signature yet")


_UNSEEN = object()
