"""A kernel that maps a 1-D fp32 tensor through lane functions of ``vmi_core.tl``, for the tests of
those functions: the functions of ``vmi_core.tl.elementary`` as the ops' kernels call them, on
scalar lanes (cpu: a vectorized C loop; ascend-sim: a SIMT region)."""

# No ``from __future__ import annotations``: TileLang reads the prim_func's annotations as values.

from dataclasses import dataclass

import pytest
import tilelang.language as T
import torch

from vmi_core.compile import cached_kernel, kernel_source
from vmi_core.tl import log1p as L
from vmi_core.tl.elementary import call
from vmi_core.tl.formats import f32_const
from vmi_core.tl.shell import SIMT, Shell
from vmi_core.tl.simd import select
from vmi_core.tools.source_checks import cpu_vectorized_loops, transcendental_calls


def exp_parts(x):
    """``vmi_exp``, then the fast path's value (-1.0 where undecided) and the flag of an undecided
    lane, then the exact evaluation."""
    fast = call("vmi_exp_fast_or_mark", x)
    return call("vmi_exp", x), fast, select(fast < f32_const(0.0), T.int32(1), T.int32(0)), call("vmi_exp_exact", x)


def log1p_parts(x):
    """``vmi_log1p``, then the parts H, M and L of the sum it rounds (the lane code inlined; meaningful
    for 2^-24 <= |x|, x > -1 finite)."""
    return (call("vmi_log1p", x), *L.log1p_parts(x))


PROBES = {"exp_parts": (exp_parts, ("float32", "float32", "int32", "float32")),
          "log1p": (log1p_parts, ("float32", "float32", "float32", "float32"))}


@dataclass(frozen=True)
class LaneMap:
    probe: str  # a key of PROBES
    n: int
    block: int = 1024


def _emit(stmt):
    if stmt is not None:
        T.evaluate(stmt)


