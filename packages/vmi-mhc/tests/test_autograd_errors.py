"""Bad arguments of the autograd and functional layers: the right exception, naming the argument,
raised before any kernel runs (a given ``out`` keeps its bits; no kernel is reached: the cases run on
the ``cpu`` target with a spy on the first kernel entry point each function would call)."""

from __future__ import annotations

import pytest
import torch

import vmi_mhc.autograd as autograd
import vmi_mhc.functional as functional
from vmi_mhc import (
    expand_from_embedding,
    expand_to_mhc,
    mhc_head,
    mhc_head_compute_mix,
    mhc_post,
    mhc_pre,
    mhc_pre_apply_mix,
    mhc_pre_big_fuse,
    mhc_pre_norm_fn,
    mhc_pre_split_mixes,
    sinkhorn_normalize,
)

N, H = 4, 64
K, N3 = N * H, 24
BF16, F32 = torch.bfloat16, torch.float32


def residual(*lead, n=N, dtype=BF16):
    return torch.zeros(*lead, n, H, dtype=dtype)


def pre_args(**changes):
    args = {"residual": residual(2, 3), "fn": torch.zeros(N3, K), "scale": torch.zeros(3), "base": torch.zeros(N3)}
    args.update(changes)
    return args


def head_args(**changes):
    args = {"residual": residual(2, 3), "fn": torch.zeros(N, K), "scale": torch.zeros(1), "base": torch.zeros(N)}
    args.update(changes)
    return args


