"""ascend-sim: run the exact AscendC that the ``ascend`` target emits, on the CPU.

The source TileLang lowers for ``ascend`` (same pass configs, same text) is compiled
with the host C++ compiler against vmi-core's model of the Ascend 950 AI core
(``include/vmi_ascend_sim``: Unified Buffer, DMA, pipes and events, SIMT threads with
barriers, the SIMD vector unit; the Cube unit and the AIC/AIV instances of mixed kernels,
``cube.h`` and ``mix.h``), then run on CPU tensors. It is a simulation from
documented semantics, not an NPU run; the assumptions it rests on are listed in
vmi-core's README.

Before compiling, every ``__ubuf__ T*`` of the source becomes ``ub_ptr<T>`` and every
``__gm__ T*`` becomes ``gm_ptr<T>`` (bounds-checked pointers), the address of a UB element
``&(p[i])`` becomes the UB pointer ``p + (i)``, and the TileLang
template includes become the model's header, except TileLang's own SIMD wrapper header
(``simd_inst.h``), which is compiled as shipped, with the same pointer rewrite, against
the model's C API (``include/c_api/asc_simd.h``), and the ``ascend_gemm_l1`` template of
TileLang's ``gemm.h`` likewise against the Cube model, whose memories' pointers (``__cbuf__``,
``__ca__``, ``__cb__``, ``__cc__``) become byte offsets. Each ``__simd_vf__`` function becomes a
launcher that issues its body on the V pipe with the arguments of the call, as the
hardware runs a vector function; nothing else of the text changes.

Each launch counts what it executed (``SimKernel.last_stats``, ``last_launch_stats()``).

Environment:

- ``VMI_ASCEND_SIM_SCHEDULE``: how the pipes interleave, ``random`` (default),
  ``seq``, ``consumers_first`` or ``producers_first`` (see ``pipes.h``);
- ``VMI_ASCEND_SIM_SEED``: the seed of the random schedule and of the UB fill.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from ..headers import precompiled_header
from ..tl.lazy import tilelang, tirx

SCHEDULES = ("seq", "random", "consumers_first", "producers_first")
SCHEDULE_ENV = "VMI_ASCEND_SIM_SCHEDULE"
SEED_ENV = "VMI_ASCEND_SIM_SEED"
DEFAULT_SCHEDULE = "random"

INCLUDE_DIR = Path(__file__).resolve().parent / "include"
CXX = os.environ.get("CXX", "g++")
# No contraction of a*b+c into an FMA (the emitted code says fmaf where it means one);
# integer overflow wraps, as the device's integer units do; type punning through pointers.
# -O1: simulated launches are short, so the build dominates, and -O2 takes twice as long to build
# (no flag here changes a result: IEEE arithmetic without contraction or fast-math either way).
CXX_FLAGS = ("-std=c++17", "-O1", "-fno-strict-aliasing", "-fwrapv", "-ffp-contract=off", "-fvisibility=hidden",
             "-fPIC", "-shared", "-w")
# Usable UB of one core: 248 KiB, or 216 KiB when a SIMT region needs its data cache
# (256 KiB less 8 KiB reserved less 32 KiB; AscendC GetRuntimeUBSize).
UB_BYTES = 248 * 1024
UB_BYTES_WITH_SIMT = 216 * 1024

_KERNEL_SIGNATURE = re.compile(r'extern "C" __global__ (__vector__|__cube__|__mix__\(\d+, \d+\)) void (\w+)\(([^)]*)\)')
# What runs the entry on each AI core (runner.h): the vector core, the Cube core, or both (mix.h).
_KERNEL_KINDS = {"__vector__": "KERNEL_VECTOR", "__cube__": "KERNEL_CUBE"}
_TEMPLATE_INCLUDE = re.compile(r"^\s*#include\s*<tl_templates/[^>]*>\s*$", re.M)
_SIMD_INST_INCLUDE = re.compile(r"^\s*#include\s*<tl_templates/ascend/simd_inst\.h>\s*$", re.M)
_GEMM_INCLUDE = re.compile(r"^\s*#include\s*<tl_templates/ascend/gemm\.h>\s*$", re.M)
# The one template of gemm.h that T.gemm emits (the others need Cube intrinsics the model lacks).
_GEMM_L1_TEMPLATE = re.compile(r"template <int M, int K, int N, int TILE_K_SUB, bool TRANS_B, typename InT,\s*"
                               r"typename AccumT>\s*__aicore__ inline void\s*ascend_gemm_l1\(.*?\n}\n", re.S)
_SIMD_VF = re.compile(r"__simd_vf__ inline void (\w+)\(([^)]*)\) \{")
_UB_POINTER = re.compile(r"__ubuf__\s+(\w+)\s*\*")
_UB_DECLARATION = re.compile(r"__ubuf__\s+\w+\s*\*\s*(\w+)")
_GM_POINTER = re.compile(r"__gm__\s+(\w+)\s*\*")
# The Cube core's memories (L1, L0A, L0B, L0C) and their pointer types in the model (cube.h).
_CUBE_POINTERS = {"__cbuf__": "cbuf_ptr", "__ca__": "ca_ptr", "__cb__": "cb_ptr", "__cc__": "cc_ptr"}
_TORCH_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64, "bool": torch.bool,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
}
_INT_RANGES = {"int32_t": (-2**31, 2**31 - 1), "int64_t": (-2**63, 2**63 - 1), "uint32_t": (0, 2**32 - 1),
               "int": (-2**31, 2**31 - 1)}


class AscendSimError(RuntimeError):
    """The simulated kernel broke a rule of the model (bounds, alignment, events, barriers)."""


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("num_cores", ctypes.c_int32), ("schedule", ctypes.c_int32), ("ub_alloc", ctypes.c_int64),
                ("ub_capacity", ctypes.c_int64), ("seed", ctypes.c_uint64)]


class _LaunchStats(ctypes.Structure):
    """``ascend_sim::Stats`` of ``core.h``, field for field."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "cores", "simd_regions", "simt_regions", "simt_threads", "vector_instructions", "vector_loads",
        "vector_stores", "mem_bars", "scalar_ub_accesses", "simt_ub_accesses", "simd_scalar_ub_accesses",
        "dma_gm_to_ub_bytes", "dma_ub_to_gm_bytes")]


