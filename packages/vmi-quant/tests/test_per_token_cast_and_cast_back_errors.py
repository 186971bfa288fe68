"""per_token_cast_and_cast_back: bad input raises a clear TypeError/ValueError naming the
argument, before any kernel runs and without touching x."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_quant.ops.per_token_cast_and_cast_back import (
    per_token_cast_and_cast_back,
    per_token_cast_and_cast_back_parallel,
)

no_kernel = no_kernel_fixture("vmi_quant.kernels.per_token_cast_and_cast_back")


X = torch.ones(4, 128, dtype=torch.bfloat16)


@pytest.mark.parametrize("call,error,match", [
    (lambda x: per_token_cast_and_cast_back(x.half(), "e4m3", 32), TypeError, "x must be bfloat16 or float32"),
    (lambda x: per_token_cast_and_cast_back(x.int(), "e4m3", 32), TypeError, "x must be"),
    (lambda x: per_token_cast_and_cast_back(x.tolist(), "e4m3", 32), TypeError, "x must be a torch.Tensor"),
    (lambda x: per_token_cast_and_cast_back(x[0], "e4m3", 32), ValueError, "x must be 2-D"),
    (lambda x: per_token_cast_and_cast_back(x.t(), "e4m3", 32), ValueError, "unit stride"),
    (lambda x: per_token_cast_and_cast_back(x[:1].expand(4, 128), "e4m3", 32), ValueError, "must not overlap"),
    (lambda x: per_token_cast_and_cast_back(x[:, :96], "e4m3", 32), ValueError, "multiple of 64"),
    (lambda x: per_token_cast_and_cast_back(torch.ones(4, 192), "e4m3", 128), ValueError,
     "multiple of num_per_channels"),
    (lambda x: per_token_cast_and_cast_back(x, "e4m3", 48), ValueError, "num_per_channels"),
    (lambda x: per_token_cast_and_cast_back(x, "e4m3", 256), ValueError, "num_per_channels"),
    (lambda x: per_token_cast_and_cast_back(x, "e5m2", 32), ValueError, "fmt"),
    (lambda x: per_token_cast_and_cast_back(x, None, 32), TypeError, "fmt"),
    (lambda x: per_token_cast_and_cast_back(x, "e4m3", 32, True, True), ValueError, "exclusive"),
    (lambda x: per_token_cast_and_cast_back(x, "e4m3", 32, round_sf=1), TypeError, "round_sf"),
    (lambda x: per_token_cast_and_cast_back(x, "e4m3", 32, use_e4m3_sf="no"), TypeError, "use_e4m3_sf"),
    (lambda x: per_token_cast_and_cast_back(x, "e4m3", 32, target="cuda"), ValueError, "target 'cuda'"),
    (lambda x: per_token_cast_and_cast_back(x, "e4m3", 32, target="tpu"), ValueError, "target must be one of"),
    (lambda x: per_token_cast_and_cast_back(x, "e4m3", 32, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda x: per_token_cast_and_cast_back_parallel(x, "e4m3", 32, target="torch"), ValueError,
     "always runs the kernel"),
])
def test_bad_arguments(call, error, match):
    x = X.clone()
    with pytest.raises(error, match=match):
        call(x)
    assert torch.equal(x, X), "x was modified"
