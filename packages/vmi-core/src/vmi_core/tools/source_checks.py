"""Assertions on generated kernel source, for every op's lowering tests.

Ascend: TileLang 0.1.15 emits AscendC with one function per vector region,
``__simd_vf__ inline void NAME(...) {...}`` (called directly) or
``__simt_vf__ __launch_bounds__(T) inline void NAME(...) {...}`` (launched with
``asc_vf_call<NAME>(...)``). The presence of ``__simd_vf__`` proves nothing: a
``T.Parallel`` body that the SIMD pass skips is emitted as scalar loops inside the
SIMD function without any error (toolchain guide 3.4). A real SIMD region issues
``simd_inst::`` vector ops and touches UB memory only through them.

CUDA: ``nvcc_compile`` compiles generated source to an object file with the
include paths TileLang's own build uses; it needs ``nvcc`` but no GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SIMD = "simd"
SIMT = "simt"

_QUALIFIER = {"__simd_vf__": SIMD, "__simt_vf__": SIMT}
# A region function's header up to the opening parenthesis of its parameter list: the qualifier,
# then attributes (``__launch_bounds__(128)``, ``inline``, ...) without braces or semicolons.
_HEADER = re.compile(r"\b(__simd_vf__|__simt_vf__)\b((?:[^;{}()]|\([^()]*\))*?)\bvoid\s+(\w+)\s*\(")
_VECTOR_OP = "simd_inst::"
_GM_TO_UB = "asc_copy_gm2ub_align("
_UB_TO_GM = "asc_copy_ub2gm_align("


@dataclass(frozen=True)
class Region:
    """One vector region of an AscendC kernel.

    ``vector_ops``: ``simd_inst::`` occurrences in the body; ``scalar_accesses``: body lines
    that index memory with ``[`` outside any ``simd_inst::`` call (scalar loads and stores).
    """

    name: str
    kind: str
    vector_ops: int
    scalar_accesses: int


def _skip_literal_or_comment(src: str, i: int) -> int:
    """If ``src[i]`` starts a string/char literal or a comment, the index just past it; else ``i``."""
    c = src[i]
    if c in "\"'":
        j = i + 1
        while j < len(src) and src[j] != c:
            j += 2 if src[j] == "\\" else 1
        return j + 1
    if src.startswith("//", i):
        j = src.find("\n", i)
        return len(src) if j < 0 else j
    if src.startswith("/*", i):
        j = src.find("*/", i + 2)
        return len(src) if j < 0 else j + 2
    return i


def _matching(src: str, start: int, open_char: str, close_char: str) -> int:
    """Index of the bracket closing the one at ``src[start]`` (literals and comments skipped)."""
    depth = 0
    i = start
    while i < len(src):
        skipped = _skip_literal_or_comment(src, i)
        if skipped != i:
            i = skipped
            continue
        if src[i] == open_char:
            depth += 1
        elif src[i] == close_char:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError(f"unbalanced {open_char!r} at offset {start}")


def _next_code_char(src: str, i: int) -> int:
    """Index of the next character that is neither whitespace nor inside a comment."""
    while i < len(src):
        if src[i].isspace():
            i += 1
            continue
        skipped = _skip_literal_or_comment(src, i) if src.startswith(("//", "/*"), i) else i
        if skipped == i:
            return i
        i = skipped
    return i


def _regions_with_spans(src: str) -> list[tuple[Region, int, int]]:
    """Every region function defined in ``src`` with the span of its definition."""
    out = []
    pos = 0
    while True:
        m = _HEADER.search(src, pos)
        if m is None:
            return out
        close_params = _matching(src, m.end() - 1, "(", ")")
        body_open = _next_code_char(src, close_params + 1)
        if body_open >= len(src) or src[body_open] != "{":  # a declaration, not a definition
            pos = close_params + 1
            continue
        body_close = _matching(src, body_open, "{", "}")
        lines = src[body_open + 1:body_close].splitlines()
        vector_ops = sum(line.count(_VECTOR_OP) for line in lines)
        scalar = sum(1 for line in lines if "[" in line and _VECTOR_OP not in line)
        region = Region(m.group(3), _QUALIFIER[m.group(1)], vector_ops, scalar)
        out.append((region, m.start(), body_close + 1))
        pos = body_close + 1


def region_report(src: str) -> list[Region]:
    """The SIMD and SIMT regions of AscendC source, in order of definition."""
    return [region for region, _, _ in _regions_with_spans(src)]


def _format_report(regions: list[Region]) -> str:
    if not regions:
        return "  (no __simd_vf__/__simt_vf__ functions)"
    return "\n".join(f"  {r.kind} {r.name}: {r.vector_ops} vector ops, {r.scalar_accesses} scalar accesses"
                     for r in regions)


def assert_vector_regions(src: str, *, simd: int | None = None, simt: int | None = None) -> list[Region]:
    """Assert that AscendC ``src`` computes in real vector regions; returns the report.

    * every SIMD region issues vector ops and no scalar memory accesses;
    * every SIMD region is called and every SIMT region launched (``asc_vf_call<NAME>``);
    * ``simd`` / ``simt``, when given, are the exact numbers of regions of each kind;
    * without counts, the source must contain at least one region;
    * no barrier sits inside a thread-guarded branch (``barriers_in_thread_guards``).
    """
    spans = _regions_with_spans(src)
    regions = [region for region, _, _ in spans]
    problems = []
    counts = {SIMD: sum(r.kind == SIMD for r in regions), SIMT: sum(r.kind == SIMT for r in regions)}
    for kind, expected in ((SIMD, simd), (SIMT, simt)):
        if expected is not None and counts[kind] != expected:
            problems.append(f"expected {expected} {kind} region(s), found {counts[kind]}")
    if simd is None and simt is None and not regions:
        problems.append("no vector region found")
    outside = src
    for _, start, stop in reversed(spans):
        outside = outside[:start] + outside[stop:]
    for r in regions:
        if r.kind == SIMD:
            if r.vector_ops == 0 or r.scalar_accesses:
                problems.append(f"SIMD region {r.name} is scalar code ({r.vector_ops} vector ops, "
                                f"{r.scalar_accesses} scalar accesses)")
            if not re.search(rf"\b{re.escape(r.name)}\s*\(", outside):
                problems.append(f"SIMD region {r.name} is never called")
        elif not re.search(rf"\basc_vf_call\s*<\s*{re.escape(r.name)}\s*>", outside):
            problems.append(f"SIMT region {r.name} is never launched with asc_vf_call<{r.name}>")
    barriers = barriers_in_thread_guards(src)
    if barriers:
        problems.append(f"{barriers} barrier(s) inside thread-guarded branches")
    if problems:
        raise AssertionError("vector regions: " + "; ".join(problems) + "\n" + _format_report(regions))
    return regions


_THREAD_GUARD = re.compile(r"\bif\s*\(\s*\(*\s*\(int(?:32_t)?\)\s*(?:simtvf_)?threadIdx\.x\s*\)*\s*<")
_BARRIER = re.compile(r"\b(?:asc_syncthreads|__syncthreads)\s*\(")


def barriers_in_thread_guards(src: str) -> int:
    """Barriers emitted inside ``if (threadIdx.x < N)`` branches of generated source.

    A ``T.Parallel`` loop with fewer iterations than threads is guarded so; a barrier
    inside that branch is reached by only some threads of the block, which is undefined
    on CUDA and unsafe on Ascend SIMT. TileLang puts one there when it cannot prove that
    the lanes of a loop never touch each other's data (e.g. a store at a data-dependent
    index), so kernels keep such stores out of their per-lane loops.
    """
    count = 0
    for m in _THREAD_GUARD.finditer(src):
        body_open = _next_code_char(src, _matching(src, src.index("(", m.start()), "(", ")") + 1)
        if body_open < len(src) and src[body_open] == "{":
            count += len(_BARRIER.findall(src, body_open, _matching(src, body_open, "{", "}")))
    return count


def dma_counts(src: str) -> tuple[int, int]:
    """``(gm_to_ub, ub_to_gm)``: the DMA calls (``asc_copy_gm2ub_align`` / ``asc_copy_ub2gm_align``)."""
    return src.count(_GM_TO_UB), src.count(_UB_TO_GM)


# The exponential and logarithm family: vector SFU instructions and the C library's functions. No
# kernel may call one: vmi builds them from documented arithmetic (``vmi_core.tl.exp``).
_TRANSCENDENTAL = re.compile(r"\b(?:vexp|vln|vlog|vexpdif|expf?|exp2f?|expm1f?|__expf|logf?|log1pf?|log2f?|"
                             r"__logf|powf?|tanhf?)\s*\(")


def transcendental_calls(src: str) -> list[str]:
    """The exp/log-family calls in generated source (``[]`` for a kernel that builds its own)."""
    return [m.group(0).rstrip("( ") for m in _TRANSCENDENTAL.finditer(src)]


# --- CUDA ---------------------------------------------------------------------------------------

# CUDA shared memory: a TMA transfer through a tensor descriptor needs its shared address 128-byte
# aligned, and 1024-byte aligned for the 128-byte swizzle; a bulk copy without a descriptor needs
# 16. The swizzle is in the host's descriptor, not in the kernel source: TileLang places a swizzled
# tile of the dynamic shared-memory buffer at its swizzle's alignment (its smem alignment map), which
# static ``__shared__`` arrays do not get. Some architectures cap static shared memory at 48 KB.
TMA_ALIGNMENT = 128
BULK_COPY_ALIGNMENT = 16
STATIC_SHARED_LIMIT = 48 * 1024
_ELEMENT_BYTES = {"uchar": 1, "char": 1, "signed char": 1, "int8_t": 1, "uint8_t": 1, "bool": 1,
                  "ushort": 2, "short": 2, "half_t": 2, "bfloat16_t": 2, "int16_t": 2, "uint16_t": 2,
                  "float": 4, "int": 4, "uint": 4, "int32_t": 4, "uint32_t": 4,
                  "double": 8, "int64_t": 8, "uint64_t": 8}
_STATIC_SHARED = re.compile(r"__shared__\s+(?:__align__\(\d+\)\s+)?([\w ]+?)\s+(\w+)\[(\d+)\];")
_DYNAMIC_TILE = re.compile(r"void\*\s+(\w+)\s*=\s*\(\(void\*\)\(\(char\*\)buf_dyn_shmem\s*\+\s*(\d+)\)\);")
_TILE_ELEMENT = re.compile(r"\(&\((?:\(\((\w+)\*\))?(\w+)\)?\[(.*)\]\)\)")


# TVM's C code generator prints a min/max as a ternary over its operands, each bound first to a
# variable (``uint32_t v__1 = hi[0];``), and reuses that variable for the same operand text later in
# the scope, even after a store changed the memory it read.
_OPERAND_BINDING = re.compile(r"^\s*\w[\w\s*]*?\b(v_+\d+)\s*=\s*(.*);\s*$")
_STORE = re.compile(r"^\s*(\w+)\s*\[[^=]*\]\s*=[^=]")


def stale_operand_reuses(src: str) -> list[str]:
    """Each place in a cpu (C) source where an operand variable of the code generator is used after
    a store to the memory it was read from, in the same block: the use reads the old value."""
    lines = src.splitlines()
    found = []
    for i, line in enumerate(lines):
        binding = _OPERAND_BINDING.match(line)
        if not binding:
            continue
        var, expr = binding.groups()
        buffers = set(re.findall(r"\b(\w+)\s*\[", expr))
        depth, stored = 0, None
        for j in range(i + 1, len(lines)):
            depth += lines[j].count("{") - lines[j].count("}")
            if depth < 0:
                break
            store = _STORE.match(lines[j])
            if stored is None and store and store.group(1) in buffers:
                stored = j
            elif stored is not None and re.search(rf"\b{var}\b", lines[j]):
                found.append(f"line {j + 1}: {lines[j].strip()!r} uses {var} (line {i + 1}: {line.strip()!r}) "
                             f"after line {stored + 1}: {lines[stored].strip()!r}")
                break
    return found


def _split_arguments(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


def _index_bytes_alignment(index: str, element: int) -> int:
    """The largest power of two (up to ``TMA_ALIGNMENT``) that every value of the element index ``index``
    times ``element`` bytes is a multiple of: a literal or ``(var * K)``; 1 when it cannot tell."""
    index = index.strip()
    while index.startswith("(") and _matching(index, 0, "(", ")") == len(index) - 1:
        index = index[1:-1].strip()
    if index.isdigit():
        value = int(index) * element
    elif (product := re.fullmatch(r"\w+\s*\*\s*(\d+)", index)) is not None:
        value = int(product.group(1)) * element
    else:
        return 1
    return TMA_ALIGNMENT if value == 0 else min(value & -value, TMA_ALIGNMENT)


def cuda_shared_memory_problems(src: str) -> list[str]:
    """What in a CUDA kernel source breaks the shared-memory rules above: static ``__shared__``
    arrays over ``STATIC_SHARED_LIMIT`` in all, and each ``tl::tma_*`` whose shared tile is a static
    array (placed wherever ptxas packs it) or sits at an offset short of its alignment."""
    problems = []
    static = {}
    for dtype, name, count in _STATIC_SHARED.findall(src):
        if dtype not in _ELEMENT_BYTES:
            problems.append(f"static shared array {name}: unknown element type {dtype!r}")
            continue
        static[name] = (_ELEMENT_BYTES[dtype], int(count))
    static_bytes = sum(element * count for element, count in static.values())
    if static_bytes > STATIC_SHARED_LIMIT:
        problems.append(f"{static_bytes} bytes of static shared memory (over {STATIC_SHARED_LIMIT})")
    dynamic = {name: int(offset) for name, offset in _DYNAMIC_TILE.findall(src)}
    for call in re.finditer(r"tl::tma_(?:load|store)\w*\(", src):
        args = _split_arguments(src[call.end():_matching(src, call.end() - 1, "(", ")")])
        need = TMA_ALIGNMENT if args[0].endswith("_desc") else BULK_COPY_ALIGNMENT
        for arg in args:
            tile = _TILE_ELEMENT.fullmatch(arg)
            if tile is None or (tile.group(2) not in static and tile.group(2) not in dynamic):
                continue
            cast, name, index = tile.groups()
            line = src[:call.start()].count("\n") + 1
            if name in static:
                problems.append(f"line {line}: TMA tile {name} is a static shared array (alignment not guaranteed)")
                continue
            element = _ELEMENT_BYTES.get(cast, 1) if cast else 1
            if dynamic[name] % need:
                problems.append(f"line {line}: TMA tile {name} at shared offset {dynamic[name]} "
                                f"is not {need}-byte aligned")
            elif _index_bytes_alignment(index, element) < need:
                problems.append(f"line {line}: TMA box {name}[{index}] is not {need}-byte aligned")
    return problems


def cuda_dynamic_shared_bytes(func, **config) -> int:
    """Bytes of dynamic shared memory the cuda lowering of prim_func ``func`` launches with (the
    kernel source does not say: its tiles are offsets into one buffer sized at the launch)."""
    from ..compile import lower_artifact

    functions = lower_artifact(func, "cuda", **config).device_mod.functions.values()
    return max((int(f.attrs["dyn_shared_memory_buf"]) for f in functions
                if f.attrs is not None and "dyn_shared_memory_buf" in f.attrs), default=0)


def nvcc_path() -> str | None:
    """The ``nvcc`` on ``PATH``, else ``$CUDA_HOME/bin/nvcc`` if it exists, else None."""
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    return None


def _arch_number(arch: str) -> str:
    number = arch
    for prefix in ("sm_", "compute_"):
        number = number.removeprefix(prefix)
    if not re.fullmatch(r"\d+[a-z]?", number):
        raise ValueError(f"CUDA arch must look like 'sm_90a', got {arch!r}")
    return number


def nvcc_compile(src: str, arch: str = "sm_90a", timeout: float = 600.0) -> None:
    """Compile CUDA ``src`` for ``arch`` to a cubin, the device code a GPU runs (nvcc's device pass and
    ptxas); AssertionError with nvcc's output on failure. A kernel source has no host code of its own,
    so the host pass of ``nvcc -c`` would compile only the headers again, at twice the device pass's cost."""
    number = _arch_number(arch)
    nvcc = nvcc_path()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (neither on PATH nor in $CUDA_HOME/bin)")
    import tilelang

    from ..compile import CUDA_COMPILE_FLAGS

    includes = [p for p in (tilelang.env.TILELANG_TEMPLATE_PATH, tilelang.env.CUTLASS_INCLUDE_DIR) if p]
    with tempfile.TemporaryDirectory(prefix="vmi-nvcc-") as tmp:
        cu = Path(tmp) / "k.cu"
        cu.write_text(src)
        cmd = [nvcc, "-std=c++17", "-w", "--cubin", str(cu), "-o", str(Path(tmp) / "k.cubin"), *CUDA_COMPILE_FLAGS,
               "-gencode", f"arch=compute_{number},code=sm_{number}", *(f"-I{path}" for path in includes)]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout)[-4000:]
        raise AssertionError(f"nvcc failed (exit {result.returncode}) for arch {arch}:\n{tail}")


