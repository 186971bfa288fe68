"""per_block_cast: bad input raises a clear TypeError/ValueError naming the argument, before any
kernel runs."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_quant import reference
from vmi_quant.ops.per_block_cast import (
    per_block_cast,
    per_block_cast_parallel,
    per_block_cast_with_precomputed_sf,
    per_block_cast_with_sf_only,
)

no_kernel = no_kernel_fixture("vmi_quant.kernels.per_block_cast")


X = torch.zeros(128, 256, dtype=torch.bfloat16)
B = (32, 32)


@pytest.mark.parametrize("call,error,match", [
    (lambda: per_block_cast(X.half(), "e4m3", B), TypeError, "x must be bfloat16 or float32"),
    (lambda: per_block_cast(X.tolist(), "e4m3", B), TypeError, "x must be a torch.Tensor"),
    (lambda: per_block_cast(X[0], "e4m3", B), ValueError, "x must be 2-D"),
    (lambda: per_block_cast(X.t(), "e4m3", B), ValueError, "unit stride"),
    (lambda: per_block_cast(X[:64], "e4m3", B), ValueError, "multiples of 128"),
    (lambda: per_block_cast(X[:, :192], "e4m3", B), ValueError, "multiples of 128"),
    (lambda: per_block_cast((X, X), "e4m3", B), TypeError, "needs a plain bf16/fp32 x"),
    (lambda: per_block_cast(X, "e4m3", (64, 32)), ValueError, "block_size"),
    (lambda: per_block_cast(X, "e4m3", (32, 1)), ValueError, "block_size"),
    (lambda: per_block_cast(X, "e4m3", [32, 32]), ValueError, "block_size must be a tuple"),
    (lambda: per_block_cast(X, "e4m3", (32,)), ValueError, "block_size"),
    (lambda: per_block_cast(X, "e4m3", 32), ValueError, "block_size"),
    (lambda: per_block_cast(X, "e5m2", B), ValueError, "fmt"),
    (lambda: per_block_cast(X, 4, B), TypeError, "fmt"),
    (lambda: per_block_cast(X, "e4m3", B, use_packed_ue8m0=True), ValueError, "use_packed_ue8m0 requires round_sf"),
    (lambda: per_block_cast(X, "e4m3", B, round_sf="yes"), TypeError, "round_sf"),
    (lambda: per_block_cast(X, "e4m3", B, use_tma_aligned_col_major_sf=1), TypeError,
     "use_tma_aligned_col_major_sf"),
    (lambda: per_block_cast(X, "e4m3", B, target="cuda"), ValueError, "target 'cuda'"),
    (lambda: per_block_cast(X, "e4m3", B, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: per_block_cast_parallel(X, "e4m3", B, target="torch"), ValueError, "always runs the kernel"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_bad_out_tensors():
    data, sf = reference.cast(X, "e4m3", B)
    with pytest.raises(TypeError, match="out must be a \\(data, sf\\) tuple"):
        per_block_cast(X, "e4m3", B, out=data)
    with pytest.raises(ValueError, match="out data must have shape"):
        per_block_cast(X, "e4m3", B, out=(data[:, :128], sf))
    with pytest.raises(TypeError, match="out data must have dtype"):
        per_block_cast(X, "e2m1", B, out=(data, sf))
    with pytest.raises(ValueError, match="out_sf must have shape"):
        per_block_cast(X, "e4m3", B, out=(data, sf[:, :2]))
    with pytest.raises(TypeError, match="out_sf must have dtype"):
        per_block_cast(X, "e4m3", B, out=(data, sf.double()))
    with pytest.raises(TypeError, match="out_sf must have dtype torch.int16"):
        per_block_cast_with_sf_only(X, "e4m3", B, round_sf=True, use_packed_ue8m0=True, out_sf=sf)
    with pytest.raises(ValueError, match="out_sf must have shape"):
        per_block_cast_with_sf_only(X, "e4m3", (32, 128), out_sf=sf)


def test_bad_precomputed_sf():
    _, sf = reference.cast(X, "e4m3", B)
    with pytest.raises(TypeError, match="sf must be a torch.Tensor"):
        per_block_cast_with_precomputed_sf(X, "e4m3", B, None)
    with pytest.raises(ValueError, match="row-major and unpacked"):
        per_block_cast_with_precomputed_sf(X, "e4m3", B, sf, round_sf=True, use_packed_ue8m0=True)
    with pytest.raises(ValueError, match="row-major and unpacked"):
        per_block_cast_with_precomputed_sf(X, "e4m3", B, sf, use_tma_aligned_col_major_sf=True)
    with pytest.raises(TypeError, match="sf must be float32"):
        per_block_cast_with_precomputed_sf(X, "e4m3", B, sf.to(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match="sf must have shape"):
        per_block_cast_with_precomputed_sf(X, "e4m3", (128, 32), sf)
    with pytest.raises(ValueError, match="sf must be row-major"):
        per_block_cast_with_precomputed_sf(X, "e4m3", B, sf.t().contiguous().t())
    with pytest.raises(ValueError, match="sf is on"):
        per_block_cast_with_precomputed_sf(X, "e4m3", B, sf.to("meta"))
