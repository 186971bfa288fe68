"""Bad input raises a clear TypeError/ValueError naming the argument, before any kernel runs."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_quant import (
    per_token_cast,
    per_token_cast_parallel,
    per_token_cast_with_precomputed_sf,
    per_token_cast_with_sf_only,
    reference,
)

no_kernel = no_kernel_fixture("vmi_quant.kernels.per_token_cast")


X = torch.zeros(4, 128, dtype=torch.bfloat16)


@pytest.mark.parametrize("call,error,match", [
    (lambda: per_token_cast(X.half(), "e4m3", 32), TypeError, "x must be bfloat16 or float32"),
    (lambda: per_token_cast(X.int(), "e4m3", 32), TypeError, "x must be"),
    (lambda: per_token_cast(X[0], "e4m3", 32), ValueError, "x must be 2-D"),
    (lambda: per_token_cast(X.view(2, 2, 128), "e4m3", 32), ValueError, "x must be 2-D"),
    (lambda: per_token_cast(X.t(), "e4m3", 32), ValueError, "unit stride"),
    (lambda: per_token_cast(torch.zeros(4, 96), "e4m3", 32), ValueError, "multiple of 64"),
    (lambda: per_token_cast(X, "e4m3", 48), ValueError, "num_per_channels"),
    (lambda: per_token_cast(X, "e4m3", 256), ValueError, "num_per_channels"),
    (lambda: per_token_cast(X, "e5m2", 32), ValueError, "fmt"),
    (lambda: per_token_cast(X, 4, 32), TypeError, "fmt"),
    (lambda: per_token_cast(X, "e4m3", 32, use_packed_ue8m0=True), ValueError, "use_packed_ue8m0 requires round_sf"),
    (lambda: per_token_cast(X, "e4m3", 32, round_sf=True, use_e4m3_sf=True), ValueError, "exclusive"),
    (lambda: per_token_cast(X, "e4m3", 32, round_sf=1), TypeError, "round_sf"),
    (lambda: per_token_cast(X, "e4m3", 32, stochastic_cast="yes"), TypeError, "stochastic_cast"),
    (lambda: per_token_cast(X, "e4m3", 32, x_block_size=(1, 32)), ValueError, "x_block_size must be None"),
    (lambda: per_token_cast(X, "e4m3", 32, target="cuda"), ValueError, "target 'cuda'"),
    (lambda: per_token_cast(X, "e4m3", 32, target="tpu"), ValueError, "target must be one of"),
    (lambda: per_token_cast(X, "e4m3", 32, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: per_token_cast_parallel(X, "e4m3", 32, target="torch"), ValueError, "always runs the kernel"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def _quantized(flavor="ascend", **options):
    return reference.cast(torch.randn(64, 128), "e4m3", (32, 32), flavor=flavor, **options)


def test_bad_quantized_input():
    data, sf = _quantized()
    with pytest.raises(ValueError, match="x_block_size is required"):
        per_token_cast((data, sf), "e4m3", 32)
    with pytest.raises(ValueError, match=r"x_block_size\[0\] must be in \[1, 2147483647\], got 0"):
        per_token_cast((data, sf), "e4m3", 32, x_block_size=(0, 32))
    with pytest.raises(TypeError, match="x data must be float8_e4m3fn or int8"):
        per_token_cast((data.float(), sf), "e4m3", 32, x_block_size=(32, 32))
    with pytest.raises(ValueError, match="x sf must have shape"):
        per_token_cast((data, sf[:1]), "e4m3", 32, x_block_size=(32, 32))
    with pytest.raises(ValueError, match="\\(data, sf\\) tuple"):
        per_token_cast((data, sf, sf), "e4m3", 32, x_block_size=(32, 32))
    # Packed words must be the flavor's: int32 quads are not the ascend flavor's int16 pairs.
    packed_data, packed_sf = _quantized("cuda", round_sf=True, use_packed_ue8m0=True)
    with pytest.raises(TypeError, match="x sf must be float32, float8_e4m3fn or packed UE8M0 torch.int16"):
        per_token_cast((packed_data, packed_sf), "e4m3", 32, x_block_size=(32, 32), flavor="ascend")
    with pytest.raises(ValueError, match="needs a plain bf16/fp32 x"):
        per_token_cast_with_sf_only((data, sf), "e4m3", 32)


def test_bad_out_tensors():
    data, sf = per_token_cast(X, "e4m3", 32, target="torch")
    with pytest.raises(TypeError, match="out must be a \\(data, sf\\) tuple"):
        per_token_cast(X, "e4m3", 32, out=data)
    with pytest.raises(ValueError, match="out data must have shape"):
        per_token_cast(X, "e4m3", 32, out=(data[:, :64], sf))
    with pytest.raises(TypeError, match="out data must have dtype"):
        per_token_cast(X, "e2m1", 32, out=(data, sf))
    with pytest.raises(ValueError, match="out_sf must have shape"):
        per_token_cast(X, "e4m3", 32, out=(data, sf[:, :2]))
    with pytest.raises(TypeError, match="out_sf must have dtype"):
        per_token_cast(X, "e4m3", 32, out=(data, sf.double()))
    with pytest.raises(ValueError, match="out_sf must have shape"):
        per_token_cast_with_sf_only(X, "e4m3", 64, out_sf=sf)


def test_bad_precomputed_sf():
    _, sf = per_token_cast(X, "e4m3", 32, target="torch")
    with pytest.raises(TypeError, match="sf must be a torch.Tensor"):
        per_token_cast_with_precomputed_sf(X, "e4m3", 32, sf.tolist())
    with pytest.raises(ValueError, match="row-major and unpacked"):
        per_token_cast_with_precomputed_sf(X, "e4m3", 32, sf, round_sf=True, use_packed_ue8m0=True)
    with pytest.raises(TypeError, match="sf must be float8_e4m3fn with use_e4m3_sf=True"):
        per_token_cast_with_precomputed_sf(X, "e4m3", 32, sf, use_e4m3_sf=True)
    with pytest.raises(ValueError, match="sf must have shape"):
        per_token_cast_with_precomputed_sf(X, "e4m3", 64, sf)