_last_stats = threading.local()


def last_launch_stats() -> dict[str, int] | None:
    """Execution counts of the calling thread's latest successful launch on ascend-sim (None before
    one): see ``SimKernel.last_stats``."""
    return getattr(_last_stats, "value", None)


@dataclass(frozen=True)
class KernelParam:
    """One parameter of the emitted kernel entry: a GM pointer or a scalar."""

    name: str
    ctype: str
    is_pointer: bool


def kernel_signature(source: str) -> tuple[str, list[KernelParam]]:
    """Name and parameters of the ``extern "C"`` kernel entry in an emitted source."""
    match = _KERNEL_SIGNATURE.search(source)
    if match is None:
        raise AscendSimError("no kernel entry (extern \"C\" __global__ __vector__/__cube__/__mix__ void ...) "
                             "in the source")
    params = []
    for text in filter(None, (p.strip() for p in match.group(3).split(","))):
        pointer = re.fullmatch(r"__gm__ (\w+)\* (\w+)", text)
        scalar = re.fullmatch(r"(\w+) (\w+)", text)
        if pointer:
            params.append(KernelParam(pointer.group(2), pointer.group(1), True))
        elif scalar:
            params.append(KernelParam(scalar.group(2), scalar.group(1), False))
        else:
            raise AscendSimError(f"kernel parameter {text!r} is not modelled")
    return match.group(2), params


def _kernel_kind(source: str) -> str:
    return _KERNEL_KINDS.get(_KERNEL_SIGNATURE.search(source).group(1), "KERNEL_MIX")


def _ub_element_addresses(text: str, address=None) -> str:
    """``&(p[i])`` as ``(p + (i))`` for a UB pointer ``p`` (``((__ubuf__ T*)buf)`` or a name declared
    ``__ubuf__ T*``): on the device the address of a UB element is a UB pointer, while the
    model's ``ub_ptr<T>`` indexes to a host reference. (For any other pointer or array the two
    forms are the same value.)"""
    if address is None:
        names = sorted(set(_UB_DECLARATION.findall(text)), key=len, reverse=True)
        address = re.compile(r"&\((\(\(__ubuf__ \w+\*\)\w+\)" + "".join(f"|{n}" for n in names) + r")\[")
    out, pos = [], 0
    while match := address.search(text, pos):
        depth, end = 1, match.end()
        while depth:
            if end == len(text):
                raise AscendSimError("an unbalanced UB element address in the source")
            depth += {"[": 1, "]": -1}.get(text[end], 0)
            end += 1
        if text[end:end + 1] != ")":
            raise AscendSimError("a UB element address in a form the model does not rewrite")
        index = _ub_element_addresses(text[match.end():end - 1], address)
        out.append(f"{text[pos:match.start()]}({match.group(1)} + ({index}))")
        pos = end + 1
    return "".join(out) + text[pos:]


