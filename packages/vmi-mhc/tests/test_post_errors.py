"""mhc_post_fwd / mhc_post_bwd: bad input raises a clear TypeError/ValueError naming the argument
before any kernel runs, and a given ``out`` is left as it was."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_mhc.ops.post import mhc_post_bwd, mhc_post_bwd_parallel, mhc_post_fwd, mhc_post_fwd_parallel

B, S, N, H = 2, 3, 4, 128
X = torch.ones(B, S, H, dtype=torch.bfloat16)
R = torch.ones(B, S, N, H, dtype=torch.bfloat16)
P = torch.ones(B, S, N, 1)
C = torch.ones(B, S, N, N)
G = torch.ones(B, S, N, H, dtype=torch.bfloat16)


no_kernel = no_kernel_fixture("vmi_mhc.kernels.post")


def _streams(n, hidden=H):
    return (torch.ones(B, S, hidden, dtype=torch.bfloat16), torch.ones(B, S, n, hidden, dtype=torch.bfloat16),
            torch.ones(B, S, n, 1), torch.ones(B, S, n, n))


def _fwd(**changes):
    args = {"x": X, "residual": R, "post_layer_mix": P, "comb_res_mix": C, **changes}
    return lambda: mhc_post_fwd(**args)


def _bwd(**changes):
    args = {"x": X, "residual": R, "post_layer_mix": P, "comb_res_mix": C, "d_o": G, **changes}
    return lambda: mhc_post_bwd(**args)


# Errors both entry points share (the tensor named, what was expected).
SHARED = [
    ({"residual": R.float()}, TypeError, "residual must be torch.bfloat16"),
    ({"residual": "R"}, TypeError, "residual must be a torch.Tensor"),
    ({"residual": R[0]}, ValueError, "residual must be 4-D"),
    ({"residual": R.reshape(B * S, N, H)}, ValueError, "residual must be 4-D"),
    ({"residual": R[..., :0]}, ValueError, r"residual.size\(3\) \(the hidden size H\) must be >= 1"),
    ({"x": X.float()}, TypeError, "x must be torch.bfloat16"),
    ({"x": None}, TypeError, "x must be a torch.Tensor"),
    ({"x": X[:, :, :64]}, ValueError, r"x must have shape \(2, 3, 128\)"),
    ({"x": X.reshape(B * S, H)}, ValueError, "x must have shape"),
    ({"x": torch.ones(B, S, 2 * H, dtype=torch.bfloat16)[..., ::2]}, ValueError, "x must be contiguous"),
    ({"x": X.to("meta")}, ValueError, "x must be on cpu"),
    ({"post_layer_mix": P.bfloat16()}, TypeError, "post_layer_mix must be torch.float32"),
    ({"post_layer_mix": P[..., 0]}, ValueError, r"post_layer_mix must have shape \(2, 3, 4, 1\)"),
    ({"post_layer_mix": torch.ones(B, S, N, 2)[..., :1]}, ValueError, "post_layer_mix must be contiguous"),
    ({"post_layer_mix": P.to("meta")}, ValueError, "post_layer_mix must be on cpu"),
    ({"comb_res_mix": C.double()}, TypeError, "comb_res_mix must be torch.float32"),
    ({"comb_res_mix": C[..., :2]}, ValueError, r"comb_res_mix must have shape \(2, 3, 4, 4\)"),
    ({"comb_res_mix": C.transpose(-1, -2)}, ValueError, "comb_res_mix must be contiguous"),
    ({"comb_res_mix": C.to("meta")}, ValueError, "comb_res_mix must be on cpu"),
    ({"target": "cuda"}, ValueError, "target 'cuda'"),
    ({"target": 3}, TypeError, "target must be a str or None"),
    ({"flavor": "rocm"}, ValueError, "flavor must be one of"),
    ({"target": "ascend-sim", "flavor": "cuda"}, ValueError, "flavor"),
]


@pytest.mark.parametrize("changes,error,match", SHARED)
def test_bad_forward_arguments(changes, error, match):
    with pytest.raises(error, match=match):
        _fwd(**changes)()


@pytest.mark.parametrize("changes,error,match", SHARED + [
    ({"d_o": G.float()}, TypeError, "d_o must be torch.bfloat16"),
    ({"d_o": G[..., :64]}, ValueError, r"d_o must have shape \(2, 3, 4, 128\)"),
    ({"d_o": [G]}, TypeError, "d_o must be a torch.Tensor"),
    ({"d_o": G.to("meta")}, ValueError, "d_o must be on cpu"),
])
def test_bad_backward_arguments(changes, error, match):
    with pytest.raises(error, match=match):
        _bwd(**changes)()


@pytest.mark.parametrize("n", (2, 3, 5, 8))
def test_backward_needs_four_streams(n):
    # The backward kernel keeps n + n² = 20 partial sums: it is built for n = 4 only.
    x, residual, post, comb = _streams(n)
    with pytest.raises(ValueError, match=r"mhc_post_bwd: residual.size\(2\) \(the stream count n\) must be 4"):
        mhc_post_bwd(x, residual, post, comb, torch.ones_like(residual))


def test_forward_stream_count_range():
    x, residual, post, comb = _streams(9)
    with pytest.raises(ValueError, match=r"residual.size\(2\) \(the stream count n\) must be at most 8"):
        mhc_post_fwd(x, residual, post, comb)
    x, residual, post, comb = _streams(0)
    with pytest.raises(ValueError, match=r"residual.size\(2\) \(the stream count n\) must be >= 1"):
        mhc_post_fwd(x, residual, post, comb)


@pytest.mark.parametrize("out,error,match", [
    (torch.zeros(B, S, N, H), TypeError, "out must be torch.bfloat16"),
    (torch.zeros(B, S, N, H + 1, dtype=torch.bfloat16), ValueError, r"out must have shape \(2, 3, 4, 128\)"),
    (torch.zeros(B, S, N, 2 * H, dtype=torch.bfloat16)[..., ::2], ValueError, "out must be contiguous"),
    (torch.zeros(B, S, N, H, dtype=torch.bfloat16, device="meta"), ValueError, "out must be on cpu"),
    ("out", TypeError, "out must be a torch.Tensor"),
])
def test_bad_out(out, error, match):
    with pytest.raises(error, match=match):
        mhc_post_fwd(X, R, P, C, out=out)


def test_out_overlapping_an_input_is_refused():
    # out aliasing the residual (in place), or an x-sized slice of the same storage.
    residual = torch.ones(B, S, N, H, dtype=torch.bfloat16)
    storage = torch.ones(2 * B * S * N * H, dtype=torch.bfloat16)
    x = storage[:B * S * H].view(B, S, H)
    out = storage[B * S * H // 2:][:B * S * N * H].view(B, S, N, H)
    for args, given, name in (((X, residual, P, C), residual, "residual"), ((x, R, P, C), out, "x")):
        before = given.clone()
        with pytest.raises(ValueError, match=f"out shares memory with {name}"):
            mhc_post_fwd(*args, out=given)
        assert torch.equal(given, before)


def test_parallel_entry_points_refuse_torch():
    with pytest.raises(ValueError, match="always runs the kernel"):
        mhc_post_fwd_parallel(X, R, P, C, target="torch")
    with pytest.raises(ValueError, match="always runs the kernel"):
        mhc_post_bwd_parallel(X, R, P, C, G, target="torch")
