"""The op registry behind the ``vmi`` command.

Each family package declares an entry point in the ``vmi.ops`` group naming a
module with an ``OPS`` list of ``OpInfo``; the command discovers them, so a user
who installs only vmi-quant sees only the quantization ops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "vmi.ops"


@dataclass(frozen=True)
class Option:
    """A command-line option of an op: ``-o name=value``."""

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


@dataclass(frozen=True)
class OpInfo:
    """What the command needs to list, run, check, benchmark and show one op.

    ``make_inputs(shape, options, seed)`` -> dict of inputs (CPU tensors);
    ``run(inputs, options, target, flavor)`` -> outputs (tensors, tuples of tensors);
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
    reference: Callable
    check: Callable
    source: Callable
    nbytes: Callable
    aliases: tuple[str, ...] = field(default=())
    check_criterion: str = "bit for bit"

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
        for op in ep.load().OPS:
            ops[op.name] = op
            for alias in op.aliases:
                ops.setdefault(alias, op)
    return ops
