"""The compile wrapper (vmi_core.compile) and the portable shell (vmi_core.tl.shell) end to end.

A small kernel written once against ``Shell`` (persistent tiles over a runtime row
count with a partial last tile: DMA in, an element-wise SIMT region, DMA out) runs on
cpu against torch, lowers for ascend (regions and DMA asserted with
``vmi_core.tools.source_checks``) and for cuda (compiled with nvcc where installed). SIMD
bodies show what the source checker accepts and what it catches.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import tilelang
import tilelang.language as T
import torch

import vmi_core
from vmi_core import compile as vc
from vmi_core.compile import compile_kernel, cuda_arch, lower, pass_configs
from vmi_core.headers import is_gcc, precompiled_header
from vmi_core.tl.shell import Shell
from vmi_core.tl.simd import maximum
from vmi_core.tools.source_checks import assert_vector_regions, dma_counts, region_report
from vmi_core.tools.testing import assert_bitwise_equal
from vmi_devkit.cuda import check_cuda_source

BM = 16
N = 64  # a multiple of 64: the innermost extent Ascend SIMD needs for fp32
CPU_WORKERS = 3  # several persistent workers, so the round-robin hand-out is exercised on cpu


# --- cache key and directory ------------------------------------------------------------------

class TestCache:
    def test_key_changes_with_lowering_rules(self, monkeypatch):
        key = vc.cache_key()
        assert key == vc.cache_key()
        monkeypatch.setattr(vc, "CPU_LOWERING_RULES", vc.CPU_LOWERING_RULES + (("exp", "my_expf"),))
        assert vc.cache_key() != key

    def test_key_changes_with_compile_flags(self, monkeypatch):
        key = vc.cache_key()
        monkeypatch.setattr(vc, "CPU_COMPILE_FLAGS", ("-O3",))
        assert vc.cache_key() != key

    def test_key_changes_with_the_cpu_architecture_level(self, monkeypatch):
        key = vc.cache_key()
        vc.cpu_arch.cache_clear()
        monkeypatch.setenv(vc.CPU_ARCH_ENV, "x86-64" if vc.cpu_arch() != "x86-64" else "x86-64-v2")
        vc.cpu_arch.cache_clear()
        try:
            assert vc.cpu_compile_flags()[-1] == f"-march={os.environ[vc.CPU_ARCH_ENV]}"
            assert vc.cache_key() != key
        finally:
            monkeypatch.delenv(vc.CPU_ARCH_ENV)
            vc.cpu_arch.cache_clear()
        assert vc.cache_key() == key

    @pytest.mark.parametrize("extra,level", [
        (set(), "x86-64"),
        ({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}, "x86-64-v2"),
        ({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma",
          "movbe", "xsave"}, "x86-64-v3"),
        # AVX-512 without the v3 set is no level above v2.
        ({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3", "avx512f", "avx512bw", "avx512cd", "avx512dq",
          "avx512vl"}, "x86-64-v2"),
    ])
    def test_cpu_architecture_level_from_the_cpu_flags(self, monkeypatch, extra, level):
        base = {"lm", "cmov", "cx8", "fpu", "fxsr", "mmx", "syscall", "sse", "sse2"}
        monkeypatch.delenv(vc.CPU_ARCH_ENV, raising=False)
        monkeypatch.setattr(vc, "_cpuinfo_flags", lambda: base | extra)
        vc.cpu_arch.cache_clear()
        try:
            assert vc.cpu_arch() == level
        finally:
            vc.cpu_arch.cache_clear()

    def test_no_architecture_flag_off_x86(self, monkeypatch):
        monkeypatch.delenv(vc.CPU_ARCH_ENV, raising=False)
        monkeypatch.setattr(vc, "_cpuinfo_flags", lambda: {"fp", "asimd", "aes"})
        vc.cpu_arch.cache_clear()
        try:
            assert vc.cpu_arch() is None
            assert not any(flag.startswith("-march") for flag in vc.cpu_compile_flags())
        finally:
            vc.cpu_arch.cache_clear()

    def test_cpu_flags_keep_the_bits(self):
        flags = vc.cpu_compile_flags()
        assert "-ffp-contract=off" in flags
        assert not any(flag in flags for flag in ("-ffast-math", "-Ofast", "-funsafe-math-optimizations"))

    def test_key_changes_with_version(self, monkeypatch):
        key = vc.cache_key()
        assert key.startswith(f"vmi-{vmi_core.__version__}-")
        monkeypatch.setattr(vc, "__version__", "999.0.0")
        assert vc.cache_key() != key
        assert vc.cache_key().startswith("vmi-999.0.0-")

    def test_dir_honours_env(self, monkeypatch, tmp_path):
        monkeypatch.setenv(vc.CACHE_DIR_ENV, str(tmp_path))
        assert vc.cache_dir() == tmp_path / vc.cache_key()

    def test_dir_fallbacks(self, monkeypatch, tmp_path):
        monkeypatch.delenv(vc.CACHE_DIR_ENV, raising=False)
        monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
        assert vc.cache_dir() == tmp_path / vc.cache_key()
        monkeypatch.delenv("TILELANG_CACHE_DIR")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert vc.cache_dir() == tmp_path / "xdg" / "vmi" / vc.cache_key()
        monkeypatch.delenv("XDG_CACHE_HOME")
        assert vc.cache_dir() == Path.home() / ".cache" / "vmi" / vc.cache_key()

    def test_session_cache_is_set(self):
        """vmi-devkit's pytest plugin points the test session's cache away from ``~``."""
        import os

        assert os.environ.get(vc.CACHE_DIR_ENV)


class TestConfig:
    def test_pass_configs(self):
        assert pass_configs("cpu") == {"tirx.disable_vectorize": True}
        assert pass_configs("cuda") == {"tl.device_compile_flags": ["--fmad=false"]}
        assert pass_configs("ascend") == {"tl.force_let_inline": True}
        assert pass_configs("ascend", simd_parallel=False) == {}
        assert pass_configs("ascend", simd_parallel=False, simt_8bit=True) == {"tirx.disable_vectorize": True}
        with pytest.raises(ValueError, match="got 'rocm'"):
            pass_configs("rocm")

    def test_targets(self, monkeypatch):
        assert vc.tvm_target("cpu") == "c"
        monkeypatch.setenv(vc.CUDA_ARCH_ENV, "sm_80")
        assert cuda_arch() == "sm_80"
        assert str(vc.tvm_target("cuda").attrs["arch"]) == "sm_80"
        assert vc.tvm_target("ascend").kind.name == "ascend"
        with pytest.raises(ValueError, match="got 'rocm'"):
            vc.tvm_target("rocm")

    def test_kernel_cache_builds_once(self):
        cache = vc.KernelCache()
        calls = []
        first = cache.get(("k", 1), lambda: calls.append(1) or object())
        assert cache.get(("k", 1), lambda: calls.append(1) or object()) is first
        assert cache.get(("k", 2), lambda: "other") == "other"
        assert len(calls) == 1


# --- the shell kernel -------------------------------------------------------------------------

def build_shell_kernel(target: str, workers: int | None = None):
    """``Y = max(X, 0) * 2 - 1`` over (M, N) fp32, M a runtime value, in persistent BM-row tiles."""
    sh = Shell(target, workers=workers)
    M = T.dynamic("M")

    @T.prim_func
    def shell_kernel(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
        with sh.persistent_kernel() as worker:
            for t in sh.tiles([T.ceildiv(M, BM)], worker):
                x = sh.tile((BM, N), "float32")
                y = sh.tile((BM, N), "float32")
                sh.copy(X[t * BM, 0], x)
                with sh.vector("simt"):
                    for i, j in T.Parallel(BM, N):
                        # Scaling by 2 is exact: no FMA contraction can change the bits.
                        y[i, j] = maximum(x[i, j], T.float32(0.0)) * T.float32(2.0) - T.float32(1.0)
                sh.copy(y, Y[t * BM, 0])

    return shell_kernel


@pytest.fixture(scope="module")
def shell_kernel():
    return compile_kernel(build_shell_kernel("cpu", CPU_WORKERS), "cpu")


def run_shell(kernel, x: torch.Tensor) -> torch.Tensor:
    y = torch.full_like(x, float("nan"))
    if x.shape[0] == 0:  # nothing to do: no launch (as the ops do)
        return y
    kernel(x, y)
    return y


# 33 and 100 rows mix full tiles (the cpu copy's unchecked path) with an edge tile (``T.copy``).
@pytest.mark.parametrize("m", [0, 1, 33, 100])
def test_shell_kernel_runs_on_cpu(shell_kernel, m):
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, N, generator=g) * 10
    y = run_shell(shell_kernel, x)
    assert_bitwise_equal(y, x.clamp_min(0.0) * 2.0 - 1.0, f"M={m}")


def test_shell_kernel_rows_are_independent(shell_kernel):
    """A row range of a larger input gives the rows of the full run (the cpu_parallel contract)."""
    x = torch.randn(100, N, generator=torch.Generator().manual_seed(7))
    full = run_shell(shell_kernel, x)
    assert_bitwise_equal(run_shell(shell_kernel, x[37:90]), full[37:90])


def test_shell_kernel_lowers_for_ascend():
    src = lower(build_shell_kernel("ascend"), "ascend")
    regions = assert_vector_regions(src, simd=0, simt=1)
    assert regions[0].name in src and f"asc_vf_call<{regions[0].name}>" in src
    assert dma_counts(src) == (1, 1)
    assert "block_idx" in src


@pytest.mark.cuda_compile
def test_shell_kernel_lowers_and_compiles_for_cuda():
    src = lower(build_shell_kernel("cuda"), "cuda")
    assert "__global__" in src
    check_cuda_source(src, cuda_arch())


# --- SIMD regions -----------------------------------------------------------------------------

def build_simd_kernel(target: str, body: str, *, persistent: bool = False, num_stages: int = 1):
    """An Ascend SIMD region over (BM, N) tiles; ``body``: ``"arith"`` (pure fp32 arithmetic),
    ``"let"`` (the same through a Python local, i.e. a let binding) or ``"cast"`` (int32 -> fp32)."""
    sh = Shell(target, workers=4)
    M = T.dynamic("M")
    in_dtype = "int32" if body == "cast" else "float32"

    @T.macro
    def compute(x, y):
        with sh.vector("simd"):
            for i, j in T.Parallel(BM, N):
                if body == "arith":
                    y[i, j] = (x[i, j] + T.float32(1.0)) * T.float32(0.5)
                elif body == "let":
                    v = x[i, j] + T.float32(1.0)
                    y[i, j] = v * T.float32(0.5)
                else:
                    y[i, j] = T.Cast("float32", x[i, j]) * T.float32(0.5)

    if persistent:
        @T.prim_func
        def simd_kernel(X: T.Tensor((M, N), in_dtype), Y: T.Tensor((M, N), "float32")):
            with sh.persistent_kernel() as worker:
                for t in sh.tiles([T.ceildiv(M, BM)], worker, num_stages=num_stages):
                    x = sh.tile((BM, N), in_dtype)
                    y = sh.tile((BM, N), "float32")
                    sh.copy(X[t * BM, 0], x)
                    compute(x, y)
                    sh.copy(y, Y[t * BM, 0])
    else:
        @T.prim_func
        def simd_kernel(X: T.Tensor((M, N), in_dtype), Y: T.Tensor((M, N), "float32")):
            with sh.kernel(T.ceildiv(M, BM)) as bx:
                x = sh.tile((BM, N), in_dtype)
                y = sh.tile((BM, N), "float32")
                sh.copy(X[bx * BM, 0], x)
                compute(x, y)
                sh.copy(y, Y[bx * BM, 0])

    return simd_kernel


def test_simd_arithmetic_is_vector_code():
    src = lower(build_simd_kernel("ascend", "arith"), "ascend")
    (region,) = assert_vector_regions(src, simd=1, simt=0)
    assert region.vector_ops >= 4 and region.scalar_accesses == 0
    assert "simd_inst::vadd" in src and "simd_inst::vmul" in src
    assert dma_counts(src) == (1, 1)


def test_simd_persistent_single_buffered():
    src = lower(build_simd_kernel("ascend", "arith", persistent=True, num_stages=1), "ascend")
    assert_vector_regions(src, simd=1, simt=0)


def test_simd_persistent_multi_buffered_is_rejected_by_tilelang():
    """Known TileLang 0.1.15 limitation: with double-buffered tiles (``Shell.tiles``' default
    ``num_stages=2``) the SIMD pass cannot lower a 2-D ``T.Parallel``; SIMD bodies in persistent
    loops need ``num_stages=1``."""
    with pytest.raises(Exception, match="2D parallel requires one dimension with stride=1"):
        lower(build_simd_kernel("ascend", "arith", persistent=True, num_stages=2), "ascend")


def test_simd_let_binding_is_inlined_by_default():
    """``simd_parallel=True`` (the default) inlines let bindings, so the body stays vector code."""
    src = lower(build_simd_kernel("ascend", "let"), "ascend")
    assert_vector_regions(src, simd=1)


def test_checker_catches_scalar_simd_region():
    """Without let inlining the SIMD pass skips the body: scalar loops inside ``__simd_vf__``."""
    src = lower(build_simd_kernel("ascend", "let"), "ascend", simd_parallel=False)
    assert "__simd_vf__" in src  # the string alone proves nothing
    (region,) = region_report(src)
    assert region.kind == "simd" and region.vector_ops == 0 and region.scalar_accesses > 0
    with pytest.raises(AssertionError, match="is scalar code"):
        assert_vector_regions(src)


def test_simd_cast_is_rejected():
    with pytest.raises(Exception, match="unsupported expr"):
        lower(build_simd_kernel("ascend", "cast"), "ascend")


def test_simd_cast_through_let_is_detected():
    """The same cast hidden behind a let binding lowers silently, as scalar code; the checker fails it."""
    sh = Shell("ascend", workers=4)
    M = T.dynamic("M")

    @T.prim_func
    def cast_kernel(X: T.Tensor((M, N), "int32"), Y: T.Tensor((M, N), "float32")):
        with sh.kernel(T.ceildiv(M, BM)) as bx:
            x = sh.tile((BM, N), "int32")
            y = sh.tile((BM, N), "float32")
            sh.copy(X[bx * BM, 0], x)
            with sh.vector("simd"):
                for i, j in T.Parallel(BM, N):
                    v = T.Cast("float32", x[i, j])
                    y[i, j] = v * T.float32(0.5)
            sh.copy(y, Y[bx * BM, 0])

    src = lower(cast_kernel, "ascend", simd_parallel=False)
    with pytest.raises(AssertionError, match="scalar code"):
        assert_vector_regions(src, simd=1)


def test_simd_body_runs_on_cpu():
    """On cpu the SIMD region is no region at all: the same body runs as plain loops."""
    kernel = compile_kernel(build_simd_kernel("cpu", "arith"), "cpu")
    x = torch.randn(37, N, generator=torch.Generator().manual_seed(8))
    y = torch.empty_like(x)
    kernel(x, y)
    assert_bitwise_equal(y, (x + 1.0) * 0.5)


# --- cache trust ------------------------------------------------------------------------------

class TestCacheTrust:
    """Cached binaries are loaded and run: the cache must be the user's alone."""

    def test_new_cache_directories_are_private(self, monkeypatch, tmp_path):
        monkeypatch.setenv(vc.CACHE_DIR_ENV, str(tmp_path / "fresh"))
        directory = vc.private_cache_dir()
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert stat.S_IMODE(directory.parent.stat().st_mode) == 0o700

    def test_a_cache_others_can_write_is_refused_before_anything_loads(self, monkeypatch, tmp_path):
        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        monkeypatch.setenv(vc.CACHE_DIR_ENV, str(shared))
        # A library planted there with a self-consistent manifest would be loaded by TileLang.
        with pytest.raises(PermissionError, match=r"writable by others \(mode 777\); run `chmod go-w"):
            compile_kernel(build_shell_kernel("cpu", 2), "cpu")

    def test_a_cache_of_another_user_is_refused(self, monkeypatch, tmp_path):
        monkeypatch.setenv(vc.CACHE_DIR_ENV, str(tmp_path))
        monkeypatch.setattr(vc.os, "geteuid", lambda: os.getuid() + 1)
        with pytest.raises(PermissionError, match="belongs to uid .* not to this user"):
            vc.private_cache_dir()

    def test_key_changes_with_the_toolchain(self, monkeypatch):
        key = vc.cache_key()
        assert "--version" not in vc.toolchain_identity() and "libtilelang.so" in vc.toolchain_identity()
        monkeypatch.setattr(vc, "toolchain_identity", lambda: "g++ (other) 99.0 | libtilelang.so:1:2")
        assert vc.cache_key() != key

    def test_tilelang_cache_setting_does_not_leak(self, monkeypatch, tmp_path):
        monkeypatch.setenv(vc.CACHE_DIR_ENV, str(tmp_path / "vmi"))
        before = tilelang.env.TILELANG_CACHE_DIR
        compile_kernel(build_shell_kernel("cpu", 2), "cpu")
        assert tilelang.env.TILELANG_CACHE_DIR == before
        assert any((tmp_path / "vmi").rglob("kernel_lib.so")), "vmi compiled into its own cache"


