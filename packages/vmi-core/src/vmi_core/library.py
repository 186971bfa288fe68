"""vmi's ops as torch custom ops: ``torch.ops.vmi.<name>``.

Every public op is declared once, as a ``KernelOp``: its parameters and its ``run``. From that
one declaration come

* the schema of ``torch.ops.vmi.<name>`` (and of ``<name>.out`` where the op takes
  preallocated outputs), registered for every device with the implementation;
* the fake (meta) implementation that ``torch.compile``, ``FakeTensorMode`` and meta tensors
  use: the op's own validation and allocation without a launch, so output shapes, dtypes,
  strides and SF layouts are those a real call returns;
* the type checks that run before dispatch, so a wrong argument raises ``TypeError`` naming
  it (the dispatcher's own schema errors name the argument less clearly);
* the parameter names and defaults the ``vmi`` command binds its options to, and with its
  ``Command`` the op's entry in that command (``vmi list``, ``run``, ``bench``, ``source``).

Every op takes the keyword-only ``target`` and ``flavor`` (see ``vmi_core.targets``). An op's
``run`` takes its parameters positionally, then ``out`` (a tuple of the preallocated outputs,
or ``None``), ``target``, ``flavor`` and ``launch`` as keywords: it validates the arguments and
allocates the outputs, then, with ``launch``, runs the kernel (or the reference for
``target="torch"``); without, it returns the outputs as allocated: that is the shape function.
"""

from __future__ import annotations

import functools
import inspect
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .plan import PlanCache
from .targets import require_kernel

NAMESPACE = "vmi"
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
_REQUIRED = object()
# Every declared op by name, in declaration order.
KERNEL_OPS: dict[str, KernelOp] = {}


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_int_tuple(value) -> bool:
    return isinstance(value, tuple) and all(_is_int(v) for v in value)


def _is_list_of(value, kind) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(v, kind) for v in value)


# Schema type -> (what a caller may pass, how the error names it).
_KINDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "Tensor": (lambda v: isinstance(v, torch.Tensor), "a torch.Tensor"),
    "int": (_is_int, "an int"),
    "float": (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "a float"),
    "bool": (lambda v: isinstance(v, bool), "a bool"),
    "str": (lambda v: isinstance(v, str), "a str"),
    "ScalarType": (lambda v: isinstance(v, torch.dtype), "a torch.dtype"),
    "int[]": (_is_int_tuple, "a tuple of ints"),
    "bool[]": (lambda v: _is_list_of(v, bool), "a list of bools"),
    "Tensor[]": (lambda v: _is_list_of(v, torch.Tensor), "a list of torch.Tensors"),
}


@dataclass(frozen=True)
class Param:
    """One parameter of an op: ``kind`` is its schema type (``Tensor``, ``int``, ``float``,
    ``bool``, ``str``, ``ScalarType``, ``int[]``, ``bool[]``, ``Tensor[]``); ``optional`` admits ``None``; ``mutable``
    marks a tensor, or a list of tensors, the op writes in place (declared ``Tensor(a!)`` or
    ``Tensor(a!)[]`` in the schema)."""

    name: str
    kind: str
    default: object = _REQUIRED
    optional: bool = False
    mutable: bool = False

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"parameter {self.name}: unknown kind {self.kind!r}")
        if self.mutable and self.kind not in ("Tensor", "Tensor[]"):
            raise ValueError(f"parameter {self.name}: only a tensor or a list of tensors can be mutable")

    @property
    def has_default(self) -> bool:
        return self.default is not _REQUIRED

    def schema(self, alias: str | None) -> str:
        kind = f"Tensor({alias}!){self.kind[len('Tensor'):]}" if alias else self.kind
        text = f"{kind}{'?' if self.optional else ''} {self.name}"
        if self.has_default:
            text += f"={_schema_value(self.default)}"
        return text

    def check(self, value, op: str) -> None:
        if value is None and self.optional:
            return
        accepts, wanted = _KINDS[self.kind]
        if not accepts(value):
            got = type(value).__name__ if value is not None else "None"
            raise TypeError(f"{op}: {self.name} must be {wanted}{' or None' if self.optional else ''}, got {got}")


