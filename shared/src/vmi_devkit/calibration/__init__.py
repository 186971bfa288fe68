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

from .. import sim_kernels as K
from . import references as R


@dataclass(frozen=True)
class Calibration:
    name: str
    kernel: str  # the kernel of vmi_devkit.sim_kernels it runs
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


def _on(target: str, *tensors: torch.Tensor):
    device = device_of(target)
    return [t.to(device) for t in tensors]


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.cpu().contiguous().view(torch.int32).numpy() if t.element_size() == 4 else t.cpu().numpy()


def _family(family: str, reference: Callable[..., dict]):
    def run(target: str):
        values = R.family_inputs(family)
        inputs = torch.from_numpy(np.stack([np.ascontiguousarray(v).view(np.int32) for v in values.values()]))
        got = K.run_family(family, *_on(target, inputs), target=target).cpu().numpy()
        expected = reference(values)
        names = K.family_ops(family)
        assert set(names) == set(expected), set(names) ^ set(expected)
        return {name: (got[:, n], np.broadcast_to(np.asarray(expected[name]).view(np.int32), (K.ROWS, K.LANES)))
                for n, name in enumerate(names)}
    return run


def _memory(target: str):
    image, sentinel = R.memory_inputs()
    loads, outs = K.run_memory(*_on(target, torch.from_numpy(image), torch.from_numpy(sentinel)), target=target)
    expected_loads, expected_outs = R.memory_reference(image, sentinel)
    results = {name: (got, want) for name, got, want in zip(K.LOAD_ROWS, loads.cpu().numpy(), expected_loads,
                                                             strict=True)}
    for kind, got, want in zip(("store_o8", "store_o16", "store_o32"), outs, expected_outs, strict=True):
        results[kind] = (got.cpu().numpy().view(np.uint8).reshape(K.STORE_ROWS, 256), want)
    return results


def _gather(target: str):
    values = R.gather_inputs()
    got, o32, o16 = K.run_gather(*_on(target, *values.values()), target=target)
    expected, e32, e16 = R.gather_reference(values)
    results = {name: (g, e) for name, g, e in zip(K.GATHER_OUT_ROWS, got.cpu().numpy(), expected, strict=True)}
    results.update(scatter_o32=(o32.cpu().numpy(), e32), scatter_o16=(o16.cpu().numpy(), e16))
    return results


def _simt(target: str):
    x, i = R.simt_inputs()
    got = K.run_simt_arith(*_on(target, torch.from_numpy(x), torch.from_numpy(i)), target=target).cpu().numpy()
    expected = R.simt_reference(x, i)
    results = {}
    for k, name in enumerate(K.SIMT_OPS):
        row = got[k]
        if not name.startswith("int_"):  # any NaN counts as the reference's NaN
            row = R.canonical(row.view(np.float32)).view(np.int32)
        results[name] = (row, expected[name])
    return results


def _dma(target: str):
    x = R.dma_inputs()
    got = K.run_dma_rounding(*_on(target, torch.from_numpy(x.view(np.float32))), target=target)
    return {"rounding_bytes": (_bits(got), R.dma_reference(x).view(np.int32))}


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
    got = K.cube_gemm(*_on(target, a, b), target=target)
    return {"gemm": (_bits(got), _bits(K.cube_gemm_reference(a, b)))}


CALIBRATIONS = {c.name: c for c in (
    Calibration("vector-float", "vector_family float", (
        "vector float arithmetic", "TileLang's default `vdiv`", "vector `sqrt`", "vector NaN results",
        "vector `max`/`min` with NaN", "vector `abs`/`neg` (f32)", "reductions", "predicate bits"),
        _family("float", lambda v: R.float_reference(v["a"], v["b"]))),
    Calibration("vector-int", "vector_family int", ("integer overflow", "predicate bits", "reductions"),
                _family("int", lambda v: R.int_reference(v["i"], v["j"], v["s"], np.arange(K.ROWS)))),
    Calibration("vector-convert", "vector_family convert", ("`vcvt`", "vector NaN results"),
                _family("convert", lambda v: R.convert_reference(v["a"], v["i"], v["h"]))),
    Calibration("vector-rearrange", "vector_family rearrange",
                ("interleave, de-interleave", "register gather (`vselr`)"),
                _family("rearrange", lambda v: R.rearrange_reference(v["a"], v["b"], v["idx"]))),
    Calibration("vector-memory", "vector_memory", ("vector load/store addresses", "predicate bytes in UB"), _memory),
    Calibration("vector-gather", "vector_gather", ("gathers and scatters of UB",), _gather),
    Calibration("simt", "simt_arith", ("SIMT float arithmetic", "SIMT `fabsf`, ...", "integer overflow"), _simt),
    Calibration("dma", "dma_rounding", ("DMA UB rounding bytes", "DMA strides"), _dma),
    Calibration("cube", "cube_gemm", ("Mmad order", "L0A/L0B layout", "L0C layout", "`asc_set_gm2l1_nz_para`"),
                _cube),
)}


def _first_difference(got: np.ndarray, expected: np.ndarray) -> str | None:
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape:
        return f"shape {got.shape} != {expected.shape}"
    bad = np.argwhere(got != expected)
    if not len(bad):
        return None
    at = tuple(int(i) for i in bad[0])
    width = 2 * got.dtype.itemsize
    mask = (1 << (8 * got.dtype.itemsize)) - 1
    return (f"{len(bad)} of {got.size} elements differ; first at {list(at)}: "
            f"{int(got[at]) & mask:#0{width + 2}x}, expected {int(expected[at]) & mask:#0{width + 2}x}")


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
