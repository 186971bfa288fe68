"""expand: bad input raises a clear TypeError/ValueError naming the argument before any kernel runs,
and the output is left as it was."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_mhc import expand_to_mhc_bwd, expand_to_mhc_fwd, expand_to_mhc_fwd_parallel

X = torch.ones(8, 64, dtype=torch.bfloat16)
O = torch.full((8, 4, 64), 3.0, dtype=torch.bfloat16)
OG = torch.ones(8, 4, 64, dtype=torch.bfloat16)
XG = torch.full((8, 64), 3.0, dtype=torch.bfloat16)


no_kernel = no_kernel_fixture("vmi_mhc.kernels.expand")


def _o(*shape, dtype=torch.bfloat16):
    return torch.full(shape, 3.0, dtype=dtype)


@pytest.mark.parametrize("call,error,match", [
    (lambda o: expand_to_mhc_fwd(X.float(), o), TypeError, "x must be torch.bfloat16"),
    (lambda o: expand_to_mhc_fwd("x", o), TypeError, "x must be a torch.Tensor"),
    (lambda o: expand_to_mhc_fwd(X[0], o), ValueError, "x must be 2-D"),
    (lambda o: expand_to_mhc_fwd(X.t(), o), ValueError, "x must be contiguous"),
    (lambda o: expand_to_mhc_fwd(X.to("meta"), o), ValueError, "o must be on meta"),
    (lambda o: expand_to_mhc_fwd(X[:, :0], _o(8, 4, 0)), ValueError, "x must have a hidden size of at least 1"),
    (lambda o: expand_to_mhc_fwd(X, "o"), TypeError, "o must be a torch.Tensor"),
    (lambda o: expand_to_mhc_fwd(X, o[0]), ValueError, "o must be 3-D"),
    (lambda o: expand_to_mhc_fwd(X, o.float()), TypeError, "o must be torch.bfloat16"),
    (lambda o: expand_to_mhc_fwd(X, o[:4]), ValueError, r"o must have shape \(8, 4, 64\)"),
    (lambda o: expand_to_mhc_fwd(X, o[:, :, :32]), ValueError, r"o must have shape \(8, 4, 64\)"),
    (lambda o: expand_to_mhc_fwd(X, _o(8, 64, 4).transpose(1, 2)), ValueError, "o must be contiguous"),
    (lambda o: expand_to_mhc_fwd(X, _o(8, 0, 64)), ValueError, r"mhc_mult must be in \[1, 16\]"),
    (lambda o: expand_to_mhc_fwd(X, _o(8, 17, 64)), ValueError, r"mhc_mult must be in \[1, 16\]"),
    (lambda o: expand_to_mhc_fwd(X, o.to("meta")), ValueError, "o must be on cpu"),
    (lambda o: expand_to_mhc_fwd(X, o.clone().requires_grad_()), RuntimeError, "o"),
    (lambda o: expand_to_mhc_fwd(X, o, target="cuda"), ValueError, "target 'cuda'"),
    (lambda o: expand_to_mhc_fwd(X, o, target=3), TypeError, "target must be a str"),
    (lambda o: expand_to_mhc_fwd(X, o, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda o: expand_to_mhc_fwd(X, o, target="ascend-sim", flavor="cuda"), ValueError, "flavor"),
    (lambda o: expand_to_mhc_fwd_parallel(X, o, target="torch"), ValueError, "always runs the kernel"),
])
def test_bad_forward_arguments(call, error, match):
    o = O.clone()
    with pytest.raises(error, match=match):
        call(o)
    assert torch.equal(o, O), "the output was written"


@pytest.mark.parametrize("call,error,match", [
    (lambda xg: expand_to_mhc_bwd(OG.float(), xg), TypeError, "o_grad must be torch.bfloat16"),
    (lambda xg: expand_to_mhc_bwd(None, xg), TypeError, "o_grad must be a torch.Tensor"),
    (lambda xg: expand_to_mhc_bwd(OG[0], xg), ValueError, "o_grad must be 3-D"),
    (lambda xg: expand_to_mhc_bwd(OG.transpose(1, 2).contiguous().transpose(1, 2), xg), ValueError,
     "o_grad must be contiguous"),
    (lambda xg: expand_to_mhc_bwd(_o(8, 17, 64), xg), ValueError, r"number of streams\) must be in \[1, 16\]"),
    (lambda xg: expand_to_mhc_bwd(_o(8, 0, 64), xg), ValueError, r"number of streams\) must be in \[1, 16\]"),
    (lambda xg: expand_to_mhc_bwd(_o(8, 4, 0), _o(8, 0)), ValueError, "o_grad must have a hidden size"),
    (lambda xg: expand_to_mhc_bwd(OG, "x_grad"), TypeError, "x_grad must be a torch.Tensor"),
    (lambda xg: expand_to_mhc_bwd(OG, xg.float()), TypeError, "x_grad must be torch.bfloat16"),
    (lambda xg: expand_to_mhc_bwd(OG, xg[:4]), ValueError, r"x_grad must have shape \(8, 64\)"),
    (lambda xg: expand_to_mhc_bwd(OG, _o(64, 8).t()), ValueError, "x_grad must be contiguous"),
    (lambda xg: expand_to_mhc_bwd(OG, xg.to("meta")), ValueError, "x_grad must be on cpu"),
    (lambda xg: expand_to_mhc_bwd(OG, xg.clone().requires_grad_()), RuntimeError, "x_grad"),
    (lambda xg: expand_to_mhc_bwd(OG, xg, target="ascend"), ValueError, "target 'ascend'"),
])
def test_bad_backward_arguments(call, error, match):
    x_grad = XG.clone()
    with pytest.raises(error, match=match):
        call(x_grad)
    assert torch.equal(x_grad, XG), "the output was written"


def test_outputs_overlapping_inputs_are_refused():
    # x inside o's memory; x_grad inside o_grad's.
    shared = torch.ones(8 * 4 * 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="o shares memory with x"):
        expand_to_mhc_fwd(shared[:8 * 64].view(8, 64), shared.view(8, 4, 64))
    with pytest.raises(ValueError, match="x_grad shares memory with o_grad"):
        expand_to_mhc_bwd(shared.view(8, 4, 64), shared[-8 * 64:].view(8, 64))
    assert torch.equal(shared, torch.ones_like(shared))