def _rewrite_pointers(text: str) -> str:
    text = _UB_POINTER.sub(r"::ascend_sim::ub_ptr<\1> ", _ub_element_addresses(text))
    text = _GM_POINTER.sub(r"::ascend_sim::gm_ptr<\1> ", text)
    for qualifier, pointer in _CUBE_POINTERS.items():
        text = re.sub(qualifier + r"\s+(\w+)\s*\*", rf"::ascend_sim::{pointer}<\1> ", text)
    for qualifier in ("__ubuf__", "__gm__", *_CUBE_POINTERS):
        if qualifier in text:
            raise AscendSimError(f"the source uses {qualifier} in a form the model does not rewrite")
    return text


def _simd_vf_launcher(match: re.Match) -> str:
    """A vector function's definition as a launcher (what the kernel calls) and its body."""
    name, params = match.group(1), match.group(2)
    names = ", ".join(p.split()[-1] for p in params.split(",") if p.strip())
    launch = f"::ascend_sim::simd_vf_call(\"{name}\", [=] {{ {name}_body({names}); }});"
    return (f"inline void {name}_body({params});\n"
            f"inline void {name}({params}) {{ {launch} }}\n"
            f"inline void {name}_body({params}) {{")


def _ascend_template(name: str) -> Path:
    """A header of TileLang's Ascend templates."""
    return Path(tilelang.__file__).resolve().parent / "src" / "tl_templates" / "ascend" / name


@functools.cache
def _gemm_l1_template() -> str:
    header = _ascend_template("gemm.h")
    match = _GEMM_L1_TEMPLATE.search(header.read_text())
    if match is None:
        raise AscendSimError(f"no ascend_gemm_l1 template in {header}")
    return match.group(0)


def prepare_source(source: str) -> str:
    """The emitted source as the model compiles it, with its launch entry appended."""
    name, params = kernel_signature(source)
    body = _SIMD_INST_INCLUDE.sub(lambda _: _ascend_template("simd_inst.h").read_text(), source, count=1)
    body = _GEMM_INCLUDE.sub(lambda _: _gemm_l1_template(), body, count=1)
    body = _rewrite_pointers(_TEMPLATE_INCLUDE.sub("", body))
    body = _SIMD_VF.sub(_simd_vf_launcher, body)
    if "__simd_vf__" in body:
        raise AscendSimError("the source declares a __simd_vf__ function in a form the model does not rewrite")
    args = []
    for i, p in enumerate(params):
        if p.is_pointer:
            args.append(f"::ascend_sim::gm_ptr<{p.ctype}>(({p.ctype}*)pointers[{i}])")
        elif p.ctype in ("float", "double"):
            args.append(f"({p.ctype})floats[{i}]")
        else:
            args.append(f"({p.ctype})ints[{i}]")
    regions = ", ".join(f'{{(uintptr_t)pointers[{i}], (uintptr_t)pointers[{i}] + sizes[{i}], "{p.name}"}}'
                        for i, p in enumerate(params) if p.is_pointer)
    num_regions = sum(p.is_pointer for p in params)
    entry = f"""
extern "C" __attribute__((visibility("default"))) int vmi_ascend_sim_launch(
    void *const *pointers, const uint64_t *sizes, const int64_t *ints, const double *floats,
    const ::ascend_sim::LaunchConfig *config, ::ascend_sim::Stats *stats, char *error, size_t error_bytes) {{
  const ::ascend_sim::GmRegion regions[] = {{{regions or '{0, 0, ""}'}}};
  return ::ascend_sim::run_launch("{name}", *config, regions, {num_regions}, [&] {{ {name}({", ".join(args)}); }},
                                  stats, error, error_bytes, ::ascend_sim::{_kernel_kind(source)});
}}
"""
    return '#include "vmi_ascend_sim/runner.h"\n' + body + entry


@functools.cache
def _toolchain_identity() -> str:
    version = subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True).stdout
    headers = sorted(INCLUDE_DIR.rglob("*.h"))
    return version + "".join(h.read_text() for h in headers) + " ".join(CXX_FLAGS)


def _model_header(cache: Path) -> tuple[str, ...]:
    """The model's headers, which every prepared source includes first, precompiled (the digest of
    the headers, flags and compiler names the header)."""
    text = f"// {hashlib.sha256(_toolchain_identity().encode()).hexdigest()}\n#include \"vmi_ascend_sim/runner.h\"\n"
    return precompiled_header(CXX, tuple(flag for flag in CXX_FLAGS if flag != "-shared"), (str(INCLUDE_DIR),), text,
                              cache / "pch")


