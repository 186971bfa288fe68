"""ascend-sim's SIMD vector unit: kernels written with explicit ``T.simd`` code, run on the model
and compared bit for bit with references written from the documented semantics and the model's
stated assumptions (``vmi_devkit.calibration.references``; vmi-core README, "ascend-sim
assumptions").

The instruction-family kernels are the calibration kernels an NPU run compares with the same
references (``vmi_devkit.calibration``): here every calibration must agree with the model. The
negative controls break the emitted source one rule at a time and show that the model reports
each break, as an error or as wrong data.
"""

import functools
import re

import numpy as np
import pytest
import torch

from vmi_core.ascend_sim import AscendSimError, SimKernel, last_launch_stats, launch_shape
from vmi_core.compile import cache_dir, lower_artifact
from vmi_core.tl.shell import SIMT_THREADS
from vmi_core.tools.testing import SIM_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.calibration import CALIBRATIONS, calibrate
from vmi_devkit.calibration.references import (
    FAR,
    NAN32,
    canonical,
    encode,
    family_inputs,
    flush,
    gather_inputs,
    precise_div,
    value_of_f32,
)
from vmi_devkit.sim_kernels import (
    COUNTED_CORES,
    COUNTED_ROWS,
    E4M3_MAX,
    GATHER_OUT_ROWS,
    GROUP,
    LANES,
    ROWS,
    SF_CLAMP,
    build_family,
    build_gather,
    build_token_cast,
    counted_kernel,
    family_ops,
    run_gather,
    token_cast,
)

BLOCK_M = 16


def test_reference_encoder_agrees_with_torch_casts():
    """The exact encoder above rounds to nearest even as torch's casts do (finite, in range)."""
    x = (torch.randn(4096, generator=generator(11)) * torch.exp(torch.randn(4096, generator=generator(12)) * 4))
    x = torch.cat([x, torch.tensor([0.0, -0.0, 1e-40, 448.0, 464.0, 465.0, 0.001953125, 0.0009765625])])
    for fmt, dtype, limit in (("bf16", torch.bfloat16, 3e38), ("f16", torch.float16, 65504.0),
                              ("e4m3", torch.float8_e4m3fn, 448.0), ("e5m2", torch.float8_e5m2, 57344.0)):
        finite = x[x.abs() <= limit]
        expected = finite.to(dtype).view(torch.uint8 if dtype.itemsize == 1 else torch.int16).numpy().astype(np.int64)
        expected &= (1 << (8 * dtype.itemsize)) - 1
        got = [encode(value_of_f32(v), fmt) for v in finite.numpy()]
        assert got == expected.tolist(), fmt


# ---- per-token cast --------------------------------------------------------------------------------

def token_cast_reference(x: torch.Tensor, patch_nan: bool = True):
    """Codes and scales of ``build_token_cast``: amax of |x| bit patterns per 32 channels (NaN above
    inf), clamped, scale = c / 448 and its inverse 448 / c (correctly rounded), codes = e4m3 of x times
    the inverse, rounded to nearest even and saturating; NaN -> 0x7F | sign, or 0 unpatched."""
    m, k = x.shape
    groups = -(-k // GROUP)
    xf = x.float()
    a = torch.zeros(m, groups * GROUP, dtype=torch.int64)
    a[:, :k] = xf.view(torch.int32).to(torch.int64) & 0x7FFFFFFF
    amax = a.view(m, groups, GROUP).amax(-1).to(torch.int32).view(torch.float32)
    clamped = torch.where(amax.isnan(), amax, amax.clamp_min(SF_CLAMP)).numpy()
    # numpy divides exactly; torch's scalar / tensor multiplies by a reciprocal (448 / 96 is one ulp off)
    sf = torch.from_numpy(clamped / np.float32(E4M3_MAX))
    inv = torch.from_numpy(np.float32(E4M3_MAX) / clamped)
    y = xf * inv.repeat_interleave(GROUP, dim=1)[:, :k]
    nan = torch.tensor(NAN32, dtype=torch.int32).view(torch.float32)
    sf = torch.where(sf.isnan(), nan, sf)
    y = torch.where(y.isnan(), nan, y)
    codes = y.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    nan_code = (0x7F | (y.view(torch.int32) >> 24) & 0x80).to(torch.uint8) if patch_nan else torch.zeros_like(codes)
    return torch.where(y.isnan(), nan_code, codes), sf


def _token_inputs(m: int, k: int, seed: int) -> torch.Tensor:
    g = generator(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g) * 3)
    if m > 8 and k > 70:
        x[5, 5], x[6, 40], x[7, 64:66], x[3, 3], x[4, 0:32] = float("inf"), -float("inf"), float("nan"), 1e-30, 0.0
    return x.to(torch.bfloat16)


