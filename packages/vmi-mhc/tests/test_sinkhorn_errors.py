"""mhc_sinkhorn_fwd and mhc_sinkhorn_bwd: bad input raises a clear TypeError/ValueError naming the
argument before any kernel runs, and the given output is left as it was."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_mhc import mhc_sinkhorn_bwd, mhc_sinkhorn_bwd_parallel, mhc_sinkhorn_fwd, mhc_sinkhorn_fwd_parallel

X = torch.zeros(5, 4, 4)
G = torch.ones(5, 4, 4)
OUT = torch.full((5, 4, 4), 7.0)


no_kernel = no_kernel_fixture("vmi_mhc.kernels.sinkhorn")


def _strided():
    return torch.zeros(5, 4, 8)[:, :, ::2]


def fwd(x=X, out=OUT, repeat=10, eps=1e-6, **kwargs):
    return lambda: mhc_sinkhorn_fwd(x, out, repeat, eps, **kwargs)


def bwd(grad=G, x=X, out=OUT, repeat=10, eps=1e-6, **kwargs):
    return lambda: mhc_sinkhorn_bwd(grad, x, out, repeat, eps, **kwargs)


FORWARD_CASES = [
    (fwd(x="x"), TypeError, "comb_res_mix must be a torch.Tensor"),
    (fwd(x=X.double()), TypeError, "comb_res_mix must be torch.float32"),
    (fwd(x=X[0]), ValueError, "comb_res_mix must be 3-D"),
    (fwd(x=torch.zeros(5, 4, 3)), ValueError, r"comb_res_mix must have shape \(T, n, n\)"),
    (fwd(x=torch.zeros(5, 3, 3)), ValueError, r"comb_res_mix.size\(1\) \(n\) must be 4"),
    (fwd(x=torch.zeros(5, 8, 8)), ValueError, r"comb_res_mix.size\(1\) \(n\) must be 4"),
    (fwd(x=_strided()), ValueError, "comb_res_mix must be contiguous"),
    (fwd(out="out"), TypeError, "comb_res_mix_out must be a torch.Tensor"),
    (fwd(out=OUT.double()), TypeError, "comb_res_mix_out must be torch.float32"),
    (fwd(out=OUT[:4]), ValueError, "comb_res_mix_out must have shape"),
    (fwd(out=torch.zeros(5, 16)), ValueError, "comb_res_mix_out must have shape"),
    (fwd(out=_strided()), ValueError, "comb_res_mix_out must be contiguous"),
    (fwd(out=OUT.to("meta")), ValueError, "comb_res_mix_out must be on comb_res_mix's device"),
    (fwd(out=X), ValueError, "comb_res_mix_out shares memory with comb_res_mix"),
    (fwd(repeat=10.0), TypeError, "repeat must be an int"),
    (fwd(repeat=True), TypeError, "repeat must be an int"),
    (fwd(repeat=0), ValueError, "repeat must be in"),
    (fwd(repeat=2**31), ValueError, "repeat must be in"),
    (fwd(eps="1e-6"), TypeError, "eps must be a float"),
    (fwd(eps=-1e-6), ValueError, "eps must be >= 0"),
    (fwd(eps=float("nan")), ValueError, "eps must be finite"),
    (fwd(eps=float("inf")), ValueError, "eps must be finite"),
    (fwd(eps=1e39), ValueError, "eps must be at most the largest fp32 value"),
    (fwd(target="cuda"), ValueError, "target 'cuda'"),
    (fwd(flavor="rocm"), ValueError, "flavor must be one of"),
    (fwd(target="ascend-sim", flavor="cuda"), ValueError, "flavor"),
    (lambda: mhc_sinkhorn_fwd_parallel(X, OUT, 10, 1e-6, target="torch"), ValueError, "always runs the kernel"),
]

BACKWARD_CASES = [
    (bwd(x=None), TypeError, "x must be a torch.Tensor"),
    (bwd(x=X.half()), TypeError, "x must be torch.float32"),
    (bwd(x=X.view(5, 16)), ValueError, "x must be 3-D"),
    (bwd(x=torch.zeros(5, 2, 2), grad=torch.zeros(5, 2, 2), out=torch.zeros(5, 2, 2)), ValueError,
     r"x.size\(1\) \(n\) must be 4"),
    (bwd(x=torch.zeros(5, 4, 2)), ValueError, r"x must have shape \(T, n, n\)"),
    (bwd(x=_strided()), ValueError, "x must be contiguous"),
    (bwd(grad="g"), TypeError, "grad_output must be a torch.Tensor"),
    (bwd(grad=G.double()), TypeError, "grad_output must be torch.float32"),
    (bwd(grad=G[1:]), ValueError, "grad_output must have shape"),
    (bwd(grad=_strided()), ValueError, "grad_output must be contiguous"),
    (bwd(grad=G.to("meta")), ValueError, "grad_output must be on x's device"),
    (bwd(out=OUT.double()), TypeError, "grad_input must be torch.float32"),
    (bwd(out=OUT[:, :2]), ValueError, "grad_input must have shape"),
    (bwd(out=_strided()), ValueError, "grad_input must be contiguous"),
    (bwd(out=OUT.to("meta")), ValueError, "grad_input must be on x's device"),
    (bwd(out=X), ValueError, "grad_input shares memory with x"),
    (bwd(out=G), ValueError, "grad_input shares memory with grad_output"),
    (bwd(repeat=1.5), TypeError, "repeat must be an int"),
    (bwd(repeat=0), ValueError, r"repeat must be in \[1, 16\]"),
    (bwd(repeat=17), ValueError, r"repeat must be in \[1, 16\]"),
    (bwd(eps=None), TypeError, "eps must be a float"),
    (bwd(eps=-0.5), ValueError, "eps must be >= 0"),
    (bwd(eps=float("-inf")), ValueError, "eps must be finite"),
    (bwd(target="cuda"), ValueError, "target 'cuda'"),
    (bwd(flavor=3), TypeError, "flavor must be a str"),
    (lambda: mhc_sinkhorn_bwd_parallel(G, X, OUT, 10, 1e-6, target="torch"), ValueError, "always runs the kernel"),
]


@pytest.mark.parametrize(("call", "error", "match"), FORWARD_CASES + BACKWARD_CASES)
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()
    assert bool((OUT == 7.0).all()), "the output was written"


def test_overlapping_views_are_refused():
    """An output that is another view of an input's memory (not the same tensor) is refused too."""
    storage = torch.zeros(10, 4, 4)
    before = storage.clone()
    with pytest.raises(ValueError, match="comb_res_mix_out shares memory with comb_res_mix"):
        mhc_sinkhorn_fwd(storage[:5], storage[4:9], 10, 1e-6, target="cpu")
    with pytest.raises(ValueError, match="grad_input shares memory with grad_output"):
        mhc_sinkhorn_bwd(storage[:5], X, storage[4:9], 10, 1e-6, target="cpu")
    assert torch.equal(storage, before)
