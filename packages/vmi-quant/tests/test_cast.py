"""cast on the cpu and ascend-sim targets, bit for bit against the torch reference (and torch's own casts).

One kernel per format pair (9) and per stochastic-rounding pair (3); the element
count is a runtime value, so every size below reuses them. ascend-sim (the AscendC the
``ascend`` target emits, on vmi-core's model of the vector core) runs every kernel too
(each lowers in about a second), each size under another pipe schedule and the 193-tile one
under both consumers_first and producers_first; of the same-format casts (DMA only) just the
E4M3 one by default, the others under ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.formats import f32_from_bits
from vmi_core.plan import invalidate
from vmi_core.stochastic import random16, stochastic_round
from vmi_core.tools.testing import (
    REUSE_SCHEDULES,
    SIM_SCHEDULES,
    assert_bitwise_equal,
    generator,
    randn,
    randn_with_ties,
    sim_schedule,
    with_extremes,
)
from vmi_devkit.cases.cast_cases import CAST_PAIRS, DTYPES, SR_PAIRS
from vmi_quant.kernels import cast as kernels
from vmi_quant.kernels.cast import BLOCK, CastSpec, quad_base
from vmi_quant.ops.cast import cast, cast_parallel
from vmi_quant.reference.elementwise import cast as reference_cast

# Empty, a 0-d tensor, one element, one quad, a partial tile, a partial tile after 16 full ones, a 3-D
# shape, and enough elements for the cpu launcher to split the work over threads.
SIZES = [(0,), (), (1,), (4,), (1000,), (2**16 + 4,), (3, 5, 68), (2**18 + 12,)]
# ascend-sim (64 cores, 2 buffer versions): also 193 tiles, so every core runs 3 or 4 (the
# sizes above run 1 tile with 63 idle cores, partial tiles, 17 and 65 tiles). Only there do
# cores reuse a buffer version, so it runs under both schedules that expose a missing wait
# (consumers first: read-after-write; producers first: write-after-read).
SIM_WIDE_SIZE = (192 * BLOCK + 12,)
SIM_SIZES = [*SIZES, SIM_WIDE_SIZE]

# fp32 bit patterns every cast must get right: NaNs (quiet, signalling, negative, with
# payload), infinities, signed zeros, fp32 subnormals, E4M3 saturation and its midpoint
# 464, E4M3 subnormals and ties, the largest finite fp32, bf16 ties.
SPECIAL_BITS = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA12345, 0x7F800000, 0xFF800000, 0x00000000, 0x80000000,
                0x00000001, 0x807FFFFF, 0x43E00000, 0xC3E80000, 0x43E80000, 0x43E7FFFF, 0x44000000, 0x3B000000,
                0x3A800000, 0xBAC00000, 0x3AA00000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F808000, 0x3F818000, 0xBF80C000]


def _inputs(shape, fmt: str, seed: int) -> torch.Tensor:
    """Random values in ``fmt`` over the whole range with every special case mixed in."""
    n = torch.Size(shape).numel()
    g = generator(seed)
    if fmt == "e4m3":
        # Every code, the NaNs 0x7F/0xFF included.
        return torch.randint(256, (n,), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(shape)
    x = randn_with_ties((n,), seed) * torch.exp2(torch.randint(-12, 10, (n,), generator=g).float())
    if n:
        x = with_extremes(x, seed)
        ties = torch.rand(n, generator=g) < 0.125
        x = torch.where(ties, f32_from_bits(torch.bitwise_or(x.view(torch.int32) & ~0xFFFF, 0x8000)), x)
        specials = f32_from_bits(torch.tensor(SPECIAL_BITS, dtype=torch.int64))
        pos = torch.randint(n, (min(n, 4 * len(SPECIAL_BITS)),), generator=g)
        x[pos] = specials[torch.arange(len(pos)) % len(specials)]
    if fmt == "bf16":
        raw = torch.randint(1 << 16, (n,), generator=g, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
        x = torch.where(torch.rand(n, generator=g) < 0.25, raw, x.to(torch.bfloat16))
    return x.reshape(shape)


def _torch_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torch's own conversion (the spec's test reference); E4M3 after the saturating clamp."""
    if dtype == torch.float8_e4m3fn:
        return x.float().clamp(-448, 448).to(dtype)
    return x.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


def _check_pair(in_fmt, out_fmt, sizes, stochastic=False, *, seed0=0, target=None, offset=0):
    """Each size (``seed0 + i``-th inputs) against the reference; ascend-sim cycles the pipe schedules,
    and runs ``SIM_WIDE_SIZE`` under each of ``REUSE_SCHEDULES`` (one launch each, one reference)."""
    for i, shape in enumerate(sizes):
        x = _inputs(shape, in_fmt, seed0 + i)
        want = reference_cast(x, DTYPES[out_fmt], stochastic)
        wide = target == "ascend-sim" and shape == SIM_WIDE_SIZE
        for schedule in REUSE_SCHEDULES if wide else [SIM_SCHEDULES[(i + offset) % len(SIM_SCHEDULES)]]:
            with sim_schedule(schedule):
                y = cast(x, DTYPES[out_fmt], stochastic, target=target)
            label = f"{'SR ' if stochastic else ''}{in_fmt}->{out_fmt} {shape} target={target} schedule={schedule}"
            assert_bitwise_equal(y, want, label)
    return x, y