def _vectorized_lines(src: str, timeout: float) -> set[int] | None:
    """Line numbers of the loops of the cpu kernel source ``src`` that GCC vectorizes with the cpu
    build's flags (``-fopt-info-vec-optimized``); None when the host C++ compiler is not GCC."""
    import tilelang

    from ..compile import cpu_compile_flags, host_cxx
    from ..headers import is_gcc

    cxx = host_cxx()
    if not is_gcc(cxx):
        return None
    with tempfile.TemporaryDirectory(prefix="vmi-cpu-") as tmp:
        cpp = Path(tmp) / "k.cpp"
        cpp.write_text(src)
        cmd = [cxx, "-std=c++17", "-c", str(cpp), "-o", str(Path(tmp) / "k.o"),
               f"-I{tilelang.env.TILELANG_TEMPLATE_PATH}", *cpu_compile_flags(), "-fopt-info-vec-optimized"]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{cxx} failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    return {int(n) for n in re.findall(r":(\d+):\d+: optimized: loop vectorized", result.stderr)}


def cpu_vectorized_loops(src: str, timeout: float = 300.0) -> list[str] | None:
    """The loops of the cpu kernel source ``src`` that GCC vectorizes with the cpu build's flags,
    each as its header line and the first line of its body; None when the host C++ compiler is not
    GCC."""
    numbers = _vectorized_lines(src, timeout)
    if numbers is None:
        return None
    lines = src.splitlines()
    return [f"{lines[n - 1].strip()} {lines[n].strip() if n < len(lines) else ''}" for n in sorted(numbers)]


def cpu_loop_vectorizes(src: str, marker: str, timeout: float = 300.0) -> bool | None:
    """Whether GCC vectorizes the innermost loop of the cpu kernel source ``src`` around the first line
    in a loop that contains ``marker`` (None when the host C++ compiler is not GCC)."""
    header = _loop_around(src.splitlines(), marker)
    numbers = _vectorized_lines(src, timeout)
    return None if numbers is None else header + 1 in numbers


def _loop_around(lines: list[str], marker: str) -> int:
    """The line of the ``for`` whose block holds the first line in a loop that contains ``marker``."""
    for line in (i for i, text in enumerate(lines) if marker in text):
        depth = 0
        for header in range(line, -1, -1):  # back to the ``for`` whose block holds the marker
            depth += lines[header].count("}") - lines[header].count("{")
            if depth < 0:  # the opening line of a block that holds the marker
                if lines[header].lstrip().startswith("for ("):
                    return header
                depth = 0
    raise ValueError(f"no loop around {marker!r}")
