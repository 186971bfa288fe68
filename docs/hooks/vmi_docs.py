"""mkdocs hook of the vmi documentation (``hooks:`` in mkdocs.yml).

What the pages take from the code at build time, so that they cannot drift from it:

``::: vmi_quant.per_token_cast``
    A public name (listed in its package's ``__all__``) is rewritten to the object's defining
    module, with the public name as the heading. A ``*_parallel`` entry made by
    ``vmi_core.library.parallel_entry`` (which griffe, reading the source, sees only as an
    assignment) is rendered here: its heading, signature and docstring. Other ``:::``
    identifiers are left to mkdocstrings as written.
``<!-- vmi:targets OP [OP ...] -->``
    Support per target of the named ops (names or aliases): their ``OpInfo.targets``, from
    ``vmi_core.tools.registry.discover()``, and what the checks compare (``OpInfo.check_criterion``).
``<!-- vmi:targets family=FAMILY -->``
    The same for every registered op of a family, ops with identical support in one table.
``<!-- vmi:ops FAMILY -->``
    The family's registered ops: name and aliases, ``OpInfo.summary``, link to the op's page.
``<!-- vmi:cli OP -->``
    The ``vmi run OP -o name=value`` options of an op (``OpInfo.options``).
``<!-- vmi:torch OP [OP ...] -->``
    The ops as torch custom ops (``KernelOp``): their ``torch.ops.vmi`` schemas, whether a
    derivative is registered, and the kernels each runs at its default options with what every
    kernel is compiled for (its spec's fields and docstring, from ``Command.kernels``).

It warns (an error under ``mkdocs build --strict``) when a public name of a family package has
no ``:::`` directive on any page, when a registered op appears in no ``vmi:targets`` table or in
no ``vmi:torch`` section, and when a marker names an unknown op, family or marker kind.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import posixpath
import re

from vmi_core.library import KERNEL_OPS, KernelOp
from vmi_core.targets import TARGETS
from vmi_core.tools.registry import OpInfo, discover

log = logging.getLogger("mkdocs.plugins.vmi_docs")

FAMILY_PACKAGES = ("vmi_quant", "vmi_moe", "vmi_mhc")
_DIRECTIVE = re.compile(r"^::: *(?P<ident>[A-Za-z_][\w.]*) *$")
_MARKER = re.compile(r"<!-- *vmi:(?P<kind>[\w-]+)(?P<args>[^>]*?) *-->")


class _State:
    ops: dict[str, OpInfo] = {}  # name or alias -> op
    public: dict[str, str] = {}  # "vmi_quant.cast" -> "vmi_quant.ops.cast.cast"
    generated: dict[str, object] = {}  # public name -> a parallel_entry function
    pages: dict[str, str] = {}  # public name -> src_uri of the page documenting it
    shown: set[str] = set()  # op names rendered in a vmi:targets table
    in_torch: set[str] = set()  # op names rendered in a vmi:torch section


def on_config(config):
    _State.ops = discover()
    _State.public = {}
    for package in FAMILY_PACKAGES:
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            _State.public[f"{package}.{name}"] = f"{obj.__module__}.{obj.__qualname__}"
            if hasattr(obj, "parallel_of"):
                _State.generated[f"{package}.{name}"] = obj
    _State.shown = set()
    _State.in_torch = set()
    return config


def on_files(files, config):
    """Which page documents which public name; warn for any public name no page documents."""
    _State.pages = {}
    for file in files.documentation_pages():
        with open(file.abs_src_path, encoding="utf-8") as f:
            for line in f:
                match = _DIRECTIVE.match(line.rstrip("\n"))
                if match and match["ident"] in _State.public:
                    _State.pages.setdefault(match["ident"], file.src_uri)
    for name in sorted(set(_State.public) - set(_State.pages)):
        log.warning(f"{name} is public (in __all__) but no page has a '::: {name}' directive")
    return files


def on_page_markdown(markdown, page, config, files):
    markdown = _rewrite_directives(markdown)
    return _MARKER.sub(lambda m: _expand(m["kind"], m["args"].split(), page.file.src_uri), markdown)


def on_post_build(config):
    names = {op.name for op in _State.ops.values()}
    for name in sorted(names - _State.shown):
        log.warning(f"op {name!r} is registered but no page shows its targets (<!-- vmi:targets {name} -->)")
    for name in sorted(names - _State.in_torch):
        log.warning(f"op {name!r} is registered but no page shows it in torch (<!-- vmi:torch {name} -->)")


# --- ::: directives ---


def _rewrite_directives(markdown: str) -> str:
    lines = markdown.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = _DIRECTIVE.match(lines[i])
        if not match or match["ident"] not in _State.public:
            out.append(lines[i])
            i += 1
            continue
        ident = match["ident"]
        i += 1
        if ident in _State.generated:
            while i < len(lines) and lines[i].startswith(" ") and lines[i].strip():
                i += 1  # the directive's options
            out.extend(_generated_entry(ident, _State.generated[ident]))
            continue
        out.append(f"::: {_State.public[ident]}")
        heading = [f'      heading: "{ident}"', f'      toc_label: "{ident.rpartition(".")[2]}"']
        if i < len(lines) and lines[i].strip() == "options:":
            out.append(lines[i])
            i += 1
        else:
            out.append("    options:")
        out.extend(heading)
    return "\n".join(out)


def _generated_entry(ident: str, entry) -> list[str]:
    """Markdown for a ``parallel_entry`` function, laid out as mkdocstrings lays out the others."""
    name = ident.rpartition(".")[2]
    public = entry.parallel_of
    signature = str(inspect.signature(entry)).replace("'", "")
    doc = inspect.getdoc(entry).replace("``", "`")
    doc = doc.replace(f"`{public.__name__}`", f"[`{public.__name__}`][{public.__module__}.{public.__qualname__}]", 1)
    return [f"### `{ident}` {{ #{ident} data-toc-label=\"{name}\" }}", "", "```python", f"{name}{signature}", "```",
            "", doc, ""]


# --- markers ---


def _expand(kind: str, args: list[str], src_uri: str) -> str:
    try:
        if kind == "targets":
            if len(args) == 1 and args[0].startswith("family="):
                return _family_targets(args[0].partition("=")[2])
            return _targets_table([_op(name) for name in args])
        if kind == "ops" and len(args) == 1:
            return _ops_table(args[0], src_uri)
        if kind == "cli" and len(args) == 1:
            return _cli_table(_op(args[0]))
        if kind == "torch" and args:
            return _torch_section([_op(name) for name in args])
        raise LookupError(f"unknown marker vmi:{kind} {' '.join(args)}")
    except LookupError as error:
        log.warning(f"{src_uri}: {error.args[0]}")
        return f"*(vmi:{kind}: {error.args[0]})*"


def _op(name: str) -> OpInfo:
    if name not in _State.ops:
        raise LookupError(f"no registered op {name!r} (known: {', '.join(sorted(_State.ops))})")
    return _State.ops[name]


def _family_ops(family: str) -> list[OpInfo]:
    ops = list({op.name: op for op in _State.ops.values() if op.family == family}.values())
    if not ops and f"vmi_{family}" not in FAMILY_PACKAGES:
        raise LookupError(f"no family {family!r}")
    return ops


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _targets_of(ops: list[OpInfo]) -> list[str]:
    extra = [t for op in ops for t in op.targets if t not in TARGETS]
    return list(TARGETS) + list(dict.fromkeys(extra))


def _targets_table(ops: list[OpInfo]) -> str:
    if not ops:
        raise LookupError("vmi:targets names no op")
    _State.shown.update(op.name for op in ops)
    if len(ops) == 1:
        rows = ["| target | support |", "| --- | --- |"]
    else:
        rows = ["| target | " + " | ".join(f"`{op.name}`" for op in ops) + " |",
                "| --- |" + " --- |" * len(ops)]
    for target in _targets_of(ops):
        cells = [_cell(op.targets.get(target, "not supported")) for op in ops]
        rows.append(f"| `{target}` | " + " | ".join(cells) + " |")
    checks = "; ".join(f"`{op.name}` {op.check_criterion}" if len(ops) > 1 else op.check_criterion for op in ops)
    return "\n".join(rows) + f"\n\nChecked against the PyTorch reference: {_cell(checks)}.\n"


def _family_targets(family: str) -> str:
    ops = _family_ops(family)
    if not ops:
        return "No op of this family is registered yet.\n"
    groups: dict[tuple, list[OpInfo]] = {}
    for op in ops:
        groups.setdefault(tuple(sorted(op.targets.items())), []).append(op)
    parts = []
    for group in groups.values():
        _State.shown.update(op.name for op in group)
        names = ", ".join(f"`{op.name}`" for op in group)
        rows = ["| target | support |", "| --- | --- |"]
        rows += [f"| `{t}` | {_cell(group[0].targets.get(t, 'not supported'))} |" for t in _targets_of(group)]
        parts.append(f"**{names}**\n\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


def _ops_table(family: str, src_uri: str) -> str:
    ops = _family_ops(family)
    if not ops:
        return "No op of this family is registered yet.\n"
    rows = ["| op | what it does | checked |", "| --- | --- | --- |"]
    for op in ops:
        names = [op.name, *op.aliases]
        page = next((_State.pages[f"vmi_{family}.{n}"] for n in names if f"vmi_{family}.{n}" in _State.pages), None)
        label = " / ".join(f"`{n}`" for n in names)
        if page:
            label = f"[{label}]({posixpath.relpath(page, posixpath.dirname(src_uri) or '.')})"
        rows.append(f"| {label} | {_cell(op.summary)} | {_cell(op.check_criterion)} |")
    return "\n".join(rows) + "\n"


def _cli_table(op: OpInfo) -> str:
    rows = ["| option | default | choices | meaning |", "| --- | --- | --- | --- |"]
    for o in op.options:
        choices = ", ".join(f"`{c}`" for c in o.choices) if o.choices else ""
        rows.append(f"| `{o.name}` | `{o.default}` | {choices} | {_cell(o.help)} |")
    shape = "x".join(str(n) for n in op.default_shape)
    return (f"`vmi run {op.name} [-o name=value ...]` runs the op at its default shape ({shape}) on a target, "
            f"checks it against the reference and times both; its options:\n\n" + "\n".join(rows) + "\n")


def _kernel_op(op: OpInfo) -> KernelOp:
    return next(k for k in KERNEL_OPS.values() if k.command is not None and (k.command.name or k.name) == op.name)


def _torch_section(ops: list[OpInfo]) -> str:
    """Schemas, derivative and kernel specialisations of each op."""
    parts = []
    for op in ops:
        _State.in_torch.add(op.name)
        kernel_op = _kernel_op(op)
        overloads = [kernel_op.schema()] + ([kernel_op.schema("out")] if kernel_op.out is not None else [])
        derivative = ("a derivative is registered (`torch.library.register_autograd`): `backward()` through it runs "
                      "the backward kernels" if kernel_op.differentiable else "no derivative is registered")
        parts.append(f"`torch.ops.vmi.{kernel_op.name}` ({derivative}):\n\n```text\n"
                     + "\n".join(f"vmi::{o}" for o in overloads) + "\n```\n")
        parts.append(_specialisations(op, kernel_op))
    return "\n".join(parts) + (
        "\nEach op has a fake implementation, so FakeTensor, meta tensors and `torch.compile(fullgraph=True)` "
        "trace it without running a kernel (`torch.library.opcheck` passes on a sample call of every op).\n")


def _specialisations(op: OpInfo, kernel_op: KernelOp) -> str:
    """The kernels ``op`` runs at its default options (cpu target, ascend flavor), each with the
    fields of its spec: the spec is the kernel's cache key (with the target and flavor), so a new
    value of a field compiles a kernel and every other size is a runtime value."""
    options = {o.name: o.default for o in op.options}
    rows = ["| kernel | compiled once per value of |", "| --- | --- |"]
    for kernel, spec in kernel_op.command.kernels(options, "cpu", "ascend"):
        fields = (", ".join(f"`{f.name}`" for f in dataclasses.fields(spec)) if dataclasses.is_dataclass(spec)
                  else f"`{spec!r}`")
        row = f"| `{kernel.name}` | {fields or 'nothing: one kernel'} |"
        if row not in rows:
            rows.append(row)
    return (f"The kernels `{op.name}` runs at its default options. Each is compiled (seconds on `cpu`; then it "
            f"comes from the disk cache) once per target, flavor and value of the fields below; every other "
            f"size, the token count included where it is not listed, is a runtime value:\n\n"
            + "\n".join(rows) + "\n")
