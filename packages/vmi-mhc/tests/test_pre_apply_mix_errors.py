"""pre_apply_mix: bad input raises a clear TypeError/ValueError naming the argument before any kernel
runs, and the output (or the accumulated x_grad) is left as it was."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_mhc import mhc_pre_apply_mix_bwd, mhc_pre_apply_mix_bwd_parallel, mhc_pre_apply_mix_fwd
from vmi_mhc.kernels.pre_apply_mix import max_hidden

X = torch.ones(8, 4, 64, dtype=torch.bfloat16)
MIX = torch.full((8, 4), 0.25)
O = torch.full((8, 64), 3.0, dtype=torch.bfloat16)
OG = torch.ones(8, 64, dtype=torch.bfloat16)
XG = torch.full((8, 4, 64), 3.0, dtype=torch.bfloat16)


no_kernel = no_kernel_fixture("vmi_mhc.kernels.pre_apply_mix")


def _full(*shape, dtype=torch.bfloat16):
    return torch.full(shape, 1.0, dtype=dtype)


@pytest.mark.parametrize("call,error,match", [
    (lambda o: mhc_pre_apply_mix_fwd(X.float(), MIX, o), TypeError, "x must be torch.bfloat16"),
    (lambda o: mhc_pre_apply_mix_fwd([X], MIX, o), TypeError, "x must be a torch.Tensor"),
    (lambda o: mhc_pre_apply_mix_fwd(X[0], MIX, o), ValueError, "x must be 3-D"),
    (lambda o: mhc_pre_apply_mix_fwd(X.transpose(1, 2).contiguous().transpose(1, 2), MIX, o), ValueError,
     "x must be contiguous"),
    (lambda o: mhc_pre_apply_mix_fwd(_full(8, 17, 64), _full(8, 17, dtype=torch.float32), o), ValueError,
     r"number of streams\) must be in \[1, 16\]"),
    (lambda o: mhc_pre_apply_mix_fwd(_full(8, 4, 0), MIX, _full(8, 0)), ValueError, "x must have a hidden size"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX.double(), o), TypeError, "mix must be torch.float32"),
    (lambda o: mhc_pre_apply_mix_fwd(X, "mix", o), TypeError, "mix must be a torch.Tensor"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX[:, :3].contiguous(), o), ValueError,
     r"mix must have shape \(8, 4\) or \(8, 4, 1\)"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX.view(8, 1, 4), o), ValueError, "mix must have shape"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX.view(8, 2, 2), o), ValueError, "mix must have shape"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX.t().contiguous().t(), o), ValueError, "mix must be contiguous"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX.to("meta"), o), ValueError, "mix must be on cpu"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX, "o"), TypeError, "o must be a torch.Tensor"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX, o.float()), TypeError, "o must be torch.bfloat16"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX, o[:4]), ValueError, r"o must have shape \(8, 64\)"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX, _full(64, 8).t()), ValueError, "o must be contiguous"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX, o.to("meta")), ValueError, "o must be on cpu"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX, o.clone().requires_grad_()), RuntimeError, "o"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX, o, target="cuda"), ValueError, "target 'cuda'"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX, o, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda o: mhc_pre_apply_mix_fwd(X, MIX, o, target="ascend-sim", flavor="cuda"), ValueError, "flavor"),
])
def test_bad_forward_arguments(call, error, match):
    o = O.clone()
    with pytest.raises(error, match=match):
        call(o)
    assert torch.equal(o, O), "the output was written"


@pytest.mark.parametrize("call,error,match", [
    (lambda xg: mhc_pre_apply_mix_bwd(OG.float(), X, MIX, xg), TypeError, "o_grad must be torch.bfloat16"),
    (lambda xg: mhc_pre_apply_mix_bwd(None, X, MIX, xg), TypeError, "o_grad must be a torch.Tensor"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG[:4], X, MIX, xg), ValueError, r"o_grad must have shape \(8, 64\)"),
    (lambda xg: mhc_pre_apply_mix_bwd(_full(64, 8).t(), X, MIX, xg), ValueError, "o_grad must be contiguous"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG.to("meta"), X, MIX, xg), ValueError, "o_grad must be on cpu"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG, X.half(), MIX, xg), TypeError, "x must be torch.bfloat16"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG, X[0], MIX, xg), ValueError, "x must be 3-D"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG, _full(8, 0, 64), MIX[:, :0], xg[:, :0]), ValueError,
     r"number of streams\) must be in \[1, 16\]"),
    (lambda xg: mhc_pre_apply_mix_bwd(_full(8, max_hidden(4) + 1), _full(8, 4, max_hidden(4) + 1), MIX,
                                      _full(8, 4, max_hidden(4) + 1)), ValueError,
     rf"hidden size must be at most {max_hidden(4)} for 4 streams"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG, X, MIX.double(), xg), TypeError, "mix must be torch.float32"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG, X, MIX[:4], xg), ValueError, "mix must have shape"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG, X, MIX, "x_grad"), TypeError, "x_grad must be a torch.Tensor"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG, X, MIX, xg.float()), TypeError, "x_grad must be torch.bfloat16"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG, X, MIX, xg[:, :2]), ValueError, r"x_grad must have shape \(8, 4, 64\)"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG, X, MIX, xg.to("meta")), ValueError, "x_grad must be on cpu"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG, X, MIX, xg.requires_grad_()), RuntimeError, "x_grad"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG, X, MIX, xg, target="ascend"), ValueError, "target 'ascend'"),
    (lambda xg: mhc_pre_apply_mix_bwd(OG, X, MIX, xg, flavor=4), TypeError, "flavor must be a str"),
    (lambda xg: mhc_pre_apply_mix_bwd_parallel(OG, X, MIX, xg, target="torch"), ValueError,
     "always runs the kernel"),
])
def test_bad_backward_arguments(call, error, match):
    x_grad = XG.clone()
    with pytest.raises(error, match=match):
        call(x_grad)
    assert torch.equal(x_grad.detach(), XG), "x_grad was written"


def test_outputs_overlapping_inputs_are_refused():
    # o over x's memory; x_grad aliasing x, over o_grad's memory, or over mix's.
    x = torch.ones(8, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="o shares memory with x"):
        mhc_pre_apply_mix_fwd(x, MIX, x.view(-1)[:8 * 64].view(8, 64))
    with pytest.raises(ValueError, match="x_grad shares memory with x"):
        mhc_pre_apply_mix_bwd(OG, x, MIX, x)
    pool = torch.ones(8 * 4 * 64 + 8 * 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="x_grad shares memory with o_grad"):
        mhc_pre_apply_mix_bwd(pool[-8 * 64:].view(8, 64), x, MIX, pool[8 * 64:].view(8, 4, 64))
    floats = torch.ones(8 * 4 * 64 // 2 + 32)
    with pytest.raises(ValueError, match="x_grad shares memory with mix"):
        mhc_pre_apply_mix_bwd(OG, x, floats[:32].view(8, 4), floats[16:16 + 8 * 4 * 32].view(torch.bfloat16)
                              .view(8, 4, 64))
    assert torch.equal(x, torch.ones_like(x)) and torch.equal(pool, torch.ones_like(pool))
