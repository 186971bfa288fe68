"""norm_backward: bad input raises a clear TypeError/ValueError naming the argument before any kernel
runs, and a given weight_grad is left as it was."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_quant.ops.norm_backward import norm_backward, norm_backward_parallel

X = torch.ones(8, 256, dtype=torch.bfloat16)
G = torch.ones(8, 256, dtype=torch.bfloat16)
W = torch.ones(256, dtype=torch.bfloat16)
RSTD = torch.ones(8)
BUFFER = torch.full((256,), 3.0)


no_kernel = no_kernel_fixture("vmi_quant.kernels.norm_backward")


def _wide(rows, cols, dtype=torch.bfloat16):
    return torch.ones(rows, cols, dtype=dtype)


@pytest.mark.parametrize("call,error,match", [
    (lambda: norm_backward(G, X.half(), W, RSTD), TypeError, "x must be bfloat16 or float32"),
    (lambda: norm_backward(G, "x", W, RSTD), TypeError, "x must be a torch.Tensor"),
    (lambda: norm_backward(G, X[0], W, RSTD), ValueError, "x must be 2-D"),
    (lambda: norm_backward(G, X.t(), W, RSTD), ValueError, "x must have unit stride"),
    (lambda: norm_backward(G, _wide(8, 250), W, RSTD), ValueError, "multiple of 32"),
    (lambda: norm_backward(G, _wide(8, 8224), W, RSTD), ValueError, "up to 8192"),
    (lambda: norm_backward(G.float(), X, W, RSTD), TypeError, "out_grad must have x's dtype"),
    (lambda: norm_backward(G[:4], X, W, RSTD), ValueError, "out_grad must have x's shape"),
    (lambda: norm_backward(G.t().contiguous().t(), X, W, RSTD), ValueError, "out_grad must have unit stride"),
    (lambda: norm_backward(None, X, W, RSTD), TypeError, "out_grad must be a torch.Tensor"),
    (lambda: norm_backward(G.to("meta"), X, W, RSTD), ValueError, "out_grad is on meta"),
    (lambda: norm_backward(G, X, W, RSTD, G.float()), TypeError, "residual_out_grad must have x's dtype"),
    (lambda: norm_backward(G, X, W, RSTD, G[:, :128]), ValueError, "residual_out_grad must have x's shape"),
    (lambda: norm_backward(G, X, W, RSTD.double()), TypeError, "rstd must be torch.float32"),
    (lambda: norm_backward(G, X, W, RSTD[:4]), ValueError, "rstd must have shape"),
    (lambda: norm_backward(G, X, W, torch.ones(16)[::2]), ValueError, "rstd must be contiguous"),
    (lambda: norm_backward(G, X, W, RSTD.to("meta")), ValueError, "rstd is on meta"),
    (lambda: norm_backward(G, X, W.float(), RSTD), TypeError, "weight must be torch.bfloat16"),
    (lambda: norm_backward(G, X, W[:128], RSTD), ValueError, "weight must have shape"),
    (lambda: norm_backward(G, X, torch.ones(512, dtype=torch.bfloat16)[::2], RSTD), ValueError,
     "weight must be contiguous"),
    (lambda: norm_backward(G, X, W, RSTD, out_scale="0.3"), TypeError, "out_scale"),
    (lambda: norm_backward(G, X, W, RSTD, out_scale=float("inf")), ValueError, "out_scale must be finite"),
    (lambda: norm_backward(G, X, None, RSTD, weight_grad=BUFFER), ValueError, "weight_grad needs a weight"),
    (lambda: norm_backward(G, X, W, RSTD, weight_grad=BUFFER.half()), TypeError, "weight_grad must be"),
    (lambda: norm_backward(G, X, W, RSTD, weight_grad=BUFFER[:128]), ValueError, "weight_grad must have shape"),
    (lambda: norm_backward(G, X, W, RSTD, weight_grad=torch.ones(512)[::2]), ValueError,
     "weight_grad must be contiguous"),
    (lambda: norm_backward(G, X, W, RSTD, weight_grad=BUFFER.to("meta")), ValueError, "weight_grad is on meta"),
    (lambda: norm_backward(G, X, W, RSTD, weight_grad=BUFFER.clone().requires_grad_()), RuntimeError, "weight_grad"),
    (lambda: norm_backward(G, X, W, RSTD, target="cuda"), ValueError, "target 'cuda'"),
    (lambda: norm_backward(G, X, W, RSTD, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: norm_backward(G, X, W, RSTD, target="ascend-sim", flavor="cuda"), ValueError, "flavor"),
    (lambda: norm_backward_parallel(G, X, W, RSTD, target="torch"), ValueError, "always runs the kernel"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_weight_grad_overlapping_an_input_is_refused():
    # The gradient buffer aliasing the weight (the same storage), an input row, or rstd.
    weight = torch.ones(256)
    x, out_grad = torch.ones(8, 256), torch.ones(8, 256)
    rstd = torch.ones(256)
    for buffer, name in ((weight, "weight"), (x[3], "x"), (out_grad[0], "out_grad"), (rstd, "rstd")):
        before = buffer.clone()
        with pytest.raises(ValueError, match=f"weight_grad shares memory with {name}"):
            norm_backward(out_grad, x, weight, rstd[:8], weight_grad=buffer)
        assert torch.equal(buffer, before)
