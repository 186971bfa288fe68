"""pre_big_fuse: bad input raises a clear TypeError/ValueError naming the argument before any
kernel runs, and given outputs are left as they were."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_mhc import mhc_pre_big_fuse_fwd, mhc_pre_big_fuse_fwd_parallel

T, H, S = 8, 16, 2
MUL = torch.ones(S, T, 24)
SQ = torch.ones(S, T)
SCALE = torch.ones(3)
BASE = torch.ones(24)
RESIDUAL = torch.ones(T, 4, H, dtype=torch.bfloat16)


no_kernel = no_kernel_fixture("vmi_mhc.kernels.pre_big_fuse")


def fwd(mul=MUL, sq=SQ, scale=SCALE, base=BASE, residual=RESIDUAL, post=None, comb=None, layer_input=None,
        rms_eps=1e-6, pre_eps=1e-6, sinkhorn_eps=1e-6, post_mult=1.0, repeat=10, n_splits=S, **kwargs):
    return mhc_pre_big_fuse_fwd(mul, sq, scale, base, residual, post, comb, layer_input, rms_eps, pre_eps,
                                sinkhorn_eps, post_mult, repeat, n_splits, **kwargs)


def _strided(*shape, dtype=torch.float32):
    return torch.ones(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2]


FLAT = torch.ones(T * 24)

CASES = [
    (lambda: fwd(residual="r"), TypeError, "residual must be a torch.Tensor"),
    (lambda: fwd(residual=RESIDUAL.float()), TypeError, "residual must be torch.bfloat16"),
    (lambda: fwd(residual=RESIDUAL[0]), ValueError, "residual must be 3-D"),
    (lambda: fwd(residual=torch.ones(T, 2, H, dtype=torch.bfloat16)), ValueError,
     "residual.size\\(1\\) \\(n\\) must be 4"),
    (lambda: fwd(residual=torch.ones(T, 4, 0, dtype=torch.bfloat16), layer_input=None), ValueError,
     "residual must have 1 <= n·H"),
    (lambda: fwd(residual=torch.ones(T, 4, 2 ** 22 + 1, dtype=torch.bfloat16, device="meta")), ValueError,
     "residual must have 1 <= n·H"),
    (lambda: fwd(residual=_strided(T, 4, H, dtype=torch.bfloat16)), ValueError, "residual must be contiguous"),
    (lambda: fwd(mul=MUL.double()), TypeError, "gemm_out_mul must be torch.float32"),
    (lambda: fwd(mul=torch.ones(S, T, 20)), ValueError, "gemm_out_mul must have shape"),
    (lambda: fwd(mul=torch.ones(S, T + 1, 24)), ValueError, "gemm_out_mul must have shape"),
    (lambda: fwd(mul=torch.ones(S + 1, T, 24)), ValueError, "gemm_out_mul must hold n_splits = 2 partials"),
    (lambda: fwd(mul=_strided(S, T, 24)), ValueError, "gemm_out_mul must be contiguous"),
    (lambda: fwd(mul=MUL.to("meta")), ValueError, "gemm_out_mul must be on cpu"),
    (lambda: fwd(sq=SQ.double()), TypeError, "gemm_out_sqrsum must be torch.float32"),
    (lambda: fwd(sq=torch.ones(S, T, 1)), ValueError, "gemm_out_sqrsum must have shape"),
    (lambda: fwd(sq=torch.ones(S + 1, T)), ValueError, "gemm_out_sqrsum must have shape"),
    (lambda: fwd(sq=_strided(S, T)), ValueError, "gemm_out_sqrsum must be contiguous"),
    (lambda: fwd(n_splits=0, mul=torch.ones(0, T, 24)), ValueError, "n_splits must be"),
    (lambda: fwd(n_splits=65, mul=torch.ones(65, T, 24)), ValueError, "n_splits must be"),
    (lambda: fwd(n_splits=2.0), TypeError, "n_splits"),
    (lambda: fwd(scale=torch.ones(4)), ValueError, "mhc_scale must have shape"),
    (lambda: fwd(scale=SCALE.bfloat16()), TypeError, "mhc_scale must be torch.float32"),
    (lambda: fwd(scale=SCALE.to("meta")), ValueError, "mhc_scale must be on cpu"),
    (lambda: fwd(base=torch.ones(16)), ValueError, "mhc_base must have shape"),
    (lambda: fwd(base=torch.ones(48)[::2]), ValueError, "mhc_base must be contiguous"),
    (lambda: fwd(base=None), TypeError, "mhc_base must be a torch.Tensor"),
    (lambda: fwd(rms_eps="1e-6"), TypeError, "rms_eps"),
    (lambda: fwd(rms_eps=-1.0), ValueError, "rms_eps must be in"),
    (lambda: fwd(rms_eps=float("inf")), ValueError, "rms_eps must be finite"),
    (lambda: fwd(pre_eps=None), TypeError, "mhc_pre_eps"),
    (lambda: fwd(pre_eps=1e39), ValueError, "mhc_pre_eps must be finite as fp32"),
    (lambda: fwd(sinkhorn_eps=-1e-6), ValueError, "mhc_sinkhorn_eps must be >= 0"),
    (lambda: fwd(sinkhorn_eps=float("nan")), ValueError, "mhc_sinkhorn_eps must be finite"),
    (lambda: fwd(post_mult=True), TypeError, "mhc_post_mult_value"),
    (lambda: fwd(post_mult=1e-40), ValueError, "mhc_post_mult_value must be 0 or at least 2\\^-126"),
    (lambda: fwd(post_mult=-1e39), ValueError, "mhc_post_mult_value must be finite as fp32"),
    (lambda: fwd(repeat=0), ValueError, "sinkhorn_repeat must be"),
    (lambda: fwd(repeat=10.0), TypeError, "sinkhorn_repeat"),
    (lambda: fwd(post=torch.ones(T, 4, 1)), ValueError, "post_mix must have shape"),
    (lambda: fwd(post=torch.ones(T, 4).double()), TypeError, "post_mix must be torch.float32"),
    (lambda: fwd(post=_strided(T, 4)), ValueError, "post_mix must be contiguous"),
    (lambda: fwd(comb=torch.ones(T, 4, 4)), ValueError, "comb_mix must have shape"),
    (lambda: fwd(comb=torch.ones(T, 16, device="meta")), ValueError, "comb_mix must be on cpu"),
    (lambda: fwd(layer_input=torch.ones(T, H)), TypeError, "layer_input must be torch.bfloat16"),
    (lambda: fwd(layer_input=torch.ones(T, H + 1, dtype=torch.bfloat16)), ValueError,
     "layer_input must have shape"),
    (lambda: fwd(layer_input="o"), TypeError, "layer_input must be a torch.Tensor"),
    (lambda: fwd(post=FLAT[:T * 4].view(T, 4), comb=FLAT[T * 2:T * 18].view(T, 16)), ValueError,
     "post_mix shares memory with comb_mix"),
    (lambda: fwd(mul=FLAT.view(1, T, 24), sq=torch.ones(1, T), n_splits=1, comb=FLAT[:T * 16].view(T, 16)),
     ValueError,
     "comb_mix shares memory with gemm_out_mul"),
    (lambda: fwd(layer_input=RESIDUAL[:, 0]), ValueError, "layer_input must be contiguous"),
    (lambda: fwd(layer_input=RESIDUAL.view(-1)[:T * H].view(T, H)), ValueError,
     "layer_input shares memory with residual"),
    (lambda: fwd(post=SCALE.view(-1).expand(T, 3)[:, :1].expand(T, 4)), ValueError, "post_mix must be contiguous"),
    (lambda: fwd(target="gpu"), ValueError, "target"),
    (lambda: fwd(target=1), TypeError, "target must be a str"),
    (lambda: fwd(target="cuda"), ValueError, "target 'cuda' runs on 'cuda' tensors"),
    (lambda: fwd(target="ascend-sim", flavor="cuda"), ValueError, "flavor 'cuda' is not available"),
    (lambda: fwd(flavor="npu"), ValueError, "flavor"),
    (lambda: mhc_pre_big_fuse_fwd_parallel(MUL, SQ, SCALE, BASE, RESIDUAL, None, None, None, 1e-6, 1e-6, 1e-6, 1.0,
                                           10, S, target="torch"), ValueError, "always runs the kernel"),
]


@pytest.mark.parametrize("call,error,match", CASES)
def test_bad_input_raises(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_given_outputs_are_left_as_they_were():
    # Errors found after the outputs were checked (a bad scalar, a shared output, a bad target)
    # write nothing.
    post, comb = torch.full((T, 4), 5.0), torch.full((T, 16), 6.0)
    layer_input = torch.full((T, H), 7.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="mhc_sinkhorn_eps"):
        fwd(post=post, comb=comb, layer_input=layer_input, sinkhorn_eps=-1.0)
    with pytest.raises(ValueError, match="shares memory"):
        fwd(post=post, comb=comb, layer_input=layer_input, mul=torch.ones(1, T, 24), sq=post[:1, :1].expand(1, T)
            .contiguous(), n_splits=1, scale=post[0, :3])
    with pytest.raises(ValueError, match="target"):
        fwd(post=post, comb=comb, layer_input=layer_input, target="npu")
    with torch.enable_grad(), pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        fwd(post=torch.zeros(T, 4, requires_grad=True), comb=comb, layer_input=layer_input)
    for t, value in ((post, 5.0), (comb, 6.0), (layer_input, 7.0)):
        assert (t == value).all()