CASES = [
    # (function, args, kwargs, exception, words the message must contain)
    (mhc_pre, pre_args(residual=residual(2, 3, dtype=F32)), {}, TypeError, "residual"),
    (mhc_pre, pre_args(residual=residual(2, 3, n=3)), {}, ValueError, "residual"),
    (mhc_pre, pre_args(residual=torch.zeros(H, dtype=BF16)), {}, ValueError, "residual"),
    (mhc_pre, pre_args(fn=torch.zeros(N3, K + 1)), {}, ValueError, "fn"),
    (mhc_pre, pre_args(fn=torch.zeros(N3, K, dtype=torch.float64)), {}, TypeError, "fn"),
    (mhc_pre, pre_args(scale=torch.zeros(2)), {}, ValueError, "scale"),
    (mhc_pre, pre_args(base=torch.zeros(N3 - 1)), {}, ValueError, "base"),
    (mhc_pre, pre_args(), {"norm_weight": torch.zeros(K - 1)}, ValueError, "norm_weight"),
    (mhc_pre, pre_args(), {"norm_weight": torch.zeros(K, dtype=BF16)}, TypeError, "norm_weight"),
    (mhc_pre, pre_args(), {"mhc_mult": 2}, ValueError, "mhc_mult"),
    (mhc_pre, pre_args(), {"mhc_mult": 4.0}, TypeError, "mhc_mult"),
    (mhc_pre, pre_args(), {"n_splits": 3}, ValueError, "n_splits"),
    (mhc_pre, pre_args(), {"norm_eps": -1.0}, ValueError, "norm_eps"),
    (mhc_pre, pre_args(), {"sinkhorn_eps": float("inf"), "n_splits": 4}, ValueError, "sinkhorn_eps"),
    (mhc_pre, pre_args(), {"sinkhorn_repeat": 0, "n_splits": 4}, ValueError, "sinkhorn_repeat"),
    (mhc_pre, pre_args(residual=residual(2, 3).requires_grad_()), {"sinkhorn_repeat": 17, "n_splits": 4}, ValueError,
     "sinkhorn_repeat"),
    (mhc_pre, pre_args(residual=torch.zeros(5, N, 48, dtype=BF16, requires_grad=True),
                       fn=torch.zeros(N3, N * 48)), {"n_splits": 3}, ValueError, "residual"),
    (mhc_pre, pre_args(), {"pre_eps": "x", "n_splits": 4}, TypeError, "pre_eps"),
    (mhc_head, head_args(fn=torch.zeros(N + 1, K)), {}, ValueError, "fn"),
    (mhc_head, head_args(scale=torch.zeros(3)), {}, ValueError, "scale"),
    (mhc_head, head_args(base=torch.zeros(N3)), {}, ValueError, "base"),
    (mhc_head, head_args(residual="x"), {}, TypeError, "residual"),
    (mhc_pre_big_fuse, (residual(5), torch.zeros(N3, K), torch.zeros(3), torch.zeros(N3 + 1), 1e-6, 1e-6, 1e-6,
                        1.0, 10), {}, ValueError, "base"),
    (mhc_pre_big_fuse, (residual(5), torch.zeros(N3, K), torch.zeros(3), torch.zeros(N3), 1e-6, 1e-6, 1e-6,
                        1.0, 10), {"n_splits": 0}, ValueError, "n_splits"),
    (mhc_pre_norm_fn, (residual(5), torch.zeros(N3, K + 4), None, 1e-6), {}, ValueError, "mhc_fn"),
    (mhc_pre_norm_fn, (residual(5), torch.zeros(N3, K), torch.zeros(K, 1), 1e-6), {}, ValueError,
     "mhc_norm_weight"),
    (mhc_pre_norm_fn, (residual(5), torch.zeros(N3, K), None, float("nan")), {}, ValueError, "mhc_norm_eps"),
    (mhc_pre_norm_fn, (residual(5), torch.zeros(N3, K), None, 1e-6), {"fuse_grad_acc": 1}, TypeError,
     "fuse_grad_acc"),
    (mhc_pre_norm_fn, (residual(5), torch.zeros(N3, K), None, 1e-6), {"n_splits": 1.0}, TypeError, "n_splits"),
    (mhc_pre_split_mixes, (torch.zeros(5, N3 + 1), torch.zeros(3), torch.zeros(N3), N, 1.0, 1e-6), {},
     ValueError, "input_mixes"),
    (mhc_pre_split_mixes, (torch.zeros(5, N3), torch.zeros(3), torch.zeros(N3), 3, 1.0, 1e-6), {}, ValueError,
     "mhc_mult"),
    (mhc_pre_split_mixes, (torch.zeros(5, N3, dtype=BF16), torch.zeros(3), torch.zeros(N3), N, 1.0, 1e-6), {},
     TypeError, "input_mixes"),
    (sinkhorn_normalize, (torch.zeros(5, N, N + 1),), {}, ValueError, "x"),
    (sinkhorn_normalize, (torch.zeros(5, N, N, dtype=torch.float64),), {}, TypeError, "x"),
    (mhc_head_compute_mix, (torch.zeros(5, N, dtype=BF16), torch.zeros(1), torch.zeros(N), 1e-6), {}, TypeError,
     "input_mix"),
    (expand_to_mhc, (torch.zeros(5, H), N), {}, TypeError, "hidden"),
    (expand_to_mhc, (torch.zeros(H, 5, dtype=BF16).T, N), {}, ValueError, "hidden"),
    (expand_from_embedding, (torch.zeros(5, H, dtype=BF16), 2.0), {}, TypeError, "mhc_mult"),
    (mhc_pre_apply_mix, (residual(5), torch.zeros(5, N)), {}, ValueError, "mix"),
    (mhc_pre_apply_mix, (residual(5), torch.zeros(5, N, 1, dtype=BF16)), {}, TypeError, "mix"),
    (mhc_post, (torch.zeros(5, H + 1, dtype=BF16), residual(5), torch.zeros(5, N, 1), torch.zeros(5, N, N)), {},
     ValueError, "x"),
    (mhc_post, (torch.zeros(5, H, dtype=BF16), residual(5), torch.zeros(5, N), torch.zeros(5, N, N)), {},
     ValueError, "post_layer_mix"),
    (mhc_post, (torch.zeros(5, H, dtype=BF16), residual(5), torch.zeros(5, N, 1), torch.zeros(5, N, N + 1)), {},
     ValueError, "comb_res_mix"),
    (mhc_post, (torch.zeros(5, H, dtype=BF16), residual(5, dtype=torch.float16), torch.zeros(5, N, 1),
                torch.zeros(5, N, N)), {}, TypeError, "residual"),
]


@pytest.fixture
def no_kernel(monkeypatch):
    """Every kernel entry point the layers call raises if reached."""
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel ran before the argument check")

    for module in (autograd, functional):
        for name in dir(module):
            if name.startswith(("mhc_", "expand_to_mhc_")) and name.endswith(("_fwd", "_bwd")):
                monkeypatch.setattr(module, name, refuse)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_bad_argument(case, no_kernel):
    function, args, kwargs, error, word = CASES[case]
    with pytest.raises(error, match=word):
        if isinstance(args, dict):
            function(**args, **kwargs, target="cpu")
        else:
            function(*args, **kwargs, target="cpu")


@pytest.mark.parametrize("function, args, out", [
    (expand_to_mhc, (torch.ones(5, H, dtype=BF16), N), torch.full((5, N, H + 1), 7.0, dtype=BF16)),
    (mhc_pre_apply_mix, (residual(5), torch.ones(5, N, 1)), torch.full((4, H), 7.0, dtype=BF16)),
    (mhc_post, (torch.ones(5, H, dtype=BF16), residual(5), torch.ones(5, N, 1), torch.ones(5, N, N)),
     torch.full((5, N, H), 7.0, dtype=F32)),
])
def test_bad_out_is_untouched(function, args, out, no_kernel):
    before = out.clone()
    with pytest.raises((TypeError, ValueError), match="out"):
        function(*args, out=out, target="cpu")
    assert torch.equal(out, before)