# One row with a tail; a partial tile; more tiles than the 64 cores (every core wraps around its
# two buffer versions), with a K tail in the last column of tiles.
TOKEN_SHAPES = [(1, 5), (33, 600), (2 * 64 * BLOCK_M + 5, 300)]


@pytest.mark.parametrize("schedule", SIM_SCHEDULES)
def test_token_cast_matches_torch_under_every_schedule(schedule):
    for seed, (m, k) in enumerate(TOKEN_SHAPES):
        x = _token_inputs(m, k, seed)
        with sim_schedule(schedule):
            q, sf = token_cast(x, BLOCK_M, True)
        codes, scales = token_cast_reference(x)
        assert_bitwise_equal(q, codes, f"codes m={m} k={k} schedule={schedule}")
        assert_bitwise_equal(sf, scales, f"scales m={m} k={k} schedule={schedule}")


@pytest.mark.slow
def test_token_cast_without_the_nan_patch_differs_exactly_on_nan():
    """Saturating vcvt writes 0 for NaN (documented): without the kernel's patch, only those codes differ."""
    x = _token_inputs(33, 600, 5)
    q, _ = token_cast(x, BLOCK_M, False)
    assert_bitwise_equal(q, token_cast_reference(x, patch_nan=False)[0])
    patched = token_cast_reference(x)[0]
    differs = q != patched
    assert differs.any() and bool((q[differs] == 0).all()) and bool((patched[differs] & 0x7F == 0x7F).all())



@pytest.mark.parametrize("name", list(CALIBRATIONS))
def test_calibration_agrees_with_the_model(name):
    """Every calibration kernel (the instruction families, SIMT arithmetic, DMA rounding bytes, the
    Cube GEMM) gives on ascend-sim exactly what its reference says."""
    result = calibrate(name, "ascend-sim")
    assert result.error is None, result.error
    assert not result.disagreements, "\n".join(f"{k}: {v}" for k, v in result.disagreements.items())


def test_fast_math_division_is_the_division_unit():
    """With tl.enable_fast_math TileLang emits the bare instruction: flushed operands and result,
    correctly rounded (the wrapper's residual test no longer applies)."""
    import tilelang
    from tilelang.ascend.target import _make_ascend_target

    from vmi_devkit.sim_kernels import build_family

    func = build_family("float", "ascend")
    with _make_ascend_target(), tilelang.transform.PassContext(config={"tl.enable_fast_math": True}):
        artifact = tilelang.lower(func, target=_make_ascend_target())
    assert "simd_inst::vdiv(" in artifact.kernel_source and "vdiv_0ulp" not in artifact.kernel_source
    values = family_inputs("float")
    inputs = torch.from_numpy(np.stack([v.view(np.int32) for v in values.values()]))
    out = torch.empty((ROWS, len(family_ops("float")), LANES), dtype=torch.int32)
    cores, ub = launch_shape(artifact.device_mod)
    SimKernel(func, artifact.kernel_source, cores, ub, cache_dir() / "ascend-sim")(inputs, out)
    a, b = values["a"], values["b"]
    with np.errstate(all="ignore"):
        expected = canonical(flush(flush(a) / flush(b))).view(np.int32)
    assert np.array_equal(out.numpy()[:, family_ops("float").index("div")], expected)
    assert not np.array_equal(expected, precise_div(a, b).view(np.int32))  # the inputs tell the two apart

def _with(values: dict, name: str, edit) -> dict:
    changed = values[name].clone()
    edit(changed)
    return {**values, name: changed}


