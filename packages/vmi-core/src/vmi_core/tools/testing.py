"""Testing helpers: bitwise comparison with readable mismatches, seeded input generators,
and the pipe schedules of ascend-sim runs."""

from __future__ import annotations

import contextlib
import os

import torch

from ..ascend_sim import SCHEDULE_ENV
from ..ascend_sim import SCHEDULES as SIM_SCHEDULES

# The schedules under which a dropped wait between pipes shows up as wrong data (consumers first:
# read-after-write; producers first: write-after-read), where a core reuses a buffer (more work
# tiles on it than the buffer has versions): a test runs such a shape under both.
REUSE_SCHEDULES = ("consumers_first", "producers_first")

_BIT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns of ``t`` as an integer tensor of the same element size (contiguous)."""
    t = t.contiguous()
    if not t.dtype.is_floating_point and t.dtype not in (torch.uint16, torch.uint32):
        return t
    return t.view(_BIT_VIEWS[t.element_size()])


def _fmt_bits(value: int, size: int) -> str:
    return f"0x{value & ((1 << (8 * size)) - 1):0{2 * size}x}"


def bitwise_mismatches(actual: torch.Tensor, expected: torch.Tensor, limit: int = 8) -> list[str]:
    """Lines describing the first ``limit`` elements whose bit patterns differ."""
    a, e = bits(actual).cpu(), bits(expected).cpu()
    diff = (a != e).nonzero()
    size = actual.element_size()
    lines = []
    for index in diff[:limit].tolist():
        idx = tuple(index)
        lines.append(f"  at {idx}: actual {actual.cpu()[idx].item()!r} ({_fmt_bits(a[idx].item(), size)}), "
                     f"expected {expected.cpu()[idx].item()!r} ({_fmt_bits(e[idx].item(), size)})")
    if len(diff) > limit:
        lines.append(f"  ... {len(diff) - limit} more of {a.numel()} elements differ")
    return lines


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor, name: str = "tensor",
                         check_stride: bool = True, any_nan: bool = False) -> None:
    """Same dtype, shape, device (and strides unless empty or ``check_stride=False``) and identical
    bytes; -0.0 differs from +0.0 and NaN payloads count, unless ``any_nan``: then a floating
    NaN matches a NaN of any payload (the vector unit's arithmetic makes its own NaN pattern)."""
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != expected {expected.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    assert actual.device == expected.device, f"{name}: device {actual.device} != expected {expected.device}"
    if check_stride and actual.numel() > 0:
        assert actual.stride() == expected.stride(), \
            f"{name}: strides {actual.stride()} != expected {expected.stride()}"
    if any_nan and actual.is_floating_point():
        nan = expected.isnan()
        assert torch.equal(actual.isnan(), nan), f"{name}: NaNs at other positions than expected"
        actual, expected = torch.where(nan, 0, actual), torch.where(nan, 0, expected)
    lines = bitwise_mismatches(actual, expected)
    if lines:
        raise AssertionError(f"{name}: bit patterns differ\n" + "\n".join(lines))


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(shape, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Normal samples, reproducible from ``seed``."""
    return torch.randn(shape, generator=generator(seed)).to(dtype)


def randn_with_ties(shape, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Normal samples where a quarter of the values sit exactly on E4M3/E2M1 rounding midpoints
    (after scaling by a power of two), so round-to-nearest-even decisions are exercised."""
    x = randn(shape, seed)
    g = generator(seed + 1)
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 1.0625, 1.1875, 17.0, 19.0, 304.0])
    pick = midpoints[torch.randint(len(midpoints), x.shape, generator=g)]
    sign = torch.where(torch.rand(x.shape, generator=g) < 0.5, -1.0, 1.0)
    scale = torch.exp2(torch.randint(-3, 3, x.shape, generator=g).float())
    use = torch.rand(x.shape, generator=g) < 0.25
    return torch.where(use, sign * pick * scale, x).to(dtype)


def with_zero_groups(x: torch.Tensor, group: int, seed: int) -> torch.Tensor:
    """A copy of ``x`` where about one group of ``group`` channels in eight is all zeros
    (some of them negative zeros)."""
    g = generator(seed)
    rows, cols = x.shape
    groups = -(-cols // group)
    zero = (torch.rand(rows, groups, generator=g) < 0.125).repeat_interleave(group, dim=1)[:, :cols]
    negative = (torch.rand(rows, groups, generator=g) < 0.5).repeat_interleave(group, dim=1)[:, :cols]
    zeros = torch.where(negative, -0.0, 0.0).to(x.dtype)
    return torch.where(zero, zeros, x)


def with_extremes(x: torch.Tensor, seed: int) -> torch.Tensor:
    """A copy of ``x`` with a few huge (~1e30) and tiny (fp32-subnormal) values mixed in."""
    y = x.clone().float()
    g = generator(seed)
    n = y.numel()
    flat = y.view(-1)
    idx = torch.randint(n, (max(1, n // 64),), generator=g)
    flat[idx[0::2]] = torch.randn(len(idx[0::2]), generator=g) * 1e30
    flat[idx[1::2]] = torch.randn(len(idx[1::2]), generator=g) * 1e-40
    return y.to(x.dtype)


def compare_named(names):
    """A ``vmi`` command ``check``: the outputs called ``names`` against the expected ones, bit
    for bit (dtype and shape first), as lines for the report (empty when all match)."""
    def compare(outputs, expected) -> list[str]:
        lines = []
        for name, actual, wanted in zip(names, outputs, expected, strict=True):
            if actual.shape != wanted.shape or actual.dtype != wanted.dtype:
                lines.append(f"  {name}: {actual.dtype}{tuple(actual.shape)} vs expected "
                             f"{wanted.dtype}{tuple(wanted.shape)}")
            else:
                lines += [f"  {name}{line}" for line in bitwise_mismatches(actual.cpu(), wanted.cpu())]
        return lines
    return compare


@contextlib.contextmanager
def sim_schedule(schedule: str | None):
    """Run the block's ascend-sim launches with their pipes interleaved by ``schedule`` (``None``:
    the schedule in force, unchanged).

    Tests cycle through ``SIM_SCHEDULES``, and run a shape on which a core reuses a buffer under
    both ``REUSE_SCHEDULES``, so that a missing wait between pipes shows up as wrong data.
    """
    if schedule is None:
        yield
        return
    if schedule not in SIM_SCHEDULES:
        raise ValueError(f"schedule must be one of {SIM_SCHEDULES}, got {schedule!r}")
    saved = os.environ.get(SCHEDULE_ENV)
    os.environ[SCHEDULE_ENV] = schedule
    try:
        yield
    finally:
        if saved is None:
            del os.environ[SCHEDULE_ENV]
        else:
            os.environ[SCHEDULE_ENV] = saved
