"""pre_split_mixes: bad input raises a clear TypeError/ValueError naming the argument before any
kernel runs, and given outputs are left as they were."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_mhc import mhc_pre_split_mixes_bwd, mhc_pre_split_mixes_fwd

T = 8
X = torch.ones(T, 24)
SCALE = torch.ones(3)
BASE = torch.ones(24)
MIX = torch.ones(T, 4)
COMB = torch.ones(T, 16)


no_kernel = no_kernel_fixture("vmi_mhc.kernels.pre_split_mixes")


def fwd(x=X, scale=SCALE, base=BASE, pre=None, post=None, comb=None, post_mult=2.0, pre_eps=1e-2, **kwargs):
    return mhc_pre_split_mixes_fwd(x, scale, base, pre, post, comb, post_mult, pre_eps, **kwargs)


def bwd(d_pre=MIX, d_post=MIX, d_comb=COMB, x=X, post=MIX, scale=SCALE, base=BASE, dx=None, scale_grad=None,
        base_grad=None, post_mult=2.0, **kwargs):
    return mhc_pre_split_mixes_bwd(d_pre, d_post, d_comb, x, post, scale, base, dx, scale_grad, base_grad, post_mult,
                                   **kwargs)


def _strided(rows, cols):
    return torch.ones(rows, 2 * cols)[:, ::2]


SHARED = torch.ones(T, 40)

FWD_CASES = [
    (lambda: fwd(x="x"), TypeError, "input_mixes must be a torch.Tensor"),
    (lambda: fwd(x=X.double()), TypeError, "input_mixes must be torch.float32"),
    (lambda: fwd(x=X[0]), ValueError, "input_mixes must have shape"),
    (lambda: fwd(x=_strided(T, 24)), ValueError, "input_mixes must be contiguous"),
    (lambda: fwd(x=torch.ones(T, 23)), ValueError, "input_mixes must have n·\\(n\\+2\\) = 24 columns"),
    (lambda: fwd(x=torch.ones(T, 8), pre=torch.ones(T, 2)), ValueError,
     "pre_layer_mix.size\\(1\\) \\(n\\) must be 4"),
    (lambda: fwd(pre=torch.ones(T, 3)), ValueError, "pre_layer_mix.size\\(1\\) \\(n\\) must be 4"),
    (lambda: fwd(scale=SCALE.double()), TypeError, "mhc_scale must be torch.float32"),
    (lambda: fwd(scale=torch.ones(4)), ValueError, "mhc_scale must have shape"),
    (lambda: fwd(scale=torch.ones(6)[::2]), ValueError, "mhc_scale must be contiguous"),
    (lambda: fwd(scale=SCALE.to("meta")), ValueError, "mhc_scale must be on cpu"),
    (lambda: fwd(base=None), TypeError, "mhc_base must be a torch.Tensor"),
    (lambda: fwd(base=torch.ones(16)), ValueError, "mhc_base must have shape"),
    (lambda: fwd(base=torch.ones(24, dtype=torch.bfloat16)), TypeError, "mhc_base must be torch.float32"),
    (lambda: fwd(post_mult="2"), TypeError, "mhc_post_mult_value"),
    (lambda: fwd(post_mult=float("nan")), ValueError, "mhc_post_mult_value must be finite"),
    (lambda: fwd(post_mult=1e39), ValueError, "mhc_post_mult_value must be finite as fp32"),
    (lambda: fwd(post_mult=1e-40), ValueError, "mhc_post_mult_value must be 0 or at least 2\\^-126"),
    (lambda: fwd(post_mult=1e-50), ValueError, "mhc_post_mult_value must be 0 or at least 2\\^-126"),
    (lambda: fwd(pre_eps=True), TypeError, "mhc_pre_eps"),
    (lambda: fwd(pre_eps=float("-inf")), ValueError, "mhc_pre_eps must be finite"),
    (lambda: fwd(pre=torch.ones(T, 4).double()), TypeError, "pre_layer_mix must be torch.float32"),
    (lambda: fwd(pre=torch.ones(T + 1, 4)), ValueError, "pre_layer_mix must have shape"),
    (lambda: fwd(post=torch.ones(T, 5)), ValueError, "post_layer_mix must have shape"),
    (lambda: fwd(post=_strided(T, 4)), ValueError, "post_layer_mix must be contiguous"),
    (lambda: fwd(comb=torch.ones(T, 4, 4)), ValueError, "comb_res_mix must have shape"),
    (lambda: fwd(comb=torch.ones(T, 16, device="meta")), ValueError, "comb_res_mix must be on cpu"),
    (lambda: fwd(comb="comb"), TypeError, "comb_res_mix must be a torch.Tensor"),
    (lambda: fwd(x=SHARED[:, :24], pre=SHARED[:, 20:24].clone(), comb=torch.ones(T, 16)), ValueError,
     "input_mixes must be contiguous"),
    (lambda: fwd(pre=SHARED.view(-1)[:T * 4].view(T, 4), post=SHARED.view(-1)[T * 2:T * 6].view(T, 4)), ValueError,
     "pre_layer_mix shares memory with post_layer_mix"),
    (lambda: fwd(x=SHARED.view(-1)[:T * 24].view(T, 24), comb=SHARED.view(-1)[T * 20:T * 36].view(T, 16)),
     ValueError, "comb_res_mix shares memory with input_mixes"),
    (lambda: fwd(target="gpu"), ValueError, "target"),
    (lambda: fwd(target=3), TypeError, "target must be a str"),
    (lambda: fwd(target="ascend-sim", flavor="cuda"), ValueError, "flavor 'cuda' is not available"),
    (lambda: fwd(flavor="npu"), ValueError, "flavor"),
]

BWD_CASES = [
    (lambda: bwd(x=X.half()), TypeError, "input_mixes must be torch.float32"),
    (lambda: bwd(x=torch.ones(T, 25)), ValueError, "input_mixes must have n·\\(n\\+2\\) = 24 columns"),
    (lambda: bwd(d_pre=torch.ones(T, 2), d_post=torch.ones(T, 2), d_comb=torch.ones(T, 4), x=torch.ones(T, 8),
                 post=torch.ones(T, 2), base=torch.ones(8)), ValueError,
     "pre_layer_mix_grad.size\\(1\\) \\(n\\) must be 4"),
    (lambda: bwd(d_pre=MIX[0]), ValueError, "pre_layer_mix_grad must be 2-D"),
    (lambda: bwd(d_pre=MIX.double()), TypeError, "pre_layer_mix_grad must be torch.float32"),
    (lambda: bwd(d_pre=torch.ones(T + 1, 4)), ValueError, "pre_layer_mix_grad must have shape"),
    (lambda: bwd(d_pre=_strided(T, 4)), ValueError, "pre_layer_mix_grad must be contiguous"),
    (lambda: bwd(d_post=torch.ones(T, 3)), ValueError, "post_layer_mix_grad must have shape"),
    (lambda: bwd(d_post=MIX.to("meta")), ValueError, "post_layer_mix_grad must be on cpu"),
    (lambda: bwd(d_comb=torch.ones(T, 4, 4)), ValueError, "comb_res_mix_grad must have shape"),
    (lambda: bwd(d_comb=COMB.bfloat16()), TypeError, "comb_res_mix_grad must be torch.float32"),
    (lambda: bwd(post=torch.ones(T - 1, 4)), ValueError, "post_layer_mix must have shape"),
    (lambda: bwd(post=None), TypeError, "post_layer_mix must be a torch.Tensor"),
    (lambda: bwd(scale=torch.ones(1)), ValueError, "mhc_scale must have shape"),
    (lambda: bwd(base=torch.ones(24, dtype=torch.int32)), TypeError, "mhc_base must be torch.float32"),
    (lambda: bwd(post_mult=float("inf")), ValueError, "mhc_post_mult_value must be finite"),
    (lambda: bwd(post_mult=-1e-39), ValueError, "mhc_post_mult_value must be 0 or at least 2\\^-126"),
    (lambda: bwd(dx=torch.ones(T, 16)), ValueError, "input_mixes_grad must have shape"),
    (lambda: bwd(dx=_strided(T, 24)), ValueError, "input_mixes_grad must be contiguous"),
    (lambda: bwd(scale_grad=torch.ones(3).double()), TypeError, "mhc_scale_grad must be torch.float32"),
    (lambda: bwd(scale_grad=torch.ones(24)), ValueError, "mhc_scale_grad must have shape"),
    (lambda: bwd(base_grad=torch.ones(3)), ValueError, "mhc_base_grad must have shape"),
    (lambda: bwd(base_grad=torch.ones(48)[::2]), ValueError, "mhc_base_grad must be contiguous"),
    (lambda: bwd(base_grad=torch.ones(24, device="meta")), ValueError, "mhc_base_grad must be on cpu"),
    (lambda: bwd(base_grad=BASE), ValueError, "mhc_base_grad shares memory with mhc_base"),
    (lambda: bwd(scale_grad=SCALE), ValueError, "mhc_scale_grad shares memory with mhc_scale"),
    (lambda: bwd(dx=X), ValueError, "input_mixes_grad shares memory with input_mixes"),
    (lambda: bwd(scale_grad=torch.ones(1).expand(3)), ValueError, "mhc_scale_grad must be contiguous"),
    (lambda: bwd(target="cuda"), ValueError, "target 'cuda' runs on 'cuda' tensors"),
]


@pytest.mark.parametrize("call,error,match", FWD_CASES + BWD_CASES)
def test_bad_input_raises(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_given_outputs_are_left_as_they_were():
    # An error found after the outputs were checked (a shared output, a bad multiplier) writes nothing.
    pre, post, comb = torch.full((T, 4), 5.0), torch.full((T, 4), 6.0), torch.full((T, 16), 7.0)
    with pytest.raises(ValueError, match="mhc_post_mult_value"):
        fwd(pre=pre, post=post, comb=comb, post_mult=float("nan"))
    with pytest.raises(ValueError, match="shares memory"):
        fwd(x=torch.ones(T, 24), pre=pre, post=pre, comb=comb)
    dx, scale_grad, base_grad = torch.full((T, 24), 8.0), torch.full((3,), 9.0), torch.full((24,), 10.0)
    with pytest.raises(ValueError, match="shares memory"):
        bwd(dx=dx, scale_grad=scale_grad, base_grad=BASE)
    with pytest.raises(ValueError, match="target"):
        bwd(dx=dx, scale_grad=scale_grad, base_grad=base_grad, target="npu")
    for t, value in ((pre, 5.0), (post, 6.0), (comb, 7.0), (dx, 8.0), (scale_grad, 9.0), (base_grad, 10.0)):
        assert (t == value).all()