# name -> (inputs of the gather kernel, the error); the kernel as emitted
GATHER_ERRORS = {
    "gather index past the UB allocation": (
        lambda v: _with(v, "I32", lambda t: t.__setitem__((1, 9), FAR)),
        r"asc_gather \(vector gather at UB byte \d+\): UB bytes \[\d+, \d+\) outside the kernel's UB allocation"),
    "scatter index past the UB allocation": (
        lambda v: _with(v, "S16", lambda t: t.__setitem__(5, 0xFFFF)),
        r"asc_scatter \(vector scatter at UB byte \d+\): UB bytes \[\d+, \d+\) outside the kernel's UB allocation"),
    "a scatter index repeated on active lanes": (
        lambda v: _with(v, "S32", lambda t: t.__setitem__(3, t[0])),
        r"asc_scatter \(vector scatter at UB byte \d+\): two active lanes have the index \d+"),
}


@pytest.mark.parametrize("case", GATHER_ERRORS)
def test_gather_and_scatter_errors_are_reported(case):
    inputs, error = GATHER_ERRORS[case]
    with pytest.raises(AscendSimError, match=error):
        run_gather(*inputs(gather_inputs()).values())
    assert last_launch_stats() is None  # a failed launch leaves no statistics


# ---- launch statistics -----------------------------------------------------------------------------

def test_launch_statistics_count_the_kernel_by_hand():
    """``counted``: per core one DMA in and out of its rows; a vector function of one predicate,
    then per row a load, an add of a scalar read from UB and a store, and one mem_bar; a SIMT
    region of one element per thread (two UB reads and a write); three scalar UB accesses."""
    x = torch.randn(COUNTED_CORES * COUNTED_ROWS, LANES, generator=generator(21))
    kernel = counted_kernel()
    rows, cores, row_bytes = COUNTED_ROWS, COUNTED_CORES, LANES * 4
    expected = {
        "cores": cores, "simd_regions": cores, "simt_regions": cores, "simt_threads": cores * SIMT_THREADS,
        "vector_instructions": cores * (1 + 3 * rows), "vector_loads": cores * rows, "vector_stores": cores * rows,
        "mem_bars": cores, "scalar_ub_accesses": cores * 3, "simt_ub_accesses": cores * SIMT_THREADS * 3,
        "simd_scalar_ub_accesses": cores * rows, "dma_gm_to_ub_bytes": cores * rows * row_bytes,
        "dma_ub_to_gm_bytes": cores * rows * row_bytes,
    }
    for schedule in ("seq", "random"):  # counted anew at every launch, whatever the order of the pipes
        y = torch.empty_like(x)
        with sim_schedule(schedule):
            kernel(x, y)
        assert kernel.last_stats == expected
        assert last_launch_stats() == expected
    want = (x + x[:, 1:2]) * x[:, 0:1]
    want[1::rows, -1] = x[0::rows, 5] + x[1::rows, 7]
    assert_bitwise_equal(y, want)


# ---- negative controls -----------------------------------------------------------------------------

@functools.cache
def _token_cast_artifact():
    return lower_artifact(build_token_cast((BLOCK_M, True), "ascend"), "ascend", simd_parallel=False)


def _token_cast_kernel(source: str) -> SimKernel:
    cores, ub = launch_shape(_token_cast_artifact().device_mod)
    return SimKernel(build_token_cast((BLOCK_M, True), "ascend"), source, cores, ub, cache_dir() / "ascend-sim")


def _replace(source: str, old: str, new: str, count: int = 1) -> str:
    assert source.count(old) == count, f"expected {count} of {old!r} in the source"
    return source.replace(old, new)


UNPACK_LOAD = "(r * 256)) + (c * 64))])), 0), v_1"
SF_STORE = "((u * 64) + 6272)"
INV_STORE = "((u * 64) + 6400)"
CODE_STORE = "(((((x_version_counter_1 & 1) * 4096) + (r_1 * 256)) + (c_1 * 64)) + 16384)"

FIRST_BARRIER = "  simd_inst::mem_bar(VST_VLD);\n  for (int32_t u = 0;"
LOAD_WAIT = "      asc_sync_wait(PIPE_MTE2, PIPE_V, static_cast<event_t>((x_version_counter_1 & 1)));\n"

