"""swiglu_forward and swiglu_forward_and_per_token_cast: bad input raises a clear TypeError/ValueError
naming the argument, before any kernel runs, and the clamp counters are left as they were."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_quant.ops.swiglu_forward import (
    swiglu_forward,
    swiglu_forward_and_per_token_cast,
    swiglu_forward_and_per_token_cast_parallel,
    swiglu_forward_parallel,
)

no_kernel = no_kernel_fixture("vmi_quant.kernels.swiglu_forward")


X = torch.zeros(16, 256, dtype=torch.bfloat16)
# One expert over every row (the default token alignment is 128).
PSUM = torch.tensor([16], dtype=torch.int32)
W = torch.ones(16)
COUNT_START = [3, 1, 4, 1]


def _count():
    return torch.tensor(COUNT_START, dtype=torch.int64)


COUNT = _count()


def fwd(*args, **kwargs):
    return swiglu_forward(*args, **kwargs)


def cast(*args, **kwargs):
    return swiglu_forward_and_per_token_cast(*args, **kwargs)


@pytest.mark.parametrize("call,error,match", [
    (lambda: fwd("x", "bf16"), TypeError, "x must be a torch.Tensor"),
    (lambda: fwd(X.half(), "bf16"), TypeError, "x must be bfloat16 or float32"),
    (lambda: fwd(X[0], "bf16"), ValueError, "x must be 2-D"),
    (lambda: fwd(X.t(), "bf16"), ValueError, "unit stride"),
    (lambda: fwd(X[:, :192], "bf16"), ValueError, "H a multiple of 64"),
    (lambda: fwd(X[:, :130], "bf16"), ValueError, "H a multiple of 64"),
    (lambda: fwd(X, "e4m3"), ValueError, "fmt must be one of \\('fp32', 'bf16'\\)"),
    (lambda: fwd(X, 16), TypeError, "fmt"),
    (lambda: fwd(X, "bf16", PSUM.long()), TypeError, "psum_num_tokens_per_expert must be torch.int32"),
    (lambda: fwd(X, "bf16", PSUM[None]), ValueError, "psum_num_tokens_per_expert must be 1-D"),
    (lambda: fwd(X, "bf16", PSUM[:0]), ValueError, "psum_num_tokens_per_expert must hold at least one expert"),
    (lambda: fwd(X, "bf16", torch.tensor([17], dtype=torch.int32)), ValueError,
     "psum_num_tokens_per_expert\\[-1\\] = 17 exceeds"),
    (lambda: fwd(X, "bf16", torch.tensor([-1, 4], dtype=torch.int32)), ValueError,
     "psum_num_tokens_per_expert\\[0\\] must be >= 0"),
    (lambda: fwd(X, "bf16", torch.tensor([9, 4], dtype=torch.int32)), ValueError,
     "psum_num_tokens_per_expert\\[1\\] = 4 is below"),
    (lambda: fwd(X, "bf16", torch.tensor([1, 2, 3, 4], dtype=torch.int32)[::2]), ValueError,
     "psum_num_tokens_per_expert must be contiguous"),
    (lambda: fwd(X, "bf16", [16]), TypeError, "psum_num_tokens_per_expert"),
    (lambda: fwd(X, "bf16", topk_weights=W.double()), TypeError, "topk_weights must be torch.float32"),
    (lambda: fwd(X, "bf16", topk_weights=W[:8]), ValueError, "topk_weights must have shape \\(16\\)"),
    (lambda: fwd(X, "bf16", topk_weights=torch.ones(32)[::2]), ValueError, "topk_weights must be contiguous"),
    (lambda: fwd(X, "bf16", routed_scaling_factor=2.5), ValueError, "routed_scaling_factor requires topk_weights"),
    (lambda: fwd(X, "bf16", topk_weights=W, routed_scaling_factor="2.5"), TypeError, "routed_scaling_factor"),
    (lambda: fwd(X, "bf16", topk_weights=W, routed_scaling_factor=float("inf")), ValueError,
     "routed_scaling_factor must be finite"),
    (lambda: fwd(X, "bf16", clamp_value=-1.0), ValueError, "clamp_value must be >= 0"),
    (lambda: fwd(X, "bf16", clamp_value=float("nan")), ValueError, "clamp_value must be finite"),
    (lambda: fwd(X, "bf16", clamp_value=True), TypeError, "clamp_value"),
    (lambda: fwd(X, "bf16", clamped_count=COUNT), ValueError, "clamped_count requires clamp_value"),
    (lambda: fwd(X, "bf16", clamp_value=1.0, clamped_count=COUNT.int()), TypeError,
     "clamped_count must be torch.int64"),
    (lambda: fwd(X, "bf16", clamp_value=1.0, clamped_count=torch.zeros(3, dtype=torch.int64)), ValueError,
     "clamped_count must have shape \\(4\\)"),
    (lambda: fwd(X, "bf16", clamp_value=1.0, clamped_count=X.view(torch.int64)[0, :4]), ValueError,
     "clamped_count shares memory with x"),
    (lambda: fwd(X, "bf16", target="npu"), ValueError, "target"),
    (lambda: fwd(X, "bf16", flavor="tpu"), ValueError, "flavor"),
    (lambda: fwd(X, "bf16", target="ascend-sim", flavor="cuda"), ValueError, "flavor"),
    (lambda: cast(X, "e4m3", 64), ValueError, "num_per_channels must be one of \\(32, 128\\)"),
    (lambda: cast(X, "e4m3", None), TypeError, "num_per_channels"),
    (lambda: cast(X, "e4m3", 32.0), TypeError, "num_per_channels"),
    (lambda: cast(X[:, :128], "e4m3", 128), ValueError, "multiple of num_per_channels=128"),
    (lambda: cast(X, "e2m1", 32), ValueError, "fmt must be one of \\('e4m3',\\)"),
    (lambda: cast(X, "bf16", 32), ValueError, "num_per_channels must be None for fmt 'bf16'"),
    (lambda: cast(X, "fp32", None, round_sf=True), ValueError, "round_sf applies to fmt 'e4m3' only"),
    (lambda: cast(X, "e4m3", 32, use_packed_ue8m0=True), ValueError, "requires round_sf"),
    (lambda: cast(X, "e4m3", 32, round_sf=1), TypeError, "round_sf"),
    (lambda: cast(X, "e4m3", 32, use_tma_aligned_col_major_sf="no"), TypeError, "use_tma_aligned_col_major_sf"),
    (lambda: cast(X, "e4m3", 32, PSUM, W, 2.5, clamp_value=1.0, clamped_count=torch.zeros(4)), TypeError,
     "clamped_count must be torch.int64"),
    (lambda: swiglu_forward_parallel(X, "bf16", target="torch"), ValueError, "target 'torch'"),
    (lambda: swiglu_forward_and_per_token_cast_parallel(X, "e4m3", 32, target="torch"), ValueError,
     "target 'torch'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
    assert COUNT.tolist() == COUNT_START


def test_counters_untouched_on_error():
    # A check that fails after the counter is validated (a bad weight) leaves it as it was.
    count = _count()
    with pytest.raises(ValueError, match="topk_weights"):
        cast(X, "e4m3", 32, PSUM, W[:4], clamp_value=1.0, clamped_count=count)
    assert count.tolist() == COUNT_START


def test_meta_tensors_shape_only():
    # The fake implementation (torch.compile, meta tensors): shapes and layouts, no values read.
    x = torch.empty(16, 256, dtype=torch.bfloat16, device="meta")
    psum = torch.empty(3, dtype=torch.int32, device="meta")
    out = torch.ops.vmi.swiglu_forward(x, "fp32", psum)
    assert out.shape == (16, 128) and out.dtype == torch.float32 and out.device.type == "meta"
    data, sf = torch.ops.vmi.swiglu_forward_and_per_token_cast(x, "e4m3", 32, psum, None, None, True, True, True,
                                                               flavor="cuda")
    assert data.shape == (16, 128) and data.dtype == torch.float8_e4m3fn
    assert sf.shape == (16, 1) and sf.dtype == torch.int32 and sf.stride() == (1, 16)
