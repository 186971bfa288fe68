"""norm_forward and norm_forward_and_per_token_cast: bad input raises a clear TypeError/ValueError
naming the argument, before any kernel runs and without touching a given output."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_quant.ops.norm_forward import norm_forward, norm_forward_and_per_token_cast

no_kernel = no_kernel_fixture("vmi_quant.kernels.norm_forward")


X = torch.ones(64, 256, dtype=torch.bfloat16)
W = torch.ones(256, dtype=torch.bfloat16)
EPS = 1e-6


def _mega(tokens=64, words=2, stride=128):
    return torch.full((words * stride,), -1, dtype=torch.int32).as_strided((tokens, words), (1, stride))


def nf(*args, **kwargs):
    return norm_forward(*args, **kwargs)


def cast(x=X, weight=W, eps=EPS, fmt="e4m3", npc=32, **kwargs):
    return norm_forward_and_per_token_cast(x, weight, eps, fmt, npc, **kwargs)


NORM_ERRORS = [
    (lambda: nf("x", W, EPS), TypeError, "x must be a torch.Tensor"),
    (lambda: nf(X.half(), W.half(), EPS), TypeError, "x must be bfloat16 or float32"),
    (lambda: nf(X[0], W, EPS), ValueError, "x must be 2-D"),
    (lambda: nf(X.view(2, 2, 16, 256), W, EPS), ValueError, "x must be 2-D"),
    (lambda: nf(X.t(), None, EPS), ValueError, "unit stride"),
    (lambda: nf(torch.ones(4, 8200, dtype=torch.bfloat16), None, EPS), ValueError, "hidden size of x must be in"),
    (lambda: nf(X[:, :0], None, EPS), ValueError, "hidden size of x must be in"),
    (lambda: nf(X, W.float(), EPS), TypeError, "weight must be torch.bfloat16"),
    (lambda: nf(X, W[:128], EPS), ValueError, "weight must have shape"),
    (lambda: nf(X, torch.ones(512, dtype=torch.bfloat16)[::2], EPS), ValueError, "weight must be contiguous"),
    (lambda: nf(X, [1.0] * 256, EPS), TypeError, "weight"),
    (lambda: nf(X, W, "1e-6"), TypeError, "eps"),
    (lambda: nf(X, W, 0.0), ValueError, "eps must be in"),
    (lambda: nf(X, W, float("nan")), ValueError, "eps must be in"),
    (lambda: nf(X, W, EPS, out_scale=float("inf")), ValueError, "out_scale must be finite"),
    (lambda: nf(X, W, EPS, out_scale="2"), TypeError, "out_scale"),
    (lambda: nf(X, W, EPS, X.float()), TypeError, "residual must be torch.bfloat16"),
    (lambda: nf(X, W, EPS, X[:32]), ValueError, "residual must have shape"),
    (lambda: nf(X, W, EPS, torch.ones(256, 64, dtype=torch.bfloat16).t()), ValueError, "residual must have unit"),
    (lambda: nf(X, W, EPS, out=X[:32].clone()), ValueError, "out must have shape"),
    (lambda: nf(X, W, EPS, out=X.float()), TypeError, "out must be torch.bfloat16"),
    (lambda: nf(X, W, EPS, out=X), ValueError, "out shares memory with x"),
    (lambda: nf(X, W, EPS, out=torch.ones(1, 256, dtype=torch.bfloat16).expand(64, 256)), ValueError,
     "elements that share memory"),
    (lambda: nf(X, W, EPS, X.clone(), residual_out=X), ValueError, "residual_out shares memory with x"),
    (lambda: nf(X, W, EPS, X.clone(), residual_out=X[:4].clone()), ValueError, "residual_out must have shape"),
    (lambda: nf(X, W, EPS, target="npu"), ValueError, "target must be one of"),
    (lambda: nf(X, W, EPS, target="ascend-sim", flavor="cuda"), ValueError, "flavor 'cuda' is not available"),
]


@pytest.mark.parametrize("call,error,match", NORM_ERRORS)
def test_norm_forward_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


CAST_ERRORS = [
    (lambda: cast(fmt="e2m1"), ValueError, "fmt must be 'e4m3'"),
    (lambda: cast(fmt=3), TypeError, "fmt"),
    (lambda: cast(npc=128), ValueError, "num_per_channels must be 32"),
    (lambda: cast(npc=32.0), TypeError, "num_per_channels"),
    (lambda: cast(x=torch.ones(4, 200, dtype=torch.bfloat16), weight=None), ValueError, "multiple of 32"),
    (lambda: cast(round_sf=1), TypeError, "round_sf"),
    (lambda: cast(with_out_bf16=None), TypeError, "with_out_bf16"),
    (lambda: cast(use_tma_aligned_col_major_sf="no"), TypeError, "use_tma_aligned_col_major_sf"),
    (lambda: cast(use_packed_ue8m0=True), ValueError, "requires round_sf"),
    (lambda: cast(out_bf16=X.clone()), ValueError, "out_bf16 is given but with_out_bf16 is False"),
    (lambda: cast(with_out_bf16=True, out_bf16=X.float()), TypeError, "out_bf16 must be torch.bfloat16"),
    (lambda: cast(out=X), TypeError, "out must be a \\(data, sf\\) tuple"),
    (lambda: cast(out=(X, None)), TypeError, "out data must be torch.float8_e4m3fn"),
    (lambda: cast(out=(None, torch.zeros(64, 4))), ValueError, "out sf must have shape"),
    (lambda: cast(out=(None, torch.zeros(64, 8, dtype=torch.int16))), TypeError, "out sf must be torch.float32"),
    (lambda: cast(out=(None, torch.zeros(8, 64).t())), ValueError, "out sf must be row-major"),
    (lambda: cast(use_tma_aligned_col_major_sf=True, out=(None, torch.zeros(64, 8))), ValueError,
     "out sf must be None with use_tma_aligned_col_major_sf"),
    (lambda: cast(mega_moe_sf=_mega()), ValueError, "give both or neither"),
    (lambda: cast(mega_moe_block_m=64), ValueError, "give both or neither"),
    (lambda: cast(mega_moe_sf=_mega(), mega_moe_block_m=64), ValueError, "needs round_sf"),
    (lambda: cast(mega_moe_sf=_mega(), mega_moe_block_m=-64, round_sf=True), ValueError, "must be > 0"),
    (lambda: cast(mega_moe_sf=_mega(), mega_moe_block_m=64.0, round_sf=True), TypeError, "mega_moe_block_m"),
    (lambda: cast(x=X.view(2, 32, 256), mega_moe_sf=_mega(tokens=32), mega_moe_block_m=64, round_sf=True), ValueError,
     "needs a 2-D x"),
    (lambda: cast(x=torch.ones(64, 96, dtype=torch.bfloat16), weight=None, mega_moe_sf=_mega(words=1),
                  mega_moe_block_m=64, round_sf=True), ValueError, "multiple of 128"),
    (lambda: cast(mega_moe_sf=_mega().float(), mega_moe_block_m=64, round_sf=True), TypeError,
     "mega_moe_sf must be torch.int32"),
    (lambda: cast(mega_moe_sf=_mega(words=3), mega_moe_block_m=64, round_sf=True), ValueError,
     "mega_moe_sf must have shape"),
    (lambda: cast(mega_moe_sf=torch.zeros(64, 2, dtype=torch.int32), mega_moe_block_m=64, round_sf=True),
     ValueError, "M-major"),
    (lambda: cast(mega_moe_sf=_mega(stride=100), mega_moe_block_m=64, round_sf=True), ValueError,
     "stride\\(1\\) >= 128"),
    (lambda: cast(X, None, EPS, residual=X.clone(), residual_out=X), ValueError, "residual_out shares memory"),
    (lambda: cast(with_out_bf16=True, out_bf16=X), ValueError, "out_bf16 shares memory with x"),
]


@pytest.mark.parametrize("call,error,match", CAST_ERRORS)
def test_norm_forward_and_per_token_cast_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_outputs_untouched_on_error():
    out = torch.full((64, 256), 7.0, dtype=torch.bfloat16)
    residual_out = torch.full((64, 256), 5.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="eps"):
        norm_forward(X, W, 0.0, X.clone(), out=out, residual_out=residual_out)
    assert (out == 7).all() and (residual_out == 5).all()
    data = torch.full((64, 256), 3.0).to(torch.float8_e4m3fn)
    mega = _mega()
    with pytest.raises(ValueError, match="needs round_sf"):
        norm_forward_and_per_token_cast(X, W, EPS, "e4m3", 32, out=(data, None), mega_moe_sf=mega,
                                        mega_moe_block_m=64)
    assert (data.float() == 3).all() and (mega == -1).all()
