"""norm_fn stages A, A', C, D: bad input raises a TypeError/ValueError naming the argument before
any kernel runs, and no output or accumulation buffer is touched."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_mhc.ops.norm_fn import (
    mhc_fn_normw_merge_bwd,
    mhc_fn_normw_merge_fwd,
    mhc_reduce_partials_and_rmsnorm_bwd,
    mhc_reduce_partials_and_rmsnorm_fwd,
)

M, K, T, S, N3 = 24, 256, 8, 2, 24
FN = torch.ones(M, K)
NW = torch.ones(K)
P = torch.ones(S, T, 1, N3)
Q = torch.ones(S, T, 1)
G = torch.ones(T, N3)
OM = torch.ones(T, 1, N3)
SQ = torch.ones(T, 1)


no_kernel = no_kernel_fixture("vmi_mhc.kernels.norm_fn")


def _outputs():
    return {"out_fn": torch.full((M, K), 3.0), "fn_grad": torch.full((M, K), 3.0), "normw_grad": torch.full((K,), 3.0),
            "out_mul": torch.full((T, 1, N3), 3.0), "sqrsum": torch.full((T, 1), 3.0),
            "out": torch.full((T, N3), 3.0), "out_mul_grad": torch.full((T, 1, N3), 3.0),
            "sqrsum_grad": torch.full((T, 1), 3.0)}


def merge_fwd(o, fn=FN, normw=NW, out_fn=None):
    return mhc_fn_normw_merge_fwd(fn, normw, o["out_fn"] if out_fn is None else out_fn, target="cpu")


def merge_bwd(o, fn=FN, normw=NW, out_fn_grad=FN, fn_grad=None, normw_grad=None):
    return mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad, o["fn_grad"] if fn_grad is None else fn_grad,
                                  o["normw_grad"] if normw_grad is None else normw_grad, target="cpu")


def reduce_fwd(o, p=P, q=Q, out_mul=None, sqrsum=None, out=None, group=4096, eps=1e-6, n_splits=S, **kw):
    return mhc_reduce_partials_and_rmsnorm_fwd(p, q, o["out_mul"] if out_mul is None else out_mul,
                                               o["sqrsum"] if sqrsum is None else sqrsum,
                                               o["out"] if out is None else out, group, eps, n_splits,
                                               **{"target": "cpu", **kw})


def reduce_bwd(o, g=G, om=OM, sq=SQ, out_mul_grad=None, sqrsum_grad=None, group=4096, eps=1e-6, **kw):
    return mhc_reduce_partials_and_rmsnorm_bwd(g, om, sq, o["out_mul_grad"] if out_mul_grad is None else out_mul_grad,
                                               o["sqrsum_grad"] if sqrsum_grad is None else sqrsum_grad, group, eps,
                                               **{"target": "cpu", **kw})


CASES = [
    # merge forward
    (lambda o: merge_fwd(o, fn=FN.double()), TypeError, "fn must be torch.float32"),
    (lambda o: merge_fwd(o, fn="fn"), TypeError, "fn must be a torch.Tensor"),
    (lambda o: merge_fwd(o, fn=FN[0]), ValueError, r"fn must have shape \(\*, \*\)"),
    (lambda o: merge_fwd(o, fn=torch.ones(33, K), out_fn=torch.ones(33, K)), ValueError, "fn must have 1 to 32 rows"),
    (lambda o: merge_fwd(o, fn=torch.ones(0, K), out_fn=torch.ones(0, K)), ValueError, "fn must have 1 to 32 rows"),
    (lambda o: merge_fwd(o, fn=torch.ones(K, M).t()), ValueError, "fn must be contiguous"),
    (lambda o: merge_fwd(o, normw=NW[:128]), ValueError, "normw must have shape"),
    (lambda o: merge_fwd(o, normw=NW.half()), TypeError, "normw must be torch.float32"),
    (lambda o: merge_fwd(o, normw=torch.ones(2 * K)[::2]), ValueError, "normw must be contiguous"),
    (lambda o: merge_fwd(o, normw=NW.to("meta")), ValueError, "normw must be on cpu"),
    (lambda o: merge_fwd(o, out_fn=torch.ones(M, K - 1)), ValueError, "out_fn must have shape"),
    (lambda o: merge_fwd(o, out_fn=torch.ones(M, K, dtype=torch.bfloat16)), TypeError, "out_fn must be torch.float32"),
    (lambda o: merge_fwd(o, fn=o["out_fn"]), ValueError, "out_fn shares memory with fn"),
    (lambda o: mhc_fn_normw_merge_fwd(FN, NW, o["out_fn"], target="nope"), ValueError, "target"),
    (lambda o: mhc_fn_normw_merge_fwd(FN, NW, o["out_fn"], target="ascend-sim", flavor="cuda"), ValueError,
     "flavor"),
    # merge backward
    (lambda o: merge_bwd(o, fn=torch.ones(M, 128)), ValueError, "normw must have shape"),
    (lambda o: merge_bwd(o, out_fn_grad=FN[:4]), ValueError, "out_fn_grad must have shape"),
    (lambda o: merge_bwd(o, out_fn_grad=FN.double()), TypeError, "out_fn_grad must be torch.float32"),
    (lambda o: merge_bwd(o, fn_grad=torch.ones(M, K)[:, :K - 1]), ValueError, "fn_grad must have shape"),
    (lambda o: merge_bwd(o, fn_grad=torch.ones(K, M).t()), ValueError, "fn_grad must be contiguous"),
    (lambda o: merge_bwd(o, normw_grad=torch.ones(K, dtype=torch.float64)), TypeError,
     "normw_grad must be torch.float32"),
    (lambda o: merge_bwd(o, normw_grad=torch.ones(K + 1)), ValueError, "normw_grad must have shape"),
    (lambda o: merge_bwd(o, fn=o["fn_grad"]), ValueError, "fn_grad shares memory with fn"),
    (lambda o: merge_bwd(o, normw=o["normw_grad"]), ValueError, "normw_grad shares memory with normw"),
    (lambda o: merge_bwd(o, normw_grad=o["fn_grad"][0]), ValueError, "fn_grad shares memory with normw_grad"),
    (lambda o: merge_bwd(o, fn=torch.ones(40, K), out_fn_grad=torch.ones(40, K), fn_grad=torch.ones(40, K)),
     ValueError, "fn must have 1 to 32 rows"),
    # reduce forward
    (lambda o: reduce_fwd(o, p=P.double()), TypeError, "out_mul_splitted must be torch.float32"),
    (lambda o: reduce_fwd(o, p=P[0, 0]), ValueError, "out_mul_splitted must have shape"),
    (lambda o: reduce_fwd(o, p=torch.ones(S, T, 2, N3)), ValueError, "n_rms_group = 1"),
    (lambda o: reduce_fwd(o, p=torch.ones(S, T, 1, 33)), ValueError, "1 to 32 mix entries"),
    (lambda o: reduce_fwd(o, p=torch.ones(S, T, 1, 2 * N3)[..., ::2]), ValueError,
     "out_mul_splitted must be contiguous"),
    (lambda o: reduce_fwd(o, n_splits=3), ValueError, "n_splits = 3 partials, got 2"),
    (lambda o: reduce_fwd(o, n_splits=0), ValueError, r"n_splits must be in \[1, 64\]"),
    (lambda o: reduce_fwd(o, p=torch.ones(65, T, 1, N3), q=torch.ones(65, T, 1), n_splits=65), ValueError,
     r"n_splits must be in \[1, 64\]"),
    (lambda o: reduce_fwd(o, n_splits=2.0), TypeError, "n_splits must be an int"),
    (lambda o: reduce_fwd(o, q=Q[:, :4]), ValueError, "sqrsum_splitted must have shape"),
    (lambda o: reduce_fwd(o, q=Q.to("meta")), ValueError, "sqrsum_splitted must be on cpu"),
    (lambda o: reduce_fwd(o, group=0), ValueError, "rms_group_size"),
    (lambda o: reduce_fwd(o, group=2**24 + 1), ValueError, "rms_group_size"),
    (lambda o: reduce_fwd(o, group=True), TypeError, "rms_group_size must be an int"),
    (lambda o: reduce_fwd(o, eps=-1e-6), ValueError, "rms_eps must be in"),
    (lambda o: reduce_fwd(o, eps=float("nan")), ValueError, "rms_eps must be finite"),
    (lambda o: reduce_fwd(o, eps=1e39), ValueError, "rms_eps must be in"),
    (lambda o: reduce_fwd(o, eps="1e-6"), TypeError, "rms_eps"),
    (lambda o: reduce_fwd(o, out_mul=torch.ones(T, N3)), ValueError, "out_mul must have shape"),
    (lambda o: reduce_fwd(o, sqrsum=torch.ones(T)), ValueError, "sqrsum must have shape"),
    (lambda o: reduce_fwd(o, out=torch.ones(T, 1, N3)), ValueError, "out must have shape"),
    (lambda o: reduce_fwd(o, out=torch.ones(T, N3, dtype=torch.float64)), TypeError, "out must be torch.float32"),
    (lambda o: reduce_fwd(o, out=o["out_mul"][:, 0]), ValueError, "out_mul shares memory with out"),
    (lambda o: reduce_fwd(o, out_mul=P[1]), ValueError,
     "out_mul shares memory with out_mul_splitted"),
    (lambda o: reduce_fwd(o, target="ascend-sim", flavor="cuda"), ValueError, "flavor"),
    # reduce backward
    (lambda o: reduce_bwd(o, g=G.double()), TypeError, "out_grad must be torch.float32"),
    (lambda o: reduce_bwd(o, g=G[None]), ValueError, "out_grad must have shape"),
    (lambda o: reduce_bwd(o, g=torch.ones(T, 40), om=torch.ones(T, 1, 40)), ValueError, "1 to 32 mix entries"),
    (lambda o: reduce_bwd(o, om=torch.ones(T, 2, N3)), ValueError, "n_rms_group = 1"),
    (lambda o: reduce_bwd(o, om=OM[:4]), ValueError, "out_mul must have shape"),
    (lambda o: reduce_bwd(o, sq=SQ.t()), ValueError, "sqrsum must have shape"),
    (lambda o: reduce_bwd(o, sq=torch.ones(T, 2)[:, :1]), ValueError, "sqrsum must be contiguous"),
    (lambda o: reduce_bwd(o, group=0), ValueError, "rms_group_size"),
    (lambda o: reduce_bwd(o, eps=float("inf")), ValueError, "rms_eps must be finite"),
    (lambda o: reduce_bwd(o, out_mul_grad=torch.ones(T, N3)), ValueError, "out_mul_grad must have shape"),
    (lambda o: reduce_bwd(o, sqrsum_grad=torch.ones(T, 1).half()), TypeError, "sqrsum_grad must be torch.float32"),
    (lambda o: reduce_bwd(o, g=o["out_mul_grad"][:, 0]), ValueError, "out_mul_grad shares memory with out_grad"),
    (lambda o: reduce_bwd(o, sqrsum_grad=o["out_mul_grad"].view(-1)[:T].view(T, 1)), ValueError,
     "out_mul_grad shares memory with sqrsum_grad"),
    (lambda o: reduce_bwd(o, sq=o["sqrsum_grad"]), ValueError, "sqrsum_grad shares memory with sqrsum"),
]


@pytest.mark.parametrize("call,error,match", CASES, ids=[str(i) for i in range(len(CASES))])
def test_bad_input_raises_before_any_kernel(call, error, match):
    outputs = _outputs()
    before = {name: t.clone() for name, t in outputs.items()}
    with pytest.raises(error, match=match):
        call(outputs)
    for name, t in outputs.items():
        assert torch.equal(t, before[name]), f"{name} was written"


def test_accumulation_buffers_that_require_grad_are_refused():
    fn_grad = torch.zeros(M, K, requires_grad=True)
    with pytest.raises(RuntimeError, match="fn_grad"):
        mhc_fn_normw_merge_bwd(FN, NW, FN, fn_grad, torch.zeros(K))
