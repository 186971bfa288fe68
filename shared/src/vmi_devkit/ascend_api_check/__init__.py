"""Compile every op's emitted AscendC, syntax only, against the vendor's own declarations.

ascend-sim compiles the ``ascend`` target's source against vmi's re-declaration of the AscendC API
(``vmi_core/ascend_sim/include``), so a call the real API does not declare, or declares with other
parameter types, passes there and fails the first NPU build. This check compiles the same source
with clang against a checkout of asc-devkit (github.com/cannmirror/asc-devkit, its ``include/`` and
``impl/``; never copied into this repository) and TileLang's Ascend templates, standing in only for
what the bisheng compiler itself provides (``prelude.h``): the function and variable keywords, the
memory spaces as clang address spaces (a GM pointer where a UB one is declared is a type error), the
scalar and vector register types as distinct types, the compiler's enums. ``acl/acl.h`` (CANN's
host runtime, not in asc-devkit; the kernels use nothing of it) is an empty stand-in.

The intrinsics asc-devkit's inline bodies call are compiler built-ins too. They are learned, not
listed: a probe that includes TileLang's templates is compiled until clang reports no new name
undeclared inside asc-devkit; each such name, and each intrinsic an asc-devkit macro aliases,
becomes a catch-all (functions) or a tag (constants), and ``T::X`` names an enum with the members
asc-devkit uses. So a call that reaches a built-in directly is checked by name only.

Each error is attributed to the op's kernel (a line of it, or a template instantiated from it), to
TileLang's templates (reported once: every op includes them), or to asc-devkit's own bodies (where
the stand-ins are imprecise; counted, not shown). The vector-core pass (``__DAV_VEC__``) is compiled.

    scripts/ascend-api-check --headers PATH [--cxx clang++] [--keep DIR] [-o name=value ...] [OP ...]

Needs clang++ (GCC has no address spaces in C++). Exit status 1 when an op has errors.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tilelang

PRELUDE = Path(__file__).with_name("prelude.h")
TEMPLATES = Path(tilelang.__file__).resolve().parent / "src"
PROBE = "".join(f"#include <tl_templates/ascend/{name}.h>\n" for name in ("common", "debug", "simd_inst"))
# The arch the emitted code targets (TileLang's bisheng flags) and the vector core's pass.
DEFINES = ("-D__NPU_ARCH__=3510", "-D__DAV_VEC__")
DIAGNOSTIC = re.compile(r"^(.+?):(\d+):(\d+): (error|note|warning): (.*)$")
NOT_BUILT_INS = {"cce", "bisheng"}  # namespaces the prelude declares
LEARN_PASSES = 10


def find_cxx(explicit: str | None) -> str:
    for name in ([explicit] if explicit else []) + ["clang++", *(f"clang++-{v}" for v in range(20, 13, -1))]:
        if shutil.which(name):
            return name
    raise SystemExit("ascend-api-check: needs clang++ (GCC has no address spaces in C++)")


def compile_command(cxx: str, headers: Path, shim: Path, source: Path) -> list[str]:
    return [cxx, "-std=c++20", "-fsyntax-only", "-ferror-limit=0", "-Wno-everything", "-fno-caret-diagnostics",
            *DEFINES, "-include", str(PRELUDE), "-I", str(shim), "-I", str(headers), "-I", str(headers / "include"),
            "-I", str(TEMPLATES), str(source)]


def diagnostics(stderr: str) -> list[list[str]]:
    """clang's errors and warnings, each with the notes that follow it."""
    groups: list[list[str]] = []
    for line in stderr.splitlines():
        match = DIAGNOSTIC.match(line)
        if match and match.group(4) in ("error", "warning"):
            groups.append([line])
        elif groups and line.strip() and not line.endswith(("errors generated.", "error generated.")):
            groups[-1].append(line)
    return groups


def attribute(stderr: str, kernel: Path) -> dict[str, list[list[str]]]:
    """The errors of a compile of ``kernel``: in the kernel (or instantiated from it), in TileLang's
    templates, or in the vendor's headers."""
    found: dict[str, list[list[str]]] = {"kernel": [], "template": [], "vendor": []}
    kernel = kernel.resolve()
    for group in diagnostics(stderr):
        first = DIAGNOSTIC.match(group[0])
        if first.group(4) != "error":
            continue
        files = {Path(m.group(1)).resolve() for m in map(DIAGNOSTIC.match, group) if m}
        where = "kernel" if kernel in files else "template" if "tl_templates" in first.group(1) else "vendor"
        found[where].append(group)
    return found


