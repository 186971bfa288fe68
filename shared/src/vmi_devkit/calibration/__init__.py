"""Calibration kernels: each settles rows of the ascend-sim assumption table (vmi-core README) on an NPU.

A calibration runs one small kernel (``vmi_devkit.sim_kernels``) on a target and compares every
result, bit for bit, with ``references``: what the documentation says the instructions compute,
and where it is silent, what the model assumes. On ``ascend`` (an Ascend 950) a disagreement is the
hardware settling a row against the model; on ``ascend-sim`` every calibration agrees (vmi-core's
tests hold the model to that), so ``scripts/npu-check --target ascend-sim`` reports the model's
answers. Each calibration names the table rows it settles by their topic.

    calibrate(name, target) -> Result
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from vmi_core.targets import device_of
from vmi_core.tools.devicecheck import to_device
from vmi_core.tools.testing import bitwise_mismatches

from .. import sim_kernels
from . import references


@dataclass(frozen=True)
class Calibration:
    name: str
    rows: tuple[str, ...]  # topics of the assumption table it settles
    run: Callable[[str], dict[str, tuple[np.ndarray, np.ndarray]]]  # target -> {result: (got, expected)}


@dataclass
class Result:
    name: str
    target: str
    rows: tuple[str, ...]
    checked: list[str] = field(default_factory=list)  # the results compared
    disagreements: dict[str, str] = field(default_factory=dict)  # result -> the first differing element
    error: str | None = None  # the kernel did not compile or run: the first and last lines of why
    traceback: str | None = None

    @property
    def agrees(self) -> bool:
        return self.error is None and not self.disagreements


def _on(target: str, *tensors: torch.Tensor) -> list:
    return to_device(list(tensors), device_of(target))


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.cpu().contiguous().view(torch.int32).numpy() if t.element_size() == 4 else t.cpu().numpy()


def _family(family: str, reference: Callable[..., dict]):
    def run(target: str):
        values = references.family_inputs(family)
        inputs = torch.from_numpy(np.stack([np.ascontiguousarray(v).view(np.int32) for v in values.values()]))
        got = sim_kernels.run_family(family, *_on(target, inputs), target=target).cpu().numpy()
        expected = reference(values)
        names = sim_kernels.family_ops(family)
        assert set(names) == set(expected), set(names) ^ set(expected)
        shape = (sim_kernels.ROWS, sim_kernels.LANES)
        return {name: (got[:, n], np.broadcast_to(np.asarray(expected[name]).view(np.int32), shape))
                for n, name in enumerate(names)}
    return run


def _memory(target: str):
    image, sentinel = references.memory_inputs()
    loads, outs = sim_kernels.run_memory(*_on(target, torch.from_numpy(image), torch.from_numpy(sentinel)),
                                         target=target)
    expected_loads, expected_outs = references.memory_reference(image, sentinel)
    results = {name: (got, want) for name, got, want in zip(sim_kernels.LOAD_ROWS, loads.cpu().numpy(), expected_loads,
                                                             strict=True)}
    for kind, got, want in zip(("store_o8", "store_o16", "store_o32"), outs, expected_outs, strict=True):
        results[kind] = (got.cpu().numpy().view(np.uint8).reshape(sim_kernels.STORE_ROWS, 256), want)
    return results


def _gather(target: str):
    values = references.gather_inputs()
    got, o32, o16 = sim_kernels.run_gather(*_on(target, *values.values()), target=target)
    expected, e32, e16 = references.gather_reference(values)
    results = {name: (g, e) for name, g, e in zip(sim_kernels.GATHER_OUT_ROWS, got.cpu().numpy(), expected,
                                                   strict=True)}
    results.update(scatter_o32=(o32.cpu().numpy(), e32), scatter_o16=(o16.cpu().numpy(), e16))
    return results


def _simt(target: str):
    x, i = references.simt_inputs()
    got = sim_kernels.run_simt_arith(*_on(target, torch.from_numpy(x), torch.from_numpy(i)), target=target)
    got = got.cpu().numpy()
    expected = references.simt_reference(x, i)
    results = {}
    for k, name in enumerate(sim_kernels.SIMT_OPS):
        row = got[k]
        if not name.startswith("int_"):  # any NaN counts as the reference's NaN
            row = references.canonical(row.view(np.float32)).view(np.int32)
        results[name] = (row, expected[name])
    return results


def _dma(target: str):
    x = references.dma_inputs()
    got = sim_kernels.run_dma_rounding(*_on(target, torch.from_numpy(x.view(np.float32))), target=target)
    return {"rounding_bytes": (_bits(got), references.dma_reference(x).view(np.int32))}


CUBE_SHAPE = (48, 32, 96)  # m, n, k: 3, 2 and 6 fractals, all different


def cube_operands(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Random bf16 operands; row 0 of A against column 0 of B adds 2^24, then 1 and 1, then -2^24 ...:
    k-ascending fp32 sums give 0 there, a wider or reordered accumulation does not."""
    m, n, k = CUBE_SHAPE
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    a[0], b[0] = 1.0, 0.0
    b[0, :4] = torch.tensor([2.0**24, 1.0, 1.0, -(2.0**24)])
    return a.bfloat16(), b.bfloat16()


