"""swiglu_backward and swiglu_backward_and_per_token_cast: bad input raises a clear
TypeError/ValueError naming the argument, before any kernel runs (the ops take no preallocated
outputs, so there is no overlap to refuse)."""

from __future__ import annotations

import pytest
import torch

from vmi_devkit.errors import no_kernel_fixture
from vmi_quant import reference
from vmi_quant.config import reset_runtime_config, set_token_alignment
from vmi_quant.ops.swiglu_backward import (
    swiglu_backward,
    swiglu_backward_and_per_token_cast,
    swiglu_backward_and_per_token_cast_parallel,
    swiglu_backward_parallel,
)

no_kernel = no_kernel_fixture("vmi_quant.kernels.swiglu_backward")


X = torch.zeros(16, 256, dtype=torch.bfloat16)
G = torch.zeros(16, 128, dtype=torch.bfloat16)
W = torch.zeros(16)
PSUM = torch.tensor([4, 16], dtype=torch.int32)
Q, SF = reference.cast(X, "e4m3", (1, 32))
QX = (Q, SF)


def bwd(*args, **kwargs):
    return swiglu_backward(*args, **kwargs)


def cast_bwd(x=QX, grad=G, fmt="e4m3", npc=32, **kwargs):
    return swiglu_backward_and_per_token_cast(x, grad, fmt, npc, **kwargs)