def kernels_of(listing: str) -> list[str]:
    """The kernels of a ``vmi source`` listing, each from its ``// vmi source:`` header."""
    return ["// vmi source:" + part for part in listing.split("// vmi source:")[1:]]


class BuiltIns:
    """The compiler built-ins asc-devkit's inline bodies use, learned from clang's errors (module
    docstring), written to ``shim/apicheck_learned.h``."""

    def __init__(self, headers: Path, shim: Path):
        self.headers, self.shim = headers, shim
        self.functions: set[str] = set()
        self.constants: set[str] = set()
        self.types: set[str] = set()
        self._text: dict[Path, list[str]] = {}
        vendor = [path for folder in ("include", "impl") for path in (headers / folder).rglob("*.h")]
        corpus = "\n".join(path.read_text(errors="replace") for path in vendor)
        self._members = corpus
        c_api = "\n".join(path.read_text(errors="replace") for path in (headers / "include" / "c_api").rglob("*.h"))
        # `#define asc_x intrinsic` and `#define asc_x(a) intrinsic(a)`: the intrinsic is a built-in.
        self.aliased = set(re.findall(r"^#define\s+asc_\w+\s+([a-z_]\w*)\s*$", c_api, re.M))
        self.aliased |= set(re.findall(r"^#define\s+asc_\w+\([^)]*\)\s+([a-z_]\w*)\(", c_api, re.M))
        reg_compute = headers / "impl" / "basic_api" / "reg_compute" / "dav_3510"
        self._intrinsic_uses = "\n".join(p.read_text(errors="replace") for p in reg_compute.rglob("*.h"))

    def members(self, enum: str) -> list[str]:
        return sorted(set(re.findall(rf"\b{enum}::([A-Za-z_]\w*)", self._members)))

    def write(self) -> None:
        prelude = PRELUDE.read_text()
        self.constants -= self.types | self.functions
        declared = {name for name in self.functions | self.constants | self.types if re.search(rf"\b{name}\b", prelude)}
        lines = ["#pragma once"]
        enumerators: set[str] = set()
        for name in sorted(self.types - self.functions - declared):
            members = self.members(name)
            scoped = "class " if enumerators & set(members) else ""  # two enums with one member name
            enumerators |= set(members)
            lines.append(f"enum {scoped}{name} : int {{ {', '.join(members)} }};")
        for number, name in enumerate(sorted(self.constants - enumerators - declared), 1):
            lines.append(f"constexpr __apicheck_tag<{number}> {name}{{}};")
        for name in sorted((self.functions | self.aliased) - declared):
            lines.append(f"template <auto... P, class... A> inline __apicheck_any {name}(A&&...) {{ return {{}}; }}")
        (self.shim / "apicheck_learned.h").write_text("\n".join(lines) + "\n")

    def learn_from(self, stderr: str) -> int:
        """Take the built-ins clang reported undeclared; returns how many are new."""
        before = len(self.functions) + len(self.constants) + len(self.types)
        for group in diagnostics(stderr):
            match = DIAGNOSTIC.match(group[0])
            path, line, column, _, message = match.groups()
            if match.group(4) != "error":
                continue
            if Path(path).resolve().is_relative_to(self.headers):
                self._vendor_name(Path(path), int(line), int(column), message)
            elif "tl_templates" in path:
                self._template_name(message)
        return len(self.functions) + len(self.constants) + len(self.types) - before

    def _vendor_name(self, path: Path, line: int, column: int, message: str) -> None:
        if scope := re.match(r"'(\w+)' is not a class, namespace, or enumeration", message):
            name, kind = scope.group(1), "type"
        elif undeclared := re.match(r"(use of undeclared identifier|unknown type name) '(\w+)'", message):
            name = undeclared.group(2)
            text = self._text.setdefault(path, path.read_text(errors="replace").splitlines())
            after = text[line - 1][column - 1 + len(name):].lstrip()
            kind = ("type" if undeclared.group(1) == "unknown type name" or after.startswith("::")
                    else "function" if after[:1] in "(<" else "constant")
        else:
            return
        if name in NOT_BUILT_INS or (kind == "type" and name in self.functions):
            return
        {"type": self.types, "function": self.functions, "constant": self.constants}[kind].add(name)

    def _template_name(self, message: str) -> None:
        # A name TileLang's templates call that asc-devkit's own 950 code also calls is a built-in.
        undeclared = re.match(r"(?:use of undeclared identifier|no member named) '(\w+)'", message)
        if undeclared is None:
            return
        uses = re.findall(rf"\b{undeclared.group(1)}\b\s*(\()?", self._intrinsic_uses)
        if uses:
            (self.functions if any(uses) else self.constants).add(undeclared.group(1))


