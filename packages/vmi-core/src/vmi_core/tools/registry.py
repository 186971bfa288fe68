"""The op registry behind the ``vmi`` command.

Each family package declares an entry point in the ``vmi.ops`` group naming the package
(``quant = "vmi_quant"``); the command imports it and takes every ``KernelOp`` of that family
declared with a ``Command``, so a user who installs only vmi-quant sees only the quantization ops.

``kernel_op_entry`` builds an op's entry from its ``vmi_core.library.KernelOp``: the command runs
the op (and its reference, the same op with target ``torch``) with the parameters bound by name
from the generated inputs and the command-line options, and shows the source of every kernel the
op's ``Command.kernels`` names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points

import torch

from ..cuda_record import op_status
from ..library import KERNEL_OPS, KernelOp, Option
from ..targets import device_of, flavor_argument, resolve_flavor
from .testing import compare_named

ENTRY_POINT_GROUP = "vmi.ops"


@dataclass(frozen=True)
class OpInfo:
    """What the command needs to list, run, check, benchmark and show one op.

    ``make_inputs(shape, options, seed)`` -> dict of inputs (CPU tensors);
    ``run(inputs, options, target, flavor)`` -> outputs (tensors, tuples of tensors);
    ``bound(inputs, options, target, flavor)`` -> a function of no arguments that makes the op's
    call with its arguments bound once (what the benchmarks time: the call alone);
    ``reference(inputs, options, flavor)`` -> the reference outputs;
    ``check(outputs, expected)`` -> list of mismatch lines (empty when equal);
    ``source(options, target, flavor)`` -> generated kernel source;
    ``nbytes(inputs, outputs)`` -> bytes read and written, for throughput.
    ``targets`` maps each target to a one-line support status; ``check_criterion``
    says what ``check`` compares ("bit for bit", or a tolerance).
    """

    name: str
    family: str
    summary: str
    default_shape: tuple[int, ...]
    bench_shapes: tuple[tuple[int, ...], ...]
    options: tuple[Option, ...]
    targets: dict[str, str]
    make_inputs: Callable
    run: Callable
    bound: Callable
    reference: Callable
    check: Callable
    source: Callable
    nbytes: Callable
    aliases: tuple[str, ...] = field(default=())
    check_criterion: str = "bit for bit"
    kernel_op_arguments: Callable | None = None  # (inputs, options, flavor) -> (the KernelOp, its cpu arguments)

    def parse_options(self, pairs: list[str]) -> dict:
        known = {o.name: o for o in self.options}
        values = {o.name: o.default for o in self.options}
        for pair in pairs:
            name, sep, text = pair.partition("=")
            if not sep:
                raise ValueError(f"options are name=value, got {pair!r}")
            name = name.replace("-", "_")
            if name not in known:
                raise ValueError(f"{self.name} has no option {name!r}; options: {', '.join(known)}")
            values[name] = known[name].parse(text)
        return values


def discover() -> dict[str, OpInfo]:
    """Every op of every installed family package, by name (and alias)."""
    ops: dict[str, OpInfo] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()  # declares the family's ops
        for kernel_op in KERNEL_OPS.values():
            if kernel_op.command is None or kernel_op.family != ep.name:
                continue
            op = kernel_op_entry(kernel_op)
            ops[op.name] = op
            for alias in op.aliases:
                ops.setdefault(alias, op)
    return ops


def _fresh_copies(tensors: list) -> list:
    """Copies of ``tensors`` laid out as they are: views of one contiguous buffer (``unbind`` of a
    stacked tensor) become the same views of one copy of it, so an op that addresses such a list in
    place is measured that way; other tensors are cloned one by one."""
    base = tensors[0]._base if tensors else None
    if (base is None or any(t._base is not base for t in tensors) or not base.is_contiguous()
            or base.storage_offset() != 0):
        return [t.clone() for t in tensors]
    copy = base.clone()
    return [copy.as_strided(t.shape, t.stride(), t.storage_offset()) for t in tensors]


def bind(op: KernelOp, values: dict, device: str) -> tuple[list, list]:
    """``op``'s positional arguments from ``values`` by parameter name (defaults, or None where a
    parameter admits it, for the rest), tensors (also those of a ``Tensor[]``) moved to ``device``;
    and the tensors bound to mutable parameters (a mutable ``Tensor[]``'s one by one), which are
    fresh copies (``_fresh_copies``) so the caller's inputs stay as they were."""
    args, mutated = [], []
    for param in op.params:
        if param.name in values:
            value = values[param.name]
        elif param.has_default or param.optional:
            value = param.default if param.has_default else None
        else:
            raise KeyError(f"{op.name}: no value for parameter {param.name}")
        if isinstance(value, torch.Tensor):
            value = value.to(device)
            if param.mutable:
                value = value.clone()
                mutated.append(value)
        elif param.kind == "Tensor[]" and value is not None:
            value = [t.to(device) for t in value]
            if param.mutable:
                value = _fresh_copies(value)
                mutated.extend(value)
        args.append(value)
    return args, mutated


def tensor_bytes(value) -> int:
    """Bytes of the tensors in ``value`` (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    return 0


def _source(op: KernelOp):
    """``vmi source``: every kernel of the op with its options on a target, each under a header
    naming the op, the kernel, the options, the target, the flavor and the specialisation."""

    def source(options, target, flavor):
        flavor = resolve_flavor(target, flavor).name
        kernels = op.command.kernels(options, target, flavor)
        shown = ", ".join(f"{k}={v}" for k, v in options.items()) or "none"
        parts = []
        for number, (kernel, spec) in enumerate(kernels, 1):
            parts.append(f"// vmi source: {op.name}, kernel {number} of {len(kernels)}: {kernel.name}; "
                         f"target {target}, flavor {flavor}; options: {shown}\n// specialisation: {spec!r}\n"
                         f"{kernel.source(spec, target)}")
        return "\n".join(parts)
    return source


def kernel_op_entry(op: KernelOp) -> OpInfo:
    """The ``OpInfo`` of ``op`` from its ``Command``: ``run`` calls it on the target, ``reference``
    calls it with target ``torch``; both return its results followed by the tensors it wrote in place.

    The arguments are bound by name (``bind``) from the inputs, the options and
    ``arguments(inputs, options, flavor)``. ``check`` defaults to a bitwise comparison of the
    results and the tensors of required mutable parameters (an op with optional ones declares its
    own), ``nbytes`` to the bytes of every input and output tensor.
    """
    command = op.command

    def arguments(inputs, options, target, flavor, device):
        values = {**options, **inputs}
        if command.arguments is not None:
            values.update(command.arguments(inputs, options, resolve_flavor(target, flavor).name))
        return bind(op, values, device)

    def call(inputs, options, target, flavor, device):
        args, mutated = arguments(inputs, options, target, flavor, device)
        results = op(*args, target=target, flavor=flavor)
        results = (results,) if isinstance(results, torch.Tensor) else tuple(results or ())
        return (*results, *mutated)

    def bound(inputs, options, target, flavor):
        flavor = flavor_argument(target, flavor)
        args, _ = arguments(inputs, options, target, flavor, device_of(target))
        return lambda: op(*args, target=target, flavor=flavor)

    outputs = op.returns + tuple(p.name for p in op.params if p.mutable and not p.optional)
    return OpInfo(
        name=command.name or op.name,
        family=op.family,
        summary=command.summary,
        default_shape=command.default_shape,
        bench_shapes=command.bench_shapes,
        options=command.options,
        targets={**command.support, "cuda": op_status(f"vmi_{op.family}", command.name or op.name)},
        make_inputs=command.make_inputs,
        run=lambda inputs, options, target, flavor: call(inputs, options, target, flavor_argument(target, flavor),
                                                         device_of(target)),
        bound=bound,
        reference=lambda inputs, options, flavor: call(inputs, options, "torch", flavor, "cpu"),
        check=command.check or compare_named(outputs),
        source=_source(op),
        nbytes=command.nbytes or (lambda inputs, results: tensor_bytes(inputs) + tensor_bytes(results)),
        aliases=command.aliases + ((op.name,) if command.name else ()),
        check_criterion=command.check_criterion,
        kernel_op_arguments=lambda inputs, options, flavor: (op, arguments(inputs, options, "cpu", flavor, "cpu")[0]),
    )
