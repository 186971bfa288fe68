"""per_channel_cast: bad input raises a clear TypeError/ValueError naming the argument, before any
kernel runs (the op takes no preallocated outputs, so there is no overlap to refuse)."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_quant import reference
from vmi_quant.ops.per_channel_cast import per_channel_cast, per_channel_cast_parallel

no_kernel = no_kernel_fixture("vmi_quant.kernels.per_channel_cast")


X = torch.zeros(128, 256, dtype=torch.bfloat16)
Q, SF = reference.cast(X, "e4m3", (1, 32))
_, PACKED_SF = reference.cast(X, "e4m3", (1, 32), round_sf=True, use_packed_ue8m0=True, flavor="cuda")


@pytest.mark.parametrize("call,error,match", [
    (lambda: per_channel_cast(X.half(), "e4m3", 32), TypeError, "x must be bfloat16 or float32"),
    (lambda: per_channel_cast("x", "e4m3", 32), TypeError, "x must be a torch.Tensor"),
    (lambda: per_channel_cast(X.tolist(), "e4m3", 32), ValueError, "x must be a torch.Tensor or a \\(data, sf\\)"),
    (lambda: per_channel_cast(X[0], "e4m3", 32), ValueError, "x must be 2-D"),
    (lambda: per_channel_cast(X.t(), "e4m3", 32), ValueError, "unit stride"),
    (lambda: per_channel_cast(X[:64], "e4m3", 32), ValueError, "multiples of 128"),
    (lambda: per_channel_cast(X[:, :192], "e4m3", 32), ValueError, "multiples of 128"),
    (lambda: per_channel_cast(X, "e2m1", 32), ValueError, "fmt must be 'e4m3'"),
    (lambda: per_channel_cast(X, 4, 32), TypeError, "fmt"),
    (lambda: per_channel_cast(X, "e4m3", 64), ValueError, "num_per_tokens must be one of"),
    (lambda: per_channel_cast(X, "e4m3", 32.0), TypeError, "num_per_tokens"),
    (lambda: per_channel_cast(X, "e4m3", 32, num_per_channels=32), ValueError, "num_per_channels must be None"),
    (lambda: per_channel_cast(X, "e4m3", 32, use_packed_ue8m0=True), ValueError, "requires round_sf"),
    (lambda: per_channel_cast(X, "e4m3", 32, round_sf=1), TypeError, "round_sf"),
    (lambda: per_channel_cast(X, "e4m3", 32, round_sf=True, use_packed_ue8m0="yes"), TypeError, "use_packed_ue8m0"),
    (lambda: per_channel_cast((Q, SF), "e4m3", 32), ValueError, "num_per_channels is required"),
    (lambda: per_channel_cast((Q, SF), "e4m3", 32, num_per_channels=64), ValueError,
     "num_per_channels must be one of"),
    (lambda: per_channel_cast((Q, SF), "e4m3", 32, num_per_channels=128), ValueError, "x sf must have shape"),
    (lambda: per_channel_cast((Q, SF, SF), "e4m3", 32, num_per_channels=32), ValueError, "tuple"),
    (lambda: per_channel_cast((Q.view(torch.uint8), SF), "e4m3", 32, num_per_channels=32), TypeError,
     "x data must be float8_e4m3fn"),
    (lambda: per_channel_cast((Q.view(torch.int8)[:, :128], SF), "e4m3", 32, num_per_channels=32), TypeError,
     "x data must be float8_e4m3fn, got torch.int8"),
    (lambda: per_channel_cast((X, SF), "e4m3", 32, num_per_channels=32), TypeError, "x data must be"),
    (lambda: per_channel_cast((Q, SF.double()), "e4m3", 32, num_per_channels=32), TypeError, "x sf must be"),
    (lambda: per_channel_cast((Q, SF.tolist()), "e4m3", 32, num_per_channels=32), TypeError,
     "x sf must be a torch.Tensor"),
    (lambda: per_channel_cast((Q, PACKED_SF), "e4m3", 32, num_per_channels=32), TypeError,
     "the ascend flavor's word"),
    (lambda: per_channel_cast((Q, SF[:, ::2]), "e4m3", 32, num_per_channels=32), ValueError, "x sf"),
    (lambda: per_channel_cast((Q, SF.to("meta")), "e4m3", 32, num_per_channels=32), ValueError, "x sf is on"),
    (lambda: per_channel_cast((Q[:, ::2], SF), "e4m3", 32, num_per_channels=32), ValueError, "unit stride"),
    (lambda: per_channel_cast(X, "e4m3", 32, target="cuda"), ValueError, "target 'cuda'"),
    (lambda: per_channel_cast(X, "e4m3", 32, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: per_channel_cast(X, "e4m3", 32, target="ascend-sim", flavor="cuda"), ValueError, "flavor"),
    (lambda: per_channel_cast_parallel(X, "e4m3", 32, target="torch"), ValueError, "always runs the kernel"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()