class TestPrecompiledHeader:
    """``precompiled_header``: the headers every kernel build includes, compiled once per cache."""

    def test_a_cpu_kernel_builds_with_the_template_precompiled_to_the_same_code(self, tmp_path):
        cxx = vc.host_cxx()
        if not is_gcc(cxx):
            pytest.skip("precompiled headers are used with GCC only")
        flags = vc.cpu_template_header()
        assert flags[0] == "-include" and Path(f"{flags[1]}.gch").is_file()
        source = tmp_path / "kernel.cpp"
        source.write_text(lower(build_shell_kernel("cpu", 2), "cpu"))

        def assembly(*extra: str) -> tuple[str, str]:
            out = tmp_path / "kernel.s"
            result = subprocess.run([cxx, "-std=c++17", "-fPIC", f"-I{tilelang.env.TILELANG_TEMPLATE_PATH}",
                                     *vc.cpu_compile_flags(), *extra, "-H", "-S", str(source), "-o", str(out)],
                                    capture_output=True, text=True, check=True)
            return "\n".join(line for line in out.read_text().splitlines() if ".file" not in line), result.stderr

        plain, _ = assembly()
        precompiled, headers = assembly(*flags)
        # GCC's -H marks a precompiled header it used with "!".
        assert f"! {flags[1]}.gch" in headers
        assert precompiled == plain

    def test_a_header_that_does_not_build_gives_no_flags(self, tmp_path):
        assert precompiled_header(vc.host_cxx(), ("-std=c++17",), (), "#error not a header\n", tmp_path) == ()