def _cube(target: str):
    a, b = cube_operands()
    got = sim_kernels.cube_gemm(*_on(target, a, b), target=target)
    return {"gemm": (_bits(got), _bits(sim_kernels.cube_gemm_reference(a, b)))}


CALIBRATIONS = {c.name: c for c in (
    Calibration("vector-float", (
        "vector float arithmetic", "TileLang's default `vdiv`", "vector `sqrt`", "vector NaN results",
        "vector `max`/`min` with NaN", "vector `abs`/`neg` (f32)", "reductions", "predicate bits"),
        _family("float", lambda v: references.float_reference(v["a"], v["b"]))),
    Calibration("vector-int", ("integer overflow", "predicate bits", "reductions"),
                _family("int", lambda v: references.int_reference(v["i"], v["j"], v["s"],
                                                                  np.arange(sim_kernels.ROWS)))),
    Calibration("vector-convert", ("`vcvt`", "vector NaN results"),
                _family("convert", lambda v: references.convert_reference(v["a"], v["i"], v["h"]))),
    Calibration("vector-rearrange", ("interleave, de-interleave", "register gather (`vselr`)"),
                _family("rearrange", lambda v: references.rearrange_reference(v["a"], v["b"], v["idx"]))),
    Calibration("vector-memory", ("vector load/store addresses", "predicate bytes in UB"), _memory),
    Calibration("vector-gather", ("gathers and scatters of UB",), _gather),
    Calibration("simt", ("SIMT float arithmetic", "SIMT `fabsf`, ...", "integer overflow"), _simt),
    Calibration("dma", ("DMA UB rounding bytes", "DMA strides"), _dma),
    Calibration("cube", ("Mmad order", "L0A/L0B layout", "L0C layout", "`asc_set_gm2l1_nz_para`"),
                _cube),
)}


def _first_difference(got: np.ndarray, expected: np.ndarray) -> str | None:
    got, expected = (torch.from_numpy(np.ascontiguousarray(a)) for a in (got, expected))
    if got.shape != expected.shape:
        return f"shape {tuple(got.shape)} != {tuple(expected.shape)}"
    first = bitwise_mismatches(got, expected, limit=1)
    if not first:
        return None
    return f"{int((got != expected).sum())} of {got.numel()} elements differ; first {first[0].strip()}"


def calibrate(name: str, target: str) -> Result:
    """``CALIBRATIONS[name]`` on ``target``: every result compared; a kernel that fails is an error."""
    calibration = CALIBRATIONS[name]
    result = Result(name, target, calibration.rows)
    try:
        results = calibration.run(target)
    except Exception as error:  # noqa: BLE001 (a kernel the target rejects is a finding, not a crash)
        lines = [line for line in "".join(traceback.format_exception_only(error)).splitlines() if line.strip()]
        result.error = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
        result.traceback = traceback.format_exc()[-4000:]
        return result
    for what, (got, expected) in results.items():
        result.checked.append(what)
        difference = _first_difference(got, expected)
        if difference:
            result.disagreements[what] = difference
    return result
