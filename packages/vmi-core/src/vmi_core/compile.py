"""Compile and lower TileLang kernels for every target.

Each target needs its own pass configuration (see ``pass_configs``); the CPU
build also needs its own flags (``cpu_compile_flags``: TileLang's C build is ``-O0``
otherwise) and lowering rules for ``fabs``/``fmod``, and is called through
``vmi_core.cpu_kernel``; a cuda kernel is called through ``vmi_core.cuda_kernel``, which
refuses a tensor whose first element is not 16-byte aligned. ``ascend-sim`` lowers exactly
as ``ascend`` does and compiles that source against vmi-core's Ascend model
(``vmi_core.ascend_sim``).

The disk cache: TileLang's key ignores registered lowering rules and the
compilers, so vmi's cache lives in a directory named after vmi-core's version and
a digest of the rules, the flags (the CPU architecture level included), the host and
CUDA compilers' identities and
TileLang's native libraries: changing any of them starts a fresh cache. A cached
binary is loaded and run, so the cache must be private: its directories are made
0700, and one that another user owns or that others can write is refused. vmi
points TileLang's cache at its own only while it compiles (under a lock), so other
TileLang users in the process keep theirs.

Each kernel ``cached_kernel`` compiles or loads, and each Ascend lowering ``kernel_source``
makes, is recorded in ``entries/`` of the cache: one JSON file per kernel variant naming its op
(the builder's name without ``build_``), target, specialisation and the cache files it occupies
(TileLang's kernel directory, the ascend-sim library, the Ascend lowering). ``vmi cache`` reads
the records; they change no cache key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import os
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .headers import precompiled_header
from .targets import TARGETS, lowering_target
from .tl.lazy import import_tilelang, tilelang, tirx, tvm

CUDA_ARCH_ENV = "VMI_CUDA_ARCH"
CACHE_DIR_ENV = "VMI_CACHE_DIR"
LOG_ENV = "VMI_LOG"
# TileLang's loggers: it reports every compile at INFO on the terminal.
TILELANG_LOGGERS = ("tilelang", "tilelang.jit.kernel", "tilelang.cache.kernel_cache")
# TileLang warns (on stdout) when it finds a kernel in its memory cache: for vmi an expected event,
# two specialisations of one body that lower to the same kernel. Shown only from INFO down.
QUIET_AT_WARNING = "tilelang.cache.kernel_cache"


def configure_tilelang_logging(level: int | str | None = None) -> None:
    """Set TileLang's loggers to ``level``: default ``$VMI_LOG`` (a ``logging`` level name such as
    ``INFO``), else ``WARNING``, so that a library call prints nothing of its compiles (the memory
    cache's warning only from ``INFO`` down: ``QUIET_AT_WARNING``). vmi sets the
    default at its first lowering or compile unless this ran before. TileLang sets its own levels when
    it is imported, so this imports it first; setting the ``tilelang`` loggers' levels later overrides it."""
    global _tilelang_logging_configured
    if level is None:
        level = os.environ.get(LOG_ENV) or "WARNING"
    if isinstance(level, str):
        name = level.strip().upper()
        if not isinstance(logging.getLevelName(name), int):
            raise ValueError(f"${LOG_ENV} must be a logging level name (DEBUG, INFO, WARNING, ERROR), got {level!r}")
        level = logging.getLevelName(name)
    import_tilelang()
    for logger in TILELANG_LOGGERS:
        quiet = logger == QUIET_AT_WARNING and level >= logging.WARNING
        logging.getLogger(logger).setLevel(max(level, logging.ERROR) if quiet else level)
    _tilelang_logging_configured = True


DEFAULT_CUDA_ARCH = "sm_90a"

CPU_ARCH_ENV = "VMI_CPU_ARCH"
# Bits first: no contraction of a*b+c into an FMA (the references round twice; FMA is used only
# where a kernel asks for fma()), no -ffast-math; errno-free libm calls inline (sqrtf, fmaf).
# For the vectorizer: FP operations may be evaluated speculatively (no kernel reads the FP
# exception flags: -fno-trapping-math changes no result), and GCC's value-range and dominator
# passes, which turn the encoders' select chains into branches it cannot if-convert, are off.
CPU_COMPILE_FLAGS = ("-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-fno-tree-vrp",
                     "-fno-tree-dominator-opts")
# The same bits on a GPU: nvcc contracts a*b + c into an FMA unless told not to; the flavors' fixed
# operation orders and the error-free transformations of tl.exact need every product and sum
# rounded as written (fmaf stays fused).
CUDA_COMPILE_FLAGS = ("--fmad=false",)
# Shared memory one cuda block may use on sm_90, with the dynamic opt-in (a launch over it fails).
CUDA_SHARED_LIMIT = 227 * 1024
# x86-64 microarchitecture levels (psABI) and the /proc/cpuinfo flags each one needs.
X86_LEVELS = (
    ("x86-64-v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
    ("x86-64-v3", {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"}),
    ("x86-64-v2", {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}),
)
# C lowering of intrinsics TVM has no default scalar rule for: (tirx op, libm function).
CPU_LOWERING_RULES = (("fabs", "fabsf"), ("fmod", "fmodf"))

_setup_lock = threading.Lock()
_cpu_rules_registered = False
_tilelang_logging_configured = False
# Held while TileLang's cache directory points at vmi's.
_tilelang_cache_lock = threading.RLock()


def cuda_arch() -> str:
    return os.environ.get(CUDA_ARCH_ENV, DEFAULT_CUDA_ARCH)


def tvm_target(target: str) -> tvm.target.Target | str:
    """The TileLang target object of a vmi target name."""
    target = lowering_target(target)
    if target == "cpu":
        return "c"
    if target == "cuda":
        return tvm.target.Target({"kind": "cuda", "arch": cuda_arch()})
    if target == "ascend":
        import tilelang.ascend  # noqa: F401  (registers the backend)
        from tilelang.ascend.target import _make_ascend_target

        return _make_ascend_target()
    raise ValueError(f"target must be one of {TARGETS}, got {target!r}")


def pass_configs(target: str, *, simd_parallel: bool = True, simt_8bit: bool = False) -> dict:
    """Per-target pass configuration.

    ``simd_parallel``: the kernel's SIMD regions are ``T.Parallel`` bodies, so let
    bindings must be inlined or Ascend lowering silently emits scalar code; kernels
    using explicit ``T.simd.*`` must pass False (the inlining breaks their masks).
    ``simt_8bit``: an Ascend SIMT region touches 8-bit data, which SIMT can only
    access element by element.
    """
    target = lowering_target(target)
    if target == "cpu":
        return {"tirx.disable_vectorize": True}
    if target == "cuda":
        return {"tl.device_compile_flags": list(CUDA_COMPILE_FLAGS)}
    if target == "ascend":
        config = {}
        if simd_parallel:
            config["tl.force_let_inline"] = True
        if simt_8bit:
            config["tirx.disable_vectorize"] = True
        return config
    raise ValueError(f"target must be one of {TARGETS}, got {target!r}")


def _version_line(command: list[str]) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    return result.stdout.strip() or result.stderr.strip()


def host_cxx() -> str:
    """The host C++ compiler TileLang's cpu build calls."""
    from tilelang.contrib.cc import get_cplus_compiler

    return get_cplus_compiler() or "g++"


@functools.cache
def toolchain_identity() -> str:
    """The host C++ compiler, nvcc (when installed) and TileLang's native libraries, as one string."""
    from tilelang.contrib.nvcc import get_nvcc_compiler

    cxx = host_cxx()
    try:
        nvcc = get_nvcc_compiler()
    except Exception:  # noqa: BLE001  (no CUDA toolkit: nothing to identify)
        nvcc = None
    libraries = sorted((Path(tilelang.__file__).parent / "lib").glob("*.so"))
    native = [f"{lib.name}:{lib.stat().st_size}:{lib.stat().st_mtime_ns}" for lib in libraries]
    return "|".join([_version_line([cxx, "--version"]), _version_line([nvcc, "--version"]) if nvcc else "no nvcc",
                     *native])


def _cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


@functools.cache
def cpu_arch() -> str | None:
    """The ``-march`` of CPU kernels: ``$VMI_CPU_ARCH``, else the highest x86-64 level this CPU has
    (None elsewhere: the compiler's default)."""
    chosen = os.environ.get(CPU_ARCH_ENV)
    if chosen:
        return chosen
    flags = _cpuinfo_flags()
    base = {"lm", "cmov", "cx8", "fpu", "fxsr", "mmx", "syscall", "sse", "sse2"}
    if not base <= flags:
        return None
    for index, (level, _) in enumerate(X86_LEVELS):
        # A level includes the ones below it.
        if all(needs <= flags for _, needs in X86_LEVELS[index:]):
            return level
    return "x86-64"


def cpu_compile_flags() -> tuple[str, ...]:
    """Flags of the CPU kernels' C build (part of the cache key)."""
    arch = cpu_arch()
    return (*CPU_COMPILE_FLAGS, *((f"-march={arch}",) if arch else ()))


@functools.cache
def _cpu_template_text() -> str:
    # The template's own text (and half.hpp beside it) decides the header.
    template = Path(tilelang.env.TILELANG_TEMPLATE_PATH) / "tl_templates" / "cpp"
    contents = "".join(path.read_text() for path in sorted(template.glob("*")) if path.is_file())
    return f"// {hashlib.sha256(contents.encode()).hexdigest()}\n#include <tl_templates/cpp/common.h>\n"


def cpu_template_header() -> tuple[str, ...]:
    """``vmi_core.headers.precompiled_header`` flags of TileLang's cpu kernel template, which every cpu
    kernel includes (TileLang's cpu build: ``-std=c++17 -fPIC`` and its template directory, then vmi's
    flags)."""
    return precompiled_header(host_cxx(), ("-std=c++17", "-fPIC", *cpu_compile_flags()),
                              (tilelang.env.TILELANG_TEMPLATE_PATH,), _cpu_template_text(),
                              private_cache_dir() / "pch")


def cache_key() -> str:
    """What, besides the kernel itself, decides a cached binary's contents."""
    rules = repr((CPU_LOWERING_RULES, cpu_compile_flags(), CUDA_COMPILE_FLAGS))
    identity = f"{__version__}|{tilelang.__version__}|{rules}|{toolchain_identity()}"
    return f"vmi-{__version__}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def private_dir(path: Path) -> Path:
    """``path``, created 0700 if missing; a directory another user owns or others can write is refused.

    Cached binaries are loaded and run: whoever can write the cache can run code as the user.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.geteuid():
        raise PermissionError(f"the vmi kernel cache {path} belongs to uid {info.st_uid}, not to this user "
                              f"(uid {os.geteuid()}); set {CACHE_DIR_ENV} to a directory of your own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"the vmi kernel cache {path} is writable by others (mode "
                              f"{stat.S_IMODE(info.st_mode):o}); run `chmod go-w {path}` or set {CACHE_DIR_ENV}")
    return path


def cache_dir() -> Path:
    """vmi's kernel cache: ``$VMI_CACHE_DIR`` (else ``$TILELANG_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/vmi``, else ``~/.cache/vmi``) / key."""
    root = os.environ.get(CACHE_DIR_ENV) or os.environ.get("TILELANG_CACHE_DIR")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vmi"
    return base / cache_key()


def private_cache_dir() -> Path:
    """``cache_dir()``, checked (and created) private, with its parent."""
    directory = cache_dir()
    private_dir(directory.parent)
    return private_dir(directory)


@contextlib.contextmanager
def _tilelang_cache():
    """TileLang's cache pointed at vmi's for one compile, then restored."""
    directory = str(private_cache_dir())
    with _tilelang_cache_lock:
        saved = tilelang.env.TILELANG_CACHE_DIR
        tilelang.env.TILELANG_CACHE_DIR = directory
        try:
            yield
        finally:
            tilelang.env.TILELANG_CACHE_DIR = saved


def _setup(target: str) -> None:
    global _cpu_rules_registered
    with _setup_lock:
        if not _tilelang_logging_configured:
            configure_tilelang_logging()
        if target == "cpu" and not _cpu_rules_registered:
            for op, libm in CPU_LOWERING_RULES:
                tvm.ir.register_intrin_lowering(
                    f"tirx.{op}", target="c", level=99,
                    f=(lambda name: lambda call: tirx.call_pure_extern(call.dtype, name, *call.args))(libm))
            _cpu_rules_registered = True


def lower_artifact(func, target: str, **config):
    """TileLang's lowering of ``func`` for ``target`` (source and device module); no hardware needed."""
    _setup(target)
    tgt = tvm_target(target)
    if isinstance(tgt, str):
        tgt = tvm.target.Target(tgt)
    with tgt, tilelang.transform.PassContext(config=pass_configs(target, **config)):
        return tilelang.lower(func, target=tgt)


@dataclass(frozen=True)
class AscendLowering:
    """What the ``ascend`` lowering of a kernel gives ``ascend-sim``: the source and the launch."""

    source: str
    cores: int | None
    ub_bytes: int | None


def _launch_shape(device_mod) -> tuple[int | None, int | None]:
    from .ascend_sim import launch_shape

    try:
        return launch_shape(device_mod)
    except TypeError:  # a grid that depends on runtime sizes (not a persistent kernel): no simulation
        return None, None


def lower_ascend(func, target: str, **config) -> AscendLowering:
    """The ``ascend`` lowering of ``func``, cached on disk under a hash of its TIR and pass configs.

    Lowering for Ascend takes seconds of CPU per kernel, and every test process, the ``vmi``
    command and the simulator need the same few hundred variants: the TIR script (printed in
    milliseconds) decides the output, together with the toolchain already in ``cache_key``.
    """
    return _lower_ascend(func, target, **config)[0]


@contextlib.contextmanager
def _building(key: str):
    """Held while one process builds the cache entry ``key``: another process that needs the same
    entry (a pytest-xdist worker, a ``vmi precompile`` job) waits, then reads it from the cache
    instead of building it a second time."""
    name = hashlib.sha256(key.encode()).hexdigest()[:32]
    with open(private_dir(private_cache_dir() / "locks") / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _lower_ascend(func, target: str, **config) -> tuple[AscendLowering, Path]:
    """``lower_ascend`` and the cache file holding the lowering."""
    configs = sorted(pass_configs(target, **config).items())
    key = hashlib.sha256(f"{func.script()}|{configs}".encode()).hexdigest()
    path = private_dir(private_cache_dir() / "ascend-lowered") / f"{key}.json"
    with _building(f"ascend-lowered/{key}"):
        return _cached_lowering(func, target, path, config)


def _cached_lowering(func, target: str, path: Path, config: dict) -> tuple[AscendLowering, Path]:
    try:
        return AscendLowering(**json.loads(path.read_text())), path
    except (OSError, ValueError, TypeError):
        pass  # not cached yet, or a truncated or foreign entry: lower again
    artifact = lower_artifact(func, target, **config)
    lowering = AscendLowering(artifact.kernel_source, *_launch_shape(artifact.device_mod))
    fd, partial = tempfile.mkstemp(dir=path.parent, suffix=".partial")
    with os.fdopen(fd, "w") as out:
        json.dump(dataclasses.asdict(lowering), out)
    os.replace(partial, path)  # atomic: concurrent writers of one entry agree
    return lowering, path


def lower(func, target: str, **config) -> str:
    """Generated source of ``func`` for ``target``; needs no hardware and no device compiler."""
    if lowering_target(target) == "ascend":
        return lower_ascend(func, target, **config).source
    return lower_artifact(func, target, **config).kernel_source


def compile_kernel(func, target: str, **config):
    """A callable kernel for ``target`` (cached on disk across processes)."""
    return _compile(func, target, **config)[0]


def _compile(func, target: str, **config) -> tuple[object, list[Path]]:
    """``compile_kernel`` and the cache entries the kernel occupies."""
    if target == "ascend-sim":
        from .ascend_sim import AscendSimError, SimKernel

        lowering, lowered = _lower_ascend(func, target, **config)
        if lowering.cores is None:
            raise AscendSimError("ascend-sim runs persistent kernels: this kernel's grid depends on runtime sizes")
        kernel = SimKernel(func, lowering.source, lowering.cores, lowering.ub_bytes,
                           private_dir(private_cache_dir() / "ascend-sim"))
        return kernel, [lowered, kernel.library]
    _setup(target)
    kwargs = {}
    if target == "cpu":
        kwargs["compile_flags"] = [*cpu_compile_flags(), *cpu_template_header()]
    if target == "cuda":  # the library build's nvcc call (the pass config is the device build's)
        kwargs["compile_flags"] = list(CUDA_COMPILE_FLAGS)
    with _tilelang_cache():
        kernel = tilelang.compile(func, target=tvm_target(target), pass_configs=pass_configs(target, **config),
                                  **kwargs)
    # TileLang tags the kernel with its cache directory (tilelang==0.1.15 is pinned).
    entry = getattr(kernel, "_tilelang_cache_path", None)
    paths = [Path(entry)] if entry else []
    if target == "cpu":
        from .cpu_kernel import CpuKernel

        return CpuKernel(kernel), paths
    if target == "cuda":
        from .cuda_kernel import CudaKernel

        return CudaKernel(kernel), paths
    return kernel, paths


class KernelCache:
    """In-process memo of compiled kernels, keyed by the factory's specialisation."""

    def __init__(self) -> None:
        self._kernels: dict = {}
        self._lock = threading.Lock()

    def get(self, key, build: Callable[[], object]):
        kernel = self._kernels.get(key)  # one dict read: atomic under the GIL, so a hit takes no lock
        if kernel is None:
            kernel = build()
            with self._lock:
                kernel = self._kernels.setdefault(key, kernel)
        return kernel


kernel_cache = KernelCache()

ENTRIES_DIR = "entries"


@dataclass(frozen=True)
class CacheEntry:
    """A kernel variant's record in the disk cache: its op (the builder's name without ``build_``),
    target, builder (``module.qualname``), specialisation (``repr``), and its files, relative to
    ``cache_dir()``. ``fresh``: compiled (or lowered) by the call that noted it, not loaded."""

    op: str
    target: str
    kernel: str
    spec: str
    paths: tuple[str, ...]
    fresh: bool = False


_watchers: list[list[CacheEntry]] = []
_watchers_lock = threading.Lock()
# kernel_requests(): the (build, spec, target, config) kernel_source was asked for, per thread.
_requests = threading.local()


@contextlib.contextmanager
def watch_entries():
    """Yields a list that collects a ``CacheEntry`` for each kernel compiled or loaded from disk, and
    each Ascend lowering made or read, in this process while the block runs (kernels this process
    already holds are not listed)."""
    seen: list[CacheEntry] = []
    with _watchers_lock:
        _watchers.append(seen)
    try:
        yield seen
    finally:
        with _watchers_lock:
            _watchers.remove(seen)


@contextlib.contextmanager
def kernel_requests():
    """Within the block, ``kernel_source`` lowers nothing and returns ``""``: it appends the
    ``(build, spec, target, config)`` it was asked for to the yielded list (an op's ``source``
    then names the kernel variant its options select, without the cost of lowering it)."""
    requests: list[tuple] = []
    saved = getattr(_requests, "active", None)
    _requests.active = requests
    try:
        yield requests
    finally:
        _requests.active = saved


def _note(build: Callable, spec, target: str, config: dict, paths: list[Path], started: float) -> None:
    """Record the cache files of a kernel variant in ``entries/`` and tell the watchers."""
    directory = private_cache_dir().resolve()
    paths = [path.resolve() for path in paths]
    name = f"{build.__module__}.{build.__qualname__}"
    relative = tuple(sorted(str(path.relative_to(directory)) for path in paths if path.is_relative_to(directory)))
    if not relative:
        return
    entry = CacheEntry(build.__name__.removeprefix("build_"), target, name, repr(spec), relative)
    key = hashlib.sha256(f"{name}|{spec!r}|{target}|{sorted(config.items())}".encode()).hexdigest()[:32]
    record = private_dir(directory / ENTRIES_DIR) / f"{key}.json"
    data = {field: value for field, value in dataclasses.asdict(entry).items() if field != "fresh"}
    data["paths"] = list(relative)
    try:
        current = json.loads(record.read_text())
    except (OSError, ValueError):
        current = None
    if current != data:
        fd, partial = tempfile.mkstemp(dir=record.parent, suffix=".partial")
        with os.fdopen(fd, "w") as out:
            json.dump(data, out)
        os.replace(partial, record)
    fresh = any(path.exists() and path.stat().st_mtime >= started for path in paths)
    with _watchers_lock:
        for seen in _watchers:
            seen.append(dataclasses.replace(entry, fresh=fresh))


def kernel_source(build: Callable, spec, target: str, **config) -> str:
    """Generated source of the kernel ``build(spec, target)`` (no hardware needed)."""
    requests = getattr(_requests, "active", None)
    if requests is not None:
        requests.append((build, spec, target, config))
        return ""
    func = build(spec, lowering_target(target))
    if lowering_target(target) != "ascend":
        return lower(func, target, **config)
    started = time.time()
    lowering, path = _lower_ascend(func, target, **config)
    _note(build, spec, "ascend", config, [path], started)
    return lowering.source


def _compile_and_note(build: Callable, spec, target: str, config: dict):
    with _building(f"{build.__module__}.{build.__qualname__}|{spec!r}|{target}|{sorted(config.items())}"):
        started = time.time()
        kernel, paths = _compile(build(spec, lowering_target(target)), target, **config)
        _note(build, spec, target, config, paths, started)
    return kernel


def cached_kernel(build: Callable, spec, target: str, **config):
    """The compiled kernel ``build(spec, target)``: built once per process, cached on disk across processes.

    ``ascend-sim`` builds the ``ascend`` kernel body: the simulator runs what ``ascend`` emits.
    """
    return kernel_cache.get((build.__module__, build.__qualname__, spec, target),
                            lambda: _compile_and_note(build, spec, target, config))