_COMPILE_AND_RUN = """
import hashlib, sys, torch
from vmi_devkit.sim_kernels import row_scale
x = torch.randn(300, 64, generator=torch.Generator().manual_seed(1))
y = row_scale(x, 16, "cpu")
print(hashlib.sha256(y.numpy().tobytes()).hexdigest())
"""


def _compile_and_run_in_processes(count: int, cache: Path) -> list[str]:
    """Each process's last output line. A library call prints no TileLang compile progress (its INFO
    log is off unless $VMI_LOG asks for it; a warning, e.g. of a corrupted cache entry, still shows)."""
    env = dict(os.environ, VMI_CACHE_DIR=str(cache), PYTHONPATH=str(Path(__file__).parent))
    env.pop(vc.LOG_ENV, None)
    procs = [subprocess.Popen([sys.executable, "-c", _COMPILE_AND_RUN], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(count)]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err[-2000:]
        assert not [line for line in (out + err).splitlines() if "[TileLang:" in line and ":INFO]" in line], out + err
    return [out.strip().splitlines()[-1] for out, _ in results]


def test_tilelang_log_level_comes_from_vmi_log(monkeypatch):
    import logging

    try:
        for value, level in ((None, logging.WARNING), ("info", logging.INFO), (" DEBUG ", logging.DEBUG)):
            if value is None:
                monkeypatch.delenv(vc.LOG_ENV, raising=False)
            else:
                monkeypatch.setenv(vc.LOG_ENV, value)
            vc.configure_tilelang_logging()
            levels = {name: logging.getLogger(name).level for name in vc.TILELANG_LOGGERS}
            quiet = levels.pop(vc.QUIET_AT_WARNING)
            assert set(levels.values()) == {level}
            assert quiet == (logging.ERROR if level == logging.WARNING else level)
        monkeypatch.setenv(vc.LOG_ENV, "loud")
        with pytest.raises(ValueError, match=r"\$VMI_LOG must be a logging level name"):
            vc.configure_tilelang_logging()
    finally:
        vc.configure_tilelang_logging(logging.WARNING)


@pytest.mark.parametrize("processes", [2, pytest.param(8, marks=pytest.mark.slow)])
def test_processes_compiling_one_kernel_into_a_fresh_cache_agree_and_survive_corruption(tmp_path, processes):
    cache = tmp_path / "cache"
    digests = _compile_and_run_in_processes(processes, cache)
    assert len(set(digests)) == 1
    libraries = list(cache.rglob("kernel_lib.so"))
    assert libraries, "the kernel was cached"
    # Truncate one cached library and fill another with garbage: the next process recompiles.
    libraries[0].write_bytes(libraries[0].read_bytes()[:100])
    for other in libraries[1:]:
        other.write_bytes(b"garbage" * 100)
    assert _compile_and_run_in_processes(1, cache) == digests[:1]


class TestAscendLoweringCache:
    """``lower_ascend``: one lowering per TIR and pass config, shared through the disk cache."""

    def test_a_second_lowering_comes_from_the_cache(self, monkeypatch, tmp_path):
        monkeypatch.setenv("VMI_CACHE_DIR", str(tmp_path))
        first = vc.lower_ascend(build_shell_kernel("ascend"), "ascend")
        monkeypatch.setattr(vc, "lower_artifact", lambda *a, **k: pytest.fail("lowered again"))
        again = vc.lower_ascend(build_shell_kernel("ascend"), "ascend-sim")
        assert again == first and first.cores == 64 and first.ub_bytes > 0
        assert "__global__ __vector__" in first.source

    def test_another_pass_config_or_kernel_is_another_entry(self, monkeypatch, tmp_path):
        monkeypatch.setenv("VMI_CACHE_DIR", str(tmp_path))
        vc.lower_ascend(build_shell_kernel("ascend"), "ascend")
        vc.lower_ascend(build_shell_kernel("ascend"), "ascend", simd_parallel=False)
        vc.lower_ascend(build_shell_kernel("ascend", workers=8), "ascend")
        assert len(list(tmp_path.glob("*/ascend-lowered/*.json"))) == 3

    def test_a_corrupted_entry_is_lowered_again(self, monkeypatch, tmp_path):
        monkeypatch.setenv("VMI_CACHE_DIR", str(tmp_path))
        first = vc.lower_ascend(build_shell_kernel("ascend"), "ascend")
        (entry,) = tmp_path.glob("*/ascend-lowered/*.json")
        entry.write_text(entry.read_text()[:40])
        assert vc.lower_ascend(build_shell_kernel("ascend"), "ascend") == first
