"""``unpack_from_e2m1fn_x2`` against the E2M1 value table written out, ``set_amax_clamp_for_quant``'s
TileKernels keyword and argument checks, and the token alignment of the psum layout."""

from __future__ import annotations

import pytest
import torch

from vmi_quant import get_amax_clamp_for_quant, reset_runtime_config, set_amax_clamp_for_quant, unpack_from_e2m1fn_x2

# Nibble -> value: sign bit 3, exponent bits 2..1, mantissa bit 0.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_every_byte_unpacks_low_nibble_first(dtype, out_dtype):
    data = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).reshape(2, 128)
    values = unpack_from_e2m1fn_x2(data, out_dtype)
    expected = torch.tensor([[E2M1[b & 0xF], E2M1[b >> 4]] for b in range(256)], dtype=torch.float64)
    assert values.dtype == out_dtype and values.shape == (2, 256)
    got = values.double().reshape(256, 2)
    assert torch.equal(got, expected)
    assert torch.equal(got.signbit(), expected.signbit())  # -0.0 kept


def test_strided_and_batched_inputs():
    data = torch.randint(-128, 128, (3, 4, 10), dtype=torch.int8)
    view = data[:, :, ::2]
    assert torch.equal(unpack_from_e2m1fn_x2(view), unpack_from_e2m1fn_x2(view.contiguous()))
    assert unpack_from_e2m1fn_x2(data[:, :, :0]).shape == (3, 4, 0)


@pytest.mark.parametrize(("x", "out_dtype", "error", "match"), [
    (torch.zeros(4, dtype=torch.int16), torch.float32, TypeError, "x must be int8 or uint8"),
    ([1, 2], torch.float32, TypeError, "x must be a torch.Tensor"),
    (torch.zeros((), dtype=torch.int8), torch.float32, ValueError, "0-d"),
    (torch.zeros(4, dtype=torch.int8), torch.int32, TypeError, "out_dtype must be one of"),
])
def test_unpack_bad_arguments(x, out_dtype, error, match):
    with pytest.raises(error, match=match):
        unpack_from_e2m1fn_x2(x, out_dtype)


def test_amax_clamp_takes_the_tilekernels_keyword():
    try:
        set_amax_clamp_for_quant("e4m3", False, clamp_min_value=2e-4)
        assert get_amax_clamp_for_quant("e4m3") == 2e-4
        set_amax_clamp_for_quant("e2m1", True, 1)
        assert get_amax_clamp_for_quant("e2m1", True) == 1.0
    finally:
        reset_runtime_config()
    assert get_amax_clamp_for_quant("e4m3") == 1e-4


@pytest.mark.parametrize(("value", "error"), [
    (0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
    ("1e-4", TypeError), (True, TypeError), (None, TypeError),
])
def test_amax_clamp_refuses_bad_values(value, error):
    with pytest.raises(error, match="clamp_min_value"):
        set_amax_clamp_for_quant("e4m3", False, value)
    assert get_amax_clamp_for_quant("e4m3") == 1e-4


# --- token alignment and the psum layout (quant-b spec §0.5) ---------------------------------

def test_token_alignment_setting():
    from vmi_quant import get_token_alignment, set_token_alignment

    assert get_token_alignment() == 128
    try:
        set_token_alignment(4)
        assert get_token_alignment() == 4
    finally:
        reset_runtime_config()
    assert get_token_alignment() == 128
    with pytest.raises(TypeError, match="alignment"):
        set_token_alignment(4.0)
    with pytest.raises(ValueError, match="alignment"):
        set_token_alignment(0)


def test_expert_rows_of_the_spec_example():
    from vmi_quant.inputs import check_psum, expert_rows

    psum = torch.tensor([3, 4, 9], dtype=torch.int32)  # counts [3, 0, 5], alignment 4
    check_psum(psum, "psum", 12, torch.device("cpu"))
    valid = expert_rows(psum, 12, 4)
    assert valid.tolist() == [True] * 3 + [False] + [True] * 5 + [False] * 3
    # The empty expert ending at the previous end, before its aligned start (TileKernels accepts it).
    early_end = torch.tensor([3, 3, 9], dtype=torch.int32)
    check_psum(early_end, "psum", 12, torch.device("cpu"))
    assert expert_rows(early_end, 12, 4).tolist() == valid.tolist()
    assert expert_rows(None, 5, 4).tolist() == [True] * 5


def test_padding_ranges_are_the_rows_of_no_expert():
    """``padding_ranges`` (the kernels' zeroing) and ``expert_rows`` (the reference's mask) agree, on the
    spec example and on random layouts with empty experts, aligned ends and trailing padding."""
    from vmi_quant.inputs import expert_rows, padding_ranges

    def covered(ranges, num_rows):
        rows = [False] * num_rows
        for start, stop in ranges:
            assert start < stop
            rows[start:stop] = [True] * (stop - start)
        return rows

    assert padding_ranges([3, 4, 9], 12, 4) == [(3, 4), (9, 12)]
    g = torch.Generator().manual_seed(5)
    for _ in range(200):
        alignment = int(torch.randint(1, 9, (1,), generator=g))
        counts = torch.randint(0, 4, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g)
        ends, start = [], 0
        for count in counts.tolist():
            ends.append(start + count)
            start = -(-ends[-1] // alignment) * alignment
        psum = torch.tensor(ends, dtype=torch.int32)
        num_rows = ends[-1] + int(torch.randint(0, 5, (1,), generator=g))
        assert covered(padding_ranges(ends, num_rows, alignment), num_rows) == \
            (~expert_rows(psum, num_rows, alignment)).tolist(), (ends, num_rows, alignment)


@pytest.mark.parametrize("psum,error", [
    (torch.tensor([3, 2], dtype=torch.int32), "psum must not decrease: psum\\[1\\] = 2 is below psum\\[0\\] = 3"),
    (torch.tensor([-1], dtype=torch.int32), "psum\\[0\\] must be >= 0"),
    (torch.tensor([3, 13], dtype=torch.int32), "exceeds the number of rows, 12"),
    (torch.tensor([], dtype=torch.int32), "at least one expert"),
    (torch.tensor([[3]], dtype=torch.int32), "1-D"),
    (torch.tensor([3, 4, 9, 9], dtype=torch.int32)[::2], "contiguous"),
])
def test_check_psum_refuses_bad_layouts(psum, error):
    from vmi_quant.inputs import check_psum

    with pytest.raises(ValueError, match=error):
        check_psum(psum, "psum", 12, torch.device("cpu"))
    with pytest.raises(TypeError, match="psum must be torch.int32"):
        check_psum(psum.long(), "psum", 12, torch.device("cpu"))