def _schema_value(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


@dataclass(frozen=True)
class Option:
    """A command-line option of an op: ``vmi run OP -o name=value``."""

    name: str
    default: object
    choices: tuple = ()
    help: str = ""

    def parse(self, text: str):
        if isinstance(self.default, bool):
            if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(f"option {self.name} takes true/false, got {text!r}")
            value = text.lower() in ("1", "true", "yes")
        elif isinstance(self.default, int):
            try:
                value = int(text)
            except ValueError:
                raise ValueError(f"option {self.name} takes an integer, got {text!r}") from None
        else:
            value = text
        if self.choices and value not in self.choices:
            raise ValueError(f"option {self.name} must be one of {self.choices}, got {value!r}")
        return value


def support(ascend: str = "SIMD vector regions", *, cpu: str = "bit-exact against the reference in both flavors",
            ascend_sim: str = "bit-exact against the reference (ascend flavor)") -> dict[str, str]:
    """An op's one-line support status per target, as ``vmi list`` and the docs show it: ``ascend``
    names the lowering's vector regions, ``cpu`` and ``ascend_sim`` what the tests found against
    the reference. The ``cuda`` line is what the op's last GPU run showed: the registry takes it
    from the family's record (``vmi_core.cuda_record.op_status``)."""
    return {"cpu": f"runs; {cpu}",
            "ascend": f"lowers to AscendC ({ascend}); runs on ascend-sim, not yet on an NPU",
            "ascend-sim": f"runs the ascend source on the CPU model; {ascend_sim}"}


@dataclass(frozen=True)
class Command:
    """What the ``vmi`` command needs beyond an op's parameters to list, run, check, benchmark and
    show it (``vmi_core.tools.registry`` builds the command's entry from the op and this).

    ``make_inputs(shape, options, seed)`` -> the inputs by parameter name (CPU tensors and values);
    ``kernels(options, target, flavor)`` -> the ``(Kernel, spec)`` of every kernel the op runs with
    those options on ``target`` (``flavor`` resolved, a name), for ``vmi source`` and ``precompile``;
    ``arguments(inputs, options, flavor)`` -> further argument values computed from those;
    ``check(outputs, expected)`` -> mismatch lines (default: the results and the required mutable
    tensors bit for bit), ``check_criterion`` says what it compares; ``nbytes(inputs, outputs)`` ->
    bytes moved (default: every input and output tensor); ``support``: see ``support``; ``name``:
    the command's name for the op where it is not the op's own (then the op's is an alias).
    """

    summary: str
    support: dict[str, str]
    default_shape: tuple[int, ...]
    bench_shapes: tuple[tuple[int, ...], ...]
    make_inputs: Callable
    kernels: Callable
    options: tuple[Option, ...] = ()
    arguments: Callable | None = None
    check: Callable | None = None
    check_criterion: str = "bit for bit"
    nbytes: Callable | None = None
    aliases: tuple[str, ...] = ()
    name: str | None = None


class KernelOp:
    """One op, registered as ``torch.ops.vmi.<name>`` (see the module docstring).

    ``returns`` names the tensors the op returns (empty for an op that only writes in place);
    ``outs`` names its preallocated outputs where it takes them (one per returned tensor): then
    ``<name>.out`` takes them as mutable keyword arguments and returns nothing. With
    ``out_list``, ``outs`` names one mutable ``Tensor[]`` of preallocated outputs instead (any
    number of tensors, all given), for ops whose outputs are a list; ``run`` gets it as ``out=(list,)``.
    ``run`` is described in the module docstring. ``autograd = (backward, setup_context)``
    registers a derivative (``torch.library.register_autograd``; the op must not mutate).
    ``command`` makes it an op of the ``vmi`` command; ``family`` is its package's
    (``vmi_quant`` -> ``quant``). A repeat ``cpu`` call of either overload runs from its
    signature's launch plan (``vmi_core.plan``).
    """

    def __init__(self, name: str, params: Sequence[Param], returns: Sequence[str], run: Callable, *,
                 outs: Sequence[str] = (), out_list: bool = False,
                 autograd: tuple[Callable, Callable] | None = None, command: Command | None = None):
        if out_list and len(outs) != 1:
            raise ValueError(f"{name}: a list of preallocated outputs is one parameter")
        if outs and not out_list and len(outs) != len(returns):
            raise ValueError(f"{name}: one preallocated output per returned tensor")
        self.name = name
        self.params = tuple(params)
        self._accepts = tuple((p, _KINDS[p.kind][0]) for p in self.params)
        # The positional arguments a call must give: up to the last parameter without a default.
        self._required = max((i + 1 for i, p in enumerate(self.params) if not p.has_default), default=0)
        self.returns = tuple(returns)
        self.outs = tuple(outs)
        self.out_list = out_list
        self.run = run
        # The mutable parameters, and the preallocated outputs after every parameter (``_out_arguments``).
        self.plans = PlanCache(tuple(i for i, p in enumerate(self.params) if p.mutable)
                               + tuple(range(len(self.params), len(self.params) + len(self.outs))))
        self.command = command
        self.family = run.__module__.partition(".")[0].removeprefix(f"{NAMESPACE}_")
        if name in KERNEL_OPS:
            raise ValueError(f"op {name} is declared twice")
        self._define()
        # The overloads ``torch.ops.vmi.<name>.default`` and ``.out`` (None without preallocated outputs).
        packet = getattr(getattr(torch.ops, NAMESPACE), name)
        self.default = packet.default
        self.out = packet.out if outs else None
        self.differentiable = autograd is not None
        if autograd is not None:
            backward, setup_context = autograd
            torch.library.register_autograd(self.qualname, backward, setup_context=setup_context, lib=_LIBRARY)
        KERNEL_OPS[name] = self

    @property
    def qualname(self) -> str:
        return f"{NAMESPACE}::{self.name}"

    def schema(self, overload: str = "") -> str:
        aliases = iter("abcdefghijklmnopqrstuvwxyz")
        params = [p.schema(next(aliases) if p.mutable else None) for p in self.params]
        out_kind = "[]" if self.out_list else ""
        keywords = ([f"Tensor({next(aliases)}!){out_kind} {name}" for name in self.outs] if overload == "out"
                    else [])
        keywords += ["str? target=None", "str? flavor=None"]
        if overload == "out" or not self.returns:
            result = "()"
        elif len(self.returns) == 1:
            result = "Tensor"
        else:
            result = "(" + ", ".join("Tensor" for _ in self.returns) + ")"
        name = f"{self.name}.{overload}" if overload else self.name
        return f"{name}({', '.join(params)}, *, {', '.join(keywords)}) -> {result}"

    def _fill(self, args: tuple) -> list:
        return list(args) + [p.default for p in self.params[len(args):]]

    def _out_arguments(self, args: tuple, outs: Sequence) -> tuple:
        """What the plans see of a call of ``<name>.out``: every parameter, then the preallocated
        outputs; longer than any call of the default overload, so the two never share a signature."""
        return (*self._fill(args), *outs)

    def _complete(self, args: tuple) -> list:
        """The dispatcher hands a Python kernel the arguments as the caller passed them, ``int[]``
        as lists: fill in the defaults and make those tuples again."""
        return [tuple(v) if p.kind == "int[]" and v is not None else v
                for p, v in zip(self.params, self._fill(args), strict=True)]

    def _define(self) -> None:
        _LIBRARY.define(self.schema())

        def launch(args, target, flavor):
            return self.run(*self._complete(args), out=None, target=target, flavor=flavor, launch=True)

        def kernel(*args, target=None, flavor=None):
            if self.plans is None:
                return launch(args, target, flavor)
            return self.plans.call(args, target, flavor, launch)

        def fake(*args, target=None, flavor=None):
            return self.run(*self._complete(args), out=None, target=target, flavor=flavor, launch=False)

        _LIBRARY.impl(self.name, kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(self.qualname, fake, lib=_LIBRARY)
        if not self.outs:
            return
        _LIBRARY.define(self.schema("out"))

        def launch_out(args, target, flavor):
            params = len(self.params)
            self.run(*self._complete(args[:params]), out=args[params:], target=target, flavor=flavor, launch=True)

        def kernel_out(*args, target=None, flavor=None, **outs):
            args = self._out_arguments(args, [outs[n] for n in self.outs])
            if self.plans is None:
                launch_out(args, target, flavor)
            else:
                self.plans.call(args, target, flavor, launch_out)

        def fake_out(*args, target=None, flavor=None, **outs):
            self.run(*self._complete(args), out=tuple(outs[n] for n in self.outs), target=target, flavor=flavor,
                      launch=False)

        _LIBRARY.impl(f"{self.name}.out", kernel_out, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{self.qualname}.out", fake_out, lib=_LIBRARY)

    def dispatcher_arguments(self, args) -> tuple:
        """``args`` as the dispatcher hands them to the registered kernel: lists for list parameters,
        without the trailing arguments that equal their defaults."""
        given = [list(v) if p.kind.endswith("[]") and v is not None else v
                 for p, v in zip(self.params, args, strict=False)]
        while given and self.params[len(given) - 1].has_default and given[-1] == self.params[len(given) - 1].default:
            given.pop()
        return tuple(given)

    def plan_of(self, *args, out: Sequence[torch.Tensor] | None = None, target: str | None = None,
                flavor: str | None = None):
        """The launch plan (``vmi_core.plan.Plan``) a call with ``args`` (and ``out``, every output
        given) runs from, or why there is none."""
        given = self.dispatcher_arguments(args)
        if out is not None:
            given = self._out_arguments(given, [list(out)] if self.out_list else out)
        return self.plans.plan_of(given, target, flavor)

    def check_types(self, args: tuple) -> None:
        for (param, accepts), value in zip(self._accepts, args, strict=False):
            if not accepts(value) and not (value is None and param.optional):
                param.check(value, self.name)
        if len(args) < self._required:
            missing = next(p for p in self.params[len(args):] if not p.has_default)
            raise TypeError(f"{self.name}: missing argument {missing.name}")

    def __call__(self, *args, out: Sequence[torch.Tensor] | None = None, target: str | None = None,
                 flavor: str | None = None):
        """Run the op through the dispatcher: the results, or ``out`` once written."""
        if len(args) > len(self.params):
            raise TypeError(f"{self.name} takes at most {len(self.params)} positional arguments, got {len(args)}")
        try:
            self.check_types(args)
        except TypeError as wrong_type:
            # The op's own validation names the problem more precisely where it has a rule for it.
            try:
                self.run(*self._fill(args), out=out, target=target, flavor=flavor, launch=False)
            except (TypeError, ValueError):
                raise
            except Exception:
                raise wrong_type from None
            raise
        for name, value in (("target", target), ("flavor", flavor)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{self.name}: {name} must be a str or None, got {type(value).__name__}")
        if out is None:
            return self.default(*args, target=target, flavor=flavor)
        if not self.outs:
            raise TypeError(f"{self.name} takes no preallocated outputs")
        if self.out_list:
            if not _is_list_of(out, torch.Tensor):
                raise TypeError(f"{self.name}: out must be a list of torch.Tensors")
            self.out(*args, target=target, flavor=flavor, **{self.outs[0]: list(out)})
            return list(out)
        if not isinstance(out, (tuple, list)) or len(out) != len(self.outs):
            raise TypeError(f"{self.name}: out must be a ({', '.join(self.returns)}) tuple")
        for name, tensor in zip(self.outs, out, strict=True):
            if tensor is not None and not isinstance(tensor, torch.Tensor):
                raise TypeError(f"{self.name}: {name} must be a torch.Tensor or None, got {type(tensor).__name__}")
        if any(t is None for t in out):
            # The outputs not given are allocated as the op would, then written like the given ones.
            allocated = self.run(*self._fill(args), out=tuple(out), target=target, flavor=flavor, launch=False)
            out = (allocated,) if len(self.outs) == 1 else allocated
        self.out(*args, target=target, flavor=flavor, **dict(zip(self.outs, out, strict=True)))
        return out[0] if len(out) == 1 else tuple(out)


def parallel_entry(public: Callable, leading: str) -> Callable:
    """TileKernels' ``X_parallel`` twin of the public function ``X``: the same signature, and the
    same results and errors, but it always runs the kernel; the reference target ``torch`` is refused
    with a ``ValueError``, also when it comes from ``$VMI_TARGET`` or from a meta ``leading`` (the
    argument whose device decides the default target).

    Declared beside ``X`` in its dispatch module, so no kernel module imports its dispatch."""
    name = f"{public.__name__}_parallel"
    signature = inspect.signature(public)
    if leading not in signature.parameters:
        raise ValueError(f"{public.__name__} has no parameter {leading!r}")

    @functools.wraps(public, assigned=("__module__", "__annotations__"))
    def entry(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        require_kernel(name, bound.arguments.get(leading), bound.arguments.get("target"))
        return public(*args, **kwargs)

    entry.__name__ = entry.__qualname__ = name
    entry.__signature__ = signature
    entry.__doc__ = (f"``{public.__name__}`` that always runs the parallel kernel.\n\n"
                     f"Same arguments, returns and errors as ``{public.__name__}``, except that the reference "
                     f"target ``\"torch\"`` is refused (``ValueError``), also when it comes from ``$VMI_TARGET`` "
                     f"or from a meta ``{leading}``.\n")
    entry.parallel_of = public
    return entry