# name -> (how the emitted source is broken, the error the model reports or None for wrong data)
MUTATIONS = {
    "vcmax ignores its group mask": (
        lambda s: _replace(s, "simd_inst::vcmax(a_1, low,", "simd_inst::vcmax(a_1, every,"), None),
    "lanes past K not masked": (lambda s: _replace(s, "simd_inst::vcmax(a_1,", "simd_inst::vcmax(a,", 2), None),
    "inverse scales stored over the scales": (lambda s: _replace(s, INV_STORE, SF_STORE), None),
    "no mem_bar between the amax stores and their loads": (
        lambda s: _replace(s, FIRST_BARRIER, "  for (int32_t u = 0;"),
        r"reads UB byte \d+, which a vector store wrote with no asc_mem_bar\(VST_VLD\) in between"),
    "misaligned unpacking load": (
        lambda s: _replace(s, UNPACK_LOAD, "(r * 256)) + (c * 64) + 1)])), 0), v_1"),
        r"asc_loadalign_unpack \(vector load at UB byte \d+\): UB byte offset \d+ is not 32-byte aligned"),
    "misaligned store": (
        lambda s: _replace(s, SF_STORE, "((u * 64) + 6273)"),
        r"asc_storealign \(vector store at UB byte \d+\): UB byte offset \d+ is not 32-byte aligned"),
    "store running past the UB allocation": (
        lambda s: _replace(s, CODE_STORE, f"({launch_shape(_token_cast_artifact().device_mod)[1]} - 32)"),
        r"asc_storealign_pack_quarter \(vector store at UB byte \d+\): UB bytes \[\d+, \d+\) outside the "
        r"kernel's UB allocation"),
    # read-after-write between the DMA and the vector function: the V pipe may run it first
    "no wait for the load before the vector function": (lambda s: _replace(s, LOAD_WAIT, ""), None),
}


def _cases(table: dict, slow: set) -> list:
    """Parameters for ``table``'s keys; those in ``slow`` (more of a kind the fast ones cover) are slow."""
    assert slow <= set(table)
    return [pytest.param(name, marks=pytest.mark.slow) if name in slow else name for name in table]


@pytest.mark.parametrize("mutation", _cases(MUTATIONS, {"inverse scales stored over the scales", "misaligned store",
                                                        "no wait for the load before the vector function"}))
def test_negative_controls_are_reported(mutation):
    mutate, error = MUTATIONS[mutation]
    source = _token_cast_artifact().kernel_source
    broken = mutate(source)
    assert broken != source
    kernel = _token_cast_kernel(broken)
    x = _token_inputs(*TOKEN_SHAPES[2], seed=9)
    codes, scales = token_cast_reference(x)
    for schedule in SIM_SCHEDULES:
        q = torch.full(codes.shape, 0xAA, dtype=torch.uint8)
        sf = torch.full(scales.shape, float("nan"))
        with sim_schedule(schedule):
            try:
                kernel(x, q, sf)
            except AscendSimError as e:
                assert "token_cast_kernel" in str(e) and "core" in str(e)
                if error is not None:
                    assert re.search(error, str(e)), str(e)
                continue
        assert error is None, f"{mutation!r} ran without the error under {schedule}"
        assert not (torch.equal(q, codes) and torch.equal(sf.view(torch.int32), scales.view(torch.int32))), \
            f"{mutation!r} went unnoticed under {schedule}"


# Instructions and modes the model leaves out must not compile.
UNMODELLED = {
    "vln (not modelled)": ("auto y = simd_inst::vmul(v_4, scale, v, MODE_ZEROING);",
                           "auto y = simd_inst::vln(simd_inst::vmul(v_4, scale, v, MODE_ZEROING), v, MODE_ZEROING);",
                           "asc_ln"),
    "predicate interleave": ("auto high = simd_inst::pnot(low, every);",
                             "auto high = simd_inst::pintlv_b32(low, every).v0;",
                             "asc_intlv_b32 is not modelled by ascend-sim"),
    "a rounding mode e4m3 does not take": ("ROUND_R, RS_ENABLE, PART_P0", "ROUND_A, RS_ENABLE, PART_P0",
                                           "rounding mode not available for the pair"),
    # The arch-3510 API takes a signed register of shift amounts.
    "a shift by a register of unsigned amounts": (
        "simd_inst::vshrs((*(vector_s32 *)(&(y))), 24, v, MODE_ZEROING)",
        "simd_inst::vshr((*(vector_s32 *)(&(y))), simd_inst::vdup<uint32_t>(24, v, MODE_ZEROING), v, MODE_ZEROING)",
        "could not convert"),
}
# The same for instructions of the rearrange and gather kernels: a broadcast of the highest lane (no
# C API), a UB gather of bytes (b8 elements widened to b16 lanes).
UNMODELLED_ELSEWHERE = {
    "vdupv of the highest lane": ("rearrange", "POS_LOWEST", "POS_HIGHEST", "asc_duplicate_highest is not modelled"),
    "a gather of bytes": ("gather", "vgather2((&(((__ubuf__ uint16_t*)buf_dyn_shmem)[",
                          "vgather2((&(((__ubuf__ uint8_t*)buf_dyn_shmem)[", "no matching function for call to"),
}