def compile_library(prepared: str, cache: Path) -> Path:
    """The shared library of a prepared source, compiled once into ``cache``."""
    digest = hashlib.sha256((_toolchain_identity() + prepared).encode()).hexdigest()[:24]
    cache.mkdir(parents=True, exist_ok=True)
    library = cache / f"{digest}.so"
    if library.exists():
        return library
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        cpp = Path(scratch) / "kernel.cpp"
        cpp.write_text(prepared)
        built = Path(scratch) / "kernel.so"
        result = subprocess.run([CXX, *CXX_FLAGS, *_model_header(cache), "-I", str(INCLUDE_DIR), "-o", str(built),
                                 str(cpp)], capture_output=True, text=True)
        if result.returncode != 0:
            raise AscendSimError(f"the emitted source does not compile against the model:\n{result.stderr[-4000:]}")
        os.replace(built, library)  # atomic: concurrent builders of one kernel agree
    return library


_libraries: dict[Path, tuple[ctypes.CDLL, threading.Lock]] = {}
_libraries_lock = threading.Lock()


def _load(path: Path) -> tuple[ctypes.CDLL, threading.Lock]:
    with _libraries_lock:
        if path not in _libraries:
            lib = ctypes.CDLL(str(path))
            lib.vmi_ascend_sim_launch.restype = ctypes.c_int
            lib.vmi_ascend_sim_launch.argtypes = [
                ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int64),
                ctypes.POINTER(ctypes.c_double), ctypes.POINTER(_LaunchConfig), ctypes.POINTER(_LaunchStats),
                ctypes.c_char_p, ctypes.c_size_t]
            # The model's state lives in the library: one launch at a time per library.
            _libraries[path] = (lib, threading.Lock())
        return _libraries[path]


def schedule() -> str:
    chosen = os.environ.get(SCHEDULE_ENV) or DEFAULT_SCHEDULE
    if chosen not in SCHEDULES:
        raise ValueError(f"{SCHEDULE_ENV} must be one of {SCHEDULES}, got {chosen!r}")
    return chosen