@pytest.mark.parametrize("call,error,match", [
    (lambda: bwd(X, G, 16), TypeError, "fmt"),
    (lambda: bwd(X, G, "e4m3"), ValueError, "fmt must be 'bf16' or 'fp32'"),
    (lambda: bwd("x", G, "bf16"), TypeError, "x must be a torch.Tensor"),
    (lambda: bwd(X.half(), G.half(), "bf16"), TypeError, "x must be bfloat16 or float32"),
    (lambda: bwd(X[0], G, "bf16"), ValueError, "x must be 2-D or 3-D"),
    (lambda: bwd(X[:, :255], G, "bf16"), ValueError, "even last dim"),
    (lambda: bwd(X[:, :192], G[:, :96], "bf16"), ValueError, "multiple of 64"),
    (lambda: bwd(torch.zeros(2, 2 * 8256, dtype=torch.bfloat16), torch.zeros(2, 8256, dtype=torch.bfloat16),
                 "bf16"), ValueError, "at most 8192"),
    (lambda: bwd(torch.zeros(2, 2 * 8192), torch.zeros(2, 8192), "fp32", do_recompute=True, target="ascend-sim"),
     ValueError, "too large for the Ascend UB"),
    (lambda: bwd(X.t().contiguous().t(), G, "bf16"), ValueError, "x must have unit stride"),
    (lambda: bwd(X.view(2, 8, 256).transpose(0, 1), G, "bf16"), ValueError, "3-D and contiguous"),
    (lambda: bwd(X, G.float(), "bf16"), TypeError, "act_x_grad must have the dtype of x"),
    (lambda: bwd(X, G.half(), "bf16"), TypeError, "act_x_grad must be bfloat16 or float32"),
    (lambda: bwd(X, G[:8], "bf16"), ValueError, "act_x_grad must have 16 rows"),
    (lambda: bwd(X, G[:, :64], "bf16"), ValueError, "act_x_grad must have 128 columns"),
    (lambda: bwd(X, G.tolist(), "bf16"), TypeError, "act_x_grad must be a torch.Tensor"),
    (lambda: bwd(X, G.to("meta"), "bf16"), ValueError, "act_x_grad is on"),
    (lambda: bwd(X, G, "bf16", topk_weights=W.double()), TypeError, "topk_weights must be torch.float32"),
    (lambda: bwd(X, G, "bf16", topk_weights=W[:8]), ValueError, "topk_weights must have shape \\(16\\)"),
    (lambda: bwd(X, G, "bf16", topk_weights=torch.zeros(32)[::2]), ValueError, "topk_weights must be contiguous"),
    (lambda: bwd(X, G, "bf16", routed_scaling_factor=2.5), ValueError, "routed_scaling_factor requires"),
    (lambda: bwd(X, G, "bf16", topk_weights=W, routed_scaling_factor="2"), TypeError, "routed_scaling_factor"),
    (lambda: bwd(X, G, "bf16", topk_weights=W, routed_scaling_factor=float("inf")), ValueError,
     "routed_scaling_factor must be finite"),
    (lambda: bwd(X, G, "bf16", clamp_value=-1.0), ValueError, "clamp_value must be >= 0"),
    (lambda: bwd(X, G, "bf16", clamp_value=float("nan")), ValueError, "clamp_value must be finite"),
    (lambda: bwd(X, G, "bf16", clamp_value=True), TypeError, "clamp_value"),
    (lambda: bwd(X, G, "bf16", do_recompute=1), TypeError, "do_recompute"),
    (lambda: bwd(X, G, "bf16", psum_num_tokens_per_expert=PSUM.long()), TypeError,
     "psum_num_tokens_per_expert must be torch.int32"),
    (lambda: bwd(X, G, "bf16", psum_num_tokens_per_expert=PSUM[:0]), ValueError,
     "psum_num_tokens_per_expert must hold at least one expert"),
    (lambda: bwd(X, G, "bf16", psum_num_tokens_per_expert=torch.tensor([17], dtype=torch.int32)),
     ValueError, "exceeds the number of rows"),
    (lambda: bwd(X, G, "bf16", psum_num_tokens_per_expert=torch.tensor([4, 2], dtype=torch.int32)),
     ValueError, "psum_num_tokens_per_expert\\[1\\]"),
    (lambda: bwd(X, G, "bf16", psum_num_tokens_per_expert=PSUM.view(1, 2)), ValueError, "1-D"),
    (lambda: bwd(X, G, "bf16", target="cuda"), ValueError, "target 'cuda'"),
    (lambda: bwd(X, G, "bf16", flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: bwd(X, G, "bf16", target="ascend-sim", flavor="cuda"), ValueError, "flavor"),
    (lambda: swiglu_backward_parallel(X, G, "bf16", target="torch"), ValueError, "always runs the kernel"),
    (lambda: cast_bwd(X), TypeError, "x must be a quantized \\(data, sf\\) tuple"),
    (lambda: cast_bwd((Q, SF, SF)), ValueError, "tuple of 3"),
    (lambda: cast_bwd(fmt="bf16"), ValueError, "fmt must be 'e4m3'"),
    (lambda: cast_bwd(npc=64), ValueError, "num_per_channels must be one of"),
    (lambda: cast_bwd(npc=32.0), TypeError, "num_per_channels"),
    (lambda: cast_bwd((X, SF)), TypeError, "x data must be float8_e4m3fn"),
    (lambda: cast_bwd((Q, SF.double())), TypeError, "x sf must be torch.float32"),
    (lambda: cast_bwd((Q, SF[:, :4])), ValueError, "x sf must have shape \\(16, 8\\)"),
    (lambda: cast_bwd((Q, SF.t().contiguous().t())), ValueError, "x sf must be contiguous"),
    (lambda: cast_bwd((Q, "sf")), TypeError, "x sf must be a torch.Tensor"),
    (lambda: cast_bwd((Q[:, :192], SF[:, :6]), G[:, :96], npc=32), ValueError, "multiple of 64"),
    (lambda: cast_bwd((torch.zeros(16, 384, dtype=torch.float8_e4m3fn), torch.zeros(16, 3)),
                      torch.zeros(16, 192, dtype=torch.bfloat16), npc=128), ValueError,
     "multiple of num_per_channels 128"),
    (lambda: cast_bwd(use_packed_ue8m0=True), ValueError, "requires round_sf"),
    (lambda: cast_bwd(round_sf=1), TypeError, "round_sf"),
    (lambda: cast_bwd(use_tma_aligned_col_major_sf="no"), TypeError, "use_tma_aligned_col_major_sf"),
    (lambda: cast_bwd(grad=G.half()), TypeError, "act_x_grad must be bfloat16 or float32"),
    (lambda: swiglu_backward_and_per_token_cast_parallel(QX, G, "e4m3", 32, target="torch"), ValueError,
     "always runs the kernel"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_psum_ends_must_not_decrease_but_may_precede_the_aligned_start():
    # At alignment 8, expert 1 of psum [4, 6] ends before its aligned start 8: an empty expert, as in
    # TileKernels (the kernel runs); [6, 4] decreases.
    set_token_alignment(8)
    try:
        with pytest.raises(AssertionError, match="a kernel was launched"):
            bwd(X, G, "bf16", psum_num_tokens_per_expert=torch.tensor([4, 6], dtype=torch.int32))
        with pytest.raises(ValueError, match=r"must not decrease: psum_num_tokens_per_expert\[1\] = 4"):
            bwd(X, G, "bf16", psum_num_tokens_per_expert=torch.tensor([6, 4], dtype=torch.int32))
    finally:
        reset_runtime_config()