def build_lane_map(spec: LaneMap, target: str):
    """``outs[k][i] = PROBES[spec.probe](X[i])[k]``."""
    probe, dtypes = PROBES[spec.probe]
    n, block = spec.n, spec.block
    sh = Shell(target)

    @T.prim_func
    def lane_map(X: T.Tensor((n,), "float32"), Y0: T.Tensor((n,), dtypes[0]), Y1: T.Tensor((n,), dtypes[1]),
                 Y2: T.Tensor((n,), dtypes[2]), Y3: T.Tensor((n,), dtypes[3])):
        with sh.kernel(n // block) as bx:
            x = sh.tile((block,), "float32")
            ys = [sh.tile((block,), d) for d in dtypes]
            _emit(sh.copy(X[bx * block], x))
            with sh.vector(SIMT):
                sh.elementwise((block,), lambda at: probe(at.load(x)), ys)
            _emit(sh.copy(ys[0], Y0[bx * block]))
            _emit(sh.copy(ys[1], Y1[bx * block]))
            _emit(sh.copy(ys[2], Y2[bx * block]))
            _emit(sh.copy(ys[3], Y3[bx * block]))

    return lane_map


def run_lane_map(probe: str, x: torch.Tensor, target: str) -> list[torch.Tensor]:
    """The probe's outputs for a 1-D fp32 ``x`` whose length is a multiple of 1024."""
    _, dtypes = PROBES[probe]
    kernel = cached_kernel(build_lane_map, LaneMap(probe, x.numel()), target, simd_parallel=False)
    outs = [torch.empty(x.shape, dtype=getattr(torch, d)) for d in dtypes]
    kernel(x.contiguous(), *outs)
    return outs


@dataclass(frozen=True)
class ExpTile:
    n: int
    block: int = 1024


def build_exp_tile(spec: ExpTile, target: str):
    """``Y = e^X`` through ``Shell.exp``, a ``(1, block)`` tile at a time."""
    rows, block = spec.n // spec.block, spec.block
    sh = Shell(target)

    @T.prim_func
    def exp_tile(X: T.Tensor((rows, block), "float32"), Y: T.Tensor((rows, block), "float32")):
        with sh.kernel(rows) as bx:
            x = sh.tile((1, block), "float32")
            y = sh.tile((1, block), "float32")
            _emit(sh.copy(X[bx, 0], x))
            sh.exp((1, block), x, y)
            _emit(sh.copy(y, Y[bx, 0]))

    return exp_tile


def run_exp_tile(x: torch.Tensor, target: str) -> torch.Tensor:
    """``Shell.exp`` of a 1-D fp32 ``x`` whose length is a multiple of 1024."""
    kernel = cached_kernel(build_exp_tile, ExpTile(x.numel()), target, simd_parallel=False)
    y = torch.empty_like(x)
    kernel(x.contiguous().view(-1, 1024), y.view(-1, 1024))
    return y


def exp_tile_cpu_loops() -> list[str] | None:
    """The loops GCC vectorizes in the cpu source of ``build_exp_tile`` (None without GCC)."""
    return cpu_vectorized_loops(kernel_source(build_exp_tile, ExpTile(1 << 16), "cpu", simd_parallel=False))


def assert_vectorized_without_transcendentals(probe: str) -> None:
    """No target's source of the probe calls an exp/log-family function, and GCC vectorizes its cpu
    element loop (skipped where GCC is not installed: its vectorizer report is the evidence)."""
    spec = LaneMap(probe, 1 << 16)
    sources = {t: kernel_source(build_lane_map, spec, t, simd_parallel=False) for t in ("cpu", "cuda", "ascend")}
    for target, src in sources.items():
        assert transcendental_calls(src) == [], target
    loops = cpu_vectorized_loops(sources["cpu"])
    if loops is None:
        pytest.skip("GCC is not installed: the vectorizer report that shows the cpu loop vectorizes is unavailable")
    assert any("i < 1024" in loop for loop in loops), loops  # the element loop


def every_binary32(chunk: int = 1 << 24):
    """Every binary32 value, in chunks of ``chunk`` consecutive bit patterns."""
    for start in range(-(1 << 31), 1 << 31, chunk):
        yield torch.arange(start, start + chunk, dtype=torch.int64).to(torch.int32).view(torch.float32)


# --- the oracle's own check ---------------------------------------------------------------------

def round_f32(v) -> float:
    """An mpmath value rounded to binary32, to nearest even, subnormals included (finite, nonzero)."""
    import mpmath

    e = int(mpmath.floor(mpmath.log(abs(v), 2)))
    quantum = mpmath.mpf(2) ** (max(e, -126) - 23)
    return float(mpmath.nint(v / quantum) * quantum)


def near_boundary(y64: torch.Tensor, distance: float = 2.0**-44) -> torch.Tensor:
    """Where a float64 result lies within ``distance`` (relative to ``max(|y64|, 2^-125)``) of a
    binary32 rounding boundary: where it might round to another binary32 than the exact value."""
    y32 = y64.float()
    away = torch.nextafter(y32, torch.where(y64 > y32.double(), torch.tensor(float("inf")),
                                            torch.tensor(-float("inf"))))
    middle = (y32.double() + away.double()) / 2
    return ((y64 - middle).abs() / y64.abs().clamp_min(2.0**-125) < distance) & torch.isfinite(y64) & (y64 != 0)


def misrounded(x: torch.Tensor, y64: torch.Tensor, exact) -> tuple[int, list[tuple[int, float]]]:
    """Settle every input whose float64 result ``y64`` is near a rounding boundary with ``exact``
    (an mpmath function, 200 bits): ``(how many were settled, [(x bits, correctly rounded value)]``
    for those the float64 result misrounds)."""
    import mpmath

    mpmath.mp.prec = 200
    wrong, suspects = [], near_boundary(y64).nonzero().flatten().tolist()
    for i in suspects:
        value = round_f32(exact(mpmath.mpf(float(x[i]))))
        if float(y64[i].float()) != value:
            wrong.append((int(x.view(torch.int32)[i]) & 0xFFFFFFFF, value))
    return len(suspects), wrong
