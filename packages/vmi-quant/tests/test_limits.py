"""Hostile shapes, strides and aliasing: refused with a clear error before any kernel runs, or
computed exactly; never a crash, a wrong row or a write outside an output.

Kernels address a tensor with 32-bit offsets from its first element, so a view whose last
element lies 2^31 - 1 elements past its first is the largest accepted (tested: it
computes the reference's bits), one more is refused. The views are ``as_strided`` over a
large buffer that is never touched except where the rows are (little memory in use).
"""

import pytest
import torch

from vmi_core.checks import INT32_MAX
from vmi_core.tools.testing import assert_bitwise_equal, randn
from vmi_quant import per_block_cast, per_token_cast, per_token_cast_and_cast_back, reference

K = 256


@pytest.fixture(scope="module")
def big_buffer():
    return torch.empty(INT32_MAX + 2 * K, dtype=torch.bfloat16)


def _rows(buffer: torch.Tensor, row_stride: int) -> torch.Tensor:
    view = buffer.as_strided((2, K), (row_stride, 1))
    view.copy_(randn((2, K), 1, torch.bfloat16))
    return view


def test_a_row_stride_up_to_the_int32_limit_is_computed_exactly(big_buffer):
    x = _rows(big_buffer, INT32_MAX - (K - 1))  # last element at offset 2^31 - 1
    data, sf = per_token_cast(x, "e4m3", 32)
    want_data, want_sf = reference.cast(x.contiguous(), "e4m3", (1, 32))
    assert_bitwise_equal(data, want_data, "data")
    assert_bitwise_equal(sf, want_sf, "sf")


def test_a_row_stride_past_the_int32_limit_is_refused(big_buffer):
    x = _rows(big_buffer, INT32_MAX - (K - 2))  # last element at offset 2^31
    with pytest.raises(ValueError, match=r"x is too large for the kernels.*last element at offset 2147483648"):
        per_token_cast(x, "e4m3", 32)
    with pytest.raises(ValueError, match=r"x is too large for the kernels"):
        per_token_cast_and_cast_back(x, "e4m3", 32)


def test_the_in_place_round_trip_at_the_limit_writes_only_its_rows(big_buffer):
    stride = INT32_MAX - (K - 1)
    x = _rows(big_buffer, stride)
    after_row0 = big_buffer[K:2 * K].clone()
    expected = reference.cast_and_cast_back(x.contiguous(), "e4m3", 32, flavor="ascend")
    per_token_cast_and_cast_back(x, "e4m3", 32)
    assert_bitwise_equal(x.contiguous(), expected)
    assert_bitwise_equal(big_buffer[K:2 * K], after_row0, "wrote past row 0")


def test_outputs_that_share_memory_are_refused():
    x = randn((64, K), 2, torch.float32)
    out = torch.empty(64, K, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="out data shares memory with x"):
        per_token_cast(x, "e4m3", 32, out=(x.view(torch.float8_e4m3fn)[:, :K], torch.empty(64, 8)))
    with pytest.raises(ValueError, match="out_sf has elements that share memory"):
        per_token_cast(x, "e4m3", 32, out=(out, torch.empty(1, 8).expand(64, 8)))
    with pytest.raises(ValueError, match="out data shares memory with out_sf"):
        per_token_cast(x, "e4m3", 32, out=(out, out.view(torch.float32)[:, :8]))
    xb = randn((256, K), 3, torch.float32)
    with pytest.raises(ValueError, match="out data shares memory with x"):
        per_block_cast(xb, "e4m3", (128, 128), out=(xb.view(torch.float8_e4m3fn)[:, :K], torch.empty(2, 2)))
    with pytest.raises(ValueError, match="out_sf has elements that share memory"):
        per_block_cast(xb, "e4m3", (128, 128), out=(torch.empty(256, K, dtype=torch.float8_e4m3fn),
                                                    torch.empty(1, 2).expand(2, 2)))


def test_integer_arguments_given_as_floats_or_out_of_range_name_the_argument():
    x = randn((64, K), 4, torch.float32)
    with pytest.raises(TypeError, match="num_per_channels must be an int, got float 128.0"):
        per_token_cast(x, "e4m3", 128.0)
    with pytest.raises(TypeError, match="num_per_channels must be an int, got float 32.0"):
        per_token_cast_and_cast_back(x, "e4m3", 32.0)
    data = torch.zeros(64, K, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"x_block_size\[1\] must be in \[1, 2147483647\], got 1000000000000"):
        per_token_cast((data, torch.ones(1, 1)), "e4m3", 32, x_block_size=(64, 10**12))
    with pytest.raises(TypeError, match=r"x_block_size\[0\] must be an int, got float"):
        per_token_cast((data, torch.ones(1, 1)), "e4m3", 32, x_block_size=(64.0, 256))
