"""cast / cast_back: bad input raises a clear TypeError/ValueError naming the argument, before any kernel runs."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_quant import reference
from vmi_quant.ops.cast import cast, cast_parallel
from vmi_quant.ops.cast_back import cast_back, cast_back_parallel, per_token_cast_back, per_token_cast_back_parallel

no_kernel = no_kernel_fixture("vmi_quant.kernels.cast", "vmi_quant.kernels.cast_back")


X = torch.zeros(4, 128)
E4M3 = torch.float8_e4m3fn


@pytest.mark.parametrize("call,error,match", [
    (lambda: cast(X.tolist(), torch.bfloat16), TypeError, "x must be a torch.Tensor"),
    (lambda: cast(X.half(), torch.bfloat16), TypeError, "x dtype must be one of"),
    (lambda: cast(X.int(), torch.bfloat16), TypeError, "x dtype must be one of"),
    (lambda: cast(X, torch.float16), TypeError, "dtype must be one of"),
    (lambda: cast(X, torch.float8_e5m2), TypeError, "dtype must be one of"),
    (lambda: cast(X, "bf16"), TypeError, "dtype must be a torch.dtype"),
    (lambda: cast(X, torch.bfloat16, 1), TypeError, "stochastic_rounding must be a bool"),
    (lambda: cast(X.t(), torch.bfloat16), ValueError, "x must be contiguous"),
    (lambda: cast(X[:, ::2], E4M3), ValueError, "x must be contiguous"),
    (lambda: cast(X.bfloat16(), torch.float32, True), ValueError, "stochastic_rounding supports"),
    (lambda: cast(X.to(E4M3), torch.bfloat16, True), ValueError, "stochastic_rounding supports"),
    (lambda: cast(X, torch.float32, True), ValueError, "stochastic_rounding supports"),
    (lambda: cast(torch.zeros(6), E4M3, True), ValueError, "divisible by 4"),
    (lambda: cast(X, E4M3, target="cuda"), ValueError, "target 'cuda'"),
    (lambda: cast(X, E4M3, target="tpu"), ValueError, "target must be one of"),
    (lambda: cast(X, E4M3, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: cast_parallel(X, E4M3, target="torch"), ValueError, "always runs the kernel"),
])
def test_bad_cast_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def _quantized(block=(32, 32), flavor="ascend", fmt="e4m3", rows=64, cols=128, **options):
    return reference.cast(torch.randn(rows, cols), fmt, block, flavor=flavor, **options)


Q = _quantized()


@pytest.mark.parametrize("call,error,match", [
    (lambda: cast_back(X, "bf16", (32, 32)), TypeError, "x must be a quantized \\(data, sf\\) tuple"),
    (lambda: cast_back(Q, "e4m3", (32, 32)), ValueError, "fmt must be one of"),
    (lambda: cast_back(Q, torch.bfloat16, (32, 32)), TypeError, "fmt must be a str"),
    (lambda: cast_back(Q, "bf16", (32, 32), "e5m6"), ValueError, "x_special_fmt must be None"),
    (lambda: cast_back(Q, "bf16", None), ValueError, "x_block_size is required"),
    (lambda: cast_back(Q, "bf16", (0, 32)), ValueError, r"x_block_size\[0\] must be in \[1, 2147483647\], got 0"),
    (lambda: cast_back(Q, "bf16", [32, 32]), ValueError, "x_block_size must be a tuple"),
    (lambda: cast_back(Q, "bf16", (32, 64)), ValueError, "x sf must have shape"),
    (lambda: cast_back((Q[0].float(), Q[1]), "bf16", (32, 32)), TypeError, "x data must be float8_e4m3fn or int8"),
    (lambda: cast_back((Q[0], Q[1].double()), "bf16", (32, 32)), TypeError, "x sf must be float32"),
    (lambda: cast_back((Q[0], Q[1], Q[1]), "bf16", (32, 32)), ValueError, "\\(data, sf\\) tuple"),
    (lambda: cast_back((Q[0], Q[1].tolist()), "bf16", (32, 32)), TypeError, "x sf must be a torch.Tensor"),
    (lambda: cast_back((Q[0].tolist(), Q[1]), "bf16", (32, 32)), TypeError, "data is a torch.Tensor"),
    (lambda: cast_back(_quantized(cols=96), "bf16", (32, 32)), ValueError, "multiple of 64"),
    (lambda: cast_back(_quantized((32, 1), use_tma_aligned_col_major_sf=True), "fp32", (32, 1)),
     ValueError, "row-major when x_block_size\\[1\\] == 1"),
    (lambda: cast_back(_quantized(flavor="cuda", round_sf=True, use_packed_ue8m0=True), "bf16", (32, 32)),
     TypeError, "packed UE8M0 torch.int16"),
    (lambda: cast_back(Q, "bf16", (32, 32), target="cuda"), ValueError, "target 'cuda'"),
    (lambda: cast_back(Q, "bf16", (32, 32), flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: cast_back_parallel(Q, "bf16", (32, 32), target="torch"), ValueError, "always runs the kernel"),
    (lambda: per_token_cast_back(_quantized((1, 32)), "bf16", 0), ValueError, "num_per_channels"),
    (lambda: per_token_cast_back(_quantized((1, 32)), "bf16", True), TypeError, "num_per_channels must be an int"),
    (lambda: per_token_cast_back(_quantized((1, 32)), "bf16", 64), ValueError, "x sf must have shape"),
    (lambda: per_token_cast_back_parallel(_quantized((1, 32)), "bf16", 32.0), TypeError,
     "num_per_channels must be an int, got float 32.0"),
])
def test_bad_cast_back_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()