@pytest.mark.parametrize("case", _cases(UNMODELLED, {"vln (not modelled)"}))
def test_unmodelled_instructions_do_not_compile(case):
    old, new, message = UNMODELLED[case]
    with pytest.raises(AscendSimError, match="does not compile against the model") as error:
        _token_cast_kernel(_replace(_token_cast_artifact().kernel_source, old, new))
    assert message in str(error.value)


@pytest.mark.parametrize("case", _cases(UNMODELLED_ELSEWHERE, {"a gather of bytes"}))
def test_unmodelled_rearrangements_do_not_compile(case):
    kernel, old, new, message = UNMODELLED_ELSEWHERE[case]
    func = build_family("rearrange", "ascend") if kernel == "rearrange" else build_gather(None, "ascend")
    source = lower_artifact(func, "ascend", simd_parallel=False).kernel_source
    broken = source.replace(old, new, 1)
    assert broken != source
    with pytest.raises(AscendSimError, match="does not compile against the model") as error:
        SimKernel(func, broken, 1, 0, cache_dir() / "ascend-sim")
    assert message in str(error.value)


@functools.cache
def _gather_artifact():
    return lower_artifact(build_gather(None, "ascend"), "ascend", simd_parallel=False)


GATHER_BASE32 = "vgather2((&(((__ubuf__ uint32_t*)buf_dyn_shmem)[{}])), simd_inst::vlds_norm<uint32_t>("
SCATTER_BASE32 = "(__ubuf__ uint32_t*)(&(((__ubuf__ uint32_t*)buf_dyn_shmem)[{}])), simd_inst::vlds_norm<uint32_t>("


def _shift_base(source: str, form: str) -> str:
    """The first base of ``form`` in ``source`` one element (4 bytes) further."""
    offset = re.search(re.escape(form).replace(r"\{\}", r"(\d+)"), source).group(1)
    return _replace(source, form.format(offset), form.format(int(offset) + 1))


GATHER_MUTATIONS = {
    "misaligned gather base": (
        lambda s: _shift_base(s, GATHER_BASE32),
        r"asc_gather \(vector gather base at UB byte \d+\): UB byte offset \d+ is not 32-byte aligned"),
    "misaligned scatter base": (
        lambda s: _shift_base(s, SCATTER_BASE32),
        r"asc_scatter \(vector scatter base at UB byte \d+\): UB byte offset \d+ is not 32-byte aligned"),
    "no mem_bar between the scatter and the gather reading it back": (
        lambda s: _replace(s, "simd_inst::mem_bar(VST_VLD);", ""),
        r"asc_gather \(vector gather at UB byte \d+\): reads UB byte \d+, which a vector store wrote with no "
        r"asc_mem_bar\(VST_VLD\) in between"),
}


@pytest.mark.parametrize("mutation", _cases(GATHER_MUTATIONS, {"misaligned scatter base"}))
def test_gather_negative_controls_are_reported(mutation):
    mutate, error = GATHER_MUTATIONS[mutation]
    artifact = _gather_artifact()
    cores, ub = launch_shape(artifact.device_mod)
    kernel = SimKernel(build_gather(None, "ascend"), mutate(artifact.kernel_source), cores, ub,
                       cache_dir() / "ascend-sim")
    values = gather_inputs()
    outs = (torch.empty((len(GATHER_OUT_ROWS), LANES), dtype=torch.int32), torch.empty_like(values["Z32"]),
            torch.empty_like(values["Z16"]))
    with pytest.raises(AscendSimError, match=error):
        kernel(*values.values(), *outs)
