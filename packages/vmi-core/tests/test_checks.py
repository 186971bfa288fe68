"""vmi_core.checks: the argument checks every op's dispatch uses."""

import numpy as np
import pytest
import torch

from vmi_core.checks import (
    INT32_MAX,
    check_bool,
    check_choice,
    check_disjoint,
    check_float,
    check_int,
    check_int_choice,
    check_kernel_extent,
    check_no_internal_overlap,
    check_tensor,
    has_internal_overlap,
    tensors_overlap,
)


def test_int():
    assert check_int(5, "n", 1, 8) == 5
    assert check_int(np.int64(7), "n") == 7
    with pytest.raises(TypeError, match=r"num_per_channels must be an int, got float 128.0"):
        check_int(128.0, "num_per_channels")
    with pytest.raises(TypeError, match="flag must be an int, got bool"):
        check_int(True, "flag")
    with pytest.raises(ValueError, match=r"n must be in \[1, 8\], got 9"):
        check_int(9, "n", 1, 8)
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        check_int(-1, "n", 0)


def test_int_choice():
    assert check_int_choice(np.int64(32), "npc", (32, 128)) == 32
    with pytest.raises(TypeError, match="npc must be an int, got float 32.0"):
        check_int_choice(32.0, "npc", (32, 128))
    with pytest.raises(ValueError, match=r"npc must be one of \(32, 128\), got 64"):
        check_int_choice(64, "npc", (32, 128))


def test_float_bool_choice():
    assert check_float(2, "s") == 2.0
    with pytest.raises(TypeError, match="s must be a float, got str"):
        check_float("2", "s")
    with pytest.raises(ValueError, match="s must be finite"):
        check_float(float("nan"), "s", finite=True)
    with pytest.raises(TypeError, match="b must be a bool, got int 1"):
        check_bool(1, "b")
    with pytest.raises(ValueError, match=r"fmt must be one of \('e4m3', 'e2m1'\), got 'e5m2'"):
        check_choice("e5m2", "fmt", ("e4m3", "e2m1"))


def test_tensor():
    t = torch.zeros(4, 8)
    assert check_tensor(t, "x", dtype=(torch.float32, torch.bfloat16), shape=(None, 8), device="cpu") is t
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        check_tensor([1], "x")
    with pytest.raises(TypeError, match="x must be torch.bfloat16, got torch.float32"):
        check_tensor(t, "x", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"x must have shape \(\*, 9\), got \(4, 8\)"):
        check_tensor(t, "x", shape=(None, 9))
    with pytest.raises(ValueError, match="x must be 3-D"):
        check_tensor(t, "x", dim=3)
    with pytest.raises(ValueError, match="x must be contiguous"):
        check_tensor(t.t(), "x", contiguous=True)


def _big_buffer(elements: int) -> torch.Tensor:
    # Virtual memory only: the pages nobody touches cost no RSS.
    return torch.empty(elements, dtype=torch.uint8)


def test_kernel_extent_both_sides_of_the_int32_boundary():
    buf = _big_buffer(INT32_MAX + 1 + 64)
    ok = buf.as_strided((2, 64), (INT32_MAX - 63, 1))       # last element at offset 2^31 - 1
    check_kernel_extent(ok, "x")
    too_far = buf.as_strided((2, 64), (INT32_MAX - 62, 1))  # last element at offset 2^31
    with pytest.raises(ValueError, match=r"x is too large for the kernels.*last element at offset 2147483648"):
        check_kernel_extent(too_far, "x")
    with pytest.raises(ValueError, match=r"stride 2147483648"):
        check_kernel_extent(buf.as_strided((1, 64), (INT32_MAX + 1, 1)), "x")
    with pytest.raises(ValueError, match=r"size 2147483648"):
        check_kernel_extent(buf[: INT32_MAX + 1], "x")


def test_internal_overlap():
    base = torch.zeros(4, 8)
    assert not has_internal_overlap(base)
    assert not has_internal_overlap(base.t())
    assert not has_internal_overlap(base[:, ::2])
    assert has_internal_overlap(torch.zeros(4, 1).expand(4, 8))
    assert has_internal_overlap(torch.zeros(8).as_strided((3, 4), (2, 1)))
    with pytest.raises(ValueError, match="out has elements that share memory"):
        check_no_internal_overlap(torch.zeros(1, 8).expand(3, 8), "out")
    check_no_internal_overlap(torch.zeros(1, 8).expand(1, 8), "out")


def test_overlap_between_tensors_is_exact():
    buf = torch.zeros(8, 16)
    left, right = buf[:, :8], buf[:, 8:]
    assert not tensors_overlap(left, right)  # interleaved rows, disjoint elements
    assert tensors_overlap(buf[:, 4:12], right)
    assert not tensors_overlap(buf[:, ::2], buf[:, 1::2])
    assert tensors_overlap(buf.view(torch.uint8)[:, 1:2], buf[:, :1])  # one byte of the first float
    assert not tensors_overlap(buf, torch.zeros(8, 16))


def test_disjoint():
    x = torch.zeros(4, 8)
    out = torch.zeros(4, 8)
    sf = torch.zeros(4, 2)
    check_disjoint({"out": out, "out_sf": sf}, {"x": x})
    with pytest.raises(ValueError, match="out shares memory with x"):
        check_disjoint({"out": x[:, :4]}, {"x": x})
    with pytest.raises(ValueError, match="out shares memory with out_sf"):
        check_disjoint({"out": out, "out_sf": out[:, :2]})
    with pytest.raises(ValueError, match="out_sf has elements that share memory"):
        check_disjoint({"out_sf": torch.zeros(1, 2).expand(4, 2)})
    check_disjoint({"out": x}, {"x": x}, in_place=[("out", "x")])


def test_fp32_value_rounds_as_torch_does():
    """``fp32.value`` (plain Python, for argument checks) gives torch's float32 rounding of a Python float:
    ties to even, subnormals, the overflow threshold, signed zeros, infinities."""
    import math
    import random

    from vmi_core.fp32 import value

    largest = float(torch.finfo(torch.float32).max)
    half_ulp = 2.0 ** (127 - 24)
    rng = random.Random(7)
    values = [0.0, -0.0, 2.0**-149, 2.0**-150, -(2.0**-150) * 1.5, 1 + 2.0**-24, 1 + 3 * 2.0**-24, largest,
              largest + half_ulp, -(largest + half_ulp), largest + half_ulp / 2, 1e300, math.inf, -math.inf]
    values += [rng.uniform(-1, 1) * 10 ** rng.uniform(-48, 39) for _ in range(2000)]
    for x in values:
        got, want = value(x), float(torch.tensor(x, dtype=torch.float32))
        assert got == want and math.copysign(1, got) == math.copysign(1, want), x
    assert math.isnan(value(math.nan))