def learn(cxx: str, headers: Path, shim: Path) -> str:
    """Write the learned built-ins; returns the probe's last diagnostics."""
    built_ins = BuiltIns(headers, shim)
    probe = shim / "probe.cpp"
    probe.write_text(PROBE)
    for _ in range(LEARN_PASSES):
        built_ins.write()
        stderr = subprocess.run(compile_command(cxx, headers, shim, probe), capture_output=True, text=True).stderr
        if not built_ins.learn_from(stderr):
            return stderr
    return stderr


def check_op(op: str, listing: str, cxx: str, headers: Path, shim: Path, known: set[str], folder: Path) -> list:
    """The errors of ``op``'s kernels that the probe (TileLang's templates alone) does not have."""
    folder.mkdir(parents=True, exist_ok=True)
    errors = []
    for number, kernel in enumerate(kernels_of(listing)):
        source = folder / f"kernel{number}.cpp"
        source.write_text(kernel)
        stderr = subprocess.run(compile_command(cxx, headers, shim, source), capture_output=True, text=True).stderr
        (folder / f"kernel{number}.log").write_text(stderr)
        found = attribute(stderr, source)
        errors += [(number, group) for where in ("kernel", "template", "vendor") for group in found[where]
                   if where == "kernel" or group[0] not in known]
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ascend-api-check", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--headers", required=True, type=Path, help="an asc-devkit checkout (include/ and impl/)")
    parser.add_argument("--cxx", help="the clang++ to use (default: the newest on PATH)")
    parser.add_argument("--keep", type=Path, help="write sources and logs here (default: a temporary folder)")
    parser.add_argument("--show", type=int, default=6, help="distinct errors shown per op")
    parser.add_argument("-o", "--opt", action="append", default=[], help="an op option for vmi source, name=value")
    parser.add_argument("ops", nargs="*", help="ops to check (default: every op of `vmi list`)")
    args = parser.parse_args(argv)
    headers = args.headers.resolve()
    if not (headers / "include" / "c_api" / "asc_simd.h").exists():
        parser.error(f"{headers} has no include/c_api/asc_simd.h")
    cxx = find_cxx(args.cxx)
    work = args.keep or Path(tempfile.mkdtemp(prefix="ascend-api-check-"))
    shim = work / "shim"
    (shim / "acl").mkdir(parents=True, exist_ok=True)
    (shim / "acl" / "acl.h").write_text("#pragma once\n")
    print(f"compiler {cxx}; headers {headers}; sources and logs in {work}", flush=True)
    probe = attribute(learn(cxx, headers, shim), shim / "probe.cpp")
    known = {group[0] for where in ("template", "vendor") for group in probe[where]}
    print(f"TileLang's templates alone: {len(probe['template'])} errors; in asc-devkit's bodies (stand-ins): "
          f"{len(probe['vendor'])}")
    for line in sorted({re.sub(r":\d+:\d+:", ":", group[0]) for group in probe["template"]}):
        print(f"  {line}")
    vmi = [sys.executable, "-m", "vmi_core.tools.cli"]
    ops = args.ops or [op["name"] for op in json.loads(subprocess.run(
        [*vmi, "list", "--json"], capture_output=True, text=True, check=True).stdout)]
    failed = []
    for op in ops:
        listing = subprocess.run([*vmi, "source", op, "--target", "ascend", *(f"-o{o}" for o in args.opt)],
                                 capture_output=True, text=True)
        if listing.returncode:
            print(f"{op}: no source ({listing.stderr.strip()})", flush=True)
            failed.append(op)
            continue
        errors = check_op(op, listing.stdout, cxx, headers, shim, known, work / "ops" / op)
        print(f"{op}: " + (f"{len(errors)} errors" if errors else "OK"), flush=True)
        if errors:
            failed.append(op)
        distinct = list(dict.fromkeys((number, re.sub(r"^.*?: error: ", "", group[0]), tuple(group[1:3]))
                                      for number, group in errors))
        for number, message, notes in distinct[:args.show]:
            print(f"  kernel {number}: {message}", *(f"      {note}" for note in notes), sep="\n")
        if len(distinct) > args.show:
            print(f"  ... {len(distinct) - args.show} more (logs in {work / 'ops' / op})")
    print(f"{len(ops) - len(failed)} of {len(ops)} ops OK")
    return 1 if failed else 0
