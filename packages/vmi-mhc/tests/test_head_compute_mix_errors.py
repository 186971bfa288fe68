"""head_compute_mix: bad input raises a clear TypeError/ValueError naming the argument before any
kernel runs, and given outputs are left as they were."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_mhc import mhc_head_compute_mix_bwd, mhc_head_compute_mix_fwd

T = 8
X = torch.ones(T, 4)
SCALE = torch.ones(1)
BASE = torch.ones(4)
D_OUT = torch.ones(T, 4)


no_kernel = no_kernel_fixture("vmi_mhc.kernels.head_compute_mix")


def fwd(x=X, scale=SCALE, base=BASE, out=None, pre_eps=1e-2, *args, **kwargs):
    return mhc_head_compute_mix_fwd(x, scale, base, out, pre_eps, *args, **kwargs)


def bwd(d_out=D_OUT, x=X, scale=SCALE, base=BASE, dx=None, scale_rows=None, base_rows=None, num_sms=4, *args,
        **kwargs):
    return mhc_head_compute_mix_bwd(d_out, x, scale, base, dx, scale_rows, base_rows, num_sms, *args, **kwargs)


def _strided(rows, cols):
    return torch.ones(rows, 2 * cols)[:, ::2]


SHARED = torch.ones(T, 12)

FWD_CASES = [
    (lambda: fwd(x="x"), TypeError, "input_mix must be a torch.Tensor"),
    (lambda: fwd(x=X.double()), TypeError, "input_mix must be torch.float32"),
    (lambda: fwd(x=X[0]), ValueError, "input_mix must be 2-D"),
    (lambda: fwd(x=torch.ones(2, T, 4)), ValueError, "input_mix must be 2-D"),
    (lambda: fwd(x=_strided(T, 4)), ValueError, "input_mix must be contiguous"),
    (lambda: fwd(x=torch.ones(T, 0), base=torch.ones(0)), ValueError,
     "input_mix.size\\(1\\) \\(the number of streams n\\) must be in \\[1, 16\\]"),
    (lambda: fwd(x=torch.ones(T, 17), base=torch.ones(17)), ValueError,
     "input_mix.size\\(1\\) \\(the number of streams n\\) must be in \\[1, 16\\]"),
    (lambda: fwd(scale=SCALE.double()), TypeError, "mhc_scale must be torch.float32"),
    (lambda: fwd(scale=torch.ones(3)), ValueError, "mhc_scale must have shape \\(1\\)"),
    (lambda: fwd(scale=torch.tensor(1.0)), ValueError, "mhc_scale must have shape \\(1\\)"),
    (lambda: fwd(scale=SCALE.to("meta")), ValueError, "mhc_scale must be on cpu"),
    (lambda: fwd(base=None), TypeError, "mhc_base must be a torch.Tensor"),
    (lambda: fwd(base=torch.ones(24)), ValueError, "mhc_base must have shape \\(4\\)"),
    (lambda: fwd(base=torch.ones(8)[::2]), ValueError, "mhc_base must be contiguous"),
    (lambda: fwd(base=torch.ones(4, dtype=torch.bfloat16)), TypeError, "mhc_base must be torch.float32"),
    (lambda: fwd(pre_eps="0.01"), TypeError, "mhc_pre_eps"),
    (lambda: fwd(pre_eps=True), TypeError, "mhc_pre_eps"),
    (lambda: fwd(pre_eps=float("nan")), ValueError, "mhc_pre_eps must be finite"),
    (lambda: fwd(pre_eps=1e39), ValueError, "mhc_pre_eps must be finite as fp32"),
    (lambda: fwd(X, SCALE, BASE, None, 1e-2, 2.5), TypeError, "token_block_size"),
    (lambda: fwd(X, SCALE, BASE, None, 1e-2, -1), ValueError, "token_block_size must be >= 0"),
    (lambda: fwd(out=torch.ones(T, 4).double()), TypeError, "output_mix must be torch.float32"),
    (lambda: fwd(out=torch.ones(T + 1, 4)), ValueError, "output_mix must have shape"),
    (lambda: fwd(out=_strided(T, 4)), ValueError, "output_mix must be contiguous"),
    (lambda: fwd(out=torch.ones(T, 4, device="meta")), ValueError, "output_mix must be on cpu"),
    (lambda: fwd(out="out"), TypeError, "output_mix must be a torch.Tensor"),
    (lambda: fwd(out=X), ValueError, "output_mix shares memory with input_mix"),
    (lambda: fwd(x=SHARED.view(-1)[:T * 4].view(T, 4), out=SHARED.view(-1)[T * 2:T * 6].view(T, 4)), ValueError,
     "output_mix shares memory with input_mix"),
    (lambda: fwd(out=torch.ones(1).expand(T, 4)), ValueError, "output_mix must be contiguous"),
    (lambda: fwd(target="gpu"), ValueError, "target"),
    (lambda: fwd(target=3), TypeError, "target must be a str"),
    (lambda: fwd(target="ascend-sim", flavor="cuda"), ValueError, "flavor 'cuda' is not available"),
    (lambda: fwd(flavor="npu"), ValueError, "flavor"),
]

BWD_CASES = [
    (lambda: bwd(x=X.half()), TypeError, "input_mix must be torch.float32"),
    (lambda: bwd(x=torch.ones(T, 17)), ValueError, "input_mix.size\\(1\\) \\(the number of streams n\\)"),
    (lambda: bwd(d_out=D_OUT[0]), ValueError, "output_mix_grad must have shape"),
    (lambda: bwd(d_out=D_OUT.double()), TypeError, "output_mix_grad must be torch.float32"),
    (lambda: bwd(d_out=torch.ones(T + 1, 4)), ValueError, "output_mix_grad must have shape"),
    (lambda: bwd(d_out=_strided(T, 4)), ValueError, "output_mix_grad must be contiguous"),
    (lambda: bwd(d_out=D_OUT.to("meta")), ValueError, "output_mix_grad must be on cpu"),
    (lambda: bwd(d_out=None), TypeError, "output_mix_grad must be a torch.Tensor"),
    (lambda: bwd(scale=torch.ones(3)), ValueError, "mhc_scale must have shape"),
    (lambda: bwd(base=torch.ones(4, dtype=torch.int32)), TypeError, "mhc_base must be torch.float32"),
    (lambda: bwd(base=torch.ones(5)), ValueError, "mhc_base must have shape \\(4\\)"),
    (lambda: bwd(num_sms=0), ValueError, "num_sms must be in \\[1, 1048576\\]"),
    (lambda: bwd(num_sms=(1 << 20) + 1), ValueError, "num_sms must be in \\[1, 1048576\\]"),
    (lambda: bwd(num_sms=4.0), TypeError, "num_sms"),
    (lambda: bwd(num_sms=True), TypeError, "num_sms"),
    (lambda: bwd(D_OUT, X, SCALE, BASE, None, None, None, 4, "0"), TypeError, "token_block_size"),
    (lambda: bwd(D_OUT, X, SCALE, BASE, None, None, None, 4, -64), ValueError, "token_block_size must be >= 0"),
    (lambda: bwd(dx=torch.ones(T, 5)), ValueError, "input_mix_grad must have shape"),
    (lambda: bwd(dx=_strided(T, 4)), ValueError, "input_mix_grad must be contiguous"),
    (lambda: bwd(scale_rows=torch.ones(4, 1).double()), TypeError, "mhc_scale_grad_partial must be torch.float32"),
    (lambda: bwd(scale_rows=torch.ones(4)), ValueError, "mhc_scale_grad_partial must have shape \\(4, 1\\)"),
    (lambda: bwd(scale_rows=torch.ones(5, 1)), ValueError, "mhc_scale_grad_partial must have shape \\(4, 1\\)"),
    (lambda: bwd(base_rows=torch.ones(4, 5)), ValueError, "mhc_base_grad_partial must have shape \\(4, 4\\)"),
    (lambda: bwd(base_rows=torch.ones(3, 4)), ValueError, "mhc_base_grad_partial must have shape \\(4, 4\\)"),
    (lambda: bwd(base_rows=_strided(4, 4)), ValueError, "mhc_base_grad_partial must be contiguous"),
    (lambda: bwd(base_rows=torch.ones(4, 4, device="meta")), ValueError, "mhc_base_grad_partial must be on cpu"),
    (lambda: bwd(dx=X), ValueError, "input_mix_grad shares memory with input_mix"),
    (lambda: bwd(dx=D_OUT), ValueError, "input_mix_grad shares memory with output_mix_grad"),
    (lambda: bwd(scale_rows=SCALE.view(1, 1), num_sms=1), ValueError,
     "mhc_scale_grad_partial shares memory with mhc_scale"),
    (lambda: bwd(base_rows=BASE.view(1, 4), num_sms=1), ValueError,
     "mhc_base_grad_partial shares memory with mhc_base"),
    (lambda: bwd(dx=SHARED.view(-1)[:T * 4].view(T, 4), base_rows=SHARED.view(-1)[16:32].view(4, 4)), ValueError,
     "input_mix_grad shares memory with mhc_base_grad_partial"),
    (lambda: bwd(target="cuda"), ValueError, "target 'cuda' runs on 'cuda' tensors"),
]


@pytest.mark.parametrize("call,error,match", FWD_CASES + BWD_CASES)
def test_bad_input_raises(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_given_outputs_are_left_as_they_were():
    # An error found after the outputs were checked (a shared output, a bad epsilon, an unknown
    # target) writes nothing.
    out = torch.full((T, 4), 5.0)
    with pytest.raises(ValueError, match="mhc_pre_eps"):
        fwd(out=out, pre_eps=float("inf"))
    with pytest.raises(ValueError, match="target"):
        fwd(out=out, target="npu")
    dx, scale_rows, base_rows = torch.full((T, 4), 8.0), torch.full((4, 1), 9.0), torch.full((4, 4), 10.0)
    with pytest.raises(ValueError, match="shares memory"):
        bwd(dx=dx, scale_rows=scale_rows, base_rows=dx[:4])
    with pytest.raises(ValueError, match="target"):
        bwd(dx=dx, scale_rows=scale_rows, base_rows=base_rows, target="npu")
    with pytest.raises(ValueError, match="num_sms"):
        bwd(dx=dx, scale_rows=scale_rows, base_rows=base_rows, num_sms=0)
    for t, value in ((out, 5.0), (dx, 8.0), (scale_rows, 9.0), (base_rows, 10.0)):
        assert (t == value).all()