def _span_bytes(t: torch.Tensor) -> int:
    """Bytes from a tensor's first element to the end of its last one."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1) * t.element_size()


class SimKernel:
    """A kernel lowered for ``ascend``, compiled against the model; called like a TileLang kernel.

    ``func`` is the TileLang prim_func (its parameters say how call arguments map to the
    emitted entry's), ``source`` the lowered source, ``num_cores`` the launch's grid and
    ``ub_alloc`` the bytes of its UB allocation.

    After a successful call, ``last_stats`` (also ``last_launch_stats()``) holds the launch's
    execution counts, summed over its cores:

    - ``cores``: cores run;
    - ``simd_regions``, ``simt_regions``: vector functions (``__simd_vf__``) and SIMT regions
      (``asc_vf_call``) executed; ``simt_threads``: SIMT threads started, over all regions;
    - ``vector_instructions``: SIMD instructions executed, each call of a modelled intrinsic
      once (TileLang's wrappers count as the instructions they issue), vector loads and stores
      (gathers, scatters and predicate loads and stores included) too, ``asc_mem_bar`` not;
      ``vector_loads`` and ``vector_stores``: those of them that read or write UB;
      ``mem_bars``: ``asc_mem_bar`` calls;
    - ``scalar_ub_accesses``, ``simt_ub_accesses``, ``simd_scalar_ub_accesses``: UB element
      accesses of scalar code outside regions, of SIMT threads, and of scalar code inside
      vector functions (each ``ub[i]`` the source evaluates once, a read-modify-write once);
    - ``dma_gm_to_ub_bytes``, ``dma_ub_to_gm_bytes``: bytes DMA moved (the GM side: bursts
      times burst length, no pads).
    """

    last_stats: dict[str, int] | None = None

    def __init__(self, func, source: str, num_cores: int, ub_alloc: int, cache: Path):
        self.name, self.params = kernel_signature(source)
        self.source = source
        self.num_cores = num_cores
        self.ub_alloc = ub_alloc
        self.ub_capacity = UB_BYTES_WITH_SIMT if "__simt_vf__" in source else UB_BYTES
        self._func = func
        prepared = prepare_source(source)
        self.library = compile_library(prepared, cache)  # its cache entry
        try:
            self._lib, self._lock = _load(self.library)
        except OSError:  # a truncated or garbage cache entry: build it again
            self.library.unlink(missing_ok=True)
            self.library = compile_library(prepared, cache)
            self._lib, self._lock = _load(self.library)

    def _bind(self, args) -> dict:
        """Names of the emitted entry's parameters -> values, from the prim_func's arguments."""
        func = self._func
        if len(args) != len(func.params):
            raise TypeError(f"{self.name} takes {len(func.params)} arguments, got {len(args)}")
        values: dict = {}

        def bind(var, value, what):
            name = var.name
            if name in values and values[name] != value:
                raise ValueError(f"{self.name}: {what} gives {name} = {value}, but it is already {values[name]}")
            values[name] = value

        for var, arg in zip(func.params, args, strict=True):
            buffer = func.buffer_map.get(var)
            if buffer is None:
                bind(var, arg, f"argument {var.name}")
                continue
            if not isinstance(arg, torch.Tensor) or arg.device.type != "cpu":
                raise TypeError(f"{self.name}: argument {buffer.name} must be a CPU tensor")
            want = _TORCH_DTYPES[str(buffer.dtype)]
            if arg.dtype != want:
                raise TypeError(f"{self.name}: argument {buffer.name} must be {want}, got {arg.dtype}")
            if arg.dim() != len(buffer.shape):
                raise ValueError(f"{self.name}: argument {buffer.name} must have {len(buffer.shape)} dims")
            strides = list(buffer.strides) or None
            contiguous_stride = 1
            for dim in reversed(range(arg.dim())):
                stride = strides[dim] if strides else tirx.IntImm("int64", contiguous_stride)
                for extent, actual, kind in ((buffer.shape[dim], arg.shape[dim], "size"),
                                             (stride, arg.stride(dim), "stride")):
                    if isinstance(extent, tirx.Var):
                        bind(extent, actual, f"the {kind} of {buffer.name} in dim {dim}")
                    elif isinstance(extent, tirx.IntImm) and extent.value != actual and not (
                            kind == "stride" and arg.shape[dim] <= 1):
                        raise ValueError(f"{self.name}: argument {buffer.name} has {kind} {actual} in dim {dim}, "
                                         f"expected {extent.value}")
                contiguous_stride *= arg.shape[dim]
            values[buffer.data.name] = arg
        return values

    def __call__(self, *args) -> None:
        values = self._bind(args)
        n = len(self.params)
        pointers = (ctypes.c_void_p * n)()
        sizes = (ctypes.c_uint64 * n)()
        ints = (ctypes.c_int64 * n)()
        floats = (ctypes.c_double * n)()
        for i, p in enumerate(self.params):
            if p.name not in values:
                raise AscendSimError(f"{self.name}: no value for the emitted parameter {p.name}")
            value = values[p.name]
            if p.is_pointer:
                pointers[i] = value.data_ptr()
                sizes[i] = _span_bytes(value)
            elif p.ctype in ("float", "double"):
                floats[i] = float(value)
            else:
                low, high = _INT_RANGES.get(p.ctype, _INT_RANGES["int64_t"])
                if not low <= int(value) <= high:
                    raise ValueError(f"{self.name}: {p.name} = {int(value)} does not fit the kernel's {p.ctype}")
                ints[i] = int(value)
        config = _LaunchConfig(self.num_cores, SCHEDULES.index(schedule()), self.ub_alloc, self.ub_capacity,
                               int(os.environ.get(SEED_ENV) or 0))
        error = ctypes.create_string_buffer(1024)
        stats = _LaunchStats()
        self.last_stats = _last_stats.value = None
        with self._lock:
            status = self._lib.vmi_ascend_sim_launch(pointers, sizes, ints, floats, ctypes.byref(config),
                                                     ctypes.byref(stats), error, len(error))
        if status:
            raise AscendSimError(f"ascend-sim: {error.value.decode()}")
        self.last_stats = _last_stats.value = {name: getattr(stats, name) for name, _ in stats._fields_}


def launch_shape(device_mod) -> tuple[int, int]:
    """(cores, UB bytes) of the kernel entry of a lowered device module."""
    for function in device_mod.functions.values():
        attrs = function.attrs
        if attrs is not None and "thread_extent" in attrs:
            extent = attrs["thread_extent"]
            cores = int(extent["blockIdx.x"]) if "blockIdx.x" in extent else 1
            ub = int(attrs["dyn_shared_memory_buf"]) if "dyn_shared_memory_buf" in attrs else 0
            return cores, ub
    raise AscendSimError("the lowered module has no kernel entry with a launch grid")
