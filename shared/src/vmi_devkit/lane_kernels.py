"""A kernel that maps a 1-D fp32 tensor through lane functions of ``vmi_core.tl``, for the tests of
those functions: cpu runs them as scalar lanes in a vectorized C loop, ascend-sim as 64-lane vector
registers in a SIMD region (what the ops' Ascend kernels run)."""

# No ``from __future__ import annotations``: TileLang reads the prim_func's annotations as values.

from dataclasses import dataclass

import tilelang.language as T
import torch

from vmi_core.compile import cached_kernel
from vmi_core.tl import exp as E
from vmi_core.tl.shell import SIMD, Shell
from vmi_core.tl.simd import select


def exp_parts(x):
    """``exp``, then the fast path's value and hard flag, then the exact evaluation."""
    fast, hard = E.exp_with_flag(x)
    return E.exp(x), fast, select(hard, T.int32(1), T.int32(0)), E.exp_exact(x)


PROBES = {"exp_parts": (exp_parts, ("float32", "float32", "int32", "float32"))}


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
            with sh.vector(SIMD):
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