@pytest.mark.parametrize("pair", CAST_PAIRS, ids=lambda p: "-".join(p))
def test_matches_reference(pair):
    in_fmt, out_fmt = pair
    x, y = _check_pair(in_fmt, out_fmt, SIZES)
    # The reference itself against torch's casts, NaNs aside (torch gives bf16 NaNs one fixed pattern).
    nan = x.float().isnan()
    assert_bitwise_equal(_bits(y)[~nan], _bits(_torch_cast(x, DTYPES[out_fmt]))[~nan], "vs torch")
    assert bool(y[nan].float().isnan().all()), "NaN not kept"


@pytest.mark.parametrize("pair", SR_PAIRS, ids=lambda p: "-".join(p))
def test_stochastic_matches_reference(pair):
    _check_pair(*pair, [s for s in SIZES if torch.Size(s).numel() % 4 == 0], True, seed0=100)


SIM_SLOW_PAIRS = [("fp32", "fp32"), ("bf16", "bf16")]
# Stochastic rounding on the simulator: one pair by default, the fp32 inputs in the slow run.
SIM_SLOW_SR_PAIRS = [("fp32", "e4m3"), ("fp32", "bf16")]
SIM_CASES = [(*pair, False) for pair in CAST_PAIRS if pair not in SIM_SLOW_PAIRS] + \
    [(*pair, True) for pair in SR_PAIRS if pair not in SIM_SLOW_SR_PAIRS]
SIM_FULL_CASES = [(*pair, False) for pair in SIM_SLOW_PAIRS] + [(*pair, True) for pair in SIM_SLOW_SR_PAIRS]


def _sim_id(case):
    return "-".join(case[:2]) + ("-sr" if case[2] else "")


def _check_on_ascend_sim(in_fmt, out_fmt, stochastic, offset):
    sizes = [s for s in SIM_SIZES if not stochastic or torch.Size(s).numel() % 4 == 0]
    _check_pair(in_fmt, out_fmt, sizes, stochastic, seed0=100 if stochastic else 0, target="ascend-sim",
                offset=offset)


@pytest.mark.parametrize("case", SIM_CASES, ids=_sim_id)
def test_matches_reference_on_ascend_sim(case):
    _check_on_ascend_sim(*case, SIM_CASES.index(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", SIM_FULL_CASES, ids=_sim_id)
def test_matches_reference_on_ascend_sim_full(case):
    _check_on_ascend_sim(*case, SIM_FULL_CASES.index(case))


def _rank(t: torch.Tensor) -> torch.Tensor:
    """Monotone index of representable levels (adjacent levels differ by one; +-0 share a rank)."""
    if t.dtype == torch.bfloat16:
        b = t.view(torch.int16).to(torch.int64) & 0xFFFF
        mid, mag = 0x7F7F, b & 0x7FFF
        negative = b >= 0x8000
    else:
        b = t.view(torch.uint8).to(torch.int64)
        mid, mag = 0x7E, b & 0x7F
        negative = b >= 0x80
    return torch.where(negative, mid - mag, mid + mag)


@pytest.mark.parametrize("pair", SR_PAIRS, ids=lambda p: "-".join(p))
def test_stochastic_statistics(pair):
    in_fmt, out_fmt = pair
    dtype = DTYPES[out_fmt]
    x = randn((2**18,), 7, DTYPES[in_fmt])
    sr = cast(x, dtype, True)
    assert_bitwise_equal(cast(x, dtype, True), sr, "SR is deterministic")
    rne = cast(x, dtype)
    assert not torch.equal(_bits(sr), _bits(rne)), "SR equals RNE everywhere"
    assert int((_rank(sr) - _rank(rne)).abs().max()) <= 1, "SR moved more than one level from RNE"
    xf, yf = x.float(), sr.float()
    n = x.numel()
    # Unbiased: each error is below one quantization step (relative 2^-7 for bf16, 2^-3 for E4M3),
    # so 10 standard errors of the mean stay below 10 * step * mean|x| / sqrt(n).
    step = 2.0**-7 if out_fmt == "bf16" else 2.0**-3
    assert abs(float((yf - xf).mean())) < 10 * step * float(xf.abs().mean()) / n**0.5
    below = float((yf < xf).double().mean() + 0.5 * (yf == xf).double().mean())
    assert abs(below - 0.5) < 10 / n**0.5, f"SR rounds down {below:.4f} of the time"


def test_stochastic_counter_wraps_at_32_bits():
    # The quad counter of a chunk starting at element 4 * (2^32 - 300): it wraps to 0 inside the chunk.
    spec = CastSpec("fp32", "bf16", True)
    start = 4 * (2**32 - 300)
    assert quad_base(start) == -300
    assert quad_base(4 * 2**31) == -(2**31) and quad_base(4 * 2**32 + 8) == 2
    x = randn((4096,), 8)
    out = torch.empty(4096, dtype=torch.bfloat16)
    kernels.build_cast.compiled(spec, "cpu")(
        x, out.view(torch.uint16), quad_base(start))
    counters = (start // 4 + torch.arange(1024, dtype=torch.int64)) & 0xFFFFFFFF
    want = stochastic_round(x, "bf16", random16(x, counters)).to(torch.bfloat16)
    assert_bitwise_equal(out, want, "wrapped counters")


@pytest.mark.parametrize("stochastic", [False, True])
def test_chunked_launch(monkeypatch, stochastic):
    # Launches of a few tiles each: every chunk continues the counters where the last one stopped.
    monkeypatch.setattr(kernels, "CHUNK", 3 * BLOCK)
    invalidate()  # a planned call would launch the chunks it recorded
    x = _inputs((10 * BLOCK + 8,), "fp32", 9)
    assert_bitwise_equal(cast(x, torch.float8_e4m3fn, stochastic),
                         reference_cast(x, torch.float8_e4m3fn, stochastic), "chunked")


ROUND_TRIPS = [
    # (in, via, relative bound, absolute bound below the format's normal range)
    ("fp32", "bf16", 2.0**-8, 0.0),
    ("fp32", "e4m3", 2.0**-4, 2.0**-10),
    ("bf16", "e4m3", 2.0**-4, 2.0**-10),
]


@pytest.mark.parametrize("stochastic", [False, True], ids=["rne", "sr"])
@pytest.mark.parametrize("trip", ROUND_TRIPS, ids=lambda t: f"{t[0]}-{t[1]}")
def test_round_trip_error(trip, stochastic):
    in_fmt, via, rel, absolute = trip
    x = (randn((3, 4096), 10) * 16).to(DTYPES[in_fmt])  # |x| < 448: no saturation
    back = cast(cast(x, DTYPES[via], stochastic), DTYPES[in_fmt])
    # RNE: at most half a step; SR: less than one step (twice the RNE bound).
    scale = 2.0 if stochastic else 1.0
    error = (back.float() - x.float()).abs()
    assert bool((error <= scale * torch.maximum(rel * x.float().abs(), torch.tensor(absolute))).all())


def test_spec_examples():
    # Spec quant-a §1.4 / §4.2: E4M3 RNE with finite saturation, signed zeros, NaN kept; bf16 RNE.
    x = torch.tensor([371.2, -371.2, 500.0, float("inf"), float("-inf"), -0.0, -1e-9, 464.0, 2.0**-10, 1.0058594])
    want = [0x7C, 0xFC, 0x7E, 0x7E, 0xFE, 0x80, 0x80, 0x7E, 0x00, 0x38]
    for y in (cast(x, torch.float8_e4m3fn), reference_cast(x, torch.float8_e4m3fn)):
        assert y.view(torch.uint8).tolist() == want
    assert cast(torch.tensor([float("nan")]), torch.float8_e4m3fn).float().isnan().all()
    for y in (cast(x[-1:], torch.bfloat16), reference_cast(x[-1:], torch.bfloat16)):
        assert y.view(torch.int16).tolist() == [0x3F81]


def test_empty_and_shapes_without_launch(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a kernel was compiled for an empty tensor")

    monkeypatch.setattr("vmi_core.kernel.cached_kernel", fail)
    for shape in [(0,), (0, 5), (3, 0, 2)]:
        y = cast(torch.zeros(shape), torch.bfloat16, True)
        assert y.shape == shape and y.dtype == torch.bfloat16


def test_same_format_is_a_new_tensor():
    x = _inputs((5, 7), "bf16", 11)
    y = cast(x, torch.bfloat16)
    assert y.data_ptr() != x.data_ptr()
    assert_bitwise_equal(y, x, "bits kept, NaN payloads included")


def test_torch_target_and_parallel_entry():
    x = _inputs((2, 3, 40), "fp32", 12)
    assert_bitwise_equal(cast(x, torch.float8_e4m3fn, True, target="torch"),
                         reference_cast(x, torch.float8_e4m3fn, True), "torch target")
    assert_bitwise_equal(cast_parallel(x, torch.bfloat16), cast(x, torch.bfloat16), "parallel entry")
    with pytest.raises(ValueError, match="target 'torch'"):
        cast_parallel(x, torch.bfloat16, target="torch")
